"""The bookie's request rules, on real storage with a recording connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from asyncbk.bookie.processor import BookieState, RequestProcessor
from asyncbk.bookie.state import StateMachine
from asyncbk.bookie.storage import LedgerStorage
from asyncbk.config import BookieConfig
from asyncbk.proto import (
    AddBatchRequest,
    AddFlag,
    AddRequest,
    BookieInfoRequest,
    FrameDecoder,
    LongPollLacRequest,
    ReadBatchRequest,
    ReadFlag,
    ReadLacRequest,
    ReadRequest,
    Status,
    WriteLacRequest,
    decode_response,
)

pytestmark = pytest.mark.usefixtures("loop_errors")

KEY = b"k" * 32
OTHER = b"o" * 32


class Conn:
    peer = "test:1"

    def __init__(self) -> None:
        self.responses: list[Any] = []
        self.paused: set[str] = set()
        self.new = asyncio.Event()

    def respond(self, response: Any) -> None:
        self.responses.append(response)
        self.new.set()

    def respond_frame(self, frame: bytes) -> None:
        (body,) = FrameDecoder(1 << 20).feed(frame)
        self.respond(decode_response(body))

    def pause_reading(self, reason: str) -> None:
        self.paused.add(reason)

    def resume_reading(self, reason: str) -> None:
        self.paused.discard(reason)

    async def next(self, timeout_s: float = 5) -> Any:
        async with asyncio.timeout(timeout_s):
            while not self.responses:
                self.new.clear()
                await self.new.wait()
        return self.responses.pop(0)


@pytest_asyncio.fixture
async def proc(tmp_path: Path) -> AsyncIterator[RequestProcessor]:
    cfg = BookieConfig(journal_queue_entries_max=64)
    storage = await LedgerStorage.open(tmp_path / "j", tmp_path / "l", cfg)
    p = RequestProcessor(storage, "127.0.0.1:1")
    p.state_machine.registered(False)
    assert p.state is BookieState.WRITABLE
    yield p
    await p.close()
    await storage.close()


def add(rid: int, entry: int, key: bytes = KEY, flags: int = 0, lac: int = -1,
        ledger: int = 1) -> AddRequest:
    return AddRequest(rid, ledger, entry, key, flags, lac, b"body%d" % entry)


async def test_add_then_read(proc: RequestProcessor) -> None:
    c = Conn()
    proc.handle(add(1, 0), c)
    r = await c.next()
    assert (r.request_id, r.status, r.entry_id) == (1, Status.OK, 0)
    proc.handle(ReadRequest(2, 1, 0, 0, b""), c)
    r = await c.next()
    assert (r.status, r.body) == (Status.OK, b"body0")
    proc.handle(ReadRequest(3, 1, -1, 0, b""), c)  # -1 = last entry
    r = await c.next()
    assert (r.status, r.entry_id) == (Status.OK, 0)


async def test_add_batch(proc: RequestProcessor) -> None:
    c = Conn()
    bodies = [b"b%d" % e for e in range(4)]
    proc.handle(AddBatchRequest(1, 1, KEY, 0, 1, [0, 1, -5, 3], bodies), c)
    r = await c.next()
    assert (r.request_id, r.status, r.ledger_id) == (1, Status.OK, 1)
    assert r.entry_ids == [0, 1, -5, 3]
    assert r.statuses == [Status.OK, Status.OK, Status.BAD_REQUEST, Status.OK]
    assert not c.responses  # one answer for the whole batch
    proc.handle(ReadBatchRequest(2, 1, 0, 10, 1 << 20), c)
    assert (await c.next()).bodies == [b"b0", b"b1"]  # entry 2 was refused
    proc.handle(ReadLacRequest(3, 1), c)
    assert (await c.next()).lac == 1  # the batch's piggybacked LAC
    assert proc.add_latency.count == 3  # one observation per add
    proc.handle(AddBatchRequest(4, 1, OTHER, 0, -1, [5, 6], [b"x", b"y"]), c)
    r = await c.next()
    assert (r.status, r.statuses) == (Status.UNAUTHORIZED, [Status.UNAUTHORIZED] * 2)
    proc.handle(ReadRequest(5, 1, -1, ReadFlag.FENCE, KEY), c)
    await c.next()
    proc.handle(AddBatchRequest(6, 1, KEY, 0, -1, [7], [b"z"]), c)
    assert (await c.next()).statuses == [Status.FENCED]
    proc.handle(AddBatchRequest(7, 1, KEY, AddFlag.RECOVERY_ADD, -1, [2], [b"b2"]), c)
    assert (await c.next()).statuses == [Status.OK]  # recovery adds pass the fence
    proc.state_machine.maintenance(True)
    proc.handle(AddBatchRequest(8, 2, KEY, 0, -1, [0, 1], [b"p", b"q"]), c)
    assert (await c.next()).statuses == [Status.READ_ONLY] * 2
    proc.handle(AddBatchRequest(9, 2, KEY, 0, -1, [], []), c)
    assert (await c.next()).statuses == []


async def test_read_batch(proc: RequestProcessor) -> None:
    c = Conn()
    for e in (0, 1, 2, 3, 5):  # entry 4 missing: the run from 0 stops at 3
        proc.handle(add(e, e, lac=e - 1), c)
        assert (await c.next()).status == Status.OK
    proc.handle(ReadBatchRequest(10, 1, 0, 100, 1 << 20), c)
    r = await c.next()
    assert (r.request_id, r.status, r.first_entry_id, r.lac) == (10, Status.OK, 0, 4)
    assert r.bodies == [b"body0", b"body1", b"body2", b"body3"]
    proc.handle(ReadBatchRequest(11, 1, 1, 2, 1 << 20), c)  # count limit
    assert (await c.next()).bodies == [b"body1", b"body2"]
    proc.handle(ReadBatchRequest(12, 1, 0, 100, 14), c)  # byte limit: 5 + 5 <= 14 < 5 + 5 + 5
    assert (await c.next()).bodies == [b"body0", b"body1"]
    proc.handle(ReadBatchRequest(13, 1, 0, 100, 1), c)  # the first is always returned
    assert (await c.next()).bodies == [b"body0"]
    proc.handle(ReadBatchRequest(14, 1, 4, 100, 1 << 20), c)
    r = await c.next()
    assert (r.status, r.bodies) == (Status.NO_ENTRY, [])
    proc.handle(ReadBatchRequest(15, 99, 0, 100, 1 << 20), c)
    assert (await c.next()).status == Status.NO_LEDGER


async def test_unknown_ledger_and_entry(proc: RequestProcessor) -> None:
    c = Conn()
    proc.handle(ReadRequest(1, 99, 0, 0, b""), c)
    assert (await c.next()).status == Status.NO_LEDGER
    proc.handle(add(2, 0), c)
    await c.next()
    proc.handle(ReadRequest(3, 1, 5, 0, b""), c)
    assert (await c.next()).status == Status.NO_ENTRY
    proc.handle(ReadLacRequest(4, 99), c)
    assert (await c.next()).status == Status.NO_LEDGER


async def test_master_key_mismatch_is_unauthorized(proc: RequestProcessor) -> None:
    c = Conn()
    proc.handle(add(1, 0), c)
    await c.next()
    proc.handle(add(2, 1, key=OTHER), c)
    assert (await c.next()).status == Status.UNAUTHORIZED
    proc.handle(ReadRequest(3, 1, -1, ReadFlag.FENCE, OTHER), c)
    assert (await c.next()).status == Status.UNAUTHORIZED
    proc.handle(WriteLacRequest(4, 1, OTHER, 0), c)
    assert (await c.next()).status == Status.UNAUTHORIZED


async def test_fence_blocks_writer_but_not_recovery_adds(proc: RequestProcessor) -> None:
    c = Conn()
    proc.handle(add(1, 0), c)
    await c.next()
    proc.handle(ReadRequest(2, 1, -1, ReadFlag.FENCE, KEY), c)
    r = await c.next()
    assert (r.status, r.entry_id, r.body) == (Status.OK, 0, b"body0")
    assert proc.storage.ledger(1).fenced  # type: ignore[union-attr]
    proc.handle(add(3, 1), c)
    assert (await c.next()).status == Status.FENCED
    proc.handle(add(4, 1, flags=AddFlag.RECOVERY_ADD), c)
    assert (await c.next()).status == Status.OK


async def test_fence_of_unknown_ledger_creates_it_fenced(proc: RequestProcessor) -> None:
    c = Conn()
    proc.handle(ReadRequest(1, 7, -1, ReadFlag.FENCE, KEY), c)
    assert (await c.next()).status == Status.NO_ENTRY
    proc.handle(add(2, 0, ledger=7), c)  # the old writer's late add
    assert (await c.next()).status == Status.FENCED


async def test_bad_values_are_bad_request(proc: RequestProcessor) -> None:
    c = Conn()
    for req in (add(1, -3), add(2, 0, key=b""), AddRequest(3, -1, 0, KEY, 0, -1, b"x"),
                add(4, 0, lac=-7), ReadRequest(5, 1, -2, 0, b""),
                ReadRequest(6, 1, 0, ReadFlag.FENCE, b""),
                LongPollLacRequest(7, 1, -1, 10**9), ReadBatchRequest(8, 1, -1, 10, 100),
                ReadBatchRequest(9, 1, 0, 0, 100), ReadBatchRequest(10, 1, 0, 1025, 100),
                ReadBatchRequest(11, 1, 0, 10, 0)):
        proc.handle(req, c)
        assert (await c.next()).status == Status.BAD_REQUEST, req


def _into(machine: StateMachine, state: BookieState) -> None:
    """Drive a registered, writable ``machine`` into ``state`` by its own events."""
    if state is BookieState.READ_ONLY:
        machine.disk_full(True)
    elif state is BookieState.UNREGISTERED:
        machine.lease_lost()
    elif state is BookieState.DRAINING:
        machine.drain()
    elif state is BookieState.CLOSED:
        machine.close()
    assert machine.state is state


@pytest.mark.parametrize(("state", "status"), [
    (BookieState.READ_ONLY, Status.READ_ONLY),
    (BookieState.UNREGISTERED, Status.NOT_READY),
    (BookieState.DRAINING, Status.NOT_READY),
    (BookieState.CLOSED, Status.NOT_READY),
])
async def test_adds_refused_unless_writable(proc: RequestProcessor, state: BookieState,
                                            status: Status) -> None:
    c = Conn()
    _into(proc.state_machine, state)
    proc.handle(add(1, 0), c)
    assert (await c.next()).status == status
    proc.handle(ReadLacRequest(2, 1), c)  # reads still answered
    assert (await c.next()).status == Status.NO_LEDGER


async def test_a_starting_bookie_refuses_every_add(tmp_path: Path) -> None:
    """Until its first registration a bookie takes no add, not even a recovery add."""
    storage = await LedgerStorage.open(tmp_path / "j", tmp_path / "l", BookieConfig())
    p = RequestProcessor(storage, "127.0.0.1:1")
    c = Conn()
    try:
        assert p.state is BookieState.STARTING
        for flags in (0, AddFlag.RECOVERY_ADD):
            p.handle(add(1, 0, flags=flags), c)
            assert (await c.next()).status == Status.NOT_READY
        p.state_machine.registered(False)
        p.handle(add(2, 0), c)
        assert (await c.next()).status == Status.OK
    finally:
        await p.close()
        await storage.close()


async def test_read_only_bookie_accepts_recovery_adds(proc: RequestProcessor) -> None:
    c = Conn()
    proc.state_machine.maintenance(True)
    assert proc.state is BookieState.READ_ONLY
    proc.handle(add(1, 0, flags=AddFlag.RECOVERY_ADD), c)
    assert (await c.next()).status == Status.OK


async def test_lac_piggyback_explicit_and_long_poll(proc: RequestProcessor) -> None:
    c = Conn()
    proc.handle(add(1, 0), c)
    await c.next()
    proc.handle(LongPollLacRequest(2, 1, -1, 5000), c)  # waits: LAC is still -1
    await asyncio.sleep(0.05)
    assert not c.responses
    proc.handle(add(3, 1, lac=0), c)  # piggybacks LAC 0: wakes the poll
    got = sorted([await c.next(), await c.next()], key=lambda r: r.request_id)
    assert got[0].status == Status.OK and got[0].lac == 0
    proc.handle(WriteLacRequest(4, 1, KEY, 1), c)
    assert (await c.next()).status == Status.OK
    proc.handle(ReadLacRequest(5, 1), c)
    r = await c.next()
    assert (r.lac, r.last_entry_id) == (1, 1)
    proc.handle(LongPollLacRequest(6, 1, 1, 100), c)  # times out with the same LAC
    r = await c.next()
    assert (r.status, r.lac) == (Status.OK, 1)


async def test_backpressure_pauses_reading(proc: RequestProcessor) -> None:
    c = Conn()
    for i in range(60):  # past 3/4 of journal_queue_entries_max=64
        proc.handle(add(i, i), c)
    assert "journal" in c.paused
    got = [await c.next(timeout_s=10) for _ in range(60)]
    assert all(r.status == Status.OK for r in got)
    assert await proc.drain(10)
    assert not c.paused, "reading resumes once the journal has room"



async def test_bookie_info(proc: RequestProcessor) -> None:
    c = Conn()
    proc.handle(BookieInfoRequest(1), c)
    r = await c.next()
    assert r.status == Status.OK and r.bookie_id == "127.0.0.1:1" and r.state == "writable"
    assert 0 < r.free_bytes <= r.total_bytes


async def test_drain_waits_for_accepted_adds(proc: RequestProcessor) -> None:
    c = Conn()
    for i in range(20):
        proc.handle(add(i, i), c)
    assert await proc.drain(10)
    assert len(c.responses) == 20


async def test_deleted_ledger_refuses_adds_but_not_recovery_adds(tmp_path: Path) -> None:
    for tombstone_s, refused in ((3600.0, True), (0.0, False)):
        root = tmp_path / str(tombstone_s)
        storage = await LedgerStorage.open(root / "j", root / "l",
                                           BookieConfig(gc_tombstone_s=tombstone_s))
        p = RequestProcessor(storage, "127.0.0.1:1")
        p.state_machine.registered(False)
        c = Conn()
        try:
            p.handle(add(1, 0), c)
            assert (await c.next()).status == Status.OK
            await storage.delete_ledger(1)
            if tombstone_s:
                await asyncio.sleep(0.01)  # past the deletion time, within the retention
            p.handle(add(2, 1), c)
            assert (await c.next()).status == (Status.FENCED if refused else Status.OK)
            if refused:
                p.handle(add(3, 1, flags=AddFlag.RECOVERY_ADD), c)  # re-replication
                assert (await c.next()).status == Status.OK
                p.handle(add(4, 2), c)  # re-created: no tombstone any more
                assert (await c.next()).status == Status.OK
        finally:
            await p.close()
            await storage.close()


async def test_tombstones_survive_restarts(tmp_path: Path) -> None:
    async def reopen() -> tuple[LedgerStorage, RequestProcessor]:
        storage = await LedgerStorage.open(tmp_path / "j", tmp_path / "l", BookieConfig())
        p = RequestProcessor(storage, "127.0.0.1:1")
        p.state_machine.registered(False)
        return storage, p

    storage, p = await reopen()
    c = Conn()
    for ledger in (1, 2):
        p.handle(add(ledger, 0, ledger=ledger), c)
        assert (await c.next()).status == Status.OK
    await storage.delete_ledger(1)
    await storage.checkpoint()  # ledger 1's tombstone is in the checkpoint
    await storage.delete_ledger(2)  # ledger 2's only in the journal
    await p.close()
    await storage.abort()
    storage, p = await reopen()
    try:
        for rid, ledger in ((1, 1), (2, 2)):
            p.handle(add(rid, 5, ledger=ledger), c)
            assert (await c.next()).status == Status.FENCED, ledger
    finally:
        await p.close()
        await storage.close()
# --- F5: ids and LACs past int64 (the wire carries uint64) are BAD_REQUEST ------------

BIG = 2**63


@pytest.mark.parametrize("req", [
    AddRequest(1, 1, BIG, KEY, 0, -1, b"x"),
    AddRequest(1, BIG, 0, KEY, 0, -1, b"x"),
    AddRequest(1, 1, 0, KEY, 0, BIG, b"x"),
    AddBatchRequest(1, BIG, KEY, 0, -1, [0], [b"x"]),
    ReadRequest(1, BIG, 0, ReadFlag.FENCE, KEY),
], ids=["add-entry", "add-ledger", "add-lac", "batch-ledger", "fence-ledger"])
async def test_ids_past_int64_are_bad_requests(proc: RequestProcessor, req: Any) -> None:
    conn = Conn()
    proc.handle(req, conn)  # must neither raise nor leave the request unanswered
    assert (await conn.next()).status == Status.BAD_REQUEST
    assert proc.storage.ledger_ids() == []  # no ledger registered without a journal record


async def test_an_explicit_lac_past_int64_is_a_bad_request(proc: RequestProcessor) -> None:
    conn = Conn()
    proc.handle(add(1, 0), conn)
    assert (await conn.next()).status == Status.OK
    proc.handle(WriteLacRequest(2, 1, KEY, BIG), conn)
    assert (await conn.next()).status == Status.BAD_REQUEST


async def test_a_batch_entry_past_int64_is_refused_alone(proc: RequestProcessor) -> None:
    conn = Conn()
    proc.handle(AddBatchRequest(1, 1, KEY, 0, -1, [0, BIG], [b"a", b"b"]), conn)
    assert (await conn.next()).statuses == [Status.OK, Status.BAD_REQUEST]


async def test_a_batch_is_queued_all_or_none(proc: RequestProcessor) -> None:
    """A batch larger than the journal's free room is refused whole (64 records of
    room); the next one that fits is taken whole, and answered once all are durable
    and readable."""
    conn = Conn()
    ids = list(range(65))
    proc.handle(AddBatchRequest(1, 1, KEY, 0, -1, ids, [b"x%d" % e for e in ids]), conn)
    r = await conn.next()
    assert r.statuses == [Status.TOO_MANY_REQUESTS] * 65
    ids = list(range(40))
    proc.handle(AddBatchRequest(2, 1, KEY, 0, -1, ids, [b"y%d" % e for e in ids]), conn)
    assert (await conn.next()).statuses == [Status.OK] * 40
    proc.handle(ReadBatchRequest(3, 1, 0, 100, 1 << 20), conn)
    assert (await conn.next()).bodies == [b"y%d" % e for e in ids]
    assert proc.counters["adds"] == 40


async def test_a_batch_fails_whole_when_the_journal_fails(proc: RequestProcessor) -> None:
    conn = Conn()
    proc.handle(AddBatchRequest(1, 1, KEY, 0, -1, [0, 1], [b"a", b"b"]), conn)
    assert (await conn.next()).statuses == [Status.OK, Status.OK]
    proc.storage._journal.fail(OSError("disk gone"))  # type: ignore[attr-defined]
    proc.handle(AddBatchRequest(2, 1, KEY, 0, -1, [2, 3], [b"c", b"d"]), conn)
    assert (await conn.next()).statuses == [Status.IO_ERROR, Status.IO_ERROR]


async def test_traced_batch_entries_get_spans_with_their_own_answers(tmp_path: Path) -> None:
    """Each traced entry of an ADD_BATCH gets a span under its client's context, with
    that entry's status; the accepted ones a journal.fsync child, the refused none."""
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from asyncbk.tracing import Tracing, encode_context

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    storage = await LedgerStorage.open(tmp_path / "j", tmp_path / "l", BookieConfig())
    p = RequestProcessor(storage, "127.0.0.1:1", tracing=Tracing.from_provider(provider))
    p.state_machine.registered(False)
    try:
        c = Conn()
        traces = [encode_context(7, 100 + i, 1) for i in range(3)] + [b""]
        p.handle(AddBatchRequest(1, 1, KEY, 0, -1, [0, -5, 2, 3],
                                 [b"a", b"b", b"c", b"d"], traces), c)
        r = await c.next()
        assert r.statuses == [Status.OK, Status.BAD_REQUEST, Status.OK, Status.OK]
    finally:
        await p.close()
        await storage.close()
    spans = exporter.get_finished_spans()
    adds = {s.parent.span_id: s for s in spans if s.name == "asyncbk.bookie.add"}  # type: ignore[union-attr]
    assert sorted(adds) == [100, 101, 102]  # the untraced entry has none
    assert all(s.context.trace_id == 7 for s in adds.values())
    assert [adds[i].attributes["asyncbk.status"] for i in (100, 101, 102)] == \
        ["OK", "BAD_REQUEST", "OK"]  # type: ignore[index]
    fsync_parents = {s.parent.span_id for s in spans  # type: ignore[union-attr]
                     if s.name == "asyncbk.journal.fsync"}
    assert fsync_parents == {adds[100].context.span_id, adds[102].context.span_id}
