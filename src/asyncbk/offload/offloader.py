"""The offloader: copies completed segments to the object store, records them, and
later deletes their ledgers from the bookies (``asyncbk offload``, or in a bookie
with ``--offload-object-store``).

Each segment goes through four steps, each safe to crash in:

1. **upload** its ledger's entries as one object (:mod:`.format`) under a key of
   its own (``<namespace>/<stream>/<seq>-<ledger>-<nonce>.seg``: a redo never
   overwrites an earlier attempt).  A multipart upload appears whole or not at all.
2. **verify** by reading the whole object back: trailer, index, every block's
   checksum, the digest of every byte, and the digest of the entries compared with
   the one computed from the bookies' copy while uploading.
3. **record** the object in the segment's metadata by compare-and-set on the
   segment's record.  A truncation, retention pass or stream deletion that dropped
   the segment meanwhile makes it fail (and one that comes later compares the
   record's new version, re-reads, and deletes the object).  The losing object is
   deleted; one left by a crash before this step is named by no segment and the
   sweep deletes it after the grace period.
4. ``offload_deletion_lag_s`` later, **delete the ledger** (after checking that the
   object is still there), then mark the record.  A crash between the two repeats
   the deletion, which finds nothing to delete.

No step deletes data that is not elsewhere: a ledger is deleted only when its
segment's record names an object that was read back whole, and an object is
deleted only when no record names it.  The offloader reads only completed segments,
so writers and tailing readers never meet the object store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from ..clock import LOOP_CLOCK, Clock
from ..errors import (
    BKError,
    CorruptObjectError,
    MetadataVersionError,
    NoSuchNamespaceError,
    NoSuchStreamError,
    ObjectStoreError,
    ObjectStoreUnavailableError,
)
from ..log import get_logger
from ..stream.context import LedgerClient, StreamContext, open_context
from ..stream.meta import Offload, Segment, StreamMetadata
from ..stream.segment_ledger import delete_ledger, open_for_read
from ..tiered.format import (
    BLOCK_BYTES_DEFAULT,
    FORMAT_VERSION,
    HEADER,
    TRAILER,
    ObjectBuilder,
    ObjectLayout,
    decode_block,
    decode_header,
    decode_index,
    decode_trailer,
)
from ..tiered.reader import stream_blocks
from ..tiered.store import UPLOAD_PART_BYTES, ObjectStore
from .policy import ObjectKey, Sweep, deletion_due, offload_candidates, sweep_decision

READ_WINDOW_ENTRIES = 64
"""Entries the offloader reads from the bookies per request (one more in flight)."""
SWEEP_GRACE_S_DEFAULT = 3600.0
"""An object no segment names, whose segment still exists, is deleted once this old
(it may be a copy in progress)."""
SEGMENTS_PER_PASS_DEFAULT = 16
HOLD_ENV = "ASYNCBK_OFFLOAD_HOLD_AT"
"""Testing seam of ``asyncbk offload``: the offloader stops at this step (one of
:data:`STEPS`), prints ``HOLD <step>``, and waits to be killed: the crash tests
SIGKILL it there."""
STEPS = ("uploading", "uploaded", "verified", "recorded", "ledger-deleted")


class RateLimit:
    """At most ``bytes_per_s`` bytes a second on average (0: no limit), bursts of one
    second's worth."""

    def __init__(self, bytes_per_s: float, clock: Clock = LOOP_CLOCK) -> None:
        self.bytes_per_s = bytes_per_s
        self._clock = clock
        self._allowance = bytes_per_s
        self._at: float | None = None

    async def take(self, n: int) -> None:
        if self.bytes_per_s <= 0:
            return
        now = self._clock.monotonic_s()
        if self._at is not None:
            self._allowance = min(self.bytes_per_s,
                                  self._allowance + (now - self._at) * self.bytes_per_s)
        self._at = now
        self._allowance -= n
        if self._allowance < 0:
            await self._clock.sleep(-self._allowance / self.bytes_per_s)


@dataclass
class PassReport:
    """What one pass did."""

    offloaded: list[str] = field(default_factory=list)
    """``namespace/stream:seq`` of each segment copied and recorded."""
    offloaded_bytes: int = 0
    ledgers_deleted: list[str] = field(default_factory=list)
    swept: int = 0
    failures: list[str] = field(default_factory=list)
    """One line per segment that failed (it is tried again at the next pass)."""


@dataclass(frozen=True, slots=True)
class OffloaderOptions:
    segments_per_pass: int = SEGMENTS_PER_PASS_DEFAULT
    """Segments copied at most per pass (the rest wait for the next)."""
    rate_bytes_per_s: float = 0.0
    """Bytes read from the bookies per second at most (0: no limit)."""
    block_bytes: int = BLOCK_BYTES_DEFAULT
    sweep_grace_s: float = SWEEP_GRACE_S_DEFAULT
    retries: int = 3
    """Tries of one step against a store that does not answer (with back-off)."""


Progress = Callable[[str], None]
StepHook = Callable[[str], Awaitable[None]]
"""Called as each segment reaches a step of :data:`STEPS` (tests race the protocol)."""


class Offloader:
    """Offloads the segments of every namespace (or of ``namespaces``) of the cluster
    of ``client`` to ``store`` (see the module docstring)."""

    def __init__(self, client: LedgerClient, store: ObjectStore,
                 options: OffloaderOptions | None = None, *, clock: Clock = LOOP_CLOCK,
                 progress: Progress | None = None, step_hook: StepHook | None = None,
                 rng: random.Random | None = None) -> None:
        self.client = client
        self.store = store
        self.options = options or OffloaderOptions()
        self.clock = clock
        self.md = StreamMetadata(client.meta)
        self.rate = RateLimit(self.options.rate_bytes_per_s, clock)
        self._log = get_logger(component="offloader", store=str(store.uri))
        self._progress = progress or (lambda line: None)
        self._step_hook = step_hook
        self._rng = rng if rng is not None else random.Random()
        """Draws the objects' key nonces (a seeded one in the simulator)."""
        client.objects.add(store)  # this client's reads of what it offloads use it too

    def _now_ms(self) -> int:
        return int(self.clock.wall_s() * 1000)

    async def _hold(self, step: str) -> None:
        if self._step_hook is not None:
            await self._step_hook(step)

    # ------------------------------------------------------------------ passes

    async def run_pass(self, namespaces: Sequence[str] | None = None) -> PassReport:
        """One pass: copy what is due (at most ``segments_per_pass``), delete the
        ledgers whose lag has passed, sweep objects no segment names."""
        report = PassReport()
        names = list(namespaces) if namespaces else await self.md.list_namespaces()
        budget = self.options.segments_per_pass
        for ns in names:
            try:
                ctx = await open_context(self.client, ns, clock=self.clock)
            except NoSuchNamespaceError:
                continue
            for stream in await self.md.list_streams(ns):
                try:
                    budget -= await self._stream_pass(ctx, stream, budget, report)
                except (NoSuchStreamError, NoSuchNamespaceError):
                    continue
        try:
            await self.sweep(report)
        except ObjectStoreError as exc:
            report.failures.append(f"sweep: {exc}")
        return report

    async def _stream_pass(self, ctx: StreamContext, stream: str, budget: int,
                           report: PassReport) -> int:
        sm = await self.md.stream(ctx.namespace, stream)
        config = ctx.stream_config(sm)
        segs = await self.md.segments(ctx.namespace, stream)
        now = self._now_ms()
        for seg in deletion_due(segs, config, now):
            try:
                await self.delete_bookie_copy(ctx, stream, seg)
                report.ledgers_deleted.append(f"{ctx.namespace}/{stream}:{seg.seq}")
            except (BKError, OSError) as exc:
                report.failures.append(f"{ctx.namespace}/{stream}:{seg.seq}: {exc}")
        used = 0
        for seg in offload_candidates(segs, config, now):
            if used >= budget:
                break
            used += 1
            try:
                done = await self.offload_segment(ctx, stream, seg)
            except (BKError, OSError) as exc:
                report.failures.append(f"{ctx.namespace}/{stream}:{seg.seq}: {exc}")
                self._log.warning("offload failed; tried again at the next pass",
                                  namespace=ctx.namespace, stream=stream, segment=seg.seq,
                                  error=str(exc))
                continue
            if done is not None and done.offload is not None:
                report.offloaded.append(f"{ctx.namespace}/{stream}:{seg.seq}")
                report.offloaded_bytes += done.offload.size
        return used

    async def run(self, interval_s: float, stop: asyncio.Event,
                  namespaces: Sequence[str] | None = None,
                  on_pass: Callable[[PassReport], Any] | None = None) -> None:
        """Passes every ``interval_s`` until ``stop`` is set (a failed pass is logged)."""
        while not stop.is_set():
            try:
                report = await self.run_pass(namespaces)
                if on_pass is not None:
                    on_pass(report)
            except (BKError, OSError) as exc:
                self._log.warning("offload pass failed; trying again later", error=str(exc))
            try:
                async with asyncio.timeout(interval_s):
                    await stop.wait()
            except TimeoutError:
                pass

    # ------------------------------------------------------------------ one segment

    async def _retry(self, what: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        for attempt in range(self.options.retries):
            try:
                return await fn()
            except ObjectStoreUnavailableError as exc:
                if attempt + 1 >= self.options.retries:
                    raise
                self._log.info("object store unavailable; retrying", step=what, error=str(exc))
                await self.clock.sleep(min(8.0, 0.5 * 2 ** attempt))
        raise AssertionError("unreachable")

    async def offload_segment(self, ctx: StreamContext, stream: str,
                              seg: Segment) -> Segment | None:
        """Copy, verify and record ``seg``; its record with the object (None: the
        segment was dropped meanwhile, or another offloader recorded it first)."""
        ns = ctx.namespace
        where = f"{ns}/{stream}:{seg.seq}"
        rh = await open_for_read(ctx, seg.ledger_id)
        md = rh.metadata
        if not md.is_closed:
            raise BKError(f"segment {where}: ledger {seg.ledger_id} is not closed")
        last_entry = md.last_entry_id
        key = str(ObjectKey(ns, stream, seg.seq, seg.ledger_id,
                            f"{self._rng.getrandbits(32):08x}"))
        self._progress(f"offloading {where} (ledger {seg.ledger_id}, {last_entry + 1} entries, "
                       f"{seg.size_bytes} bytes) to {key}")
        payload_digest = xxhash.xxh3_64()
        layout_box: list[ObjectLayout] = []

        async def chunks() -> AsyncIterator[bytes]:
            builder = ObjectBuilder(seg.ledger_id, 0, self.options.block_bytes)
            windows = [(lo, min(last_entry, lo + READ_WINDOW_ENTRIES - 1))
                       for lo in range(0, last_entry + 1, READ_WINDOW_ENTRIES)]
            pending: asyncio.Future[Any] | None = None
            sent = 0
            try:
                for i, (lo, hi) in enumerate(windows):
                    current = pending or asyncio.ensure_future(rh.read(lo, hi))
                    pending = (asyncio.ensure_future(rh.read(*windows[i + 1]))
                               if i + 1 < len(windows) else None)
                    entries = await current
                    nbytes = 0
                    for e in entries:
                        payload_digest.update(e.data)
                        nbytes += len(e.data)
                        for part in builder.add(e.entry_id, e.data):
                            yield part
                            sent += 1
                            if sent == 1:
                                await self._hold("uploading")
                    await self.rate.take(nbytes)
            finally:
                if pending is not None:
                    pending.cancel()
                    await asyncio.gather(pending, return_exceptions=True)
            tail, layout = builder.finish()
            layout_box.append(layout)
            for part in tail:
                yield part

        if seg.size_bytes + (last_entry + 1) * 8 < UPLOAD_PART_BYTES:
            body = b"".join([c async for c in chunks()])
            await self._hold("uploading")
            await self._retry("upload", lambda: self.store.put(key, body))
        else:
            await self.store.put(key, chunks())  # (a multipart upload: not retried whole)
        layout = layout_box[0]
        await self._hold("uploaded")
        try:
            await self._retry("verify", lambda: self.verify(key, layout, seg.ledger_id,
                                                           last_entry,
                                                           payload_digest.intdigest()))
        except BaseException:
            await self._discard(key)
            raise
        await self._hold("verified")
        offload = Offload(store=str(self.store.uri), key=key, size=layout.size,
                          index_offset=layout.index_offset, index_length=layout.index_length,
                          digest=layout.digest, format=FORMAT_VERSION, last_entry=last_entry,
                          offloaded_ms=self._now_ms())
        recorded = await self._record(ctx, stream, seg, offload)
        if recorded is None:
            await self._discard(key)
            return None
        await self._hold("recorded")
        self._log.info("segment offloaded", namespace=ns, stream=stream, segment=seg.seq,
                       ledger_id=seg.ledger_id, object=key, bytes=layout.size)
        self._progress(f"offloaded {where}: {layout.size} bytes verified and recorded")
        return recorded

    async def _record(self, ctx: StreamContext, stream: str, seg: Segment,
                      offload: Offload) -> Segment | None:
        """Record ``offload`` in ``seg``'s record by compare-and-set (None: dropped
        meanwhile, or offloaded by another)."""
        current = seg
        for _ in range(3):
            try:
                return await self.md.put_segment(ctx.namespace, stream,
                                                 dataclasses.replace(current, offload=offload))
            except MetadataVersionError:
                got = await self.md.segments(ctx.namespace, stream, from_seq=seg.seq, limit=1)
                if not got or got[0].seq != seg.seq or got[0].ledger_id != seg.ledger_id \
                        or got[0].offload is not None or not got[0].completed:
                    self._log.info("segment changed while it was offloaded; object discarded",
                                   namespace=ctx.namespace, stream=stream, segment=seg.seq)
                    return None
                current = got[0]
        return None

    async def _discard(self, key: str) -> None:
        try:
            await self.store.delete(key)
        except ObjectStoreError as exc:
            self._log.warning("could not delete an unrecorded object; the sweep will",
                              object=key, error=str(exc))

    async def verify(self, key: str, layout: ObjectLayout, ledger_id: int, last_entry: int,
                     payload_digest: int) -> None:
        """Read the whole object back and check it against what was uploaded
        (CorruptObjectError naming what differs)."""
        where = f"{self.store.uri}/{key}"
        info = await self.store.head(key)
        if info is None or info.size != layout.size:
            raise CorruptObjectError(f"{where}: uploaded {layout.size} bytes, the store has "
                                     f"{'none' if info is None else info.size}")
        head = await self.store.get_range(key, 0, HEADER.size)
        if decode_header(head, where) != ledger_id:
            raise CorruptObjectError(f"{where}: the header names another ledger")
        trailer = await self.store.get_range(key, layout.size - TRAILER.size, layout.size)
        if decode_trailer(trailer, where) != (layout.index_offset, layout.index_length,
                                              layout.digest):
            raise CorruptObjectError(f"{where}: the trailer differs from what was uploaded")
        index_bytes = await self.store.get_range(key, layout.index_offset,
                                                 layout.index_offset + layout.index_length)
        idx = decode_index(index_bytes, where)
        if idx.first_entry != 0 or idx.last_entry != last_entry:
            raise CorruptObjectError(f"{where}: holds entries {idx.first_entry}.."
                                     f"{idx.last_entry}, the ledger 0..{last_entry}")
        whole = xxhash.xxh3_64(head)
        entries = xxhash.xxh3_64()
        expect_at = HEADER.size
        m = len(idx.block_firsts)
        for b in range(m):
            start, end = idx.block_range(b)
            if start != expect_at:
                raise CorruptObjectError(f"{where}: block {b} is not where it should be")
            expect_at = end
        if m:  # one streamed GET of every block
            async for b, data in stream_blocks(self.store, key, idx, 0, m - 1, where):
                first, last = idx.block_entries(b)
                for payload in decode_block(data, f"{where} block {b}", first, last):
                    entries.update(payload)
                whole.update(data)
        if expect_at != layout.index_offset:
            raise CorruptObjectError(f"{where}: the blocks do not reach the index")
        whole.update(index_bytes)
        if whole.intdigest() != layout.digest:
            raise CorruptObjectError(f"{where}: digest mismatch")
        if entries.intdigest() != payload_digest:
            raise CorruptObjectError(f"{where}: the entries differ from the ledger's")

    # ------------------------------------------------------------------ bookie copy

    async def delete_bookie_copy(self, ctx: StreamContext, stream: str, seg: Segment) -> None:
        """Delete the ledger of offloaded ``seg`` (its object checked first), then mark
        the record."""
        off = seg.offload
        assert off is not None
        if off.store != str(self.store.uri):
            return  # another store's object: its own offloader deletes the ledger
        info = await self._retry("head", lambda: self.store.head(off.key))
        if info is None or info.size != off.size:
            # The object is missing or different: keep the ledger and forget the object,
            # so the segment is offloaded again.
            self._log.error("a recorded object is missing or changed; the segment is kept on "
                            "the bookies and offloaded again", namespace=ctx.namespace,
                            stream=stream, segment=seg.seq, object=off.key)
            await self._unrecord(stream, ctx, seg)
            return
        await delete_ledger(ctx, seg.ledger_id)
        await self._hold("ledger-deleted")
        marked = dataclasses.replace(off, ledger_deleted_ms=self._now_ms())
        try:
            await self.md.put_segment(ctx.namespace, stream,
                                      dataclasses.replace(seg, offload=marked))
        except MetadataVersionError:
            pass  # dropped or changed meanwhile: the next pass sees it as it is
        self._log.info("offloaded segment's ledger deleted from the bookies",
                       namespace=ctx.namespace, stream=stream, segment=seg.seq,
                       ledger_id=seg.ledger_id)
        self._progress(f"deleted ledger {seg.ledger_id} of {ctx.namespace}/{stream}:{seg.seq} "
                       "from the bookies")

    async def _unrecord(self, stream: str, ctx: StreamContext, seg: Segment) -> None:
        try:
            await self.md.put_segment(ctx.namespace, stream,
                                      dataclasses.replace(seg, offload=None))
        except MetadataVersionError:
            pass

    # ------------------------------------------------------------------ sweep

    async def sweep(self, report: PassReport | None = None) -> int:
        """Delete the objects no segment names (see :mod:`.policy`); how many."""
        now_s = self.clock.wall_s()
        store = str(self.store.uri)
        segments: dict[tuple[str, str], list[Segment] | None] = {}
        doomed: list[str] = []
        async for info in self.store.list():
            key = ObjectKey.parse(info.key)
            if key is None:
                continue
            where = (key.namespace, key.stream)
            if where not in segments:
                try:
                    segments[where] = await self.md.segments(key.namespace, key.stream) \
                        if await self._stream_exists(key.namespace, key.stream) else None
                except BKError:
                    continue
            decision = sweep_decision(key, info.key, store, segments[where],
                                      now_s - info.mtime_s, self.options.sweep_grace_s)
            if decision is Sweep.DELETE:
                doomed.append(info.key)
        for k in doomed:
            try:
                await self.store.delete(k)
            except ObjectStoreError as exc:
                self._log.warning("could not sweep an object", object=k, error=str(exc))
                continue
            self._log.info("swept an object no segment names", object=k)
        if report is not None:
            report.swept += len(doomed)
        return len(doomed)

    async def _stream_exists(self, namespace: str, stream: str) -> bool:
        try:
            await self.md.stream(namespace, stream)
        except (NoSuchStreamError, NoSuchNamespaceError):
            return False
        return True


def hold_hook_from_env(say: Progress) -> StepHook | None:
    """The testing seam (HOLD_ENV): a step hook that says ``HOLD <step>`` and waits
    forever at that step (None when the variable is not set to a step)."""
    step = os.environ.get(HOLD_ENV) or None
    if step not in STEPS:
        return None

    async def hold(at: str) -> None:
        if at == step:
            say(f"HOLD {at}")
            await asyncio.Event().wait()  # until killed

    return hold
