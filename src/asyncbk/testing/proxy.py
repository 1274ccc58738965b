"""A fault-injecting TCP proxy for tests: sits between clients and one server.

Modes, switchable at any time:

* ``pass``      forward both ways;
* ``delay``     forward after ``delay_s`` (each chunk, both directions);
* ``blackhole`` accept and read, but forward nothing (the peer sees a hung server);
* ``reset``     abort every open connection now, and every new one at once;
* ``http503``   (for HTTP servers: the object store) abort every open connection now,
  and answer every request of a new one ``503 Service Unavailable``.

Point a client at it with ``ClientConfig.bookie_addresses``
(``{bookie_id: proxy.address}``).
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

MODES = ("pass", "delay", "blackhole", "reset", "http503")
_HTTP_503 = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
             b"Content-Length: 0\r\nConnection: close\r\n\r\n")
_CHUNK_BYTES = 64 * 1024


class FaultProxy:
    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self.mode = "pass"
        self.delay_s = 0.0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    def set_mode(self, mode: str, delay_s: float = 0.0) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode = mode
        self.delay_s = delay_s
        if mode in ("reset", "http503"):
            for w in list(self._writers):
                transport = w.transport
                transport.abort()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._server.wait_closed()

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.mode == "reset":
            writer.transport.abort()
            return
        if self.mode == "http503":
            await self._refuse_http(reader, writer)
            return
        try:
            async with asyncio.timeout(5):
                up_reader, up_writer = await asyncio.open_connection(*self.target)
        except (OSError, TimeoutError):
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        pumps = [asyncio.create_task(self._pump(reader, up_writer)),
                 asyncio.create_task(self._pump(up_reader, writer))]
        for p in pumps:
            self._tasks.add(p)
            p.add_done_callback(self._tasks.discard)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for p in pumps:
            p.cancel()
        await asyncio.wait(pumps)
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.transport.abort()

    async def _refuse_http(self, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
        """Read one request (its head and body) and answer 503, then close."""
        with contextlib.suppress(ConnectionError, OSError, TimeoutError,
                                 asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length" and value.strip().isdigit():
                        await reader.readexactly(int(value.strip()))
                writer.write(_HTTP_503)
                await writer.drain()
        writer.transport.abort()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                data = await src.read(_CHUNK_BYTES)
                if not data:
                    return
                if self.mode == "blackhole":
                    continue
                if self.mode == "delay" and self.delay_s:
                    await asyncio.sleep(self.delay_s)
                dst.write(data)
                await dst.drain()
