"""What a client's streams did, per namespace (``bk.stream_stats``;
``asyncbk.stream.metrics`` exports it to Prometheus)."""

from __future__ import annotations

import collections
from dataclasses import dataclass


@dataclass
class NamespaceCounts:
    records_written: int = 0
    bytes_written: int = 0
    records_read: int = 0
    bytes_read: int = 0
    segment_rolls: int = 0
    writer_takeovers: int = 0


class StreamStats:
    """Counters per namespace: records and bytes written (acknowledged) and read,
    segment rolls, writer takeovers (a writer opened on a stream whose last segment
    was still open, i.e. fencing another writer or finishing a dead one's)."""

    def __init__(self) -> None:
        self.namespaces: collections.defaultdict[str, NamespaceCounts] = \
            collections.defaultdict(NamespaceCounts)

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
