"""The client's bookie channel (flow control, answers checked against their request)
and the pieces of the writer's fault handling that need no bookie: the quarantine
and the open-time password check."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from asyncbk.client.client import BookKeeper
from asyncbk.client.placement import Quarantine
from asyncbk.clock import ManualClock
from asyncbk.config import ClientConfig
from asyncbk.errors import BookieIOError, TooManyRequestsError, UnauthorizedAccessError
from asyncbk.meta.memory import MemoryMetadataStore
from asyncbk.meta.model import new_metadata
from asyncbk.net.adds import AddGroup
from asyncbk.net.channel import BookieChannel
from asyncbk.proto import (
    AddResponse,
    FrameDecoder,
    ReadRequest,
    ReadResponse,
    Status,
    encode_response,
)


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def connected_channel(**kw: Any) -> tuple[BookieChannel, FakeTransport]:
    transport = FakeTransport()

    async def connector(bookie_id: str, factory: Any) -> Any:
        factory().connection_made(transport)
        return transport, None

    options: dict[str, Any] = dict(frame_bytes_max=1 << 20, requests_max=1000,
                                   connect_timeout_s=1.0, reconnect_backoff_s_max=0.1)
    options.update(kw)
    ch = BookieChannel("b:1", connector=connector, **options)
    # The first send connects; let the connection be made.
    got: list[Any] = []
    ch.send(ReadRequest(ch.next_request_id(), 1, 0, 0, b""), got.append, 5.0)
    for _ in range(3):
        await asyncio.sleep(0)
    assert ch.connected
    return ch, transport


def sent_requests(transport: FakeTransport) -> int:
    decoder = FrameDecoder(1 << 20)
    return sum(len(decoder.feed(chunk)) for chunk in transport.written)


async def test_paused_channel_keeps_requests_and_bounds_its_buffer() -> None:
    ch, transport = await connected_channel(write_buffer_bytes_max=4096)
    assert sent_requests(transport) == 1
    ch.pause_writing()
    answers: list[Any] = []
    refused: list[Any] = []
    for _ in range(200):  # ~40 bytes each: far past 4 KiB
        ch.send(ReadRequest(ch.next_request_id(), 1, 0, 0, b"k" * 8),
                lambda r: (refused if isinstance(r, TooManyRequestsError) else answers).append(r),
                5.0)
    await asyncio.sleep(0)
    assert sent_requests(transport) == 1, "nothing is written while the transport is paused"
    assert refused, "past write_buffer_bytes_max, requests are refused at once"
    assert 4096 <= ch.buffered_bytes < 4096 + 100
    kept = 200 - len(refused)
    ch.resume_writing()
    assert sent_requests(transport) == 1 + kept
    assert ch.buffered_bytes == 0
    assert not answers  # nothing answered: nothing failed
    await ch.close()


async def test_an_answer_of_another_op_fails_the_request_with_a_typed_error() -> None:
    ch, transport = await connected_channel()
    fut = ch.request(ReadRequest(ch.next_request_id(), 7, 3, 0, b""), 5.0)
    rid = ch.next_request_id() - 1
    ch.data_received(encode_response(AddResponse(rid, Status.OK, 7, 3)))
    with pytest.raises(BookieIOError, match="answered a READ request with ADD"):
        await fut
    # The connection stays usable: the right answer to the next request is delivered.
    fut2 = ch.request(ReadRequest(ch.next_request_id(), 7, 4, 0, b""), 5.0)
    rid2 = ch.next_request_id() - 1
    ch.data_received(encode_response(ReadResponse(rid2, Status.OK, 7, 4, b"x", 4)))
    resp = await fut2
    assert isinstance(resp, ReadResponse) and resp.body == b"x"
    assert not transport.closed
    await ch.close()


def test_quarantine_is_bounded_and_ends_at_a_new_registration() -> None:
    clock = ManualClock()
    q = Quarantine(10.0, clock)
    q.add("a:1", session=5)
    q.add("b:1", session=6)
    assert q.active() == {"a:1", "b:1"}
    assert not q.release_if_new_session("a:1", 5), "same registration: still quarantined"
    assert q.release_if_new_session("a:1", 9), "registered anew: released"
    assert q.active() == {"b:1"}
    clock.advance(10.0)
    assert q.active() == set(), "a quarantine ends after its duration"
    off = Quarantine(0.0, clock)
    off.add("a:1")
    assert off.active() == set()


async def test_missing_password_is_not_reported_as_a_wrong_one() -> None:
    store = MemoryMetadataStore()
    bk = BookKeeper(store, ClientConfig())
    try:
        md = await store.create_ledger(new_metadata(
            await store.allocate_ledger_id(), ["b:1"], 1, 1, "xxh3", b"secret", {}, 0))
        with pytest.raises(UnauthorizedAccessError, match="has a password and none was given"):
            await bk.open_ledger(md.ledger_id)
        with pytest.raises(UnauthorizedAccessError, match="wrong password") as info:
            await bk.open_ledger(md.ledger_id, password=b"guess")
        assert "secret" not in str(info.value) and "guess" not in str(info.value)
    finally:
        await bk.close()


class Answers:
    """A target of ``send_adds`` that records each entry's answer."""

    def __init__(self, got: list[Any]) -> None:
        self.got = got

    def acked(self, entry_ids: list[int]) -> None:
        self.got.extend(("ok", e) for e in entry_ids)

    def answered(self, entry_id: int, result: Any) -> None:
        self.got.append(result)


async def test_an_add_queued_as_the_sweep_runs_still_times_out() -> None:
    """The deadline sweep fires in the loop turn in which an add is queued but not yet
    framed (framing runs at the end of the turn): it found no request in flight and
    stopped watching, so that add never timed out and its writer hung (found with a
    rack cut on separate hosts, under load)."""
    ch, _ = await connected_channel()
    first = next(iter(ch._pending))
    ch.cancel(first)  # nothing in flight; the sweep started by that send is still armed
    got: list[Any] = []
    ch.send_adds(AddGroup(1, b"k", 0, -1, [0], [b"body"], Answers(got), 0.1))
    assert ch._sweep_handle is not None
    ch._sweep_handle.cancel()
    ch._sweep()  # the armed sweep fires now, before this turn's flush frames the add
    await asyncio.sleep(0)
    assert len(ch._pending) == 1  # framed and sent
    await asyncio.sleep(0.4)
    assert len(got) == 1 and "did not answer in time" in str(got[0])


async def test_an_add_that_never_leaves_the_queue_times_out() -> None:
    """Adds wait unframed while a connection is being made; past their deadline they
    fail even if the connect is still under way."""
    never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def connector(bookie_id: str, factory: Any) -> Any:
        return await never  # a connect that hangs (its own timeout is longer)

    ch = BookieChannel("b:1", connector=connector, frame_bytes_max=1 << 20, requests_max=10,
                       connect_timeout_s=30.0, reconnect_backoff_s_max=0.1)
    got: list[Any] = []
    ch.send_adds(AddGroup(1, b"k", 0, -1, [0], [b"body"], Answers(got), 0.1))
    await asyncio.sleep(0.4)
    assert len(got) == 1 and "not sent" in str(got[0])
    assert ch.buffered_bytes == 0
    await ch.close()
