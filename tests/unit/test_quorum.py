"""Write sets and ack quorums against a brute-force model."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from asyncbk.client.quorum import stores_entry, write_set
from asyncbk.client.write_path import COMPLETE_TABLE_POSITIONS_MAX, WritePath


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
def test_completion_at_the_ack_quorum(q: tuple[int, int, int], data: st.DataObject) -> None:
    """An entry completes once ``Qa`` positions of its write set acknowledged it, in any
    order, repeated acknowledgements counting once (the write path's table of ack
    quorums by bitmask)."""
    e, w, a = q
    bookies = [f"b{i}" for i in range(e)]
    wp = WritePath(bookies, w, a)
    entry = data.draw(st.integers(0, 20))
    for i in range(entry + 1):
        wp.submit(i)
    for i in range(entry):
        for p in wp.write_set(i):
            wp.ack(i, p, bookies[p])
    assert wp.lac == entry - 1
    events = data.draw(st.lists(st.sampled_from(wp.write_set(entry)), max_size=3 * w))
    seen: set[int] = set()
    for p in events:
        before = wp.lac == entry
        fx = wp.ack(entry, p, bookies[p])
        seen.add(p)
        assert (wp.lac == entry) == (len(seen) >= a)
        assert fx.completed == ((entry,) if wp.lac == entry and not before else ())


def test_large_ensembles_count_acknowledgements() -> None:
    """Ensembles past the table's size count the bits instead."""
    e = COMPLETE_TABLE_POSITIONS_MAX + 2
    bookies = [f"b{i}" for i in range(e)]
    wp = WritePath(bookies, e, e - 3)
    wp.submit(0)
    for p in range(e - 4):
        wp.ack(0, p, bookies[p])
    assert wp.lac == -1
    assert wp.ack(0, e - 1, bookies[e - 1]).completed == (0,)


def test_brute_force_all_small_orders() -> None:
    for w, a in itertools.product(range(1, 4), range(1, 4)):
        if a > w:
            continue
        for order in itertools.permutations(range(w)):
            wp = WritePath([f"b{i}" for i in range(w)], w, a)
            wp.submit(0)
            for i, pos in enumerate(order, 1):
                assert (wp.ack(0, pos, f"b{pos}").completed == (0,)) == (i == a)
                assert (wp.lac == 0) == (i >= a)
