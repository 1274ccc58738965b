"""The bookie listener's bounds against misbehaving clients, over real loopback sockets
(the request processor replaced by a stub that answers only when told)."""

from __future__ import annotations

import asyncio

import pytest

from asyncbk.net.server import BookieListener, ServerConnection
from asyncbk.proto import (
    AuthRequest,
    BookieInfoRequest,
    FrameDecoder,
    ReadLacRequest,
    ReadLacResponse,
    Request,
    Status,
    decode_response,
    encode_request,
)


class Holder:
    """Keeps every request, answers none until ``answer`` is called."""

    def __init__(self) -> None:
        self.held: list[tuple[Request, ServerConnection]] = []

    def handle(self, request: Request, conn: ServerConnection) -> None:
        self.held.append((request, conn))

    def answer(self, n: int) -> None:
        for request, conn in self.held[:n]:
            conn.respond(ReadLacResponse(request.request_id, Status.OK, 1, -1, -1))
        del self.held[:n]


async def _listener(handler: Holder, **kw: object) -> tuple[BookieListener, int]:
    listener = BookieListener(handler, frame_bytes_max=1 << 20,  # type: ignore[arg-type]
                              write_buffer_bytes_high=1 << 20, connections_max=8, **kw)
    return listener, await listener.start("127.0.0.1", 0)


async def _wait_for(cond: object, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():  # type: ignore[operator]  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_requests_in_flight_are_bounded_per_connection() -> None:
    """A client that pipelines far more requests than the bound gets no more than the
    bound taken in (plus one socket read's worth) until some are answered."""
    holder = Holder()
    listener, port = await _listener(holder, requests_max=200)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        frames = b"".join(encode_request(ReadLacRequest(i, 1)) for i in range(1, 20_001))
        writer.write(frames)  # 20,000 requests, never drained by us
        await _wait_for(lambda: len(holder.held) >= 200)
        await asyncio.sleep(0.3)
        taken = len(holder.held)
        assert taken == 200  # exactly the bound, not the 20,000 sent
        holder.answer(taken)  # answering resumes reading
        await _wait_for(lambda: len(holder.held) >= 200)
        got = 0
        decoder = FrameDecoder(1 << 20)
        async with asyncio.timeout(5):
            while got < taken:
                got += len(decoder.feed(await reader.read(65536)))
        assert got == taken
    finally:
        writer.close()
        await listener.close()


async def test_idle_connections_are_closed_busy_ones_kept() -> None:
    holder = Holder()
    listener, port = await _listener(holder, idle_timeout_s=0.4)
    idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
    busy_r, busy_w = await asyncio.open_connection("127.0.0.1", port)
    try:
        busy_w.write(encode_request(ReadLacRequest(1, 1)))  # held: in flight
        async with asyncio.timeout(5):
            assert await idle_r.read(1) == b""  # closed by the bookie
        assert listener.idle_closed == 1
        holder.answer(1)
        assert decode_response((await busy_r.read(65536))[4:]).status == Status.OK
    finally:
        idle_w.close()
        busy_w.close()
        await listener.close()


async def test_no_auth_in_time_closes_and_nothing_reaches_the_handler() -> None:
    holder = Holder()
    listener, port = await _listener(holder, tokens=[b"t"], auth_timeout_s=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(encode_request(BookieInfoRequest(1)))
        async with asyncio.timeout(5):
            first = await reader.read(65536)
            assert decode_response(first[4:]).status == Status.UNAUTHORIZED
            assert await reader.read(1) == b""  # then closed: no AUTH in time
        assert holder.held == [] and listener.auth_failures == 1
    finally:
        writer.close()
        await listener.close()


@pytest.mark.parametrize("token", [b"", b"x" * 10_000, b"t\x00"])
async def test_odd_tokens_are_refused(token: bytes) -> None:
    holder = Holder()
    listener, port = await _listener(holder, tokens=[b"t"])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(encode_request(AuthRequest(1, token)) + encode_request(ReadLacRequest(2, 1)))
        async with asyncio.timeout(5):
            data = await reader.read(65536)
            assert decode_response(data[4:]).status == Status.UNAUTHORIZED
            assert await reader.read(1) == b""
        assert holder.held == []
    finally:
        writer.close()
        await listener.close()
