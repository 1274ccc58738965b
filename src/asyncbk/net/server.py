"""Server side of the bookie protocol: a listener and one protocol object per
connection.

Each connection decodes frames as they arrive and hands every request to a
:class:`RequestHandler` (the bookie's processor), which answers through
:meth:`ServerConnection.respond`, now or later, in any order.  Responses are
coalesced into one ``transport.write`` per loop turn.

A malformed or oversized frame closes that one connection (the reason is
logged with the peer); other connections are untouched.  Flow control: when
the socket's write buffer passes its high-water mark, or the handler asks for
backpressure, the connection stops reading until it drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any, Protocol, cast

from ..errors import ProtocolError
from ..log import get_logger
from ..proto import FrameDecoder, Request, Response, decode_request, encode_response


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

    # ---- called by the handler

    def respond(self, response: Response) -> None:
        self.respond_frame(encode_response(response))

    def respond_frame(self, frame: bytes) -> None:
        """``respond`` with an already encoded frame (the add path's fast encoder)."""
        if self._transport is None:
            return
        self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

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

    def data_received(self, data: bytes) -> None:
        try:
            bodies = self._decoder.feed(data)
            handle = self._handler.handle
            for body in bodies:
                handle(decode_request(body), self)
        except ProtocolError as exc:
            self._log.warning("malformed request, closing connection", reason=str(exc))
            self._server.protocol_errors += 1
            if self._transport is not None:
                self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
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
    ) -> None:
        self.handler = handler
        self.frame_bytes_max = frame_bytes_max
        self.write_buffer_bytes_high = write_buffer_bytes_high
        self.connections_max = connections_max
        self.log = log or get_logger()
        self.connections: set[ServerConnection] = set()
        self.protocol_errors = 0
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ServerConnection(self), host, port, reuse_address=True, backlog=1024
        )
        sockets = self._server.sockets
        return int(sockets[0].getsockname()[1])

    async def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    def close_connections(self) -> None:
        for conn in list(self.connections):
            conn.close()

    async def close(self) -> None:
        await self.stop_accepting()
        self.close_connections()
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._server.wait_closed()
            self._server = None
