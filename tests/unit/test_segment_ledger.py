"""The stream layer's context and the life of a segment ledger
(``asyncbk.stream.context``, ``asyncbk.stream.segment_ledger``,
``asyncbk.stream.retention``), on fake ledgers and the in-memory metadata store:
what a writer counts in its segment, how a segment whose writer is gone is
described from its ledger, what is created with which shape and placement, and
where the context's random generator comes from."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncbk.client.client import PlacementSpec
from asyncbk.clock import ManualClock
from asyncbk.config import ClientConfig
from asyncbk.errors import BKError, CorruptRecordError, NoSuchLedgerError
from asyncbk.meta.memory import MemoryMetadataStore
from asyncbk.stream import codec
from asyncbk.stream.client import BookKeeper
from asyncbk.stream.context import StreamContext, StreamLimits
from asyncbk.stream.meta import COMPLETED, OPEN, Segment, StreamConfig, StreamMetadata
from asyncbk.stream.position import Position
from asyncbk.stream.retention import segments_before
from asyncbk.stream.segment_ledger import (
    SEGMENT_KEY,
    STAGED_BY_KEY,
    STREAM_KEY,
    Tally,
    complete_segment,
    create_segment_ledger,
    create_staged_ledger,
    delete_ledger,
    discard_ledger,
    durable_end,
    fence_ledger,
    recover_segment,
)
from asyncbk.stream.stats import StreamStats
from asyncbk.stream.writer import WriterOptions
from asyncbk.types import LedgerEntry

NOW_S = 1_700_000_000.0

# --------------------------------------------------------------------------- fakes


@dataclass
class FakeMetadata:
    last_entry_id: int = -1
    length: int = 0
    is_closed: bool = False


@dataclass
class FakeLedger:
    """A ledger's entries, and whether it is closed (recovery closes it)."""

    id: int
    entries: list[bytes] = field(default_factory=list)
    lac: int = -1
    closed: bool = False
    close_fails: bool = False
    closed_quietly: bool = False

    @property
    def metadata(self) -> FakeMetadata:
        last = len(self.entries) - 1 if self.closed else -1
        return FakeMetadata(last, sum(len(e) for e in self.entries), self.closed)

    @property
    def last_add_confirmed(self) -> int:
        return self.lac

    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        return [LedgerEntry(self.id, e, self.entries[e]) for e in range(first, last + 1)]

    async def close(self) -> None:
        if self.close_fails:
            raise BKError("close failed")
        self.closed = True

    async def close_quietly(self) -> None:
        self.closed_quietly = True


class FakeLedgers:
    """The ledger operations of the stream layer (``LedgerOps``) over a dict."""

    def __init__(self) -> None:
        self.ledgers: dict[int, FakeLedger] = {}
        self.created: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.opened: list[tuple[int, bool]] = []
        self.delete_fails = False

    def add(self, ledger_id: int, entries: list[bytes], closed: bool = False) -> FakeLedger:
        lh = self.ledgers[ledger_id] = FakeLedger(ledger_id, list(entries), closed=closed)
        return lh

    async def create_ledger(self, *args: Any, **kwargs: Any) -> FakeLedger:
        self.created.append((args, kwargs))
        return self.add(100 + len(self.created), [])

    async def open_ledger(self, ledger_id: int, password: bytes = b"",
                          recovery: bool = True) -> FakeLedger:
        self.opened.append((ledger_id, recovery))
        lh = self.ledgers.get(ledger_id)
        if lh is None:
            raise NoSuchLedgerError(f"no ledger {ledger_id}")
        if recovery:
            lh.closed = True
        return lh

    async def delete_ledger(self, ledger_id: int) -> None:
        if self.delete_fails:
            raise BKError("metadata store unreachable")
        if self.ledgers.pop(ledger_id, None) is None:
            raise NoSuchLedgerError(f"no ledger {ledger_id}")


class Logged:
    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, **bound: Any) -> Logged.Bound:
        return Logged.Bound(self, bound)

    class Bound:
        def __init__(self, sink: Logged, bound: dict[str, Any]) -> None:
            self.sink, self.bound = sink, bound

        def warning(self, event: str, **kw: Any) -> None:
            self.sink.records.append(("warning", event, {**self.bound, **kw}))

        def info(self, event: str, **kw: Any) -> None:
            self.sink.records.append(("info", event, {**self.bound, **kw}))


def context(ledgers: FakeLedgers | None = None, logger: Any = None,
            **defaults: Any) -> StreamContext:
    return StreamContext(
        ledgers=ledgers or FakeLedgers(), md=StreamMetadata(MemoryMetadataStore("/t")),
        namespace="ns", defaults=StreamConfig(**defaults).validate(), stats=StreamStats(),
        limits=StreamLimits.from_frame_bytes_max(ClientConfig().frame_bytes_max),
        rng=random.Random(1), clock=ManualClock(NOW_S), logger=logger or Logged())


def entry(before: int, txids: list[int], flags: int = 0) -> bytes:
    return codec.encode(before, txids, [b"d%d" % t for t in txids], flags=flags)


# --------------------------------------------------------------------------- Tally


@given(st.lists(st.tuples(st.lists(st.integers(0, 50), min_size=1, max_size=5),
                          st.integers(0, 1000)), max_size=30),
       st.integers(0, 30))
def test_tally_counts_what_was_sent_and_where_the_last_ack_is(
        sends: list[tuple[list[int], int]], acked: int) -> None:
    """Against a model: records and bytes count as entries are sent; the last
    position is that of the last entry acknowledged (acks come in entry order)."""
    tally = Tally()
    txids: list[int] = []
    for i, (batch, nbytes) in enumerate(sends):
        increasing = [sum(txids[-1:]) + t for t in sorted(batch)]  # never decreasing
        tally.sent(increasing, nbytes, 100 + i, 100 + i)
        txids.extend(increasing)
        if i < acked:
            tally.acked(i, len(batch))
    seg = tally.completed(Segment(seq=4, ledger_id=9, start_sequence=12), 5_000)
    assert seg.state == COMPLETED and seg.completion_ms == 5_000
    assert (seg.seq, seg.ledger_id, seg.start_sequence) == (4, 9, 12)
    assert seg.records == len(txids)
    assert seg.size_bytes == sum(n for _, n in sends)
    assert (seg.first_txid, seg.last_txid) == ((txids[0], txids[-1]) if txids else (-1, -1))
    assert (seg.first_ts_ms, seg.last_ts_ms) == ((100, 99 + len(sends)) if txids else (-1, -1))
    last = min(acked, len(sends)) - 1
    if last < 0:
        assert (seg.last_entry, seg.last_slot) == (-1, -1)
    else:
        assert (seg.last_entry, seg.last_slot) == (last, len(sends[last][0]) - 1)


async def test_complete_closes_the_ledger_then_describes_the_segment() -> None:
    ctx = context()
    lh = FakeLedger(7)
    tally = Tally()
    tally.sent([3, 4], 10, 50, 51)
    tally.acked(0, 2)
    seg = await complete_segment(ctx, lh, Segment(seq=2, ledger_id=7), tally)
    assert lh.closed
    assert seg == dataclasses.replace(Segment(seq=2, ledger_id=7), state=COMPLETED, records=2,
                                      first_txid=3, last_txid=4, last_entry=0, last_slot=1,
                                      size_bytes=10, completion_ms=int(NOW_S * 1000),
                                      first_ts_ms=50, last_ts_ms=51)
    failing = FakeLedger(8, close_fails=True)
    with pytest.raises(BKError, match="close failed"):
        await complete_segment(ctx, failing, Segment(seq=3, ledger_id=8), Tally())


# --------------------------------------------------------------------------- recover


async def test_recover_describes_the_segment_from_its_first_and_last_entries() -> None:
    ledgers = FakeLedgers()
    ledgers.add(5, [entry(0, [10, 11]), entry(2, [12]), entry(3, [13, 14, 15])])
    ctx = context(ledgers)
    seg, ended = await recover_segment(ctx, Segment(seq=3, ledger_id=5, start_sequence=40))
    assert ledgers.opened == [(5, True)], "recovery fences and closes the ledger"
    assert not ended
    assert (seg.state, seg.records, seg.first_txid, seg.last_txid) == (COMPLETED, 6, 10, 15)
    assert seg.last_position == Position(3, 2, 2)
    assert seg.start_sequence == 40 and seg.completion_ms == int(NOW_S * 1000)
    assert seg.size_bytes == sum(len(e) for e in ledgers.ledgers[5].entries)


async def test_recover_sees_the_end_of_stream_and_skips_empty_entries() -> None:
    ledgers = FakeLedgers()
    ledgers.add(5, [entry(0, [1, 2]), entry(2, [], codec.END_OF_STREAM)])
    ctx = context(ledgers)
    seg, ended = await recover_segment(ctx, Segment(seq=1, ledger_id=5))
    assert ended
    assert (seg.records, seg.last_txid, seg.last_position) == (2, 2, Position(1, 0, 1))
    # an end marker that is not the last entry does not end the stream
    ledgers.add(6, [entry(0, [], codec.END_OF_STREAM), entry(0, [7])])
    seg, ended = await recover_segment(ctx, Segment(seq=2, ledger_id=6))
    assert not ended and (seg.records, seg.first_txid, seg.last_txid) == (1, 7, 7)


async def test_recover_of_an_empty_or_missing_ledger() -> None:
    ledgers = FakeLedgers()
    ledgers.add(5, [])
    ctx = context(ledgers)
    seg, ended = await recover_segment(ctx, Segment(seq=1, ledger_id=5, state=OPEN))
    assert not ended and seg.completed and seg.records == 0 and seg.last_position is None
    # created, then lost before any write
    seg, ended = await recover_segment(ctx, Segment(seq=2, ledger_id=99))
    assert not ended and seg.completed and seg.records == 0
    assert seg.completion_ms == int(NOW_S * 1000)


async def test_recover_refuses_an_entry_that_is_not_a_record_batch() -> None:
    ledgers = FakeLedgers()
    ledgers.add(5, [b"not a batch"])
    with pytest.raises(CorruptRecordError, match="stream ns/1:0"):
        await recover_segment(context(ledgers), Segment(seq=1, ledger_id=5))


# --------------------------------------------------------------------------- create, fence, discard, delete


async def test_created_ledgers_carry_the_streams_shape_placement_and_tags() -> None:
    ledgers = FakeLedgers()
    ctx = context(ledgers)
    placed = StreamConfig(ensemble_size=4, write_quorum=3, ack_quorum=2, digest="none",
                          placement_policy="rack-aware", enforce_placement=True).validate()
    await create_segment_ledger(ctx, "orders/eu", placed, 7)
    await create_staged_ledger(ctx, "orders/eu", StreamConfig(), "sink-1")
    (args1, kw1), (args2, kw2) = ledgers.created
    assert args1 == (4, 3, 2) and kw1["digest"] == "none"
    assert kw1["placement"] == PlacementSpec("rack-aware", enforce_placement=True)
    assert kw1["metadata"] == {STREAM_KEY: b"ns/orders/eu", SEGMENT_KEY: b"7"}
    assert args2 == (3, 3, 2) and kw2["placement"] is None  # the client's own
    assert kw2["metadata"] == {STREAM_KEY: b"ns/orders/eu", STAGED_BY_KEY: b"sink-1"}


async def test_fence_discard_and_delete() -> None:
    ledgers = FakeLedgers()
    log = Logged()
    ctx = context(ledgers, logger=log)
    ledgers.add(1, [entry(0, [1])])
    await fence_ledger(ctx, 1)
    assert ledgers.ledgers[1].closed
    await fence_ledger(ctx, 2)  # gone: nothing to fence
    await delete_ledger(ctx, 1)
    assert 1 not in ledgers.ledgers
    await delete_ledger(ctx, 1)  # gone already: fine
    lh = ledgers.add(3, [])
    await discard_ledger(ctx, lh)
    assert lh.closed_quietly and 3 not in ledgers.ledgers and not log.records
    ledgers.delete_fails = True
    lh = ledgers.add(4, [])
    await discard_ledger(ctx, lh)  # logged, not raised
    assert log.records == [("warning", "could not delete an unused segment ledger",
                            {"namespace": "ns", "ledger_id": 4,
                             "error": "metadata store unreachable"})]
    with pytest.raises(BKError):
        await delete_ledger(ctx, 4)


def test_durable_end_is_the_last_entry_once_closed_else_the_lac() -> None:
    lh = FakeLedger(1, [b"a", b"b", b"c"], lac=1)
    assert durable_end(lh) == 1
    lh.closed = True
    assert durable_end(lh) == 2


# --------------------------------------------------------------------------- context


def test_limits_and_writer_options_fit() -> None:
    limits = StreamLimits.from_frame_bytes_max(ClientConfig().frame_bytes_max)
    assert limits.record_bytes_max == limits.entry_bytes_max - codec.HEADER_BYTES \
        - codec.RECORD_OVERHEAD_BYTES_MAX
    WriterOptions().check_fits(limits)  # the default record bound fits the default frame
    small = StreamLimits.from_frame_bytes_max(1024 * 1024)
    with pytest.raises(ValueError, match="exceeds what one ledger entry carries"):
        WriterOptions().check_fits(small)
    WriterOptions(record_bytes_max=small.record_bytes_max).check_fits(small)


async def test_a_namespace_context_draws_from_the_clients_rng() -> None:
    """The stream client's injected generator (a seeded one in the simulator) is what
    its namespaces' writers draw back-off jitter from; without one, a fresh one."""
    store = MemoryMetadataStore("/r")
    rng = random.Random(5)
    bk = BookKeeper(store, ClientConfig(), rng=rng)
    try:
        ns = await bk.namespace("n", create=True)
        assert ns.context.rng is rng and bk.stream_rng is rng
        assert ns.context.namespace == "n" and ns.context.defaults == ns.defaults
        assert ns.context.ledgers is bk and ns.context.stats is bk.stream_stats
        other = BookKeeper(MemoryMetadataStore("/s"), ClientConfig())
        assert isinstance(other.stream_rng, random.Random) and other.stream_rng is not rng
        await other.close()
    finally:
        await bk.close()


def test_stream_config_is_the_defaults_with_the_streams_overrides() -> None:
    from asyncbk.stream.meta import StreamMeta

    ctx = context(rolling_entries=5)
    sm = StreamMeta("ns", "s", {"rolling_entries": 9, "write_quorum": 2})
    cfg = ctx.stream_config(sm)
    assert (cfg.rolling_entries, cfg.write_quorum, cfg.ensemble_size) == (9, 2, 3)


def test_segments_before_a_position() -> None:
    before = segments_before(Position(3, 5, 0))
    done = dict(state=COMPLETED, records=4)
    assert before(Segment(seq=1, ledger_id=1, last_entry=9, last_slot=0, **done))
    assert before(Segment(seq=3, ledger_id=3, last_entry=4, last_slot=7, **done))
    assert not before(Segment(seq=3, ledger_id=3, last_entry=5, last_slot=0, **done))
    assert not before(Segment(seq=1, ledger_id=1))  # open: never
    assert before(Segment(seq=2, ledger_id=2, state=COMPLETED))  # empty, before segment 3
    assert not before(Segment(seq=3, ledger_id=3, state=COMPLETED))
