"""Prometheus metrics of a client's streams, per namespace, for the application's
own registry::

    from prometheus_client import REGISTRY
    from asyncbk.stream.metrics import StreamCollector
    REGISTRY.register(StreamCollector(bk, name="orders-app"))

Families (labels ``client``, ``namespace``): ``asyncbk_stream_records_written``,
``..._bytes_written`` (acknowledged), ``..._records_read``, ``..._bytes_read``,
``..._segment_rolls``, ``..._writer_takeovers``.
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
}


class StreamCollector:
    """Reads ``bk.stream_stats`` at scrape time (no cost on the write or read path)."""

    def __init__(self, bk: BookKeeper, name: str = "default") -> None:
        self.bk = bk
        self.name = name

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        counts = dict(self.bk.stream_stats.namespaces)
        for f in dataclasses.fields(NamespaceCounts):
            family = CounterMetricFamily(f"{PREFIX}_{f.name}", _DOCS[f.name],
                                         labels=["client", "namespace"])
            for ns, c in sorted(counts.items()):
                family.add_metric([self.name, ns], getattr(c, f.name))
            yield family


__all__ = ["StreamCollector"]
