"""The entry index on disk: :class:`KVEntryIndex`, over an
:class:`~.kv.IndexKV` (LMDB for a bookie, :class:`~asyncbk.testing.simkv.SimKV`
in the simulator).

Keys (big-endian, so a ledger's entries are contiguous and in id order):

``b"E" + ledger u64 + entry u64``
    the entry's :data:`~.index.Location`, packed ``<III`` (log id, offset, length);
``b"L" + log id u32``
    the live (indexed) bytes of that entry log, ``<q`` (absent: 0);
``b"P" + log id u32 + offset u32``
    the entry key stored there (the reverse map), so recovery can drop, in time
    proportional to the journal replayed, every entry placed after the checkpoint's
    mark (:meth:`KVEntryIndex.truncate`), as it cuts ``index.log``: the replay then
    re-puts those the journal still has;
``b"Mcount"``
    entries stored, ``<q``.

Writes happen only on the thread that owns the storage's writes (the journal's
writer thread; the recovery thread during open), one transaction per journal
batch (:meth:`apply`), with the live-byte counters and the count updated in the
same transaction, so they are exact after any crash.  (In the storage the KV is the
write cache of :mod:`.writecache` in front of LMDB: these transactions reach LMDB
whole, a layer of them at a time.)  An entry above its ledger's highest one (the
usual append) is put without reading its key first (the writer keeps each written
ledger's highest id).  Reads (:meth:`get`, :meth:`run`, ...) are on the loop and see
the last commit.  Memory does not grow with the entries stored: nothing is kept per
entry, only an id per ledger written since the start and the ledgers whose deletion
is still on its way to the writer (:meth:`hide`).

A ledger deleted on the loop is hidden at once and its range deleted by the
writer in journal order (:meth:`apply`'s ``("del", ledger)``); the replay after a
crash re-applies the journal's DELETE_LEDGER records in order too, so a ledger
re-created with the same id never gets its old entries back.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

from .index import Location
from .kv import IndexKV

_EKEY = struct.Struct(">cQQ")
_LKEY = struct.Struct(">cI")
_PKEY = struct.Struct(">cII")
_LOC = struct.Struct("<III")
_I64 = struct.Struct("<q")
_COUNT = b"Mcount"
_RUN_CHUNK = 1024

IndexOp = tuple[Any, ...]
"""``("put", ledger, entry, location)`` or ``("del", ledger)``."""


def _ekey(ledger_id: int, entry_id: int) -> bytes:
    return _EKEY.pack(b"E", ledger_id, entry_id)


def _ledger_end(ledger_id: int) -> bytes:
    """The first key after the ledger's entries."""
    return _EKEY.pack(b"E", ledger_id, 0)[:9] + b"\xff" * 9


class KVEntryIndex:
    """:class:`~.index.EntryIndex` reads over an :class:`IndexKV`, plus the
    writer-side :meth:`apply` and :meth:`relocate` (module docstring)."""

    on_writer = True
    """Index writes are the writer thread's (``apply``), not the loop's."""

    def __init__(self, kv: IndexKV) -> None:
        self.kv = kv
        self._hidden: dict[int, int] = {}
        self._top: dict[int, int] = {}
        """Writer side: the highest entry id stored of each ledger written since the
        index was opened (read from the KV at its first put; never too low, since every
        entry is added through :meth:`apply`)."""
        value = kv.get(_COUNT)
        self.count = _I64.unpack(value)[0] if value is not None else 0
        """Entries stored (as committed; set by the writer)."""

    # --- loop side ---------------------------------------------------------------

    def hide(self, ledger_id: int) -> None:
        """The ledger was deleted on the loop: unreadable until :meth:`unhide`."""
        self._hidden[ledger_id] = self._hidden.get(ledger_id, 0) + 1

    def unhide(self, ledger_id: int) -> None:
        """The writer applied that deletion."""
        n = self._hidden.get(ledger_id, 0) - 1
        if n > 0:
            self._hidden[ledger_id] = n
        else:
            self._hidden.pop(ledger_id, None)

    def add_ledger(self, ledger_id: int) -> None:
        """A new ledger starts empty: nothing to do (a deleted one's entries are hidden
        until the writer drops them)."""

    def delete_ledger(self, ledger_id: int) -> tuple[Location, ...]:
        """Loop side: :meth:`hide` it; the writer drops its entries (and their live
        bytes) when it reaches the journaled deletion."""
        self.hide(ledger_id)
        return ()

    def get(self, ledger_id: int, entry_id: int) -> Location | None:
        if ledger_id in self._hidden or entry_id < 0:
            return None
        value = self.kv.get(_ekey(ledger_id, entry_id))
        return _LOC.unpack(value) if value is not None else None

    def run(self, ledger_id: int, first: int, count_max: int) -> Iterator[Location]:
        if ledger_id in self._hidden or count_max <= 0:
            return
        items = self.kv.range(_ekey(ledger_id, first), _ledger_end(ledger_id), count_max)
        expect = first
        for key, value in items:
            if _EKEY.unpack(key)[2] != expect:
                return
            yield _LOC.unpack(value)
            expect += 1

    def last_entry_id(self, ledger_id: int) -> int:
        if ledger_id in self._hidden:
            return -1
        items = self.kv.range(_ekey(ledger_id, 0), _ledger_end(ledger_id), 1, reverse=True)
        return _EKEY.unpack(items[0][0])[2] if items else -1

    def ledger_ids(self) -> list[int]:
        """Ledgers with entries (a seek per ledger)."""
        out: list[int] = []
        start = _ekey(0, 0)
        while True:
            items = self.kv.range(start, b"F", 1)
            if not items:
                return [x for x in out if x not in self._hidden]
            ledger_id = _EKEY.unpack(items[0][0])[1]
            out.append(ledger_id)
            start = _ledger_end(ledger_id)

    def locations(self) -> Iterator[Location]:
        start = _ekey(0, 0)
        while True:
            items = self.kv.range(start, b"F", _RUN_CHUNK)
            for key, value in items:
                if _EKEY.unpack(key)[1] not in self._hidden:
                    yield _LOC.unpack(value)
            if len(items) < _RUN_CHUNK:
                return
            start = items[-1][0] + b"\x00"

    def live_bytes(self) -> dict[int, int]:
        """Live bytes of each entry log, as committed."""
        return {_LKEY.unpack(k)[1]: _I64.unpack(v)[0]
                for k, v in self.kv.range(b"L", b"M")}

    def __len__(self) -> int:
        return self.count

    # --- writer side ---------------------------------------------------------------

    def apply(self, ops: Sequence[IndexOp]) -> dict[int, int]:
        """Apply puts and ledger deletions in order, in one transaction; returns the
        change of each entry log's live bytes.  An entry above the highest one its
        ledger has (:attr:`_top`, the usual append) is put without reading the key
        first: no entry was there to replace."""
        live: dict[int, int] = {}
        count = 0
        top = self._top
        pairs: list[tuple[bytes, bytes]] = []
        ekey, pkey, pack_loc = _EKEY.pack, _PKEY.pack, _LOC.pack
        w = self.kv.write()
        try:
            for op in ops:
                if op[0] == "put":
                    _, ledger_id, entry_id, (log_id, offset, length) = op
                    key = ekey(b"E", ledger_id, entry_id)
                    highest = top.get(ledger_id)
                    if highest is None:
                        highest = top[ledger_id] = self._highest_stored(ledger_id)
                    if entry_id > highest:
                        pairs.append((key, pack_loc(log_id, offset, length)))
                        top[ledger_id] = entry_id
                        count += 1
                    else:  # it may be there: replace it, and its live bytes
                        if pairs:
                            w.put_many(pairs)  # (the read below must see them)
                            pairs = []
                        old = w.swap(key, pack_loc(log_id, offset, length))
                        if old is None:
                            count += 1
                        else:
                            old_log, old_offset, old_length = _LOC.unpack(old)
                            live[old_log] = live.get(old_log, 0) - old_length
                            w.delete(pkey(b"P", old_log, old_offset))
                    live[log_id] = live.get(log_id, 0) + length
                    pairs.append((pkey(b"P", log_id, offset), key))
                else:
                    if pairs:
                        w.put_many(pairs)
                        pairs = []
                    ledger_id = op[1]
                    for _, value in w.pop_range(_ekey(ledger_id, 0), _ledger_end(ledger_id)):
                        log_id, offset, length = _LOC.unpack(value)
                        live[log_id] = live.get(log_id, 0) - length
                        w.delete(pkey(b"P", log_id, offset))
                        count -= 1
                    top.pop(ledger_id, None)  # (found again, from the KV, if re-created)
            if pairs:
                w.put_many(pairs)
            self._finish(w, live, count)
        except BaseException:
            w.abort()
            self._top.clear()  # (this transaction's puts raised it: read it again)
            raise
        return live

    def _highest_stored(self, ledger_id: int) -> int:
        """Writer side: the highest entry id of the ledger in the committed state (-1:
        none), hidden or not."""
        items = self.kv.range(_ekey(ledger_id, 0), _ledger_end(ledger_id), 1, reverse=True)
        return _EKEY.unpack(items[0][0])[2] if items else -1

    def relocate(self, olds: Sequence[Location],
                 moved: Sequence[tuple[int, int, Location]]) -> dict[int, int]:
        """Compaction: point moved entries at their new place unless they changed
        meanwhile; returns the live bytes' change."""
        live: dict[int, int] = {}
        w = self.kv.write()
        try:
            for old, (ledger_id, entry_id, new) in zip(olds, moved, strict=True):
                key = _ekey(ledger_id, entry_id)
                if w.get(key) != _LOC.pack(*old):
                    continue  # deleted or overwritten while being moved: garbage
                w.put(key, _LOC.pack(*new))
                w.delete(_PKEY.pack(b"P", old[0], old[1]))
                w.put(_PKEY.pack(b"P", new[0], new[1]), key)
                live[new[0]] = live.get(new[0], 0) + new[2]
                live[old[0]] = live.get(old[0], 0) - old[2]
            self._finish(w, live, 0)
        except BaseException:
            w.abort()
            raise
        return live

    def truncate(self, log_id: int, length: int) -> int:
        """Recovery: forget every entry placed at or after ``length`` in entry log
        ``log_id`` or in a later log (the part of the entry logs recovery cuts);
        returns how many."""
        live: dict[int, int] = {}
        count = 0
        w = self.kv.write()
        try:
            for _, key in w.pop_range(_PKEY.pack(b"P", log_id, length), b"Q"):
                value = w.get(key)
                if value is None:
                    continue
                log, _, size = _LOC.unpack(value)
                w.delete(key)
                live[log] = live.get(log, 0) - size
                count -= 1
            self._finish(w, live, count)
        except BaseException:
            w.abort()
            raise
        finally:
            self._top.clear()  # (entries removed: read again from the KV)
        return -count

    def clear(self) -> None:
        """Recovery: empty the KV (one durable transaction) and start from nothing."""
        self.kv.clear()
        self.count = 0
        self._top.clear()

    def _finish(self, w: Any, live: dict[int, int], count: int) -> None:
        for log_id, delta in live.items():
            if delta:
                key = _LKEY.pack(b"L", log_id)
                value = w.get(key)
                total = (_I64.unpack(value)[0] if value is not None else 0) + delta
                if total:
                    w.put(key, _I64.pack(total))
                elif value is not None:
                    w.delete(key)
        total = self.count + count
        if count:
            w.put(_COUNT, _I64.pack(total))
        w.commit()
        self.count = total
