"""Client side of a bookie connection.

A :class:`BookieChannel` is the client's one pipelined connection to one
bookie.  ``send(request, callback)`` is synchronous and cheap: the request is
encoded into the channel's output buffer and the buffer goes to the socket in
one ``transport.write`` per loop turn, whatever the number of requests.  The
response (or the error that replaced it) is handed to ``callback`` exactly
once.  Many requests are in flight at once, matched to responses by request id.
A ledger handle's adds come as groups, one per ledger and loop turn
(:mod:`asyncbk.net.adds`), framed as ADD_BATCH requests at the flush.

The channel connects lazily on the first send and reconnects on a later send
after a loss (with a capped back-off, :class:`~asyncbk.backoff.Backoff`: while
backing off, sends fail at once with BookieUnavailableError so that quorum logic
learns of the failure quickly).  When the connection dies, every pending request
fails with BookieUnavailableError carrying the cause.  Every request has a
deadline; a sweep fails expired requests with asyncbk's TimeoutError.

A bookie that refuses this client's credentials (its token, its TLS certificate,
or TLS itself: see :mod:`asyncbk.net.connector`) fails every pending request
with UnauthorizedAccessError naming the bookie and the cause, and so does every
send during the back-off that follows: a refusal is not the bookie being
unavailable, and retrying at once cannot help.  A connection the bookie closes
before answering anything is such a refusal only if the connector shows it
(:class:`~asyncbk.net.connector.ExplainsRefusals`); its requests wait for that
verdict (at most ``connect_timeout_s``).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import socket
from collections.abc import Callable
from typing import NamedTuple, cast

from ..backoff import Backoff
from ..errors import (
    BKError,
    BookieIOError,
    BookieUnavailableError,
    ProtocolError,
    TimeoutError,
    TooManyRequestsError,
    UnauthorizedAccessError,
)
from ..log import get_logger
from ..proto import (
    AuthRequest,
    FrameDecoder,
    Op,
    Request,
    Response,
    Status,
    decode_response,
    encode_request,
)
from ..types import BookieId
from .adds import AddGroup, AddSource, GroupCallback, frame_adds
from .connector import (
    Connector,
    ExplainsRefusals,
    credential_refusal,
    may_be_silent_refusal,
    tcp_connector,
)

Callback = Callable[[Response | BKError], None]

_SWEEP_INTERVAL_S = 0.05

RECONNECT_BACKOFF_S_INITIAL = 0.05
"""The first reconnect back-off (doubling up to ``reconnect_backoff_s_max``)."""


class _QueuedGroup(NamedTuple):
    """A group waiting in the channel to be framed."""

    group: AddGroup
    deadline_s: float
    nbytes: int
    """Bytes of its bodies (counted in the channel's unsent bytes)."""


class _Pending:
    __slots__ = ("callback", "deadline_s", "op")

    def __init__(self, callback: Callback, deadline_s: float, op: Op) -> None:
        self.callback = callback
        self.deadline_s = deadline_s
        self.op = op
        """The request's op: an answer of another op is the bookie's error, not ours."""


class BookieChannel(asyncio.Protocol):
    """One pipelined connection to one bookie (see the module docstring)."""

    def __init__(
        self,
        bookie_id: BookieId,
        *,
        frame_bytes_max: int,
        requests_max: int,
        connect_timeout_s: float,
        reconnect_backoff_s_max: float,
        write_buffer_bytes_max: int = 64 * 1024 * 1024,
        connector: Connector | None = None,
        token: bytes | None = None,
    ) -> None:
        self.bookie_id = bookie_id
        self._token = token
        self._write_buffer_bytes_max = write_buffer_bytes_max
        self._connector = connector or tcp_connector()
        self._explainer = self._connector if isinstance(self._connector, ExplainsRefusals) \
            else None
        """Tells a bookie's silent refusal from its absence (None: the connector cannot)."""
        self._frame_bytes_max = frame_bytes_max
        self._requests_max = requests_max
        self._connect_timeout_s = connect_timeout_s
        self._backoff = Backoff(min(RECONNECT_BACKOFF_S_INITIAL, reconnect_backoff_s_max),
                                reconnect_backoff_s_max)
        self._log = get_logger(bookie_id=bookie_id)
        self._loop = asyncio.get_running_loop()
        self._request_ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._unsent: list[bytes] = []
        self._unsent_bytes = 0
        """Bytes in ``_unsent`` and ``_groups`` (bodies), not yet handed to the socket."""
        self._paused = False
        """The transport asked us to stop writing (its buffer is over its high mark)."""
        self._groups: list[_QueuedGroup] = []
        """Groups of adds of this loop turn (:meth:`send_adds`), framed at the flush."""
        self._sources: list[AddSource] = []
        """Senders with adds for this bookie (:meth:`add_source`), asked at the flush."""
        self._flush_scheduled = False
        self._transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder(frame_bytes_max)
        self._connect_task: asyncio.Task[None] | None = None
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._retry_at_s = 0.0
        self._last_error: BaseException | None = None
        """Why the last connection failed or ended; an UnauthorizedAccessError when the
        bookie refused this client (then sends in the back-off fail with it)."""
        self._closed = False
        self._answered = False
        """Whether the bookie sent anything on the current connection."""
        self._unanswered: dict[int, _Pending] = {}
        """Requests of a connection the bookie closed before answering anything, while
        the connector is asked whether that was a refusal (failed with its verdict)."""
        self._verdict: asyncio.Future[UnauthorizedAccessError | None] | None = None
        """Whether the bookie refused this client, for the last connection it closed
        before answering anything (None: no such connection since the last one made)."""

    # ------------------------------------------------------------ public API

    @property
    def connected(self) -> bool:
        return self._transport is not None

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def next_request_id(self) -> int:
        return next(self._request_ids)

    def send(self, request: Request, callback: Callback, timeout_s: float) -> None:
        """Queue ``request``; ``callback`` later gets its response or an error.

        The callback may run synchronously (before ``send`` returns) when the
        request fails at once (channel closed, backing off, too many in flight).
        """
        self.send_frame(request.request_id, request.OP, (encode_request(request),), callback,
                        timeout_s)

    def _admit(self, callback: Callback) -> bool:
        """Whether a request may be queued now; if not, ``callback`` got the reason."""
        refused = self._refusal()
        if refused is not None:
            callback(refused)
            return False
        return True

    def _refusal(self) -> BKError | None:
        """Why a request may not be queued now (None: it may; connects if need be)."""
        if self._closed:
            return BookieUnavailableError(f"connection to bookie {self.bookie_id} is closed")
        if len(self._pending) + len(self._groups) >= self._requests_max:
            return TooManyRequestsError(
                f"{len(self._pending)} requests already in flight to bookie {self.bookie_id}")
        if self._unsent_bytes >= self._write_buffer_bytes_max:
            return TooManyRequestsError(
                f"bookie {self.bookie_id} is not reading its requests: {self._unsent_bytes} "
                f"bytes wait to be sent (write_buffer_bytes_max {self._write_buffer_bytes_max})")
        if self._transport is None and self._connect_task is None:
            now = self._loop.time()
            if now < self._retry_at_s:
                if isinstance(self._last_error, UnauthorizedAccessError):
                    return UnauthorizedAccessError(str(self._last_error))
                return BookieUnavailableError(
                    f"bookie {self.bookie_id} is unreachable ({self._last_error}); "
                    f"retrying in {self._retry_at_s - now:.2f}s")
            self._connect_task = self._loop.create_task(self._connect())
        return None

    def _queued(self) -> None:
        if self._transport is not None and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        self._arm_sweep()

    def _arm_sweep(self) -> None:
        if self._sweep_handle is None and not self._closed:
            self._sweep_handle = self._loop.call_later(_SWEEP_INTERVAL_S, self._sweep)

    def send_frame(self, request_id: int, op: Op, frame: tuple[bytes, ...], callback: Callback,
                   timeout_s: float) -> None:
        """``send`` for a request of ``op`` already encoded as frame pieces."""
        if not self._admit(callback):
            return
        self._pending[request_id] = _Pending(callback, self._loop.time() + timeout_s, op)
        self._unsent.extend(frame)
        self._unsent_bytes += sum(len(piece) for piece in frame)
        self._queued()

    def send_adds(self, group: AddGroup) -> None:
        """Queue ``group`` (adds of one ledger), framed as ADD_BATCH requests at the flush
        (one per ``ADD_BATCH_ENTRIES_MAX`` entries or bytes).  Its target gets the
        answers: ``target.acked(entry_ids)`` for a batch all OK, else
        ``target.answered(entry_id, AddResponse or error)`` for each entry (also for a
        refusal, a timeout or a lost connection, possibly before this returns)."""
        refused = self._refusal()
        if refused is not None:
            GroupCallback(group.target, group.ledger_id, group.entry_ids)(refused)
            return
        nbytes = sum(map(len, group.bodies))
        self._groups.append(_QueuedGroup(group, self._loop.time() + group.timeout_s, nbytes))
        self._unsent_bytes += nbytes
        self._queued()

    def add_source(self, source: AddSource) -> None:
        """``source.take(bookie_id)`` will be called at this loop turn's flush (or at
        the deadline sweep, or a failure, whichever comes first) and returns the groups
        of adds for this bookie, queued then as by :meth:`send_adds`.  A sender that
        queues many entries in a turn registers once and hands them over together."""
        self._sources.append(source)
        if self._transport is None and self._refusal() is not None:
            self._pull_sources()  # refused (closed, backing off): the targets learn it now
            return
        self._queued()

    def _pull_sources(self, frame: bool = False) -> None:
        """Take the registered sources' groups: framed at once with ``frame`` (the flush,
        connected: no queueing), else queued as by :meth:`send_adds`."""
        sources, self._sources = self._sources, []
        for source in sources:
            for group in source.take(self.bookie_id):
                if not frame:
                    self.send_adds(group)
                    continue
                refused = self._refusal()
                if refused is not None:
                    GroupCallback(group.target, group.ledger_id, group.entry_ids)(refused)
                    continue
                nbytes = sum(map(len, group.bodies))
                self._unsent_bytes += nbytes
                self._frame_group(group, self._loop.time() + group.timeout_s, nbytes)

    def request(self, request: Request, timeout_s: float) -> asyncio.Future[Response]:
        """``send`` with a future: resolves to the response or raises the error."""
        fut: asyncio.Future[Response] = self._loop.create_future()

        def done(result: Response | BKError) -> None:
            if fut.done():
                return
            if isinstance(result, BKError):
                fut.set_exception(result)
            else:
                fut.set_result(result)

        self.send(request, done, timeout_s)
        if not fut.done():
            rid = request.request_id
            fut.add_done_callback(lambda f: self.cancel(rid) if f.cancelled() else None)
        return fut

    @property
    def judging(self) -> bool:
        """Whether the bookie closed a connection before answering anything and the
        connector is being asked whether that was a refusal of this client
        (:meth:`verdict`; at most ``connect_timeout_s``)."""
        return self._verdict is not None and not self._verdict.done()

    async def verdict(self) -> UnauthorizedAccessError | None:
        """The error of the bookie's refusal of this client, if it refused it: the
        verdict on the last connection it closed before answering anything (waited
        for while :attr:`judging`), or a refusal whose back-off is under way; None
        when it did not refuse."""
        verdict = self._verdict
        if verdict is not None:
            if not verdict.done():
                await asyncio.shield(verdict)
            if verdict.result() is not None:
                return verdict.result()
        if isinstance(self._last_error, UnauthorizedAccessError) \
                and self._loop.time() < self._retry_at_s:
            return self._last_error
        return None

    def reset_backoff(self) -> None:
        """Forget the reconnect back-off (the bookie is known to be back): the next
        send connects at once."""
        self._backoff.reset()
        self._retry_at_s = 0.0

    @property
    def buffered_bytes(self) -> int:
        """Bytes of requests queued here, not yet handed to the socket."""
        return self._unsent_bytes

    def cancel(self, request_id: int) -> None:
        """Forget a request in flight: its response, if any comes, is dropped."""
        self._pending.pop(request_id, None)

    async def close(self) -> None:
        """Fail everything pending and close the socket."""
        self._closed = True
        task = self._connect_task
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        if self._transport is not None:
            self._transport.close()
        self._fail_all(BookieUnavailableError(f"connection to bookie {self.bookie_id} closed"))
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None

    # ------------------------------------------------------------ connecting

    async def _connect(self) -> None:
        try:
            try:
                async with asyncio.timeout(self._connect_timeout_s):
                    await self._connector(self.bookie_id, lambda: self)
                return
            except (OSError, builtins.TimeoutError) as exc:
                error = exc
            refused = credential_refusal(error)
            if refused is None and may_be_silent_refusal(error):
                refused = await self._explain_silence()
        finally:
            self._connect_task = None
        if refused is not None:
            self._fail_all(self._refused_by_bookie(refused))
            return
        self._last_error = error
        backoff_s = self._backoff.next_s()
        self._retry_at_s = self._loop.time() + backoff_s
        self._log.debug("bookie connect failed", error=str(error), backoff_s=backoff_s)
        self._fail_all(BookieUnavailableError(
            f"cannot connect to bookie {self.bookie_id}: {error or type(error).__name__}"))

    async def _explain_silence(self) -> str | None:
        """Whether the bookie, which ended a connection (or its TLS handshake) before
        answering anything, refused this client's credentials: the connector's
        verdict, None when it has none.  CancelledError propagates."""
        if self._explainer is None:
            return None
        try:
            return await self._explainer.explain_refusal(self.bookie_id,
                                                         self._connect_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a verdict we could not reach: not a refusal
            self._log.warning("could not tell why the bookie closed the connection",
                              error=repr(exc))
            return None

    def _refused_by_bookie(self, reason: str) -> UnauthorizedAccessError:
        """The bookie refused this client's credentials (or this client the bookie's
        certificate), ``reason`` saying how and what to check: the error for every request
        pending now and for sends until the back-off ends (the bookie is not marked
        unavailable; its other clients are not concerned)."""
        error = UnauthorizedAccessError(f"bookie {self.bookie_id}: {reason}")
        self._last_error = error
        backoff_s = self._backoff.next_s()
        self._retry_at_s = self._loop.time() + backoff_s
        self._log.warning("bookie refused this client's credentials", reason=reason,
                          retry_s=round(backoff_s, 3))
        return error

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if self._closed:
            transport.close()
            return
        self._transport = transport
        self._paused = False
        self._verdict = None
        if self._token is None:
            self._backoff.reset()  # (with a token: once the bookie accepts it)
        self._decoder = FrameDecoder(self._frame_bytes_max)
        self._answered = False
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._token is not None:
            # First on the wire: the bookie handles it before anything queued behind it.
            request_id = self.next_request_id()
            self._pending[request_id] = _Pending(self._auth_answered,
                                                 self._loop.time() + self._connect_timeout_s,
                                                 Op.AUTH)
            transport.write(encode_request(AuthRequest(request_id, self._token)))
        if self._unsent or self._groups or self._sources:
            self._flush()

    def _auth_answered(self, result: Response | BKError) -> None:
        if isinstance(result, BKError):
            return  # the connection failed first: its loss says why
        if result.status == Status.OK:
            self._backoff.reset()
            return
        # The bookie closes the connection now, dropping what was sent behind the AUTH.
        error = self._refused_by_bookie(
            "it refused this client's token: check the token the client was given "
            "against the bookie's --auth-tokens-file")
        transport, self._transport = self._transport, None
        self._unsent.clear()
        if transport is not None:
            transport.abort()
        self._fail_all(error)

    def data_received(self, data: bytes) -> None:
        self._answered = True
        try:
            bodies = self._decoder.feed(data)
            pending = self._pending
            for body in bodies:
                response = decode_response(body)
                entry = pending.pop(response.request_id, None)
                if entry is None:
                    continue
                if response.OP is not entry.op:
                    entry.callback(BookieIOError(
                        f"bookie {self.bookie_id} answered a {entry.op.name} request with "
                        f"{response.OP.name}"))
                    continue
                entry.callback(response)
        except ProtocolError as exc:
            self._log.warning("bad frame from bookie, closing connection", reason=str(exc))
            self._last_error = exc
            if self._transport is not None:
                self._transport.abort()

    def pause_writing(self) -> None:
        """The socket's buffer is over its high mark: keep requests here (bounded by
        ``write_buffer_bytes_max``) until ``resume_writing``."""
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._unsent or self._groups or self._sources:
            self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._paused = False
        self._unsent.clear()
        self._unsent_bytes = sum(queued.nbytes for queued in self._groups)
        if not self._closed:
            refused = credential_refusal(exc)
            if refused is not None:
                self._fail_all(self._refused_by_bookie(refused))
                return
            if not self._answered and self._explainer is not None \
                    and self._connect_task is None \
                    and (exc is None or may_be_silent_refusal(exc)):
                self._closed_before_answering(self._lost(exc))
                return
        self._fail_all(self._lost(exc))

    def _closed_before_answering(self, lost: BookieUnavailableError) -> None:
        """A refused TLS handshake looks like this, so the connector is asked
        (:meth:`judging`, :meth:`verdict`).  Adds fail now with ``lost``, as on any lost
        connection: a writer must not go on completing entries without this bookie,
        and it asks the verdict before replacing it.  Other requests wait for the
        verdict; what comes meanwhile queues (and gets the verdict's error)."""
        self._verdict = self._loop.create_future()
        adds = [entry for entry in self._pending.values()
                if isinstance(entry.callback, GroupCallback)]
        self._unanswered = {rid: entry for rid, entry in self._pending.items()
                            if not isinstance(entry.callback, GroupCallback)}
        self._pending = {}
        self._connect_task = self._loop.create_task(self._closed_silently(lost))
        groups, self._groups = self._groups, []
        self._unsent_bytes = 0
        for queued in groups:
            group = queued.group
            GroupCallback(group.target, group.ledger_id, group.entry_ids)(lost)
        if self._sources:
            self._closed_for_sources(lost)
        for entry in adds:
            entry.callback(lost)

    def _lost(self, exc: Exception | None) -> BookieUnavailableError:
        """The error of the requests of a connection that ended (with ``exc``)."""
        reason = exc or self._last_error or (
            "closed by peer" if self._answered else
            "closed by the bookie before any answer (if it serves TLS, connect with ssl=...; "
            "if it requires a token, with token=...)")
        if not self._closed:
            self._log.info("connection to bookie lost", reason=str(reason))
        self._last_error = exc or self._last_error
        return BookieUnavailableError(f"connection to bookie {self.bookie_id} lost: {reason}")

    async def _closed_silently(self, lost: BookieUnavailableError) -> None:
        """The connector's verdict on a connection the bookie closed before answering
        anything: fail what waits with UnauthorizedAccessError if the bookie refused
        this client, else with ``lost``.  (If the channel closes meanwhile,
        :meth:`close` fails them.)"""
        verdict = self._verdict
        refusal: UnauthorizedAccessError | None = None
        try:
            reason = await self._explain_silence()
            if reason is not None:
                refusal = self._refused_by_bookie(reason)
        finally:
            self._connect_task = None
            if verdict is not None and not verdict.done():
                verdict.set_result(refusal)
        self._fail_all(refusal if refusal is not None else lost)

    # ------------------------------------------------------------ internals

    def _frame_adds(self) -> None:
        """Turn the queued groups of adds into frames (in ``_unsent``) and pending
        requests (:meth:`_frame_group`)."""
        queued, self._groups = self._groups, []
        for group, deadline_s, nbytes in queued:
            self._frame_group(group, deadline_s, nbytes)

    def _frame_group(self, group: AddGroup, deadline_s: float, nbytes: int) -> None:
        """``group`` (whose bodies are ``nbytes``, counted in the unsent bytes already) as
        frames in ``_unsent`` (:func:`~.adds.frame_adds`) and pending requests."""
        pending = self._pending
        target, ledger_id = group.target, group.ledger_id
        for rid, op, ids in frame_adds(group, nbytes, self._request_ids,
                                       self._frame_bytes_max, self._unsent):
            pending[rid] = _Pending(GroupCallback(target, ledger_id, ids), deadline_s, op)

    def _flush(self) -> None:
        connected = self._transport is not None
        if self._groups and connected:
            self._frame_adds()
        if self._sources:  # (while _flush_scheduled holds: no second flush)
            self._pull_sources(frame=connected)
        self._flush_scheduled = False
        if self._transport is None or not self._unsent or self._paused:
            return
        unsent = self._unsent
        self._unsent = []
        self._unsent_bytes = 0
        if len(unsent) == 1:
            self._transport.write(unsent[0])
        else:  # (one vectored write: the parts, bodies above all, are not copied first)
            self._transport.writelines(unsent)

    def _fail_all(self, error: BKError) -> None:
        if self._unanswered:
            unanswered, self._unanswered = self._unanswered, {}
            for entry in unanswered.values():
                entry.callback(error)
        if self._sources:
            self._closed_for_sources(error)
        groups, self._groups = self._groups, []
        for queued in groups:
            group = queued.group
            GroupCallback(group.target, group.ledger_id, group.entry_ids)(error)
        self._unsent_bytes = sum(len(piece) for piece in self._unsent)
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        self._unsent.clear()
        self._unsent_bytes = 0
        for entry in pending.values():
            entry.callback(error)
        pending.clear()  # an answer decoded from the same read as the failure finds none

    def _closed_for_sources(self, error: BKError) -> None:
        """Fail what the registered sources hold for this bookie with ``error``."""
        sources, self._sources = self._sources, []
        for source in sources:
            for group in source.take(self.bookie_id):
                GroupCallback(group.target, group.ledger_id, group.entry_ids)(error)

    def _sweep(self) -> None:
        """Fail every request past its deadline, framed or still queued.  Runs while
        anything is queued or in flight: an add queued in the loop turn this runs in
        is framed after it (``_flush``), so an empty ``_pending`` alone does not mean
        there is nothing left to watch."""
        self._sweep_handle = None
        if self._sources:  # what they hold is queued now, with its deadline
            self._pull_sources()
        if not self._pending and not self._groups:
            return
        now = self._loop.time()
        expired = [rid for rid, p in self._pending.items() if p.deadline_s <= now]
        late_groups = [queued for queued in self._groups if queued.deadline_s <= now]
        if late_groups:
            self._groups = [queued for queued in self._groups if queued.deadline_s > now]
            self._unsent_bytes -= sum(queued.nbytes for queued in late_groups)
        self._arm_sweep()  # before the callbacks: one that raises must not stop the watch
        for rid in expired:
            entry = self._pending.pop(rid)
            entry.callback(TimeoutError(f"bookie {self.bookie_id} did not answer in time"))
        unsent = f"not sent: {self._last_error or 'not connected'}"
        for queued in late_groups:
            group = queued.group
            GroupCallback(group.target, group.ledger_id, group.entry_ids)(TimeoutError(
                f"bookie {self.bookie_id} did not answer in time ({unsent})"))
