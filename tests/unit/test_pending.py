"""client/pending.py: a handle's pending appends as parallel lists, against a deque of
records, across the cuts of the ring."""

from __future__ import annotations

import collections
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncbk.client import pending as pending_mod
from asyncbk.client.pending import PendingAppends


@settings(max_examples=60)
@given(steps=st.lists(st.tuples(st.booleans(), st.integers(1, 400)), max_size=40),
       traced=st.booleans(), first=st.integers(0, 5))
def test_against_a_deque_of_records(steps: list[tuple[bool, int]], traced: bool,
                                    first: int) -> None:
    ring = PendingAppends(first, traced=traced)
    model: collections.deque[tuple[int, Any, bytes, int, float, Any, bytes]] = \
        collections.deque()
    next_id = first
    for push, n in steps:
        if push:
            for _ in range(n):
                fut, span = object(), object() if traced else None
                trace = b"t%d" % next_id if traced else b""
                model.append((next_id, fut, b"e%d" % next_id, 10 * next_id, next_id / 10,
                              span, trace))
                count = ring.push(fut, b"e%d" % next_id, 10 * next_id,  # type: ignore[arg-type]
                                  next_id / 10, span, trace)
                assert count == len(model) == len(ring)
                next_id += 1
        elif model:
            count = min(n, len(model))
            done = ring.complete(count)
            taken = [model.popleft() for _ in range(count)]
            assert done.futures == [r[1] for r in taken]
            assert done.submitted_s == [r[4] for r in taken]
            assert done.length == taken[-1][3]
            assert done.spans == ([r[5] for r in taken] if traced else None)
        assert len(ring) == len(model)
        if model:
            assert ring.first == model[0][0]
            assert ring.oldest_submitted_s() == model[0][4]
            for record in (model[0], model[-1], model[len(model) // 2]):
                assert ring.body(record[0]) == record[2]
                assert ring.trace(record[0]) == record[6]
    assert len(ring.futures) <= 2 * max(pending_mod.RING_CUT_MIN, len(model)) + 400


def test_clear_takes_everything_and_empty_gives_none() -> None:
    ring = PendingAppends(3, traced=False)
    assert ring.clear() is None
    for i in range(5):
        ring.push(i, b"x", i, 0.0)  # type: ignore[arg-type]
    done = ring.clear()
    assert done is not None and done.futures == [0, 1, 2, 3, 4] and len(ring) == 0
    assert ring.first == 8
