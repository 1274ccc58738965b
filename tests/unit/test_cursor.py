"""The cursor of a subscription (:mod:`asyncbk.stream.cursor`) against a plain model:
a list of the stream's record positions and two indexes (acknowledged, persisted).

Random runs of deliveries, acks (of delivered records, of records never delivered,
backwards), persistences (done, lost, refused by a takeover), crashes (a new
consumer resumes from what was persisted), seeks and takeovers.  After every step
the cursor agrees with the model, and its invariants hold: the persisted position
never goes back but by a seek, never passes what was acknowledged, and an ack of a
fenced consumer changes nothing.
"""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncbk.errors import InvalidAckError, SubscriptionFencedError
from asyncbk.stream.cursor import CursorState, holds, release
from asyncbk.stream.meta import COMPLETED, Segment
from asyncbk.stream.position import Position


def stream_positions(shape: list[list[int]]) -> list[Position]:
    """Record positions of a stream whose segment i has entries of ``shape[i]`` records."""
    out = []
    for seq, entries in enumerate(shape, start=1):
        for entry, count in enumerate(entries):
            out.extend(Position(seq, entry, slot) for slot in range(count))
    return out


def after(p: Position) -> Position:
    return Position(p.segment, p.entry, p.slot + 1)


shapes = st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=4), min_size=1, max_size=4)
ops = st.lists(st.tuples(st.sampled_from(["deliver", "deliver", "deliver", "ack", "ack",
                                          "ack_bad", "ack_back", "persist", "persist_lost",
                                          "crash", "takeover", "seek"]),
                         st.integers(0, 1000)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(shapes, ops)
def test_the_cursor_agrees_with_a_plain_model(shape: list[list[int]],
                                              steps: list[tuple[str, int]]) -> None:
    records = stream_positions(shape)
    n = len(records)

    def pos_of(i: int) -> Position:
        return records[i] if i < n else after(records[-1])

    persisted = 0          # what the store holds (index of the resume record)
    state = CursorState(pos_of(persisted))
    delivered_from = persisted
    delivered = persisted  # next index to deliver
    acked = persisted
    persisted_log = [persisted]
    for op, x in steps:
        if op == "deliver" and delivered < n:
            state.delivered(records[delivered])
            delivered += 1
        elif op == "ack":
            if delivered > delivered_from:
                i = delivered_from + x % (delivered - delivered_from)
                if i < acked - 1:
                    with pytest.raises(InvalidAckError):
                        state.ack(records[i])
                else:
                    state.ack(records[i])
                    acked = max(acked, i + 1)
        elif op == "ack_bad":
            # a position no record of it has (past the entry's records), or never delivered
            bad = Position(records[-1].segment + 1 + x % 3, x % 5, x % 7) if x % 2 else \
                Position(1, 0, 50 + x)
            with pytest.raises(InvalidAckError):
                state.ack(bad)
            if delivered < n:
                with pytest.raises(InvalidAckError):
                    state.ack(records[delivered + x % (n - delivered)])
        elif op == "ack_back" and acked - delivered_from >= 2:
            with pytest.raises(InvalidAckError, match="backwards"):
                state.ack(records[delivered_from + x % (acked - delivered_from - 1)])
        elif op in ("persist", "persist_lost"):
            due = state.due()
            assert (due is not None) == (acked > persisted)
            if due is not None:
                assert bisect.bisect_left(records, due) == acked
                if op == "persist":
                    state.persisted_as(due)
                    persisted = acked
                    persisted_log.append(persisted)
                else:
                    state.persist_failed()
        elif op == "crash":  # a new consumer resumes from what was stored
            state = CursorState(pos_of(persisted))
            delivered_from = delivered = acked = persisted
        elif op == "takeover":  # the old consumer is fenced: its acks change nothing
            state.fence("taken over")
            if delivered > delivered_from:
                with pytest.raises(SubscriptionFencedError):
                    state.ack(records[delivered - 1])
            assert state.due() is None
            state = CursorState(pos_of(persisted))
            delivered_from = delivered = acked = persisted
        elif op == "seek":
            persisted = x % (n + 1)
            persisted_log.append(-1)  # (a seek may go back)
            persisted_log.append(persisted)
            state.fence("sought")
            state = CursorState(pos_of(persisted))
            delivered_from = delivered = acked = persisted
        state.check()
        # (A resume position is the first record at or after it: 1:0:3 past an entry
        # of three records is 1:1:0.)
        assert bisect.bisect_left(records, state.acked) == acked
        assert bisect.bisect_left(records, state.persisted) == persisted
        assert persisted <= acked <= delivered  # never past what was delivered
    # without seeks in between, what was persisted only grew
    runs: list[list[int]] = [[]]
    for v in persisted_log:
        if v < 0:
            runs.append([])
        else:
            runs[-1].append(v)
    for run in runs:
        assert run == sorted(run)


def test_acking_the_last_acknowledged_again_changes_nothing() -> None:
    s = CursorState(Position(1, 0, 0))
    for slot in range(3):
        s.delivered(Position(1, 0, slot))
    assert s.ack(Position(1, 0, 1))
    assert not s.ack(Position(1, 0, 1))
    assert s.acked == Position(1, 0, 2)
    with pytest.raises(InvalidAckError, match="backwards"):
        s.ack(Position(1, 0, 0))
    with pytest.raises(TypeError):
        s.ack("1:0:2")  # type: ignore[arg-type]


def seg(seq: int, records: int, size: int, first_ts: int) -> Segment:
    return Segment(seq=seq, ledger_id=seq, state=COMPLETED, records=records,
                   last_entry=0 if records else -1, last_slot=records - 1 if records else -1,
                   size_bytes=size, first_ts_ms=first_ts, last_ts_ms=first_ts + 10)


def test_release_keeps_what_a_subscription_holds_until_its_quota() -> None:
    segs = [seg(i, 10, 100, 1000 * i) for i in range(1, 6)]
    doomed = segs[:3]
    # s1 acknowledged segments 1 and 2; s2 is at the start of segment 1
    cursors = {"s1": Position(3, 0, 0), "s2": Position(1, 0, 0)}
    assert holds(Position(3, 0, 0), segs[2]) and not holds(Position(3, 0, 0), segs[1])
    got = release(doomed, segs, cursors, 0, 0, now_ms=10_000)
    assert got.segments == [] and got.held_by == ["s2"] and not got.evicted
    got = release(doomed, segs, {"s1": Position(3, 0, 0)}, 0, 0, now_ms=10_000)
    assert got.segments == segs[:2] and got.held_by == ["s1"]
    # a byte quota: the backlog from segment 1 on is 500 bytes, from 3 on 300
    got = release(doomed, segs, cursors, 350, 0, now_ms=10_000)
    assert got.segments == segs[:2] and got.evicted == {"s2": [1, 2]} and got.held_by == ["s1",
                                                                                         "s2"]
    # an age quota: segments whose first record is over 8.5 s old at 10 s go
    got = release(doomed, segs, cursors, 0, 8.5, now_ms=10_000)
    assert got.segments == segs[:1] and got.evicted == {"s2": [1]}
    # an empty segment is held by nobody
    empty = [seg(1, 0, 0, 0), *segs[1:]]
    assert release(empty[:1], empty, cursors, 0, 0, 10_000).segments == empty[:1]


async def test_batched_cas_coalesces_and_tells_each_writer_its_outcome() -> None:
    import asyncio

    from asyncbk.errors import MetadataVersionError
    from asyncbk.meta.memory import MemoryMetadataStore
    from asyncbk.stream.cas import CAS_BATCH_KEYS_MAX, BatchedCas

    store = MemoryMetadataStore("/t")
    versions = {}
    for i in range(100):
        versions[i] = await store.kv_txn([], put=[(f"/t/k{i}", b"0")])
    calls: list[int] = []
    real = store.kv_txn

    async def counting(compare, put=(), delete=(), delete_prefix=()):  # type: ignore[no-untyped-def]
        calls.append(len(compare))
        return await real(compare, put, delete, delete_prefix)

    store.kv_txn = counting  # type: ignore[method-assign]
    cas = BatchedCas()
    # key 7 moved meanwhile: its writer is refused, the others go through
    versions[7] = -1
    futs = [cas.write(store, f"/t/k{i}", versions[i], b"1") for i in range(100)]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert isinstance(results[7], MetadataVersionError)
    assert all(isinstance(r, int) for i, r in enumerate(results) if i != 7)
    for i in range(100):
        kv = await store.kv_get(f"/t/k{i}")
        assert kv is not None and kv.value == (b"0" if i == 7 else b"1")
    # 100 writes: two transactions, the first refused whole and retried key by key
    assert calls[:2] == [CAS_BATCH_KEYS_MAX, 100 - CAS_BATCH_KEYS_MAX] or \
        sorted(calls[:2]) == sorted([CAS_BATCH_KEYS_MAX, 100 - CAS_BATCH_KEYS_MAX])
    assert len(calls) == 2 + CAS_BATCH_KEYS_MAX
