"""Ledgers written apart from a stream, then made part of it in one transaction.

This is how a parallel writer (Spark's tasks) appends to a stream, which has one
writer at a time, exactly once:

1. Each worker writes its records into a *staged* ledger of its own
   (:class:`StagedWriter`): a ledger with the stream's shape, in the stream's entry
   format, registered under ``<root>/streams/staging/...`` so that a ledger whose
   batch never commits can be found and deleted.  Readers never see it.
2. One committer :func:`adopt`\\ s the staged ledgers: one metadata transaction fences
   and completes the stream's open segment (if another writer has one), appends the
   ledgers as completed segments, records the batch under the committer's *sink id*,
   and removes their staging keys.  It applies whole or not at all, and a batch
   whose number the sink has recorded already is not applied again.
3. :func:`sweep` deletes staged ledgers that no commit will adopt.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from ..errors import (
    BKError,
    EndOfStreamError,
    InvalidTxidError,
    MetadataVersionError,
    NoSuchLedgerError,
    WriterFencedError,
)
from ..log import get_logger
from ..meta import keys
from . import codec
from .meta import COMPLETED, Segment, StreamConfig
from .namespace import placement_spec
from .writer import _recover_segment

if TYPE_CHECKING:
    from ..client.ledger import LedgerHandle
    from .namespace import Namespace

ADOPT_ATTEMPTS = 20
ADOPT_LEDGERS_MAX = 40
"""Staged ledgers one transaction adopts at most (each costs two of etcd's operations
per transaction, 128 by default); more are first copied into this many."""
ENTRY_BYTES = 1024 * 1024
"""Bytes of records packed into one entry of a staged ledger at most."""
INFLIGHT_ENTRIES = 64


@dataclass(frozen=True)
class StagedLedger:
    """A staged ledger, closed, and what it holds."""

    ledger_id: int
    records: int
    first_txid: int
    last_txid: int
    last_entry: int
    last_slot: int
    size_bytes: int
    owner: str


class StagedWriter:
    """Writes records into a new staged ledger of ``stream`` (see the module docstring)."""

    def __init__(self, ns: Namespace, stream: str, config: StreamConfig, owner: str,
                 entry_bytes: int = ENTRY_BYTES) -> None:
        self.ns = ns
        self.stream = stream
        self.config = config
        self.owner = owner
        self.entry_bytes = entry_bytes
        self._lh: LedgerHandle | None = None
        self._txids: list[int] = []
        self._datas: list[bytes] = []
        self._pending_bytes = 0
        self._records = 0
        self._first_txid = -1
        self._last_txid = -1
        self._last_entry = -1
        self._last_count = 0
        self._inflight: set[asyncio.Future[int]] = set()

    async def _open(self) -> None:
        lh = await self.ns.bk.create_ledger(
            self.config.ensemble_size, self.config.write_quorum, self.config.ack_quorum,
            digest=self.config.digest,
            metadata={"asyncbk.stream": f"{self.ns.name}/{self.stream}".encode(),
                      "asyncbk.staged-by": self.owner.encode()},
            placement=placement_spec(self.config))
        key = keys.staging(self.ns.md.root, self.ns.name, self.stream, lh.id)
        try:
            await self.ns.bk.meta.kv_txn([], put=[(key, msgpack.packb({"owner": self.owner}))])
        except BaseException:
            await self.ns.discard_ledger(lh)
            raise
        self._lh = lh

    async def add(self, txid: int, data: bytes) -> None:
        """One record; ``txid`` must not be below the previous one."""
        if txid < self._last_txid:
            raise InvalidTxidError(f"txid {txid} is below the previous record's "
                                   f"{self._last_txid}; txids must not decrease")
        if self._records == 0:
            self._first_txid = txid
        self._last_txid = txid
        self._records += 1
        size = len(data) + codec.RECORD_OVERHEAD_BYTES
        if self._datas and self._pending_bytes + size > self.entry_bytes:
            await self._send()
        self._txids.append(txid)
        self._datas.append(data)
        self._pending_bytes += size

    async def _send(self) -> None:
        if self._lh is None:
            await self._open()
        lh = self._lh
        assert lh is not None
        while len(self._inflight) >= INFLIGHT_ENTRIES:
            done, _ = await asyncio.wait(self._inflight, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                self._inflight.discard(fut)
                fut.result()
        before = self._records - len(self._datas)
        fut = lh.append(codec.encode(before, self._txids, self._datas))
        self._inflight.add(fut)
        self._last_entry += 1
        self._last_count = len(self._datas)
        self._txids, self._datas, self._pending_bytes = [], [], 0

    async def finish(self) -> StagedLedger | None:
        """Flush, close the ledger and describe it (None if no record was added)."""
        if self._datas:
            await self._send()
        if self._lh is None:
            return None
        if self._inflight:
            await asyncio.gather(*self._inflight)
            self._inflight.clear()
        await self._lh.close()
        return StagedLedger(self._lh.id, self._records, self._first_txid, self._last_txid,
                            self._last_entry, self._last_count - 1, self._lh.metadata.length,
                            self.owner)

    async def abort(self) -> None:
        """Give up: close and delete the ledger and its staging key."""
        for fut in self._inflight:
            fut.cancel()
        self._inflight.clear()
        if self._lh is not None:
            await self._lh.close_quietly()
            await discard(self.ns, self.stream, [self._lh.id])


async def discard(ns: Namespace, stream: str, ledger_ids: Iterable[int]) -> int:
    """Delete staged ledgers that are still staged; returns how many.

    A ledger counts as staged while its staging key exists: the key is removed
    first, in a transaction that requires it, and only then the ledger.  A ledger
    that a commit adopted lost its key in that commit's transaction, so it is never
    deleted here, even when the caller cannot know whether the commit landed (an
    ``abort`` after a commit whose answer was lost)."""
    gone = 0
    for ledger_id in ledger_ids:
        key = keys.staging(ns.md.root, ns.name, stream, ledger_id)
        kv = await ns.bk.meta.kv_get(key)
        if kv is None:
            continue  # adopted, or discarded before
        try:
            await ns.bk.meta.kv_txn([(key, kv.version)], delete=[key])
        except MetadataVersionError:
            continue  # a commit adopted it meanwhile
        try:
            await ns.bk.delete_ledger(ledger_id)
        except NoSuchLedgerError:
            pass
        gone += 1
    return gone


UNCONFIRMED_PROBE_MAX = 16
"""Entries past an open segment's LAC that :func:`_durable_last_txid` looks for."""


async def _durable_last_txid(ns: Namespace, seg: Segment) -> int:
    """The last txid of an open segment, without fencing its writer: from the last
    entry the bookies have, also past the LAC (the writer's latest acknowledged
    entries are confirmed only by its next add or its explicit LAC)."""
    try:
        rh = await ns.bk.open_ledger(seg.ledger_id, recovery=False)
    except NoSuchLedgerError:
        return -1
    entry = rh.metadata.last_entry_id if rh.metadata.is_closed else rh.last_add_confirmed
    if not rh.metadata.is_closed:
        for _ in range(UNCONFIRMED_PROBE_MAX):
            try:
                await rh.read_unconfirmed(entry + 1, entry + 1)
            except BKError:  # no such entry (or no bookie has it yet): the end
                break
            entry += 1
    while entry >= 0:
        batch = codec.decode((await rh.read_unconfirmed(entry, entry))[0].data,
                             f"stream {ns.name} segment {seg.seq} entry {entry}")
        if batch.records:
            return batch.records[-1][0]
        entry -= 1
    return -1


async def last_txid(ns: Namespace, stream: str) -> int:
    """The highest txid in ``stream`` now, the open segment's durable records included
    (-1: none): a parallel writer's records take txids above it."""
    sm = await ns.md.stream(ns.name, stream)
    last = await ns.md.segments(ns.name, stream, from_seq=sm.max_seq)
    txid = max([sm.last_txid, *(s.last_txid for s in last)])
    if last and not last[-1].completed:
        txid = max(txid, await _durable_last_txid(ns, last[-1]))
    return txid


def _check_txids(ns: Namespace, stream: str, staged: Sequence[StagedLedger],
                 prev_txid: int) -> None:
    for s in staged:
        if s.records and s.first_txid < prev_txid:
            raise InvalidTxidError(
                f"stream {ns.name}/{stream}: this batch's txids start at {s.first_txid}, below "
                f"{prev_txid}, the stream's last txid (txids never decrease); another writer "
                "may have written meanwhile (run the batch again), or a txid column goes "
                "down (sort the rows by it, or leave it out)")
        if s.records:
            prev_txid = s.last_txid


@dataclass(frozen=True)
class Adopted:
    """What :func:`adopt` did: the segments it added, or that the batch was committed
    before (``replayed``)."""

    segments: list[Segment]
    replayed: bool
    last_batch: int | None


def _marker(value: bytes) -> int:
    d = msgpack.unpackb(value, raw=False)
    return int(d["batch"]) if isinstance(d, dict) and "batch" in d else -1


async def last_batch(ns: Namespace, stream: str, sink_id: str) -> int | None:
    """The last batch the sink ``sink_id`` committed to ``stream`` (None: none yet)."""
    kv = await ns.bk.meta.kv_get(keys.sink(ns.md.root, ns.name, stream, sink_id))
    return None if kv is None else _marker(kv.value)


async def adopt(ns: Namespace, stream: str, staged: Sequence[StagedLedger], *,
                sink_id: str | None = None, batch: int | None = None) -> Adopted:
    """Make ``staged`` (in order) the next completed segments of ``stream`` in one
    transaction; with ``sink_id`` and ``batch``, only if that sink has not committed
    ``batch`` (or a later one) before, and record that it has."""
    md = ns.md
    log = get_logger(namespace=ns.name, stream=stream)
    marker_key = keys.sink(md.root, ns.name, stream, sink_id) if sink_id is not None else None
    if sum(1 for s in staged if s.records) > ADOPT_LEDGERS_MAX:
        if sink_id is not None and batch is not None:
            done = await last_batch(ns, stream, sink_id)
            if done is not None and done >= batch:
                return Adopted([], True, done)
        staged = await merge(ns, stream, staged)
    for _attempt in range(ADOPT_ATTEMPTS):
        sm = await md.stream(ns.name, stream)
        compare: list[tuple[str, int]] = []
        also_put: list[tuple[str, bytes]] = []
        if marker_key is not None and batch is not None:
            kv = await ns.bk.meta.kv_get(marker_key)
            previous = None if kv is None else _marker(kv.value)
            if previous is not None and previous >= batch:
                return Adopted([], True, previous)
            compare.append((marker_key, 0 if kv is None else kv.version))
            also_put.append((marker_key, msgpack.packb({"batch": batch})))
        if sm.ended:
            raise EndOfStreamError(f"stream {ns.name}/{stream} was ended: it takes no more "
                                   "writes")
        segs = await md.segments(ns.name, stream, from_seq=sm.max_seq)  # the last one
        put: list[Segment] = []
        last = segs[-1] if segs else None
        if last is not None and not last.completed:
            # Another writer has the stream.  If its records already rule this batch
            # out, say so without fencing it; else fence it (its next change of the
            # segments fails), then complete its segment in our transaction.
            _check_txids(ns, stream, staged, max(
                sm.last_txid, last.last_txid, await _durable_last_txid(ns, last)))
            try:
                sm, _ = await md.commit(sm, epoch=sm.epoch + 1)
            except MetadataVersionError:
                continue
            last, ended = await _recover_segment(ns, last)
            put.append(last)
            if ended:
                raise EndOfStreamError(f"stream {ns.name}/{stream} was ended")
        _check_txids(ns, stream, staged, max(
            [sm.last_txid, *(s.last_txid for s in segs), *(s.last_txid for s in put)]))
        start_sequence = last.start_sequence + last.records if last is not None else 0
        seq = max([sm.max_seq, *(s.seq for s in segs)]) + 1
        now_ms = int(ns.clock.wall_s() * 1000)
        new: list[Segment] = []
        for s in staged:
            if not s.records:
                continue
            new.append(Segment(seq=seq, ledger_id=s.ledger_id, state=COMPLETED,
                               records=s.records, start_sequence=start_sequence,
                               first_txid=s.first_txid, last_txid=s.last_txid,
                               last_entry=s.last_entry, last_slot=s.last_slot,
                               size_bytes=s.size_bytes, ctime_ms=now_ms, completion_ms=now_ms))
            seq += 1
            start_sequence += s.records
        staging_keys = [keys.staging(md.root, ns.name, stream, s.ledger_id) for s in staged]
        try:
            _, committed = await md.commit(sm, put=[*put, *new], also_compare=compare,
                                           also_put=also_put, also_delete=staging_keys)
        except MetadataVersionError:
            continue
        log.info("ledgers adopted", segments=[s.seq for s in new], sink=sink_id, batch=batch)
        return Adopted(committed[len(put):], False, batch)
    raise WriterFencedError(f"stream {ns.name}/{stream}: {ADOPT_ATTEMPTS} attempts to commit "
                            "lost to other writers changing the stream; are several writers "
                            "fighting over it?")


async def merge(ns: Namespace, stream: str, staged: Sequence[StagedLedger],
                groups: int | None = None) -> list[StagedLedger]:
    """``staged`` copied, in order, into at most ``groups`` (default ADOPT_LEDGERS_MAX)
    new staged ledgers (the originals are deleted).  The slow path of a batch with
    very many tasks."""
    groups = groups or ADOPT_LEDGERS_MAX
    full = [s for s in staged if s.records]
    if len(full) <= groups:
        return full
    sm = await ns.md.stream(ns.name, stream)
    config = await ns.stream_config(sm)
    size = -(-len(full) // groups)
    out: list[StagedLedger] = []
    for i in range(0, len(full), size):
        writer = StagedWriter(ns, stream, config, full[i].owner)
        try:
            for s in full[i:i + size]:
                rh = await ns.bk.open_ledger(s.ledger_id, recovery=False)
                for lo in range(0, s.last_entry + 1, INFLIGHT_ENTRIES):
                    for entry in await rh.read(lo, min(s.last_entry, lo + INFLIGHT_ENTRIES - 1)):
                        batch = codec.decode(entry.data, f"staged ledger {s.ledger_id}")
                        for txid, data in batch.records:
                            await writer.add(txid, data)
            done = await writer.finish()
        except BaseException:
            await writer.abort()
            raise
        assert done is not None
        out.append(done)
    await discard(ns, stream, [s.ledger_id for s in staged])
    return out


async def sweep(ns: Namespace, stream: str, owner: str | None = None,
                keep: Iterable[int] = ()) -> int:
    """Delete the staged ledgers of ``stream`` (of ``owner`` only, if given) except
    ``keep``; returns how many.  Only safe while no worker of ``owner`` is writing."""
    spared = set(keep)
    prefix = keys.staging_prefix(ns.md.root, ns.name, stream)
    doomed: list[int] = []
    for kv in await ns.bk.meta.kv_range(prefix):
        ledger_id = int(kv.key[len(prefix):])
        if ledger_id in spared:
            continue
        try:
            who = msgpack.unpackb(kv.value, raw=False).get("owner")
        except Exception:
            who = None
        if owner is None or who == owner:
            doomed.append(ledger_id)
    try:
        return await discard(ns, stream, doomed)
    except BKError as exc:
        get_logger(namespace=ns.name, stream=stream).warning(
            "could not delete staged ledgers; the next commit tries again", error=str(exc))
        return 0


def staged_from(d: dict[str, Any]) -> StagedLedger:
    return StagedLedger(**d)


def staged_to(s: StagedLedger) -> dict[str, Any]:
    return dataclasses.asdict(s)
