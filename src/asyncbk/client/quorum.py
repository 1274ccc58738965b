"""Pure quorum logic: which bookies hold an entry.

Round-robin striping: entry ``e`` of a fragment whose ensemble has ``E``
bookies is written to the ``Qw`` consecutive ensemble positions starting at
``e mod E``.  Writes, reads, recovery and placement all follow it.  (When an add
is complete, once ``Qa`` of them have acknowledged it, is the write path's:
:class:`~asyncbk.client.write_path.WritePath`.)
"""

from __future__ import annotations


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> list[int]:
    """Ensemble positions that store ``entry_id``."""
    start = entry_id % ensemble_size
    return [(start + i) % ensemble_size for i in range(write_quorum)]


def stores_entry(position: int, entry_id: int, ensemble_size: int, write_quorum: int) -> bool:
    """Whether ensemble position ``position`` is in the write set of ``entry_id``."""
    return (position - entry_id) % ensemble_size < write_quorum
