"""Write sets and ack quorums against a brute-force model."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from asyncbk.client.quorum import stores_entry, write_set
from asyncbk.client.write_path import AckSet


@st.composite
def quorums(draw):  # type: ignore[no-untyped-def]
    e = draw(st.integers(1, 9))
    w = draw(st.integers(1, e))
    a = draw(st.integers(1, w))
    return e, w, a


@given(q=quorums(), entry=st.integers(0, 10_000))
def test_write_set_matches_model(q: tuple[int, int, int], entry: int) -> None:
    e, w, _ = q
    ws = write_set(entry, e, w)
    # Model: walk the ring from entry mod E, taking W distinct positions.
    model = []
    pos = entry % e
    while len(model) < w:
        model.append(pos)
        pos = (pos + 1) % e
    assert ws == model
    assert len(set(ws)) == w
    for p in range(e):
        assert stores_entry(p, entry, e, w) == (p in ws)


def test_every_bookie_gets_an_equal_share() -> None:
    for e, w in [(3, 2), (5, 3), (4, 4)]:
        counts = [0] * e
        for entry in range(e * 100):
            for p in write_set(entry, e, w):
                counts[p] += 1
        assert len(set(counts)) == 1


@given(q=quorums(), data=st.data())
def test_ack_set_against_model(q: tuple[int, int, int], data: st.DataObject) -> None:
    e, w, a = q
    positions = write_set(data.draw(st.integers(0, 100)), e, w)
    events = data.draw(st.lists(st.tuples(st.sampled_from(positions), st.booleans()), max_size=20))
    acks = AckSet(w, a)
    acked: set[int] = set()
    failed: set[int] = set()
    for pos, ok in events:
        if ok:
            acks.ack(pos)
            acked.add(pos)
            failed.discard(pos)
        else:
            acks.fail(pos)
            if pos not in acked:
                failed.add(pos)
        assert acks.complete == (len(acked) >= a)
        assert acks.broken == (w - len(failed) < a)
        # Complete and broken at once is impossible: acks and failures are disjoint.
        assert not (acks.complete and acks.broken) or len(acked) + len(failed) > w


def test_brute_force_all_small_orders() -> None:
    for w, a in itertools.product(range(1, 4), range(1, 4)):
        if a > w:
            continue
        for order in itertools.permutations(range(w)):
            acks = AckSet(w, a)
            for i, pos in enumerate(order, 1):
                assert acks.ack(pos) == (i >= a)
