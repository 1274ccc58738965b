"""Ledger handles: reading (:class:`ReadHandle`) and writing (:class:`LedgerHandle`).

Write path (``LedgerHandle.append``): the call assigns the next entry id,
seals the payload in its digest envelope (with the current LAC piggybacked),
sends it to the ``Qw`` bookies of its write set and returns a future, all
without suspending.  Each bookie's acknowledgement is recorded in the add's
:class:`~asyncbk.client.quorum.AckSet`; adds complete strictly in entry-id
order from the head of the pending queue, each advancing the LAC, so futures
resolve in id order.

Ensemble change: when a bookie errors, times out or answers READ_ONLY /
NOT_READY on an add, the handle picks a replacement (not in the ensemble),
starts a new fragment at ``LAC + 1`` by compare-and-swap on the metadata, and
re-sends every pending entry whose write set includes a replaced position.
While the change is being committed no add completes: an add that reached its
ack quorum with the help of a replaced bookie is no longer complete once the
new fragment says that position belongs to another bookie, so its
acknowledgement from the replaced bookie is withdrawn and the entry re-sent.
A lost compare-and-swap re-reads the metadata; a ledger no longer OPEN (a
recovery started) fails the pending adds with LedgerFencedError.  With no
replacement available, the handle writes on without the failed bookies as
long as every write set keeps an ack quorum of healthy ones (retrying the
replacement every ``DEGRADED_RETRY_S``); otherwise the pending adds fail with
NotEnoughBookiesError.

A handle that fails (fenced, no replacement, add quorum timeout) fails every
pending add with the cause and refuses later appends with it.

Read path: each entry is asked of the bookies of its write set in order; the
next one is tried at once on an error or digest mismatch, and speculatively
after ``speculative_read_timeout_s`` if the current one is slow.  The first
good answer wins and the other requests are cancelled.  Where a fragment's
write set is its whole ensemble (``Qw = E``) every bookie holds every entry,
and ranges are read in batches (READ_BATCH), spread over the ensemble; what a
batch cannot deliver (an error, a short run, a bad digest, a slow bookie) is
read entry by entry as above, so errors are those of single reads.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..errors import (
    BadRequestError,
    BKError,
    BookieIOError,
    BookieReadOnlyError,
    BookieUnavailableError,
    DigestMismatchError,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    ReadBeyondLastAddConfirmedError,
    TimeoutError,
    TooManyRequestsError,
    UnauthorizedAccessError,
    invariant,
)
from ..log import get_logger
from ..meta.model import Ensemble, LedgerMetadata, LedgerState
from ..net.channel import expect_answer, next_answers
from ..proto import (
    AddFlag,
    AddResponse,
    LongPollLacRequest,
    LongPollLacResponse,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Response,
    Status,
    WriteLacRequest,
)
from ..types import BookieId, LedgerEntry
from .digest import DigestManager, master_key
from .quorum import AckSet, write_set

if TYPE_CHECKING:
    from .client import BookKeeper

READ_WINDOW_ENTRIES_MAX = 1024
"""Entry reads in flight for one ``read`` call."""

READ_BATCH_ENTRIES_MAX = 256
"""Entries asked for in one READ_BATCH request."""

READ_BATCHES_INFLIGHT = 4
"""READ_BATCH requests in flight for one ``read`` call (spread over the ensemble)."""

DEGRADED_RETRY_S = 2.0
"""How often a handle writing without failed bookies (no spare) tries to replace them."""

FRAME_OVERHEAD_BYTES_MAX = 512
"""Room kept in a frame for the add request's other fields and the envelope header."""

_STATUS_ERRORS: dict[int, type[BKError]] = {
    Status.NO_LEDGER: NoSuchLedgerError,
    Status.NO_ENTRY: NoSuchEntryError,
    Status.FENCED: LedgerFencedError,
    Status.UNAUTHORIZED: UnauthorizedAccessError,
    Status.READ_ONLY: BookieReadOnlyError,
    Status.BAD_REQUEST: BadRequestError,
    Status.TOO_MANY_REQUESTS: TooManyRequestsError,
    Status.IO_ERROR: BookieIOError,
    Status.NOT_READY: BookieUnavailableError,
}


def status_error(status: int, what: str) -> BKError:
    """The client error for a bookie's non-OK status."""
    try:
        name = Status(status).name
    except ValueError:
        name = f"unknown status {status}"
    return _STATUS_ERRORS.get(status, BookieIOError)(f"{what}: bookie answered {name}")


class ReadHandle:
    """A handle to read a ledger (and to follow it while it is written)."""

    _follows_metadata = True
    """Whether reads may re-read the ledger's metadata when it may be stale (a reader;
    a writer's own metadata is always current)."""

    def __init__(self, bk: BookKeeper, metadata: LedgerMetadata, password: bytes) -> None:
        self._bk = bk
        self._metadata = metadata
        self._digest = DigestManager(metadata.ledger_id, metadata.digest, password)
        self._master_key = master_key(password)
        self._lac = metadata.last_entry_id if metadata.is_closed else -1
        self._log = get_logger(ledger_id=metadata.ledger_id)

    @property
    def id(self) -> int:
        return self._metadata.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._metadata

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    def _advance_lac(self, lac: int) -> None:
        if lac > self._lac:
            self._lac = lac

    # ------------------------------------------------------------------ reads

    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` (inclusive); all must be at or below the LAC."""
        if last > self._lac:
            raise ReadBeyondLastAddConfirmedError(
                f"ledger {self.id}: asked for entries up to {last}, last add confirmed is "
                f"{self._lac}; call read_last_add_confirmed() or read_unconfirmed()")
        return await self.read_unconfirmed(first, last)

    async def read_unconfirmed(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` without the LAC bound (no repeatable-read guarantee)."""
        if first < 0 or last < first:
            raise ValueError(f"bad entry range {first}..{last}")
        started = asyncio.get_running_loop().time()
        try:
            out = await self._read_range(first, last)
        except (BookieUnavailableError, NoSuchEntryError):
            # A reader of an open ledger may hold fragments from before the writer
            # replaced a bookie: the entries are on the replacement.  Re-read the
            # metadata and, if the fragments changed, read again.
            if not self._follows_metadata or self._metadata.is_closed:
                raise
            before = self._metadata.ensembles
            await self._refresh_metadata()
            if self._metadata.ensembles == before:
                raise
            out = await self._read_range(first, last)
        stats = self._bk.stats
        stats.read_latency.observe(asyncio.get_running_loop().time() - started)
        stats.read_entries += len(out)
        return out

    async def _read_range(self, first: int, last: int) -> list[LedgerEntry]:
        out: list[LedgerEntry] = []
        md = self._metadata
        batched = md.write_quorum == md.ensemble_size and self._bk.config.read_batch
        pos = first
        while pos <= last:
            index = _fragment_index(md, pos)
            frag_last = md.fragment_bounds(index)[1]
            hi = last if frag_last < 0 or index + 1 == len(md.ensembles) else min(last, frag_last)
            if batched and hi > pos:
                out.extend(await self._read_batched(pos, hi, md.ensembles[index][1]))
            else:
                for lo in range(pos, hi + 1, READ_WINDOW_ENTRIES_MAX):
                    top = min(hi, lo + READ_WINDOW_ENTRIES_MAX - 1)
                    out.extend(await asyncio.gather(*(self._read_entry(e)
                                                      for e in range(lo, top + 1))))
            pos = hi + 1
        return out

    async def _read_batched(self, first: int, last: int, ensemble: Ensemble) -> list[LedgerEntry]:
        """Entries ``first..last`` of one fragment whose every bookie holds every entry."""
        chunks = [(lo, min(last, lo + READ_BATCH_ENTRIES_MAX - 1))
                  for lo in range(first, last + 1, READ_BATCH_ENTRIES_MAX)]
        out: list[LedgerEntry] = []
        for w in range(0, len(chunks), READ_BATCHES_INFLIGHT):
            window = chunks[w:w + READ_BATCHES_INFLIGHT]
            parts = await asyncio.gather(*(self._read_chunk(lo, hi, ensemble, w + i)
                                           for i, (lo, hi) in enumerate(window)))
            for part in parts:
                out.extend(part)
        return out

    async def _read_chunk(self, first: int, last: int, ensemble: Ensemble,
                          start: int) -> list[LedgerEntry]:
        cfg = self._bk.config
        wait_s = cfg.speculative_read_timeout_s or cfg.read_timeout_s
        entries: list[LedgerEntry] = []
        pos = first
        for k in range(len(ensemble)):
            bookie = ensemble[(start + k) % len(ensemble)]
            while pos <= last:
                got = await self._read_batch_from(bookie, pos, last - pos + 1, wait_s)
                if not got:
                    break
                entries.extend(got)
                pos += len(got)
            if pos > last:
                return entries
        # what no batch delivered: entry by entry, with failover and speculation
        entries.extend(await asyncio.gather(*(self._read_entry(e) for e in range(pos, last + 1))))
        return entries

    async def _read_batch_from(self, bookie: BookieId, first: int, count: int,
                               wait_s: float) -> list[LedgerEntry]:
        """The good prefix of one READ_BATCH answer (empty on any failure)."""
        cfg = self._bk.config
        ch = self._bk.bookie_client.channel(bookie)
        bytes_max = max(1, cfg.frame_bytes_max - FRAME_OVERHEAD_BYTES_MAX - 8 * count)
        fut = ch.request(ReadBatchRequest(ch.next_request_id(), self.id, first, count, bytes_max),
                         cfg.read_timeout_s)
        try:
            async with asyncio.timeout(wait_s):
                resp = await fut
        except (BKError, builtins.TimeoutError):  # an error, or slow: read entry by entry
            fut.cancel()
            return []
        try:
            resp = expect_answer(resp, ReadBatchResponse, bookie)
        except BKError:
            return []
        if resp.status != Status.OK:
            return []
        out: list[LedgerEntry] = []
        lac = resp.lac
        for i, body in enumerate(resp.bodies[:count]):
            try:
                entry_lac, _, payload = self._digest.unseal(first + i, body)
            except DigestMismatchError as exc:
                self._log.warning("digest mismatch in a batch read", bookie=bookie,
                                  entry_id=first + i, error=str(exc))
                break
            lac = max(lac, entry_lac)
            out.append(LedgerEntry(self.id, first + i, payload))
        self._advance_lac(lac)
        return out

    async def _read_entry(self, entry_id: int) -> LedgerEntry:
        md = self._metadata
        ensemble = md.ensemble_at(entry_id)
        replicas = [ensemble[p] for p in write_set(entry_id, md.ensemble_size, md.write_quorum)]
        cfg = self._bk.config
        speculate_s = cfg.speculative_read_timeout_s or None
        errors: list[BKError] = []
        inflight: dict[asyncio.Future[Response], BookieId] = {}
        tried = 0

        def launch() -> None:
            nonlocal tried
            bookie = replicas[tried]
            tried += 1
            ch = self._bk.bookie_client.channel(bookie)
            req = ReadRequest(ch.next_request_id(), md.ledger_id, entry_id, 0, b"")
            inflight[ch.request(req, cfg.read_timeout_s)] = bookie

        launch()
        try:
            while inflight:
                answers = await next_answers(
                    inflight, speculate_s if tried < len(replicas) else None)
                if not answers:  # the current replicas are slow: ask one more
                    launch()
                    continue
                for bookie, r in answers:
                    if isinstance(r, BKError):
                        errors.append(r)
                    else:
                        entry = self._accept_read(r, bookie, entry_id, errors)
                        if entry is not None:
                            return entry
                    if tried < len(replicas):
                        launch()
        finally:
            for fut in inflight:
                fut.cancel()
        if errors and all(isinstance(e, DigestMismatchError) for e in errors):
            raise DigestMismatchError(
                f"ledger {md.ledger_id} entry {entry_id}: no replica has a good copy")
        if errors and all(isinstance(e, (NoSuchEntryError, NoSuchLedgerError)) for e in errors):
            raise NoSuchEntryError(f"ledger {md.ledger_id} entry {entry_id} is on no bookie")
        raise BookieUnavailableError(
            f"ledger {md.ledger_id} entry {entry_id}: no replica could be read "
            f"({'; '.join(str(e) for e in errors)})")

    def _accept_read(self, resp: Response, bookie: BookieId, entry_id: int,
                     errors: list[BKError]) -> LedgerEntry | None:
        try:
            resp = expect_answer(resp, ReadResponse, bookie)
        except BKError as exc:
            errors.append(exc)
            return None
        if resp.status != Status.OK:
            errors.append(status_error(resp.status, f"read {self.id}:{entry_id} from {bookie}"))
            return None
        try:
            lac, _, payload = self._digest.unseal(entry_id, resp.body)
        except DigestMismatchError as exc:
            self._log.warning("digest mismatch, reading another replica", bookie=bookie,
                              entry_id=entry_id, error=str(exc))
            errors.append(exc)
            return None
        self._advance_lac(max(lac, resp.lac))
        return LedgerEntry(self.id, entry_id, payload)

    async def read_last_add_confirmed(self) -> int:
        """Ask the bookies for the LAC (the highest any of them knows); updates and returns it."""
        md = self._metadata
        if md.is_closed:
            self._advance_lac(md.last_entry_id)
            return self._lac
        ensemble = md.ensembles[-1][1]
        timeout_s = self._bk.config.read_timeout_s
        futs = []
        for bookie in ensemble:
            ch = self._bk.bookie_client.channel(bookie)
            futs.append(ch.request(ReadLacRequest(ch.next_request_id(), md.ledger_id), timeout_s))
        results = await asyncio.gather(*futs, return_exceptions=True)
        answered = 0
        for r in results:
            if isinstance(r, ReadLacResponse):
                if r.status == Status.OK:
                    answered += 1
                    self._advance_lac(r.lac)
                elif r.status == Status.NO_LEDGER:
                    answered += 1
            elif isinstance(r, BaseException) and not isinstance(r, BKError):
                raise r
        if answered == 0:
            raise BookieUnavailableError(
                f"ledger {md.ledger_id}: no bookie of {', '.join(ensemble)} answered a LAC read")
        return self._lac

    async def wait_for_lac(self, after: int, timeout: float) -> int:  # noqa: ASYNC109 (public API name)
        """Long-poll the bookies until the LAC passes ``after`` or ``timeout`` seconds pass."""
        if self._lac > after or self._metadata.is_closed:
            return self._lac
        md = self._metadata
        ensemble = md.ensembles[-1][1]
        timeout_ms = max(0, int(timeout * 1000))
        grace_s = self._bk.config.read_timeout_s
        futs: list[asyncio.Future[Response]] = []
        for bookie in ensemble:
            ch = self._bk.bookie_client.channel(bookie)
            futs.append(ch.request(
                LongPollLacRequest(ch.next_request_id(), md.ledger_id, after, timeout_ms),
                timeout + grace_s))
        pending = list(futs)
        try:
            async with asyncio.timeout(timeout + grace_s):
                while pending and self._lac <= after:
                    done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    pending = [f for f in pending if f not in done]
                    for f in [f for f in futs if f in done]:  # send order: replayable
                        if f.exception() is None:
                            r = f.result()
                            if isinstance(r, LongPollLacResponse) and r.status == Status.OK:
                                self._advance_lac(r.lac)
        except builtins.TimeoutError:
            pass
        finally:
            for f in pending:
                f.cancel()
        return self._lac

    async def tail(self, start: int = 0, poll_s: float = 1.0) -> AsyncIterator[LedgerEntry]:
        """Entries from ``start`` on, waiting for new ones; ends after the last entry of a
        closed ledger."""
        next_id = start
        while True:
            if next_id <= self._lac:
                last = min(self._lac, next_id + READ_WINDOW_ENTRIES_MAX - 1)
                for entry in await self.read(next_id, last):
                    yield entry
                next_id = last + 1
                continue
            if self._metadata.is_closed:
                return
            before = self._lac
            loop = asyncio.get_running_loop()
            started_s = loop.time()
            await self.wait_for_lac(self._lac, poll_s)
            if self._lac == before:
                await self._refresh_metadata()
                # The long-poll ended early without news (bookies down or refusing):
                # wait out the interval rather than spin on the metadata store.
                idle_s = poll_s - (loop.time() - started_s)
                if idle_s > 0 and not self._metadata.is_closed:
                    await asyncio.sleep(idle_s)

    async def _refresh_metadata(self) -> None:
        md = await self._bk.meta.read_ledger(self.id)
        self._metadata = md
        if md.is_closed:
            self._advance_lac(md.last_entry_id)

    async def close(self) -> None:
        """A read handle holds no resources; provided for symmetry."""


class _PendingAdd:
    __slots__ = ("acks", "body", "entry_id", "future", "sent", "submitted_s", "total_length")

    def __init__(self, entry_id: int, total_length: int, body: bytes, acks: AckSet,
                 future: asyncio.Future[int], submitted_s: float) -> None:
        self.entry_id = entry_id
        self.total_length = total_length
        self.body = body
        self.acks = acks
        self.future = future
        self.sent = False
        self.submitted_s = submitted_s


class LedgerHandle(ReadHandle):
    """The single writer's handle of an open ledger (it can read too).

    With ``recovery=True`` it is the recovery's writer: it re-writes recovered
    entries with the RECOVERY_ADD flag into an IN_RECOVERY ledger and closes it.
    """

    _follows_metadata = False

    def __init__(self, bk: BookKeeper, metadata: LedgerMetadata, password: bytes, *,
                 recovery: bool = False, lac: int = -1, length: int = 0) -> None:
        super().__init__(bk, metadata, password)
        self._loop = asyncio.get_running_loop()
        self._recovery = recovery
        self._add_flags = AddFlag.RECOVERY_ADD if recovery else AddFlag.NONE
        self._writable_state = LedgerState.IN_RECOVERY if recovery else LedgerState.OPEN
        self._persisted_ensembles = metadata.ensembles
        self._lac = lac
        self._next_entry_id = lac + 1
        self._length = length
        self._submitted_length = length
        self._pending: collections.deque[_PendingAdd] = collections.deque()
        self._error: BKError | None = None
        self._closing: asyncio.Future[None] | None = None
        self._capacity = asyncio.Event()
        self._capacity.set()
        self._pending_max = bk.config.pending_adds_max
        self._failed_positions: dict[int, BKError] = {}
        self._degraded: set[int] = set()
        """Failed positions left unreplaced (no spare bookie) while every write set
        still has an ack quorum of healthy bookies: adds skip them."""
        self._degraded_retry: asyncio.TimerHandle | None = None
        self._stalled_since_s: float | None = None
        """Since when appends wait for want of bookies (None: they don't)."""
        self._stalled_bookies: set[BookieId] = set()
        """The bookies that failed since then (named in the error if it lasts)."""
        self._change_task: asyncio.Task[None] | None = None
        self.ensemble_changes = 0
        self._lac_sent = lac
        self._explicit_lac_handle: asyncio.TimerHandle | None = None
        self._quorum_timer: asyncio.TimerHandle | None = None

    @property
    def pending_adds(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------------ append

    def append(self, data: bytes) -> asyncio.Future[int]:
        """Submit ``data`` now; the returned future resolves to its entry id once
        ``ack_quorum`` bookies have made it durable."""
        if self._recovery:
            raise LedgerClosedError(f"ledger {self.id} is being recovered")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"append takes bytes, not {type(data).__name__}")
        payload = bytes(data)
        limit = self._bk.config.frame_bytes_max - FRAME_OVERHEAD_BYTES_MAX
        if len(payload) > limit:
            # Checked here: an oversized frame would make each bookie drop the whole
            # connection, failing other ledgers' requests too.
            raise EntryTooLargeError(
                f"entry of {len(payload)} bytes exceeds the {limit}-byte maximum "
                "(frame_bytes_max less overhead); split it into smaller entries")
        entry_id = self._next_entry_id
        total_length = self._submitted_length + len(payload)
        self._check_appendable()
        body = self._digest.seal(entry_id, self._lac, total_length, payload)
        self._submitted_length = total_length
        return self._enqueue(entry_id, total_length, body)

    def append_recovered(self, entry_id: int, body: bytes, total_length: int) -> asyncio.Future[int]:
        """Recovery: re-write an entry read back from the bookies, byte for byte."""
        invariant(self._recovery, "append_recovered on a writer handle")
        invariant(entry_id == self._next_entry_id,
                  f"recovered entry {entry_id}, expected {self._next_entry_id}")
        self._check_appendable()
        self._submitted_length = total_length
        return self._enqueue(entry_id, total_length, body)

    def _check_appendable(self) -> None:
        if self._closing is not None:
            raise LedgerClosedError(f"ledger {self.id} is closed")
        if self._error is not None:
            raise self._error
        if len(self._pending) >= self._pending_max:
            raise TooManyRequestsError(
                f"ledger {self.id}: {len(self._pending)} appends in flight (pending_adds_max); "
                "await earlier appends or wait_for_capacity()")

    def _enqueue(self, entry_id: int, total_length: int, body: bytes) -> asyncio.Future[int]:
        md = self._metadata
        self._next_entry_id = entry_id + 1
        fut: asyncio.Future[int] = self._loop.create_future()
        op = _PendingAdd(entry_id, total_length, body, AckSet(md.write_quorum, md.ack_quorum),
                         fut, self._loop.time())
        self._pending.append(op)
        if len(self._pending) >= self._pending_max:
            self._capacity.clear()
        if self._change_task is None:
            self._send(op, write_set(entry_id, md.ensemble_size, md.write_quorum))
        if self._quorum_timer is None and self._bk.config.add_quorum_timeout_s:
            self._arm_quorum_timer()
        return fut

    async def wait_for_capacity(self) -> None:
        """Wait until ``append`` would not raise TooManyRequestsError."""
        await self._capacity.wait()

    def _send(self, op: _PendingAdd, positions: list[int]) -> None:
        op.sent = True
        md = self._metadata
        ensemble = md.ensembles[-1][1]
        client = self._bk.bookie_client
        timeout_s = self._bk.config.add_timeout_s
        # A recovery does not publish its progress as a LAC: a concurrent recoverer may
        # close the ledger shorter, and readers must never be told of entries past the
        # end that wins (they trust the bookies' LAC while the ledger looks open).
        lac = -1 if self._recovery else self._lac
        self._lac_sent = max(self._lac_sent, lac)
        ledger_id, key, flags, entry_id, body = (md.ledger_id, self._master_key,
                                                 self._add_flags, op.entry_id, op.body)
        for pos in positions:
            if pos in self._degraded:
                continue
            bookie = ensemble[pos]
            client.channel(bookie).send_add(ledger_id, entry_id, key, flags, lac, body,
                                            _AddCallback(self, op, pos, bookie), timeout_s)

    # ------------------------------------------------------------------ responses

    def _on_add_response(self, op: _PendingAdd, position: int, bookie: BookieId,
                         result: Response | BKError) -> None:
        if self._error is not None or self._closing_done():
            return
        if self._metadata.ensembles[-1][1][position] != bookie:
            return  # that position was given to another bookie since: stale answer
        ok = isinstance(result, AddResponse) and result.status == Status.OK
        if op.future.done():
            # The add completed without this bookie; a failure still means the bookie
            # must be replaced, or later entries would run short of replicas.
            if not ok and position not in self._failed_positions:
                self._bookie_failed(position, bookie, op.entry_id, result)
            return
        if ok:
            op.acks.ack(position)
            if self._change_task is None and self._pending and self._pending[0] is op:
                self._complete_head()
            return
        error = (result if isinstance(result, BKError)
                 else status_error(result.status, f"add {self.id}:{op.entry_id} to {bookie}"))
        if isinstance(error, (LedgerFencedError, UnauthorizedAccessError, BadRequestError)):
            self._log.warning("add refused, ledger handle unusable", entry_id=op.entry_id,
                              bookie=bookie, error=str(error))
            self._fail(error)
            return
        self._bookie_failed(position, bookie, op.entry_id, error)

    def _bookie_failed(self, position: int, bookie: BookieId, entry_id: int,
                       result: Response | BKError) -> None:
        """A bookie-level failure: replace the bookie by an ensemble change."""
        error = (result if isinstance(result, BKError)
                 else status_error(result.status, f"add {self.id}:{entry_id} to {bookie}"))
        if isinstance(error, (LedgerFencedError, UnauthorizedAccessError)):
            self._fail(error)
            return
        if position in self._degraded:
            return  # known, and left unreplaced for now
        if position not in self._failed_positions:
            self._log.info("bookie failed an add, changing ensemble", bookie=bookie,
                           entry_id=entry_id, error=str(error))
            self._failed_positions[position] = error
            self._bk.quarantine_bookie(bookie)
        if self._change_task is None:
            self._change_task = self._loop.create_task(self._change_ensemble())

    def _closing_done(self) -> bool:
        return self._closing is not None and self._closing.done()

    def _complete_head(self) -> None:
        pending = self._pending
        released = False
        stats = self._bk.stats
        now = self._loop.time()
        while pending and pending[0].acks.complete:
            op = pending.popleft()
            stats.add_latency.observe(now - op.submitted_s)
            invariant(op.entry_id == self._lac + 1,
                      f"ledger {self.id}: completing entry {op.entry_id} after LAC {self._lac}")
            self._lac = op.entry_id
            self._length = op.total_length
            released = True
            if not op.future.done():
                op.future.set_result(op.entry_id)
        if len(pending) < self._pending_max:
            self._capacity.set()
        if released:
            self._stalled_since_s = None
            self._stalled_bookies.clear()
            self._schedule_explicit_lac()

    def _fail(self, error: BKError) -> None:
        if self._error is None:
            self._error = error
        pending, self._pending = self._pending, collections.deque()
        for op in pending:
            if not op.future.done():
                op.future.set_exception(error)
                # The application may never await a failed append; don't warn about it.
                op.future.exception()
        self._capacity.set()
        self._cancel_timers()

    # ------------------------------------------------------------------ ensemble change

    async def _change_ensemble(self) -> None:
        cfg = self._bk.config
        backoff_s = 0.05
        back: set[BookieId] = set()
        """Failed bookies of the ensemble found healthy again while appends waited:
        each may take its own position back (no spare to be had)."""
        try:
            while self._failed_positions and self._error is None:
                if self.ensemble_changes >= cfg.ensemble_changes_max:
                    raise NotEnoughBookiesError(
                        f"ledger {self.id}: {self.ensemble_changes} ensemble changes already "
                        "(ensemble_changes_max); giving up")
                failed = dict(self._failed_positions)
                md = self._metadata
                ensemble = list(md.ensembles[-1][1])
                writable = await self._bk.bookies.writable(cfg.metadata_timeout_s)
                quarantined = self._bk.quarantine.active()
                keep = [p for p in sorted(failed) if ensemble[p] in back
                        and ensemble[p] in writable and ensemble[p] not in quarantined]
                try:
                    replacements = self._bk.placement.new_ensemble(
                        len(failed) - len(keep), writable, exclude=set(ensemble) | quarantined)
                except NotEnoughBookiesError:
                    if not await self._no_replacement(failed, ensemble, writable, quarantined,
                                                      back):
                        break  # writing on without them (degraded)
                    await self._bk.bookies.wait_for_change(backoff_s)
                    backoff_s = min(cfg.ensemble_change_backoff_s_max, backoff_s * 2)
                    continue
                for pos, bookie in zip([p for p in sorted(failed) if p not in keep],
                                       replacements, strict=True):
                    ensemble[pos] = bookie
                old = md.ensembles[-1][1]
                if tuple(ensemble) != old:
                    first = self._lac + 1
                    self._metadata = await self._commit_ensemble(first, tuple(ensemble))
                    self.ensemble_changes += 1
                    self._bk.stats.ensemble_changes += 1
                    self._log.info("ensemble changed", first_entry_id=first, old=list(old),
                                   new=list(ensemble), replaced=[old[p] for p in sorted(failed)
                                                                 if p not in keep])
                if keep:
                    self._log.info("failed bookies healthy again, writing to them",
                                   bookies=[old[p] for p in keep])
                for pos in failed:
                    self._failed_positions.pop(pos, None)
                    self._degraded.discard(pos)
                back.clear()
                self._resend_after_change(set(failed))
        except BKError as exc:
            self._log.warning("ensemble change failed", error=str(exc))
            self._fail(exc)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self._fail(BookieUnavailableError(f"ensemble change failed: {exc!r}"))
            raise
        finally:
            self._change_task = None
        if self._error is None:
            self._complete_head()

    async def _no_replacement(self, failed: dict[int, BKError], ensemble: list[BookieId],
                              writable: list[BookieId], quarantined: set[BookieId],
                              back: set[BookieId]) -> bool:
        """No spare for the failed positions.  Returns False to write on without them
        (every write set keeps an ack quorum: degraded mode), True to try again (a
        quarantined bookie answered as healthy, or appends wait for one), and raises
        NotEnoughBookiesError once no append has completed for
        ``ensemble_change_timeout_s``."""
        cfg = self._bk.config
        spares = set(writable) - set(ensemble)
        # Bookies that failed recently may be healthy again (a pause that ended, a
        # network blip): ask them before doing without them.
        if await self._bk.release_healthy(spares & quarantined):
            return True
        if self._ack_quorum_survives(set(failed)):
            if set(failed) != self._degraded:
                self._log.warning("no spare bookie: writing on without the failed ones",
                                  failed=[ensemble[p] for p in sorted(failed)])
            self._degraded = set(failed)
            self._schedule_degraded_retry()
            return False
        # Too few healthy bookies for an ack quorum: appends wait (they cannot
        # complete).  With no spare at all, a failed bookie of the ensemble that is
        # healthy again (restarted, resumed) may take its own position back.
        own = {ensemble[p] for p in failed} & set(writable)
        healthy = await self._bk.release_healthy(own)
        if healthy:
            back.update(healthy)
            return True
        now_s = self._loop.time()
        self._stalled_bookies.update(ensemble[p] for p in failed)
        if self._stalled_since_s is None:
            self._stalled_since_s = now_s
            self._log.warning("no bookie can replace the failed ones yet; appends wait",
                              failed=[ensemble[p] for p in sorted(failed)],
                              quarantined=sorted(quarantined),
                              timeout_s=cfg.ensemble_change_timeout_s)
        elif now_s - self._stalled_since_s >= cfg.ensemble_change_timeout_s:
            raise NotEnoughBookiesError(
                f"ledger {self.id}: no append completed for {cfg.ensemble_change_timeout_s}s "
                f"(ensemble_change_timeout_s) for want of bookies; failed: "
                f"{', '.join(sorted(self._stalled_bookies))}; other writable bookies: "
                f"{', '.join(sorted(spares)) or 'none'}"
                + (f" (failed recently: {', '.join(sorted(quarantined & spares))})"
                   if quarantined & spares else "")
                + "; start more bookies or lower the ensemble size")
        return True

    def _ack_quorum_survives(self, failed: set[int]) -> bool:
        """Whether every write set keeps ``Qa`` positions outside ``failed``."""
        md = self._metadata
        spare = md.write_quorum - md.ack_quorum
        return all(sum(p in failed for p in write_set(s, md.ensemble_size, md.write_quorum))
                   <= spare for s in range(md.ensemble_size))

    def _schedule_degraded_retry(self) -> None:
        if self._degraded_retry is None:
            self._degraded_retry = self._loop.call_later(DEGRADED_RETRY_S, self._retry_degraded)

    def _retry_degraded(self) -> None:
        """Try again to replace the bookies left out (a spare may have appeared)."""
        self._degraded_retry = None
        if self._degraded and self._error is None and not self._closing_done() \
                and self._change_task is None:
            self._change_task = self._loop.create_task(self._change_ensemble())

    def _resend_after_change(self, replaced: set[int]) -> None:
        md = self._metadata
        for op in list(self._pending):
            positions = write_set(op.entry_id, md.ensemble_size, md.write_quorum)
            if not op.sent:
                self._send(op, positions)
                continue
            again = [p for p in positions if p in replaced]
            for p in again:
                op.acks.unack(p)
            if again:
                self._send(op, again)

    async def _commit_ensemble(self, first: int, ensemble: Ensemble) -> LedgerMetadata:
        md = self._metadata
        if self._recovery:
            # A recovery keeps its fragments to itself until the close commits them
            # with the CLOSED state in one CAS.  Persisting one now would let a later
            # recovery attempt (after this one fails) read entries past our progress
            # from a replacement that never got them, and take its "no such entry"
            # for evidence that an acknowledged entry does not exist.
            return md.replace(ensembles=_with_fragment(md.ensembles, first, ensemble, self.id))
        while True:
            if md.state is not self._writable_state:
                if md.state is LedgerState.CLOSED:
                    raise LedgerClosedError(f"ledger {self.id} was closed by someone else")
                raise LedgerFencedError(
                    f"ledger {self.id} is {md.state.value}: another client is recovering it")
            if md.ensembles[-1][1] == ensemble:
                return md  # our own earlier write landed
            fragments = _with_fragment(md.ensembles, first, ensemble, self.id)
            try:
                return await self._bk.meta.update_ledger(md.replace(ensembles=fragments))
            except MetadataVersionError:
                md = await self._bk.meta.read_ledger(self.id)

    # ------------------------------------------------------------------ timers

    def _arm_quorum_timer(self) -> None:
        self._quorum_timer = self._loop.call_later(
            max(0.05, self._bk.config.add_quorum_timeout_s / 4), self._check_quorum_timeout)

    def _check_quorum_timeout(self) -> None:
        self._quorum_timer = None
        if not self._pending or self._error is not None:
            return
        head = self._pending[0]
        limit_s = self._bk.config.add_quorum_timeout_s
        if self._loop.time() - head.submitted_s >= limit_s:
            self._log.warning("add not acknowledged by an ack quorum in time",
                              entry_id=head.entry_id, limit_s=limit_s)
            self._fail(TimeoutError(
                f"ledger {self.id}: entry {head.entry_id} not acknowledged by "
                f"{self._metadata.ack_quorum} bookies within {limit_s}s"))
            return
        self._arm_quorum_timer()

    def _schedule_explicit_lac(self) -> None:
        interval_s = self._bk.config.explicit_lac_interval_s
        if interval_s and self._explicit_lac_handle is None and self._closing is None \
                and not self._recovery:  # (see _send: a recovery publishes no LAC)
            self._explicit_lac_handle = self._loop.call_later(interval_s, self._send_explicit_lac)

    def _send_explicit_lac(self) -> None:
        """Idle writer: tell the bookies the LAC that no later add has piggybacked."""
        self._explicit_lac_handle = None
        if self._error is not None or self._lac <= self._lac_sent:
            return
        lac = self._lac
        self._lac_sent = lac
        md = self._metadata
        try:
            for bookie in md.ensembles[-1][1]:
                ch = self._bk.bookie_client.channel(bookie)
                ch.send(WriteLacRequest(ch.next_request_id(), md.ledger_id, self._master_key,
                                        lac), _ignore, self._bk.config.add_timeout_s)
        except BKError:
            pass  # the client was closed under an idle handle: nothing to tell anyone

    def _cancel_timers(self) -> None:
        for handle in (self._explicit_lac_handle, self._quorum_timer, self._degraded_retry):
            if handle is not None:
                handle.cancel()
        self._explicit_lac_handle = None
        self._quorum_timer = None
        self._degraded_retry = None

    # ------------------------------------------------------------------ close

    async def close(self) -> None:
        """Wait for appends in flight, then seal the ledger in metadata (CLOSED, last entry
        id, length).  Idempotent."""
        if self._closing is None:
            self._closing = self._loop.create_task(self._close())
            # If every caller awaiting it is cancelled, its error is still consumed.
            self._closing.add_done_callback(_consume_error)
        await asyncio.shield(self._closing)

    async def close_quietly(self) -> None:
        """Abandon the handle without touching metadata: pending appends fail, timers
        and any ensemble change in progress stop."""
        if self._error is None:
            self._fail(LedgerClosedError(f"ledger {self.id}: handle abandoned"))
        if self._closing is None:  # refuse appends; a later close() returns at once
            self._closing = self._loop.create_future()
            self._closing.set_result(None)
        task = self._change_task
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        self._cancel_timers()

    async def _close(self) -> None:
        try:
            if self._pending:
                await asyncio.wait([op.future for op in list(self._pending)])
            if self._change_task is not None:
                await asyncio.wait([self._change_task])
            if isinstance(self._error, (LedgerFencedError, LedgerClosedError)) or (
                    self._recovery and self._error is not None):
                raise self._error
            md = self._metadata
            while True:
                if md.state is LedgerState.CLOSED:
                    if self._recovery:
                        break  # another recoverer finished first: take its result
                    if md.last_entry_id != self._lac:
                        raise LedgerFencedError(
                            f"ledger {self.id} was closed by someone else at entry "
                            f"{md.last_entry_id}, this writer had {self._lac}")
                    break
                if md.state is not self._writable_state:
                    raise LedgerFencedError(
                        f"ledger {self.id} is being recovered by another client")
                try:
                    md = await self._bk.meta.update_ledger(md.replace(
                        state=LedgerState.CLOSED, last_entry_id=self._lac, length=self._length))
                except MetadataVersionError:
                    fresh = await self._bk.meta.read_ledger(self.id)
                    if self._recovery and not fresh.is_closed:
                        if fresh.ensembles != self._persisted_ensembles:
                            raise  # someone else changed the fragments: start over
                        fresh = fresh.replace(ensembles=self._metadata.ensembles)
                    md = fresh
                    continue
                break
            self._metadata = md
            self._log.info("ledger closed", last_entry_id=md.last_entry_id, length=md.length,
                           recovery=self._recovery)
        finally:
            self._cancel_timers()


def _fragment_index(md: LedgerMetadata, entry_id: int) -> int:
    index = 0
    for i, (first, _) in enumerate(md.ensembles):
        if first <= entry_id:
            index = i
        else:
            break
    return index


def _with_fragment(fragments: tuple[Any, ...], first: int, ensemble: Ensemble,
                   ledger_id: int) -> tuple[Any, ...]:
    """``fragments`` with a new last fragment at ``first`` (replacing the last one if it
    starts there too: several changes before any entry completes)."""
    out = list(fragments)
    last_first = out[-1][0]
    invariant(last_first <= first,
              f"ledger {ledger_id}: new fragment at {first} before the last at {last_first}")
    if last_first == first:
        out[-1] = (first, ensemble)
    else:
        out.append((first, ensemble))
    return tuple(out)


class _AddCallback:
    __slots__ = ("bookie", "handle", "op", "position")

    def __init__(self, handle: LedgerHandle, op: _PendingAdd, position: int,
                 bookie: BookieId) -> None:
        self.handle = handle
        self.op = op
        self.position = position
        self.bookie = bookie

    def __call__(self, result: Any) -> None:
        self.handle._on_add_response(self.op, self.position, self.bookie, result)


def _consume_error(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


def _ignore(result: Any) -> None:
    """Explicit LAC writes are best effort: the next one, or the next add, carries it."""
