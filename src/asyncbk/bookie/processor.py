"""The bookie's request processor: the rules of each operation.

* ADD: refused with READ_ONLY on a read-only bookie, NOT_READY while the bookie
  is not registered (lease lost, starting, draining), UNAUTHORIZED when the
  master key differs from the ledger's, FENCED on a fenced ledger unless it is a
  recovery add.  Otherwise the entry goes to the journal and the OK response
  is sent only once the journal fsync covering it has completed.
* READ with the FENCE flag fences the ledger durably first (creating the
  ledger with the given master key if this bookie never saw it, so a late add
  from the old writer is refused), then reads.  Entry id -1 reads the last
  entry.  The response carries the LAC this bookie knows.
* READ_BATCH returns the run of stored entries from ``first_entry_id`` (at
  most ``count_max`` <= 1024, cut once ``bytes_max`` is passed).
* READ_LAC, WRITE_LAC (explicit LAC, journaled), LONG_POLL_LAC (held until the
  LAC passes ``previous_lac`` or the timeout expires), BOOKIE_INFO.

Bad values in a well-formed request get BAD_REQUEST; nothing raises out of
``handle``.  When the journal queue is nearly full, the connection that is
adding stops being read until there is room again (backpressure), and at the
hard bound adds get TOO_MANY_REQUESTS.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Coroutine, Sequence
from typing import Any

from .._version import __version__
from ..errors import BookieIOError, NoSuchEntryError, NoSuchLedgerError, TooManyRequestsError
from ..log import get_logger
from ..net.server import ServerConnection
from ..proto import (
    AddBatchRequest,
    AddFlag,
    AddRequest,
    AddResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    LongPollLacRequest,
    LongPollLacResponse,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadFlag,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    Status,
    WriteLacRequest,
    WriteLacResponse,
    encode_add_batch_response,
    encode_add_response,
)
from ..stats import LatencyHistogram
from ..tracing import Span, Tracing
from .journal_sync import JournalSync
from .state import BookieState, StateMachine
from .storage import RequestStorage

_RECOVERY_ADD = int(AddFlag.RECOVERY_ADD)

LONG_POLL_WAITERS_MAX = 10_000
LONG_POLL_TIMEOUT_MS_MAX = 60_000
MASTER_KEY_BYTES_MAX = 64
READ_BATCH_COUNT_MAX = 1024
ADD_BATCH_ENTRIES_MAX = 4096
"""Entries one ADD_BATCH may carry (clients send at most 512)."""


ID_MAX = 2**63 - 1
"""The largest ledger id, entry id or LAC a bookie stores (journal records are signed
64-bit); the wire carries up to 2**64 - 1, and more is refused with BAD_REQUEST."""


class _LacWaiter:
    __slots__ = ("conn", "handle", "request")

    def __init__(self, request: LongPollLacRequest, conn: ServerConnection) -> None:
        self.request = request
        self.conn = conn
        self.handle: asyncio.TimerHandle | None = None


class RequestProcessor:
    """Answers the requests of every connection.  Whether adds are admitted comes from
    ``state_machine`` (the bookie's :class:`~.state.StateMachine`, shared with the
    server; a new one, ``starting``, when none is given)."""

    def __init__(self, storage: RequestStorage, bookie_id: str, log: Any = None, *,
                 state_machine: StateMachine | None = None,
                 tracing: Tracing | None = None) -> None:
        self.storage = storage
        self.tracing = tracing
        """Spans of the requests that carry a client's trace context (None: no spans;
        the contexts are then ignored)."""
        self.bookie_id = bookie_id
        self.state_machine = state_machine if state_machine is not None else StateMachine()
        self.log = log or get_logger(bookie_id=bookie_id)
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._inflight_adds = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._lac_waiters: dict[int, list[_LacWaiter]] = {}
        self._lac_waiter_count = 0
        # insertion-ordered (not a set): resume order must not depend on addresses
        self._paused: dict[ServerConnection, None] = {}
        self._space_task: asyncio.Task[None] | None = None
        self._queue_high = max(1, storage_queue_bound(storage) * 3 // 4)
        self.counters: dict[str, int] = {"adds": 0, "reads": 0, "fences": 0, "rejected": 0,
                                         "add_bytes": 0, "read_entries": 0, "read_bytes": 0,
                                         "add_errors": 0, "read_errors": 0}
        self.add_latency = LatencyHistogram()
        """From an add's arrival to its answer (journal fsync included)."""
        self.read_latency = LatencyHistogram()
        """From a read's (or batch read's) arrival to its answer."""

    @property
    def state(self) -> BookieState:
        """The bookie's state (its state machine's)."""
        return self.state_machine.state

    # ------------------------------------------------------------------ dispatch

    def handle(self, request: Request, conn: ServerConnection) -> None:
        if isinstance(request, AddRequest):
            self._add(request, conn)
        elif isinstance(request, AddBatchRequest):
            self._add_batch(request, conn)
        elif isinstance(request, ReadRequest):
            self._read(request, conn)
        elif isinstance(request, ReadBatchRequest):
            self._read_batch(request, conn)
        elif isinstance(request, ReadLacRequest):
            self._read_lac(request, conn)
        elif isinstance(request, LongPollLacRequest):
            self._long_poll_lac(request, conn)
        elif isinstance(request, WriteLacRequest):
            self._write_lac(request, conn)
        elif isinstance(request, BookieInfoRequest):
            self._info(request, conn)

    # ------------------------------------------------------------------ add

    def _add(self, req: AddRequest, conn: ServerConnection) -> None:
        span = None
        if req.trace and self.tracing is not None:
            span = self._add_span(req.trace, req.ledger_id, req.entry_id)
        status = self._check_add(req)
        if status is not Status.OK:
            self.counters["rejected"] += 1
            conn.respond(AddResponse(req.request_id, status, req.ledger_id, req.entry_id))
            if span is not None:
                self._end_add_spans([(span, status)])
            return
        counters = self.counters
        loop = self._loop
        started = loop.time()

        def done(synced: JournalSync | BaseException) -> None:
            # called by the journal in the loop turn its group commit completed
            self._add_answered()
            ok = not isinstance(synced, BaseException)
            if not ok:
                counters["add_errors"] += 1
            conn.respond_frame(encode_add_response(req.request_id, Status.OK if ok
                                                   else Status.IO_ERROR, req.ledger_id,
                                                   req.entry_id))
            self.add_latency.observe(loop.time() - started)
            if span is not None:
                self._end_add_spans([(span, Status.OK if ok else Status.IO_ERROR)],
                                    synced if isinstance(synced, JournalSync) else None)

        try:
            self.storage.add_entries_then(req.ledger_id, [req.entry_id], req.master_key,
                                          [req.body], done)
        except (TooManyRequestsError, BookieIOError) as exc:
            status = Status.TOO_MANY_REQUESTS if isinstance(exc, TooManyRequestsError) \
                else Status.IO_ERROR
            conn.respond(AddResponse(req.request_id, status, req.ledger_id, req.entry_id))
            if span is not None:
                self._end_add_spans([(span, status)])
            return
        counters["adds"] += 1
        counters["add_bytes"] += len(req.body)
        self._inflight_adds += 1
        self._drained.clear()
        if req.lac >= 0 and self.storage.update_lac(req.ledger_id, req.lac):
            self._notify_lac(req.ledger_id)
        if self.storage.journal_queue_entries >= self._queue_high:
            self._apply_backpressure(conn)

    def _add_batch(self, req: AddBatchRequest, conn: ServerConnection) -> None:
        """The entries as ADDs, queued to the journal together with one future; one
        answer once all are journaled (or refused: a full queue or a failed journal
        refuses them all)."""
        n = len(req.entry_ids)
        ledger_id = req.ledger_id
        spans = None  # (index in the batch, span) of each traced entry
        if req.traces and self.tracing is not None:
            spans = [(i, self._add_span(trace, ledger_id, entry_id)) for i, (entry_id, trace)
                     in enumerate(zip(req.entry_ids, req.traces, strict=True)) if trace]
        status = self._check_add_fields(ledger_id, req.master_key, req.flags, req.lac)
        if n != len(req.bodies) or n > ADD_BATCH_ENTRIES_MAX:
            status = Status.BAD_REQUEST
        if status is not Status.OK or n == 0:
            self.counters["rejected"] += n
            conn.respond_frame(encode_add_batch_response(req.request_id, status, ledger_id,
                                                         req.entry_ids, [int(status)] * n))
            if spans:
                self._end_add_spans([(span, status) for _, span in spans])
            return
        statuses = [0] * n
        entry_ids = req.entry_ids
        bodies = req.bodies
        if min(entry_ids) < 0 or max(entry_ids) > ID_MAX:  # (rare: keep the good ones)
            good = [i for i, e in enumerate(entry_ids) if 0 <= e <= ID_MAX]
            for i in set(range(n)) - set(good):
                statuses[i] = Status.BAD_REQUEST
            self.counters["rejected"] += n - len(good)
            entry_ids = [entry_ids[i] for i in good]
            bodies = [bodies[i] for i in good]
        else:
            good = None
        loop = self._loop
        storage = self.storage
        accepted = len(entry_ids)
        counters = self.counters
        started = loop.time()

        def done(synced: JournalSync | BaseException) -> None:
            # called by the journal in the loop turn its group commit completed
            self._add_answered(accepted)
            ok = not isinstance(synced, BaseException)
            if not ok:
                for i in (range(n) if good is None else good):
                    statuses[i] = Status.IO_ERROR
                counters["add_errors"] += accepted
            conn.respond_frame(encode_add_batch_response(req.request_id, Status.OK, ledger_id,
                                                         req.entry_ids, statuses))
            self.add_latency.observe(loop.time() - started, accepted)
            if spans:
                self._end_add_spans([(span, Status(statuses[i])) for i, span in spans],
                                    synced if isinstance(synced, JournalSync) else None)

        queued = False
        if accepted:
            refused = Status.OK
            try:
                storage.add_entries_then(ledger_id, entry_ids, req.master_key, bodies, done)
                queued = True
            except TooManyRequestsError:
                refused = Status.TOO_MANY_REQUESTS
            except BookieIOError:
                refused = Status.IO_ERROR
            if not queued:
                for i in (range(n) if good is None else good):
                    statuses[i] = refused
                accepted = 0
        if req.lac >= 0 and (queued or storage.ledger(ledger_id) is not None) \
                and storage.update_lac(ledger_id, req.lac):
            self._notify_lac(ledger_id)
        if not queued:  # nothing was accepted: answer now
            conn.respond_frame(encode_add_batch_response(req.request_id, Status.OK, ledger_id,
                                                         req.entry_ids, statuses))
            if spans:
                self._end_add_spans([(span, Status(statuses[i])) for i, span in spans])
            return
        counters["adds"] += accepted
        counters["add_bytes"] += sum(map(len, bodies))
        self._inflight_adds += accepted
        self._drained.clear()
        if storage.journal_queue_entries >= self._queue_high:
            self._apply_backpressure(conn)

    def _add_span(self, trace: bytes, ledger_id: int, entry_id: int) -> Span:
        assert self.tracing is not None
        return self.tracing.start("asyncbk.bookie.add", {
            "asyncbk.bookie": self.bookie_id, "asyncbk.ledger_id": ledger_id,
            "asyncbk.entry_id": entry_id}, parent=trace)

    def _end_add_spans(self, spans: Sequence[tuple[Span, Status]],
                       synced: JournalSync | None = None) -> None:
        """End the spans of traced adds, each with its entry's answer; ``synced``: the
        group commit that made them durable, a child span of each that it covered."""
        tracing = self.tracing
        assert tracing is not None
        for span, status in spans:
            span.set_attribute("asyncbk.status", status.name)
            if synced is not None and status is Status.OK:
                tracing.child(span, "asyncbk.journal.fsync", synced.start_ns, synced.end_ns,
                              {"asyncbk.journal.records": synced.records,
                               "asyncbk.journal.bytes": synced.nbytes})
            span.end()

    def _add_answered(self, count: int = 1) -> None:
        """Accepted adds were journaled (or failed): ``drain`` may be waiting for zero."""
        self._inflight_adds -= count
        if self._inflight_adds == 0:
            self._drained.set()

    def _check_add(self, req: AddRequest) -> Status:
        if not 0 <= req.entry_id <= ID_MAX:
            return Status.BAD_REQUEST
        return self._check_add_fields(req.ledger_id, req.master_key, req.flags, req.lac)

    def _check_add_fields(self, ledger_id: int, master_key: bytes, flags: int,
                          lac: int) -> Status:
        if not 0 <= ledger_id <= ID_MAX or not -1 <= lac <= ID_MAX:
            return Status.BAD_REQUEST
        if not master_key or len(master_key) > MASTER_KEY_BYTES_MAX:
            return Status.BAD_REQUEST
        recovery = flags & _RECOVERY_ADD  # a plain int test: this runs for every add
        machine = self.state_machine
        admitted = machine.recovery_add_status if recovery else machine.add_status
        if admitted is not Status.OK:
            return admitted
        storage = self.storage
        info = storage.ledger(ledger_id)
        if info is not None:
            if not hmac.compare_digest(info.master_key, master_key):
                return Status.UNAUTHORIZED
            if info.fenced and not recovery:
                return Status.FENCED
        elif not recovery and storage.is_deleted(ledger_id):
            return Status.FENCED  # deleted here: a zombie writer must not re-create it
        if not recovery and storage.is_full(ledger_id):
            return Status.READ_ONLY  # its ledger directory's disk is full
        return Status.OK

    def _apply_backpressure(self, conn: ServerConnection) -> None:
        conn.pause_reading("journal")
        self._paused[conn] = None
        if self._space_task is None:
            self._space_task = self._loop.create_task(self._resume_when_space())

    async def _resume_when_space(self) -> None:
        try:
            await self.storage.wait_for_queue_space()
        finally:
            self._space_task = None
            paused, self._paused = self._paused, {}
            for conn in paused:
                conn.resume_reading("journal")

    # ------------------------------------------------------------------ read

    def _read(self, req: ReadRequest, conn: ServerConnection) -> None:
        if not 0 <= req.ledger_id <= ID_MAX or not -1 <= req.entry_id <= ID_MAX:
            conn.respond(ReadResponse(req.request_id, Status.BAD_REQUEST, req.ledger_id,
                                      req.entry_id, b"", -1))
            return
        self.counters["reads"] += 1
        span = self._read_span(req.trace, req.ledger_id, req.entry_id, 1) if req.trace \
            and self.tracing is not None else None
        self._spawn(self._read_async(req, conn, span))

    async def _read_async(self, req: ReadRequest, conn: ServerConnection,
                          span: Span = None) -> None:
        ledger_id, entry_id = req.ledger_id, req.entry_id
        started = self._loop.time()

        def reply(status: Status, body: bytes = b"", eid: int = entry_id) -> None:
            info = self.storage.ledger(ledger_id)
            conn.respond(ReadResponse(req.request_id, status, ledger_id, eid, body,
                                      info.lac if info is not None else -1))
            self._count_read(started, status, 1 if status == Status.OK else 0, len(body),
                             span)

        if req.flags & ReadFlag.FENCE:
            if not req.master_key or len(req.master_key) > MASTER_KEY_BYTES_MAX:
                reply(Status.BAD_REQUEST)
                return
            info = self.storage.ledger(ledger_id)
            if info is not None and not hmac.compare_digest(info.master_key, req.master_key):
                reply(Status.UNAUTHORIZED)
                return
            self.counters["fences"] += 1
            try:
                await self.storage.fence(ledger_id, req.master_key)
            except TooManyRequestsError:
                reply(Status.TOO_MANY_REQUESTS)
                return
            except BookieIOError:
                reply(Status.IO_ERROR)
                return
            self.log.info("ledger fenced", ledger_id=ledger_id, request_id=req.request_id,
                          peer=conn.peer)
        try:
            info = self.storage.ledger(ledger_id)
            if info is None:
                raise NoSuchLedgerError(str(ledger_id))
            if entry_id == -1 and info.last_entry_id < 0:
                raise NoSuchEntryError(f"ledger {ledger_id} has no entries here")
            real_id = info.last_entry_id if entry_id == -1 else entry_id
            body = await self.storage.read_entry(ledger_id, real_id)
        except NoSuchLedgerError:
            reply(Status.NO_LEDGER)
        except NoSuchEntryError:
            reply(Status.NO_ENTRY)
        except (BookieIOError, OSError) as exc:
            self.log.error("read failed", ledger_id=ledger_id, entry_id=entry_id,
                           error=str(exc))
            reply(Status.IO_ERROR)
        else:
            reply(Status.OK, body, real_id)

    def _read_batch(self, req: ReadBatchRequest, conn: ServerConnection) -> None:
        if (req.ledger_id < 0 or req.first_entry_id < 0
                or not 1 <= req.count_max <= READ_BATCH_COUNT_MAX or req.bytes_max < 1):
            conn.respond(ReadBatchResponse(req.request_id, Status.BAD_REQUEST, req.ledger_id,
                                           req.first_entry_id, -1, []))
            return
        self.counters["reads"] += 1
        span = self._read_span(req.trace, req.ledger_id, req.first_entry_id, req.count_max) \
            if req.trace and self.tracing is not None else None
        self._spawn(self._read_batch_async(req, conn, span))

    async def _read_batch_async(self, req: ReadBatchRequest, conn: ServerConnection,
                                span: Span = None) -> None:
        started = self._loop.time()
        bodies: list[bytes] = []
        try:
            bodies = await self.storage.read_entries(req.ledger_id, req.first_entry_id,
                                                     req.count_max, req.bytes_max)
            status = Status.OK
        except NoSuchLedgerError:
            status = Status.NO_LEDGER
        except NoSuchEntryError:
            status = Status.NO_ENTRY
        except (BookieIOError, OSError) as exc:
            self.log.error("batch read failed", ledger_id=req.ledger_id,
                           entry_id=req.first_entry_id, error=str(exc))
            status = Status.IO_ERROR
        info = self.storage.ledger(req.ledger_id)
        conn.respond(ReadBatchResponse(req.request_id, status, req.ledger_id, req.first_entry_id,
                                       info.lac if info is not None else -1, bodies))
        self._count_read(started, status, len(bodies), sum(map(len, bodies)), span)

    def _read_span(self, trace: bytes, ledger_id: int, entry_id: int, count_max: int) -> Span:
        assert self.tracing is not None
        return self.tracing.start("asyncbk.bookie.read", {
            "asyncbk.bookie": self.bookie_id, "asyncbk.ledger_id": ledger_id,
            "asyncbk.entry_id": entry_id, "asyncbk.count_max": count_max}, parent=trace)

    def _count_read(self, started: float, status: Status, entries: int, nbytes: int,
                    span: Span = None) -> None:
        self.read_latency.observe(self._loop.time() - started)
        counters = self.counters
        counters["read_entries"] += entries
        counters["read_bytes"] += nbytes
        if status not in (Status.OK, Status.NO_ENTRY, Status.NO_LEDGER):
            counters["read_errors"] += 1
        if span is not None:
            span.set_attributes({"asyncbk.status": status.name, "asyncbk.entries": entries,
                                 "asyncbk.bytes": nbytes})
            span.end()

    # ------------------------------------------------------------------ LAC

    def _read_lac(self, req: ReadLacRequest, conn: ServerConnection) -> None:
        if req.ledger_id < 0:
            conn.respond(ReadLacResponse(req.request_id, Status.BAD_REQUEST, req.ledger_id, -1, -1))
            return
        info = self.storage.ledger(req.ledger_id)
        if info is None:
            conn.respond(ReadLacResponse(req.request_id, Status.NO_LEDGER, req.ledger_id, -1, -1))
        else:
            conn.respond(ReadLacResponse(req.request_id, Status.OK, req.ledger_id, info.lac,
                                         info.last_entry_id))

    def _write_lac(self, req: WriteLacRequest, conn: ServerConnection) -> None:
        info = self.storage.ledger(req.ledger_id) if req.ledger_id >= 0 else None
        if (not 0 <= req.ledger_id <= ID_MAX or not -1 <= req.lac <= ID_MAX or not req.master_key
                or len(req.master_key) > MASTER_KEY_BYTES_MAX):
            status = Status.BAD_REQUEST
        elif info is None:
            status = Status.NO_LEDGER
        elif not hmac.compare_digest(info.master_key, req.master_key):
            status = Status.UNAUTHORIZED
        else:
            status = Status.OK
        if status is not Status.OK:
            conn.respond(WriteLacResponse(req.request_id, status, req.ledger_id))
            return
        if self.storage.update_lac(req.ledger_id, req.lac):
            self._notify_lac(req.ledger_id)
        try:
            fut = self.storage.write_explicit_lac(req.ledger_id, req.lac)
        except (TooManyRequestsError, BookieIOError):
            conn.respond(WriteLacResponse(req.request_id, Status.IO_ERROR, req.ledger_id))
            return

        def done(f: asyncio.Future[JournalSync]) -> None:
            ok = not f.cancelled() and f.exception() is None
            conn.respond(WriteLacResponse(req.request_id, Status.OK if ok else Status.IO_ERROR,
                                          req.ledger_id))

        fut.add_done_callback(done)

    def _long_poll_lac(self, req: LongPollLacRequest, conn: ServerConnection) -> None:
        if req.ledger_id < 0 or not 0 <= req.timeout_ms <= LONG_POLL_TIMEOUT_MS_MAX:
            conn.respond(LongPollLacResponse(req.request_id, Status.BAD_REQUEST, req.ledger_id, -1))
            return
        info = self.storage.ledger(req.ledger_id)
        if info is not None and info.lac > req.previous_lac:
            conn.respond(LongPollLacResponse(req.request_id, Status.OK, req.ledger_id, info.lac))
            return
        if self._lac_waiter_count >= LONG_POLL_WAITERS_MAX:
            conn.respond(LongPollLacResponse(req.request_id, Status.TOO_MANY_REQUESTS,
                                             req.ledger_id, -1))
            return
        waiter = _LacWaiter(req, conn)
        self._lac_waiters.setdefault(req.ledger_id, []).append(waiter)
        self._lac_waiter_count += 1
        waiter.handle = self._loop.call_later(req.timeout_ms / 1000, self._lac_timeout, waiter)

    def _lac_timeout(self, waiter: _LacWaiter) -> None:
        waiters = self._lac_waiters.get(waiter.request.ledger_id)
        if waiters is None or waiter not in waiters:
            return
        waiters.remove(waiter)
        if not waiters:
            del self._lac_waiters[waiter.request.ledger_id]
        self._lac_waiter_count -= 1
        self._answer_lac_waiter(waiter)

    def _answer_lac_waiter(self, waiter: _LacWaiter) -> None:
        req = waiter.request
        info = self.storage.ledger(req.ledger_id)
        if info is None:
            waiter.conn.respond(LongPollLacResponse(req.request_id, Status.NO_LEDGER,
                                                    req.ledger_id, -1))
        else:
            waiter.conn.respond(LongPollLacResponse(req.request_id, Status.OK, req.ledger_id,
                                                    info.lac))

    def _notify_lac(self, ledger_id: int) -> None:
        waiters = self._lac_waiters.pop(ledger_id, None)
        if not waiters:
            return
        info = self.storage.ledger(ledger_id)
        lac = info.lac if info is not None else -1
        keep: list[_LacWaiter] = []
        for w in waiters:
            if lac > w.request.previous_lac:
                if w.handle is not None:
                    w.handle.cancel()
                self._lac_waiter_count -= 1
                self._answer_lac_waiter(w)
            else:
                keep.append(w)
        if keep:
            self._lac_waiters[ledger_id] = keep

    # ------------------------------------------------------------------ info

    def _info(self, req: BookieInfoRequest, conn: ServerConnection) -> None:
        free, total = self.storage.disk_usage()
        conn.respond(BookieInfoResponse(req.request_id, Status.OK, self.bookie_id,
                                        self.state.value, free, total, __version__))

    # ------------------------------------------------------------------ lifecycle

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.log.error("request task failed", error=repr(task.exception()))

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every accepted add has been answered; False on timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._drained.wait()
                while self._tasks:
                    await asyncio.wait(set(self._tasks))
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        for waiters in self._lac_waiters.values():
            for w in waiters:
                if w.handle is not None:
                    w.handle.cancel()
        self._lac_waiters.clear()
        self._lac_waiter_count = 0
        tasks = list(self._tasks)
        if self._space_task is not None:
            tasks.append(self._space_task)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def statistics(self) -> dict[str, Any]:
        return {**self.counters, "state": self.state.value,
                "inflight_adds": self._inflight_adds, "lac_waiters": self._lac_waiter_count}


def storage_queue_bound(storage: RequestStorage) -> int:
    cfg = getattr(storage, "config", None)
    return int(getattr(cfg, "journal_queue_entries_max", 20_000))


__all__ = ["BookieState", "RequestProcessor", "Response"]
