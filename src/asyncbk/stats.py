"""Cheap in-process statistics for hot paths: fixed-bucket latency histograms.

Recording is a ``bisect`` and three additions (no lock, no allocation), so it
can run for every request on the event loop.  The HTTP admin endpoint turns
them into Prometheus histograms when scraped.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
)
"""Upper bounds (seconds) of the latency buckets, as Prometheus ``le`` labels."""


class LatencyHistogram:
    """Counts of observations per bucket (the last bucket is +Inf), their sum and count."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float, times: int = 1) -> None:
        """Record ``seconds`` (``times`` times: e.g. once per add of a batch)."""
        self.counts[bisect_left(self.bounds, seconds)] += times
        self.sum += seconds * times
        self.count += times

    def observe_since(self, now: float, starts: Sequence[float]) -> None:
        """Record ``now - start`` for each of ``starts`` (one call for a batch of
        completions: :meth:`observe` for each, without a call each)."""
        counts, bounds = self.counts, self.bounds
        total = 0.0
        for start in starts:
            seconds = now - start
            counts[bisect_left(bounds, seconds)] += 1
            total += seconds
        self.sum += total
        self.count += len(starts)

    @classmethod
    def merged(cls, histograms: Sequence[LatencyHistogram]) -> LatencyHistogram:
        """One histogram of every observation of ``histograms`` (same bounds)."""
        out = cls(histograms[0].bounds)
        for h in histograms:
            if h.bounds != out.bounds:
                raise ValueError("histograms with different buckets cannot be merged")
            out.counts = [a + b for a, b in zip(out.counts, h.counts, strict=True)]
            out.sum += h.sum
            out.count += h.count
        return out

    def cumulative(self) -> list[tuple[str, int]]:
        """``[(le, cumulative count), ...]`` ending with ``("+Inf", count)``."""
        out: list[tuple[str, int]] = []
        total = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            total += n
            out.append((repr(bound), total))
        out.append(("+Inf", total + self.counts[-1]))
        return out

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding quantile ``q`` (0..1); 0 when empty."""
        if not self.count:
            return 0.0
        rank = q * self.count
        seen = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            seen += n
            if seen >= rank:
                return bound
        return float("inf")


class MetricFamilies:
    """Prometheus metric families of one source, all named ``<prefix>_<name>`` and
    labelled ``<label>="<value>"`` (for collectors that read counters at scrape time)."""

    def __init__(self, prefix: str, label: str, value: str) -> None:
        self.prefix, self.labels, self.ident = prefix, [label], [value]

    def gauge(self, name: str, doc: str, value: float) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(f"{self.prefix}_{name}", doc, labels=self.labels)
        family.add_metric(self.ident, value)
        return family

    def counter(self, name: str, doc: str, value: float) -> Any:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(f"{self.prefix}_{name}", doc, labels=self.labels)
        family.add_metric(self.ident, value)
        return family

    def histogram(self, name: str, doc: str, h: LatencyHistogram) -> Any:
        from prometheus_client.core import HistogramMetricFamily

        family = HistogramMetricFamily(f"{self.prefix}_{name}", doc, labels=self.labels)
        family.add_metric(self.ident, h.cumulative(), h.sum)
        return family


__all__ = ["LATENCY_BUCKETS_S", "LatencyHistogram", "MetricFamilies"]
