"""Pure quorum logic: which bookies hold an entry, and when an add is complete.

Round-robin striping: entry ``e`` of a fragment whose ensemble has ``E``
bookies is written to the ``Qw`` consecutive ensemble positions starting at
``e mod E``.  An add completes once ``Qa`` of them have acknowledged it (and
all lower entries have completed: that ordering lives in the ledger handle).
"""

from __future__ import annotations


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> list[int]:
    """Ensemble positions that store ``entry_id``."""
    start = entry_id % ensemble_size
    return [(start + i) % ensemble_size for i in range(write_quorum)]


def stores_entry(position: int, entry_id: int, ensemble_size: int, write_quorum: int) -> bool:
    """Whether ensemble position ``position`` is in the write set of ``entry_id``."""
    return (position - entry_id) % ensemble_size < write_quorum


class AckSet:
    """Acknowledgements of one add, by ensemble position."""

    __slots__ = ("_acked", "_failed", "ack_quorum", "write_quorum")

    def __init__(self, write_quorum: int, ack_quorum: int) -> None:
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self._acked = 0  # bitmask of positions
        self._failed = 0

    def ack(self, position: int) -> bool:
        """Record an ack; True once the ack quorum is reached."""
        self._acked |= 1 << position
        self._failed &= ~(1 << position)
        return self.complete

    def unack(self, position: int) -> None:
        """Withdraw an ack: after an ensemble change that position is another bookie,
        which does not have the entry yet."""
        self._acked &= ~(1 << position)

    def fail(self, position: int) -> bool:
        """Record a failure; True if the ack quorum can no longer be reached."""
        if not self._acked >> position & 1:
            self._failed |= 1 << position
        return self.broken

    @property
    def acked(self) -> int:
        return self._acked.bit_count()

    @property
    def complete(self) -> bool:
        return self._acked.bit_count() >= self.ack_quorum

    @property
    def broken(self) -> bool:
        return self.write_quorum - self._failed.bit_count() < self.ack_quorum
