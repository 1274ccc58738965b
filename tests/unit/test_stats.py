"""stats.py: the latency histogram's batch recording against one call per observation."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncbk.stats import LATENCY_BUCKETS_S, LatencyHistogram


@settings(max_examples=100)
@given(now=st.floats(0, 1e6), starts=st.lists(st.floats(0, 1e6), max_size=300),
       before=st.lists(st.floats(0, 20), max_size=5))
def test_observe_since_records_as_observe_each(now: float, starts: list[float],
                                               before: list[float]) -> None:
    one, batch = LatencyHistogram(), LatencyHistogram()
    for seconds in before:  # (what was recorded already stays)
        one.observe(seconds)
        batch.observe(seconds)
    for start in starts:
        one.observe(now - start)
    batch.observe_since(now, starts)
    assert batch.counts == one.counts
    assert batch.count == one.count == len(before) + len(starts)
    assert math.isclose(batch.sum, one.sum, rel_tol=1e-9, abs_tol=1e-6)


def test_observe_since_buckets_by_elapsed_time() -> None:
    h = LatencyHistogram()
    h.observe_since(10.0, [10.0 - 0.0002, 10.0 - 0.003, 10.0 - 0.003, 10.0 - 99.0])
    assert h.count == 4
    assert h.counts[LATENCY_BUCKETS_S.index(0.00025)] == 1
    assert h.counts[LATENCY_BUCKETS_S.index(0.005)] == 2
    assert h.counts[-1] == 1  # (past the last bound: +Inf)
    assert h.quantile(0.5) == 0.005
