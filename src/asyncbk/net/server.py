"""Server side of the bookie protocol: a listener and one protocol object per
connection.

Each connection decodes frames as they arrive and hands every request to a
:class:`RequestHandler` (the bookie's processor), which answers through
:meth:`ServerConnection.respond`, now or later, in any order.  Responses are
coalesced into one ``transport.write`` per loop turn.

A malformed or oversized frame closes that one connection (the reason is
logged with the peer); other connections are untouched.

With ``tokens``, a connection must authenticate first: an AUTH request with one
of the tokens (compared in constant time).  Until then every request is answered
UNAUTHORIZED and nothing reaches the handler; a wrong token, too many refused
requests, or no AUTH within ``auth_timeout_s`` closes the connection.  The tokens
can be replaced while the listener runs (:meth:`BookieListener.set_tokens`): new
AUTH handshakes use the new list at once, and a connection that authenticated with
a token no longer in it is closed (those with a token still in it carry on).  With
``ssl``, connections are TLS (a handshake is bounded by the same timeout).  Flow control: when
the socket's write buffer passes its high-water mark, or the handler asks for
backpressure, the connection stops reading until it drains.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import hmac
import socket
import ssl
from collections.abc import Sequence
from typing import Any, Protocol, cast

from ..errors import ProtocolError
from ..log import get_logger
from ..proto import (
    AuthRequest,
    AuthResponse,
    FrameDecoder,
    Request,
    Response,
    Status,
    decode_request,
    encode_response,
    refusal,
)

AUTH_REFUSALS_MAX = 16
"""Requests refused UNAUTHORIZED on one connection before it is closed."""


def token_matches(given: bytes, tokens: Sequence[bytes]) -> bool:
    """Whether ``given`` is one of ``tokens``: every token compared, in constant time."""
    found = False
    for token in tokens:
        found |= hmac.compare_digest(given, token)
    return found


def token_digest(token: bytes) -> bytes:
    """What a connection keeps of the token it authenticated with (not the token)."""
    return hashlib.sha256(token).digest()


class RequestHandler(Protocol):
    def handle(self, request: Request, conn: ServerConnection) -> None:
        """Process ``request``; must eventually call ``conn.respond`` exactly once
        (unless the connection closed meanwhile).  Must not raise for bad input."""
        ...


class ServerConnection(asyncio.Protocol):
    def __init__(self, server: BookieListener) -> None:
        self._server = server
        self._handler = server.handler
        self._decoder = FrameDecoder(server.frame_bytes_max)
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()
        self._reading_paused_by: set[str] = set()
        self.peer = "?"
        self._log: Any = server.log
        self.closed = False
        self.authenticated = server.tokens is None
        self.token_digest: bytes | None = None
        """The SHA-256 of the token this connection authenticated with (None: none)."""
        self._refused = 0
        self._auth_timer: asyncio.TimerHandle | None = None
        self.inflight = 0
        """Requests handed to the handler and not answered yet (at most ``requests_max``)."""
        self._backlog: collections.deque[bytes] = collections.deque()
        self._draining = False
        self.last_request_s = self._loop.time()

    # ---- called by the handler

    def respond(self, response: Response) -> None:
        self.respond_frame(encode_response(response))

    def respond_frame(self, frame: bytes) -> None:
        """``respond`` with an already encoded frame (the add path's fast encoder)."""
        self.inflight -= 1
        if self._reading_paused_by and self.inflight <= self._server.requests_resume_at \
                and "requests" in self._reading_paused_by and not self._draining:
            self.resume_reading("requests")
            self._drain()
        if self._transport is None:
            return
        self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._server.answer_later(self)

    def pause_reading(self, reason: str) -> None:
        if not self._reading_paused_by and self._transport is not None:
            self._transport.pause_reading()
        self._reading_paused_by.add(reason)

    def resume_reading(self, reason: str) -> None:
        self._reading_paused_by.discard(reason)
        if not self._reading_paused_by and self._transport is not None:
            self._transport.resume_reading()

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()

    def revoke(self) -> None:
        """Its token was revoked: nothing more reaches the handler; close."""
        self.authenticated = False
        self.token_digest = None
        self._backlog.clear()
        self.close()

    # ---- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._log = self._server.log.bind(peer=self.peer)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=self._server.write_buffer_bytes_high)
        if len(self._server.connections) >= self._server.connections_max:
            self._log.warning("too many connections, refusing", limit=self._server.connections_max)
            transport.abort()
            return
        self._server.connections.add(self)
        if not self.authenticated:
            self._auth_timer = self._loop.call_later(self._server.auth_timeout_s,
                                                     self._auth_timed_out)

    def data_received(self, data: bytes) -> None:
        try:
            bodies = self._decoder.feed(data)
        except ProtocolError as exc:
            self._protocol_error(exc)
            return
        if bodies:
            self.last_request_s = self._loop.time()
            self._backlog.extend(bodies)
            self._drain()

    def _drain(self) -> None:
        """Hand the requests read so far to the handler, as long as fewer than
        ``requests_max`` are in flight; past that, stop reading the socket (what was
        read already waits here: at most one read's worth)."""
        if self._draining:
            return
        self._draining = True
        backlog = self._backlog
        limit = self._server.requests_max
        handle = self._handler.handle
        try:
            while backlog:
                if self.inflight >= limit:
                    self.pause_reading("requests")  # backpressure: answer some first
                    return
                request = decode_request(backlog.popleft())
                self.inflight += 1
                if self.authenticated and type(request) is not AuthRequest:
                    handle(request, self)
                elif not self._gate(request):
                    backlog.clear()
                    return
        except ProtocolError as exc:
            self._protocol_error(exc)
        finally:
            self._draining = False

    def _protocol_error(self, exc: ProtocolError) -> None:
        self._backlog.clear()
        self._log.warning("malformed request, closing connection", reason=str(exc))
        self._server.protocol_errors += 1
        if self._transport is not None:
            self._transport.abort()

    def _gate(self, request: Request) -> bool:
        """AUTH, or a request before it; False once the connection is being closed."""
        server = self._server
        if isinstance(request, AuthRequest):
            ok = server.tokens is None or token_matches(request.token, server.tokens)
            self.respond(AuthResponse(request.request_id, Status.OK if ok
                                      else Status.UNAUTHORIZED))
            if ok:
                self.authenticated = True
                if server.tokens is not None:
                    self.token_digest = token_digest(request.token)
                if self._auth_timer is not None:
                    self._auth_timer.cancel()
                    self._auth_timer = None
                return True
            server.auth_failures += 1
            self._log.warning("authentication failed (wrong token), closing connection")
            self.close()
            return False
        self.respond(refusal(request, Status.UNAUTHORIZED))
        self._refused += 1
        if self._refused >= AUTH_REFUSALS_MAX:
            server.auth_failures += 1
            self._log.warning("requests without authentication, closing connection",
                              refused=self._refused)
            self.close()
            return False
        return True

    def _auth_timed_out(self) -> None:
        self._auth_timer = None
        if not self.authenticated and self._transport is not None:
            self._server.auth_failures += 1
            self._log.warning("no authentication in time, closing connection",
                              timeout_s=self._server.auth_timeout_s)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        self.closed = True
        self._transport = None
        self._out.clear()
        self._server.connections.discard(self)

    def pause_writing(self) -> None:
        self.pause_reading("write-buffer")

    def resume_writing(self) -> None:
        self.resume_reading("write-buffer")

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._transport is None or not self._out:
            return
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out.clear()
        self._transport.write(data)


class BookieListener:
    """Accepts connections and owns them until ``close``."""

    def __init__(
        self,
        handler: RequestHandler,
        *,
        frame_bytes_max: int,
        write_buffer_bytes_high: int,
        connections_max: int,
        log: Any = None,
        ssl_context: ssl.SSLContext | None = None,
        tokens: Sequence[bytes] | None = None,
        auth_timeout_s: float = 10.0,
        requests_max: int = 10_000,
        idle_timeout_s: float = 0.0,
    ) -> None:
        self.handler = handler
        self.requests_max = requests_max
        """Requests in flight on one connection before it is no longer read from."""
        self.requests_resume_at = requests_max * 3 // 4
        self.idle_timeout_s = idle_timeout_s
        """A connection with nothing in flight and no request for this long is closed
        (0: never)."""
        self._idle_task: asyncio.Task[None] | None = None
        self.idle_closed = 0
        self.ssl_context = ssl_context
        self.tokens = list(tokens) if tokens is not None else None
        self.auth_timeout_s = auth_timeout_s
        self.auth_failures = 0
        """Connections closed for a wrong token, no token in time, or too many refusals."""
        self.frame_bytes_max = frame_bytes_max
        self.write_buffer_bytes_high = write_buffer_bytes_high
        self.connections_max = connections_max
        self.log = log or get_logger()
        self.connections: set[ServerConnection] = set()
        self.protocol_errors = 0
        self._server: asyncio.Server | None = None
        self._answering: list[ServerConnection] = []  # connections with answers to write
        self._answer_handle: asyncio.Handle | None = None

    def answer_later(self, conn: ServerConnection) -> None:
        """``conn`` has answers queued: write them at the end of this loop turn (one
        write per connection for all the answers the turn made), or sooner, when the
        bookie calls :meth:`write_answers` (after a group commit's answers)."""
        self._answering.append(conn)
        if self._answer_handle is None:
            self._answer_handle = conn._loop.call_soon(self._answer_soon)

    def _answer_soon(self) -> None:
        self._answer_handle = None
        self.write_answers()

    def write_answers(self) -> None:
        """Write every queued answer now, one write per connection."""
        conns = self._answering
        if conns:
            self._answering = []
            for conn in conns:
                conn._flush()

    def set_tokens(self, tokens: Sequence[bytes]) -> int:
        """Use ``tokens`` from now on (a listener made without tokens stays without).
        New AUTH handshakes check the new list; connections that authenticated with a
        token no longer in it are closed (their clients, reconnecting, are refused).
        Returns how many were closed."""
        if self.tokens is None:
            return 0
        self.tokens = list(tokens)  # a new list: a handshake never sees half of one
        kept = {token_digest(t) for t in self.tokens}
        revoked = [c for c in self.connections
                   if c.token_digest is not None and c.token_digest not in kept]
        for conn in revoked:
            conn.revoke()
        if revoked:
            self.log.warning("token revoked, closing its connections",
                             connections=len(revoked))
        return len(revoked)

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if self.ssl_context is not None:
            tls = {"ssl": self.ssl_context, "ssl_handshake_timeout": self.auth_timeout_s}
        self._server = await loop.create_server(
            lambda: ServerConnection(self), host, port, reuse_address=True, backlog=1024, **tls
        )
        sockets = self._server.sockets
        if self.idle_timeout_s > 0:
            self._idle_task = loop.create_task(self._close_idle())
        return int(sockets[0].getsockname()[1])

    async def _close_idle(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.idle_timeout_s / 4)
            horizon = loop.time() - self.idle_timeout_s
            for conn in list(self.connections):
                if conn.inflight <= 0 and conn.last_request_s < horizon:
                    self.idle_closed += 1
                    conn.close()

    async def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    def close_connections(self) -> None:
        for conn in list(self.connections):
            conn.close()

    async def close(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
            await asyncio.wait([self._idle_task])
            self._idle_task = None
        await self.stop_accepting()
        self.close_connections()
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._server.wait_closed()
            self._server = None
