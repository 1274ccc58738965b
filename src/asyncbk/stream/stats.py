"""What a client's streams did, per namespace (``bk.stream_stats``;
``asyncbk.stream.metrics`` exports it to Prometheus)."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class NamespaceCounts:
    records_written: int = 0
    bytes_written: int = 0
    records_read: int = 0
    bytes_read: int = 0
    segment_rolls: int = 0
    writer_takeovers: int = 0
    backlog_evictions: int = 0


class StreamStats:
    """Counters per namespace: records and bytes written (acknowledged) and read,
    segment rolls, writer takeovers (a writer opened on a stream whose last segment
    was still open, i.e. fencing another writer or finishing a dead one's)."""

    def __init__(self) -> None:
        self.namespaces: collections.defaultdict[str, NamespaceCounts] = \
            collections.defaultdict(NamespaceCounts)
        self.subscription_lags: dict[tuple[str, str, str], Any] = {}
        """The last lag measured of each subscription seen, by (namespace, stream, name):
        a :class:`~asyncbk.stream.subscription.SubscriptionInfo`."""
        self.evictions: collections.Counter[tuple[str, str, str]] = collections.Counter()
        """Segments dropped by a backlog quota under each subscription."""

    def written(self, namespace: str, records: int, nbytes: int) -> None:
        c = self.namespaces[namespace]
        c.records_written += records
        c.bytes_written += nbytes

    def read(self, namespace: str, records: int, nbytes: int) -> None:
        c = self.namespaces[namespace]
        c.records_read += records
        c.bytes_read += nbytes

    def rolled(self, namespace: str) -> None:
        self.namespaces[namespace].segment_rolls += 1

    def took_over(self, namespace: str) -> None:
        self.namespaces[namespace].writer_takeovers += 1

    def subscriptions_seen(self, namespace: str, stream: str, infos: Sequence[Any]) -> None:
        """The subscriptions of a stream and their lag, as just measured (replacing
        what was known of that stream's)."""
        for key in [k for k in self.subscription_lags if k[:2] == (namespace, stream)]:
            del self.subscription_lags[key]
        for info in infos:
            self.subscription_lags[(namespace, stream, info.name)] = info

    def evicted(self, namespace: str, stream: str, subscription: str, segments: int) -> None:
        self.namespaces[namespace].backlog_evictions += segments
        self.evictions[(namespace, stream, subscription)] += segments
