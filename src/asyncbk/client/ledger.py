"""Ledger handles: reading (:class:`ReadHandle`) and writing (:class:`LedgerHandle`).

Write path (``LedgerHandle.append``): the call assigns the next entry id,
seals the payload in its digest envelope (with the current LAC piggybacked),
sends it to the ``Qw`` bookies of its write set and returns a future, all
without suspending.  Each bookie's acknowledgement is recorded in the add's
:class:`~asyncbk.client.quorum.AckSet`; adds complete strictly in entry-id
order from the head of the pending queue, each advancing the LAC, so futures
resolve in id order.  If an add can no longer reach its ack quorum, the
handle fails: every pending add fails with the cause and later appends raise
it (ensemble change on bookie failure arrives with recovery).

Read path: each entry is asked of the first bookie of its write set; on an
error, a timeout or a digest mismatch the next replica is tried.
"""

from __future__ import annotations

import asyncio
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
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadBeyondLastAddConfirmedError,
    TooManyRequestsError,
    UnauthorizedAccessError,
    invariant,
)
from ..log import get_logger
from ..meta.model import LedgerMetadata, LedgerState
from ..proto import (
    AddRequest,
    AddResponse,
    LongPollLacRequest,
    LongPollLacResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Response,
    Status,
)
from ..types import LedgerEntry
from .digest import DigestManager, master_key
from .quorum import AckSet, write_set

if TYPE_CHECKING:
    from .client import BookKeeper

READ_WINDOW_ENTRIES_MAX = 1024
"""Entry reads in flight for one ``read`` call."""


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
        out: list[LedgerEntry] = []
        for lo in range(first, last + 1, READ_WINDOW_ENTRIES_MAX):
            hi = min(last, lo + READ_WINDOW_ENTRIES_MAX - 1)
            out.extend(await asyncio.gather(*(self._read_entry(e) for e in range(lo, hi + 1))))
        return out

    async def _read_entry(self, entry_id: int) -> LedgerEntry:
        md = self._metadata
        ensemble = md.ensemble_at(entry_id)
        positions = write_set(entry_id, md.ensemble_size, md.write_quorum)
        errors: list[BKError] = []
        timeout_s = self._bk.config.read_timeout_s
        for pos in positions:
            bookie = ensemble[pos]
            ch = self._bk.bookie_client.channel(bookie)
            req = ReadRequest(ch.next_request_id(), md.ledger_id, entry_id, 0, b"")
            try:
                resp = await ch.request(req, timeout_s)
            except BKError as exc:
                errors.append(exc)
                continue
            assert isinstance(resp, ReadResponse)
            if resp.status != Status.OK:
                errors.append(status_error(resp.status, f"read {md.ledger_id}:{entry_id} from {bookie}"))
                continue
            try:
                lac, _, payload = self._digest.unseal(entry_id, resp.body)
            except DigestMismatchError as exc:
                self._log.warning("digest mismatch, trying another replica", bookie=bookie,
                                  entry_id=entry_id, error=str(exc))
                errors.append(exc)
                continue
            self._advance_lac(max(lac, resp.lac))
            return LedgerEntry(md.ledger_id, entry_id, payload)
        if errors and all(isinstance(e, DigestMismatchError) for e in errors):
            raise DigestMismatchError(
                f"ledger {md.ledger_id} entry {entry_id}: no replica has a good copy")
        if errors and all(isinstance(e, (NoSuchEntryError, NoSuchLedgerError)) for e in errors):
            raise NoSuchEntryError(f"ledger {md.ledger_id} entry {entry_id} is on no bookie")
        raise BookieUnavailableError(
            f"ledger {md.ledger_id} entry {entry_id}: no replica could be read "
            f"({'; '.join(str(e) for e in errors)})")

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

    async def wait_for_lac(self, after: int, timeout: float) -> int:  # noqa: ASYNC109 (API.md)
        """Long-poll the bookies until the LAC passes ``after`` or ``timeout`` seconds pass."""
        if self._lac > after:
            return self._lac
        md = self._metadata
        if md.is_closed:
            return self._lac
        ensemble = md.ensembles[-1][1]
        timeout_ms = max(0, int(timeout * 1000))
        grace_s = self._bk.config.read_timeout_s
        futs: list[asyncio.Future[Response]] = []
        for bookie in ensemble:
            ch = self._bk.bookie_client.channel(bookie)
            futs.append(ch.request(
                LongPollLacRequest(ch.next_request_id(), md.ledger_id, after, timeout_ms),
                timeout + grace_s))
        pending: set[asyncio.Future[Response]] = set(futs)
        try:
            async with asyncio.timeout(timeout + grace_s):
                while pending and self._lac <= after:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for f in done:
                        if f.exception() is None:
                            r = f.result()
                            if isinstance(r, LongPollLacResponse) and r.status == Status.OK:
                                self._advance_lac(r.lac)
        except TimeoutError:
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
            await self.wait_for_lac(self._lac, poll_s)
            if self._lac == before:
                await self._refresh_metadata()

    async def _refresh_metadata(self) -> None:
        md = await self._bk.meta.read_ledger(self.id)
        self._metadata = md
        if md.is_closed:
            self._advance_lac(md.last_entry_id)

    async def close(self) -> None:
        """A read handle holds no resources; provided for symmetry."""


class _PendingAdd:
    __slots__ = ("acks", "entry_id", "future", "payload_bytes")

    def __init__(self, entry_id: int, payload_bytes: int, acks: AckSet,
                 future: asyncio.Future[int]) -> None:
        self.entry_id = entry_id
        self.payload_bytes = payload_bytes
        self.acks = acks
        self.future = future


class LedgerHandle(ReadHandle):
    """The single writer's handle of an open ledger (it can read too)."""

    def __init__(self, bk: BookKeeper, metadata: LedgerMetadata, password: bytes) -> None:
        super().__init__(bk, metadata, password)
        self._loop = asyncio.get_running_loop()
        self._next_entry_id = 0
        self._length = metadata.length
        self._submitted_length = metadata.length
        self._pending: collections.deque[_PendingAdd] = collections.deque()
        self._error: BKError | None = None
        self._closing: asyncio.Task[None] | None = None
        self._capacity = asyncio.Event()
        self._capacity.set()
        self._pending_max = bk.config.pending_adds_max

    @property
    def pending_adds(self) -> int:
        return len(self._pending)

    def append(self, data: bytes) -> asyncio.Future[int]:
        """Submit ``data`` now; the returned future resolves to its entry id once
        ``ack_quorum`` bookies have made it durable."""
        if self._closing is not None:
            raise LedgerClosedError(f"ledger {self.id} is closed")
        if self._error is not None:
            raise self._error
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"append takes bytes, not {type(data).__name__}")
        if len(self._pending) >= self._pending_max:
            raise TooManyRequestsError(
                f"ledger {self.id}: {len(self._pending)} appends in flight (pending_adds_max); "
                "await earlier appends or wait_for_capacity()")
        payload = bytes(data)
        md = self._metadata
        entry_id = self._next_entry_id
        self._next_entry_id += 1
        self._submitted_length += len(payload)
        body = self._digest.seal(entry_id, self._lac, self._submitted_length, payload)
        fut: asyncio.Future[int] = self._loop.create_future()
        op = _PendingAdd(entry_id, len(payload), AckSet(md.write_quorum, md.ack_quorum), fut)
        self._pending.append(op)
        if len(self._pending) >= self._pending_max:
            self._capacity.clear()
        ensemble = md.ensembles[-1][1]
        client = self._bk.bookie_client
        timeout_s = self._bk.config.add_timeout_s
        for pos in write_set(entry_id, md.ensemble_size, md.write_quorum):
            ch = client.channel(ensemble[pos])
            req = AddRequest(ch.next_request_id(), md.ledger_id, entry_id, self._master_key, 0,
                             self._lac, body)
            ch.send(req, _AddCallback(self, op, pos), timeout_s)
        return fut

    async def wait_for_capacity(self) -> None:
        """Wait until ``append`` would not raise TooManyRequestsError."""
        await self._capacity.wait()

    def _on_add_response(self, op: _PendingAdd, position: int, result: Response | BKError) -> None:
        if op.future.done():
            return
        if isinstance(result, AddResponse) and result.status == Status.OK:
            if op.acks.ack(position) and self._pending and self._pending[0] is op:
                self._complete_head()
            return
        bookie = self._metadata.ensembles[-1][1][position]
        error = (result if isinstance(result, BKError)
                 else status_error(result.status, f"add {self.id}:{op.entry_id} to {bookie}"))
        if isinstance(error, (LedgerFencedError, UnauthorizedAccessError)) or op.acks.fail(position):
            self._log.warning("add failed, ledger handle unusable", entry_id=op.entry_id,
                              bookie=bookie, error=str(error))
            self._fail(error)

    def _complete_head(self) -> None:
        pending = self._pending
        while pending and pending[0].acks.complete:
            op = pending.popleft()
            invariant(op.entry_id == self._lac + 1,
                      f"ledger {self.id}: completing entry {op.entry_id} after LAC {self._lac}")
            self._lac = op.entry_id
            self._length += op.payload_bytes
            if not op.future.done():
                op.future.set_result(op.entry_id)
        if len(pending) < self._pending_max:
            self._capacity.set()

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

    async def close(self) -> None:
        """Wait for appends in flight, then seal the ledger in metadata (CLOSED, last entry
        id, length).  Idempotent."""
        if self._closing is None:
            self._closing = self._loop.create_task(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        if self._pending:
            await asyncio.gather(*(op.future for op in list(self._pending)),
                                 return_exceptions=True)
        if isinstance(self._error, LedgerFencedError):
            raise self._error
        md = self._metadata
        while True:
            if md.state is LedgerState.CLOSED:
                if md.last_entry_id != self._lac:
                    raise LedgerFencedError(
                        f"ledger {self.id} was closed by someone else at entry "
                        f"{md.last_entry_id}, this writer had {self._lac}")
                break
            if md.state is LedgerState.IN_RECOVERY:
                raise LedgerFencedError(f"ledger {self.id} is being recovered by another client")
            try:
                md = await self._bk.meta.update_ledger(md.replace(
                    state=LedgerState.CLOSED, last_entry_id=self._lac, length=self._length))
            except MetadataVersionError:
                md = await self._bk.meta.read_ledger(self.id)
                continue
            break
        self._metadata = md
        self._log.info("ledger closed", last_entry_id=self._lac, length=self._length)


class _AddCallback:
    __slots__ = ("handle", "op", "position")

    def __init__(self, handle: LedgerHandle, op: _PendingAdd, position: int) -> None:
        self.handle = handle
        self.op = op
        self.position = position

    def __call__(self, result: Any) -> None:
        self.handle._on_add_response(self.op, self.position, result)
