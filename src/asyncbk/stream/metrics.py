"""Prometheus metrics of a client's streams, per namespace, for the application's
own registry::

    from prometheus_client import REGISTRY
    from asyncbk.stream.metrics import StreamCollector
    REGISTRY.register(StreamCollector(bk, name="orders-app"))

Families (labels ``client``, ``namespace``): ``asyncbk_stream_records_written``,
``..._bytes_written`` (acknowledged), ``..._records_read``, ``..._bytes_read``,
``..._segment_rolls``, ``..._writer_takeovers``, ``..._backlog_evictions``.

Per subscription (labels ``client``, ``namespace``, ``stream``, ``subscription``),
as last measured by this process (its retention passes, which writers run when
they open and roll, ``ns.subscriptions()``, ``asyncbk stream retention``):
gauges ``asyncbk_subscription_lag_records``, ``..._lag_bytes``,
``..._lag_seconds``, and the counter ``asyncbk_subscription_evicted_segments``
(segments a backlog quota dropped before it acknowledged them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from .client import BookKeeper
from .stats import NamespaceCounts

PREFIX = "asyncbk_stream"

_DOCS = {
    "records_written": "records acknowledged to this client's stream writers",
    "bytes_written": "bytes of records acknowledged to this client's stream writers",
    "records_read": "records delivered by this client's stream readers",
    "bytes_read": "bytes of records delivered by this client's stream readers",
    "segment_rolls": "segments completed by a roll (size, age or record count)",
    "writer_takeovers": "writers opened on a stream whose last segment was still open",
    "backlog_evictions": "segments dropped by a backlog quota before every subscription "
                         "acknowledged them",
}
_LAGS = {
    "lag_records": "durable records after a subscription's position (not acknowledged)",
    "lag_bytes": "bytes of those records (estimated inside partial segments)",
    "lag_seconds": "age of the first record a subscription has not acknowledged",
}


class StreamCollector:
    """Reads ``bk.stream_stats`` at scrape time (no cost on the write or read path)."""

    def __init__(self, bk: BookKeeper, name: str = "default") -> None:
        self.bk = bk
        self.name = name

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.bk.stream_stats
        counts = dict(stats.namespaces)
        for f in dataclasses.fields(NamespaceCounts):
            family = CounterMetricFamily(f"{PREFIX}_{f.name}", _DOCS[f.name],
                                         labels=["client", "namespace"])
            for ns, c in sorted(counts.items()):
                family.add_metric([self.name, ns], getattr(c, f.name))
            yield family
        labels = ["client", "namespace", "stream", "subscription"]
        lags = sorted(stats.subscription_lags.items())
        for name, text in _LAGS.items():
            gauge = GaugeMetricFamily(f"asyncbk_subscription_{name}", text, labels=labels)
            attr = "lag_s" if name == "lag_seconds" else name
            for (ns, stream, sub), info in lags:
                gauge.add_metric([self.name, ns, stream, sub], float(getattr(info, attr)))
            yield gauge
        evicted = CounterMetricFamily("asyncbk_subscription_evicted_segments",
                                      "segments a backlog quota dropped before this "
                                      "subscription acknowledged them", labels=labels)
        for (ns, stream, sub), n in sorted(stats.evictions.items()):
            evicted.add_metric([self.name, ns, stream, sub], n)
        yield evicted


__all__ = ["StreamCollector"]
