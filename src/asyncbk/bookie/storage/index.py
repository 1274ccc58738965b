"""The entry index: where each stored entry's record is.

:class:`~.ledger_storage.LedgerStorage` uses an index only through
:class:`EntryIndex`.  The one implementation so far is :class:`MemoryEntryIndex`, a
:class:`LedgerIndex` (two arrays) per ledger, rebuilt at start from ``index.log``
(:data:`INDEX_RECORD` records, appended by :class:`~.entrylog.EntryLogWriter` in
the same batch as the entry log and parsed by :func:`load_index_records`).

A record is an entry's location, or a *deletion marker* (:func:`deletion_marker`):
ledger id, entry id :data:`DELETION_ENTRY_ID` (-1), log id, offset and length 0.  It
voids every earlier record of that ledger.  The writer appends one only when a
deleted ledger's id is used again (before the first record of the new ledger), so a
file written without re-created ledgers keeps the format of earlier versions, which
refuse a marker as a corrupt record.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from ...errors import BookieIOError
from ..journal_format import HEADER_BYTES, RECORD_BYTES_MAX

INDEX_FILE = "index.log"
INDEX_RECORD = struct.Struct("<qqIQI")  # ledger id, entry id, log id, record offset, record length
DELETION_ENTRY_ID = -1
"""The entry id of a deletion marker (module docstring): ``(ledger, -1, 0, 0, 0)``."""

Location = tuple[int, int, int]
"""Where an entry's record is: (entry log id, record offset, record length)."""

RECORD_SPAN_MAX = HEADER_BYTES - 1 + RECORD_BYTES_MAX
"""The most bytes one record takes in an entry log (header and checksummed part)."""

INDEX_GAP_MAX = 4096
"""An entry this far past a ledger's dense range goes to its sparse map instead."""


class EntryIndex(Protocol):
    """What storage needs from an index of entry locations (loop side only)."""

    def get(self, ledger_id: int, entry_id: int) -> Location | None:
        """Where the entry is, None if it is not stored."""
        ...

    def put(self, ledger_id: int, entry_id: int, loc: Location) -> Location | None:
        """Store ``loc`` for the entry (a new ledger starts empty); returns the
        location it replaces, if any."""
        ...

    def put_run(self, ledger_id: int, entry_ids: list[int], log_id: int, offsets: list[int],
                sizes: list[int]) -> list[Location]:
        """:meth:`put` for each entry of a run written in one entry log (entry
        ``entry_ids[i]`` at ``offsets[i]``, ``sizes[i]`` long); returns the locations
        they replace."""
        ...

    def run(self, ledger_id: int, first: int, count_max: int) -> Iterator[Location]:
        """The locations of entries ``first, first + 1, ...``: at most
        ``count_max``, ending before the first entry not stored."""
        ...

    def last_entry_id(self, ledger_id: int) -> int:
        """The highest entry id stored of the ledger, -1 if none."""
        ...

    def add_ledger(self, ledger_id: int) -> None:
        """Start the ledger's index empty (anything it held is forgotten)."""
        ...

    def delete_ledger(self, ledger_id: int) -> Iterable[Location]:
        """Forget the ledger at once; returns the locations it had."""
        ...

    def ledger_ids(self) -> list[int]:
        """The ledgers the index has, in the order they came."""
        ...

    def locations(self) -> Iterator[Location]:
        """Every stored entry's location (any order)."""
        ...

    def __len__(self) -> int:
        """Entries stored."""
        ...


class LedgerIndex:
    """Where each stored entry of one ledger is.

    Entries are mostly added in id order, so locations live in two arrays indexed
    by entry id: ``(log id << 32) | offset`` and the record length (0: not stored).
    That is 12 bytes an entry, and nothing the garbage collector has to walk,
    where a dict of tuples cost about 200 bytes and made every full collection
    slower as the bookie filled.  An entry far beyond the dense range (an
    unusual pattern) goes to a small dict.
    """

    __slots__ = ("_lengths", "_positions", "_sparse", "count", "last")

    def __init__(self) -> None:
        self._positions = array("Q")
        self._lengths = array("I")
        self._sparse: dict[int, Location] = {}
        self.count = 0
        self.last = -1

    def get(self, entry_id: int) -> Location | None:
        if 0 <= entry_id < len(self._lengths):
            n = self._lengths[entry_id]
            if n:
                pos = self._positions[entry_id]
                return pos >> 32, pos & 0xFFFFFFFF, n
            return None
        return self._sparse.get(entry_id)

    def __contains__(self, entry_id: int) -> bool:
        return self.get(entry_id) is not None

    def __len__(self) -> int:
        return self.count

    def locations(self) -> Iterator[Location]:
        """Every stored entry's location (any order)."""
        positions, lengths = self._positions, self._lengths
        for i, n in enumerate(lengths):
            if n:
                pos = positions[i]
                yield pos >> 32, pos & 0xFFFFFFFF, n
        yield from self._sparse.values()

    def items(self) -> Iterator[tuple[int, Location]]:
        """``(entry id, location)`` of every stored entry, in id order."""
        positions, lengths = self._positions, self._lengths
        for i, n in enumerate(lengths):
            if n:
                pos = positions[i]
                yield i, (pos >> 32, pos & 0xFFFFFFFF, n)
        for entry_id in sorted(self._sparse):
            yield entry_id, self._sparse[entry_id]

    def put(self, entry_id: int, loc: Location) -> Location | None:
        """Store ``loc`` for ``entry_id``; returns the location it replaces, if any."""
        lengths = self._lengths
        if entry_id == len(lengths) and not self._sparse:  # the next entry (appends)
            log_id, offset, length = loc
            self._positions.append((log_id << 32) | offset)
            lengths.append(length)
            self.count += 1
            if entry_id > self.last:
                self.last = entry_id
            return None
        old = self.get(entry_id)
        self._put(entry_id, loc)
        return old

    def put_run(self, entry_ids: list[int], log_id: int, offsets: list[int],
                sizes: list[int]) -> list[Location]:
        """:meth:`put` for each of a run of entries in log ``log_id``; the entries that
        follow the dense range in order (the usual run) extend the arrays at once.
        Returns the locations replaced."""
        lengths = self._lengths
        first = entry_ids[0]
        count = len(entry_ids)
        if first == len(lengths) and not self._sparse and entry_ids[-1] == first + count - 1 \
                and entry_ids == list(range(first, first + count)):
            base = log_id << 32
            self._positions.extend([base | offset for offset in offsets])
            lengths.extend(sizes)
            self.count += count
            if first + count - 1 > self.last:
                self.last = first + count - 1
            return []
        replaced = []
        for entry_id, offset, size in zip(entry_ids, offsets, sizes, strict=True):
            old = self.put(entry_id, (log_id, offset, size))
            if old is not None:
                replaced.append(old)
        return replaced

    def _put(self, entry_id: int, loc: Location) -> None:
        if entry_id > len(self._lengths) + INDEX_GAP_MAX:
            if entry_id not in self._sparse:
                self.count += 1
            self._sparse[entry_id] = loc
        else:
            grew = entry_id >= len(self._lengths)
            self._put_dense(entry_id, loc)
            if grew and self._sparse:
                self._absorb_sparse()
        if entry_id > self.last:
            self.last = entry_id

    def _put_dense(self, entry_id: int, loc: Location) -> None:
        log_id, offset, length = loc
        dense = len(self._lengths)
        if entry_id >= dense:
            gap = entry_id - dense
            if gap:
                self._positions.extend(array("Q", bytes(8 * gap)))
                self._lengths.extend(array("I", bytes(4 * gap)))
            self._positions.append((log_id << 32) | offset)
            self._lengths.append(length)
            self.count += 1
        else:
            if not self._lengths[entry_id]:
                self.count += 1
            self._positions[entry_id] = (log_id << 32) | offset
            self._lengths[entry_id] = length

    def _absorb_sparse(self) -> None:
        """Move the sparse entries the dense range now reaches into the arrays (in
        rounds, without recursion: each round may extend the range further)."""
        sparse = self._sparse
        while sparse:
            limit = len(self._lengths) + INDEX_GAP_MAX
            reached = sorted(e for e in sparse if e <= limit)
            if not reached:
                return
            for entry_id in reached:
                loc = sparse.pop(entry_id)
                self.count -= 1
                self._put_dense(entry_id, loc)


class MemoryEntryIndex:
    """:class:`EntryIndex` in memory: a :class:`LedgerIndex` per ledger."""

    __slots__ = ("_ledgers",)

    def __init__(self) -> None:
        self._ledgers: dict[int, LedgerIndex] = {}

    def get(self, ledger_id: int, entry_id: int) -> Location | None:
        entries = self._ledgers.get(ledger_id)
        return entries.get(entry_id) if entries is not None else None

    def put(self, ledger_id: int, entry_id: int, loc: Location) -> Location | None:
        entries = self._ledgers.get(ledger_id)
        if entries is None:
            entries = self._ledgers[ledger_id] = LedgerIndex()
        return entries.put(entry_id, loc)

    def put_run(self, ledger_id: int, entry_ids: list[int], log_id: int, offsets: list[int],
                sizes: list[int]) -> list[Location]:
        entries = self._ledgers.get(ledger_id)
        if entries is None:
            entries = self._ledgers[ledger_id] = LedgerIndex()
        return entries.put_run(entry_ids, log_id, offsets, sizes)

    def run(self, ledger_id: int, first: int, count_max: int) -> Iterator[Location]:
        entries = self._ledgers.get(ledger_id)
        if entries is None:
            return
        for entry_id in range(first, first + count_max):
            loc = entries.get(entry_id)
            if loc is None:
                return
            yield loc

    def last_entry_id(self, ledger_id: int) -> int:
        entries = self._ledgers.get(ledger_id)
        return entries.last if entries is not None else -1

    def add_ledger(self, ledger_id: int) -> None:
        self._ledgers[ledger_id] = LedgerIndex()

    def delete_ledger(self, ledger_id: int) -> Iterable[Location]:
        entries = self._ledgers.pop(ledger_id, None)
        return entries.locations() if entries is not None else ()

    def ledger_ids(self) -> list[int]:
        return list(self._ledgers)

    def entries(self, ledger_id: int) -> Iterator[tuple[int, Location]]:
        """``(entry id, location)`` of the ledger's entries, in id order."""
        entries = self._ledgers.get(ledger_id)
        return entries.items() if entries is not None else iter(())

    def locations(self) -> Iterator[Location]:
        for entries in self._ledgers.values():
            yield from entries.locations()

    def __len__(self) -> int:
        return sum(len(e) for e in self._ledgers.values())


def deletion_marker(ledger_id: int) -> bytes:
    """The index.log record voiding every earlier record of ``ledger_id``."""
    return INDEX_RECORD.pack(ledger_id, DELETION_ENTRY_ID, 0, 0, 0)


def index_log_ops(data: bytes, entry_log_id_max: int) -> Iterator[tuple[Any, ...]]:
    """The operations of ``index.log``'s records (``data``, whole records), in order:
    ``("put", ledger, entry, location)``, or ``("del", ledger)`` for a deletion marker
    (the ledger's earlier records are void).  BookieIOError at the first record that
    is neither a marker nor a location of an entry log up to ``entry_log_id_max``."""
    for i, (ledger_id, entry_id, log_id, offset, length) in enumerate(
            INDEX_RECORD.iter_unpack(data)):
        if (entry_id == DELETION_ENTRY_ID and ledger_id >= 0
                and log_id == 0 and offset == 0 and length == 0):
            yield ("del", ledger_id)
            continue
        if (ledger_id < 0 or entry_id < 0 or log_id > entry_log_id_max
                or offset > 0xFFFFFFFF or not HEADER_BYTES < length <= RECORD_SPAN_MAX):
            raise BookieIOError(f"index.log record {i} is corrupt: ledger {ledger_id} entry "
                                f"{entry_id} log {log_id} offset {offset} length {length}")
        yield ("put", ledger_id, entry_id, (log_id, offset, length))


def load_index_records(index: EntryIndex, data: bytes, entry_log_id_max: int) -> None:
    """Apply :func:`index_log_ops` to an in-memory ``index`` (streamed: no list)."""
    for op in index_log_ops(data, entry_log_id_max):
        if op[0] == "put":
            index.put(op[1], op[2], op[3])
        else:
            index.delete_ledger(op[1])
