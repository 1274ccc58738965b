"""The benchmarks' buffered latency histogram records exactly what recording each
value at once would."""

from __future__ import annotations

import random

import pytest

from asyncbk.cli import bench_record
from asyncbk.cli.bench_record import LATENCY_US_MAX, BufferedHistogram, Recorder, new_histogram


def test_buffered_histogram_equals_direct_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_record, "FOLD_DISTINCT", 300)  # several folds, one partial
    rng = random.Random(7)
    values = [int(rng.lognormvariate(8, 1)) for _ in range(4321)] + [0, -5, 10**12]
    direct = new_histogram()
    buffered = BufferedHistogram()
    for v in values:
        direct.record_value(min(LATENCY_US_MAX, max(1, v)))
        buffered.record(v)
    direct.record_value(500, 17)
    buffered.record(500, 17)
    h = buffered.histogram
    assert h.get_total_count() == len(values) + 17
    assert h.encode() == direct.encode()
    assert h.get_max_value() == direct.get_max_value() >= LATENCY_US_MAX
    assert h.get_min_value() == 1
    buffered.record(42)
    assert buffered.histogram.get_total_count() == len(values) + 18  # read after a read
    buffered.reset()
    assert buffered.histogram.get_total_count() == 0


def test_recorder_histogram_holds_pending_latencies() -> None:
    rec = Recorder(entry_size=1)
    for ms in (1, 2, 3):
        rec.record(ms / 1000)
    rec.record(0.004, entries=5, samples=5)
    assert rec.count == 8
    assert rec.histogram.get_total_count() == 8
    assert 3990 <= rec.histogram.get_max_value() <= 4010
    assert rec.to_json()["count"] == 8
