"""Prometheus metrics of a client, for the application's own registry::

    from prometheus_client import REGISTRY
    from asyncbk.client.metrics import ClientCollector
    REGISTRY.register(ClientCollector(bk, name="orders-writer"))
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..stats import MetricFamilies
from .client import BookKeeper

PREFIX = "asyncbk_client"


class ClientCollector:
    """Reads ``bk.stats`` at scrape time (no cost on the request path)."""

    def __init__(self, bk: BookKeeper, name: str = "default") -> None:
        self.bk = bk
        self.name = name

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        st = self.bk.stats
        f = MetricFamilies(PREFIX, "client", self.name)
        yield f.histogram("add_latency_seconds", "append: call to acknowledgement",
                          st.add_latency)
        yield f.histogram("read_latency_seconds", "read: one read call", st.read_latency)
        yield f.counter("read_entries", "entries read", st.read_entries)
        yield f.counter("ensemble_changes", "bookies replaced by this client's writers",
                        st.ensemble_changes)
        yield f.counter("placement_fallbacks", "ensembles and replacements that could not "
                        "meet the placement policy's racks/regions per write set (best "
                        "available used instead)", self.bk.placement.fallbacks)
        quarantined = sorted(self.bk.quarantine.active())
        yield f.gauge("quarantined_bookies", "bookies this client keeps out of new ensembles "
                      "and replacements for now (an add failed on them recently)",
                      len(quarantined))
        each = GaugeMetricFamily(f"{PREFIX}_bookie_quarantined",
                                 "1 for each bookie this client has quarantined now",
                                 labels=["client", "bookie"])
        for bookie in quarantined:
            each.add_metric([self.name, str(bookie)], 1.0)
        yield each


__all__ = ["ClientCollector"]
