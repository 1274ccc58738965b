"""The ordered key-value seam under :class:`~.kvindex.KVEntryIndex`, and its real
implementation on LMDB.

:class:`IndexKV` is a sorted map of byte keys with atomic write transactions:
readers (any thread) see the last committed state; one writer at a time opens a
:class:`KVWrite`, which reads its own writes, and commits it.  A commit is atomic;
:meth:`IndexKV.sync` makes every commit so far durable.  After a crash the state is
that of the last sync or of any commit after it, never a torn transaction.

The storage puts a :class:`~.writecache.WriteCacheKV` in front of the LMDB one:
the journal's batches commit to the cache's in-memory layers, and the LMDB
environment sees one write transaction per frozen layer (a few thousand entries'
worth, written in the background and before each checkpoint, plus start-up work).  :class:`LmdbKV` therefore commits durably: ``sync=True,
metasync=True`` (LMDB writes and fsyncs the data pages, then writes and fsyncs
the meta page), never ``writemap``, so a committed transaction survives a power
cut whole and the B-tree never depends on the file system's write order.  The
simulator's :class:`~asyncbk.testing.simkv.SimKV` models it as a commit followed
at once by a sync.

The write side is a transaction object rather than a bare ``put_batch`` because
the index reads inside it (the location an entry had, to keep the live bytes of
each entry log exact) and must see its own earlier writes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from ...config import require_lmdb
from ...errors import BookieIOError

LMDB_DIR = "index.lmdb"
_POP_CHUNK = 1024
LMDB_MAP_BYTES = 1 << 40
"""Address space reserved for the index (virtual: the file grows as it fills)."""


class KVWrite(Protocol):
    """One write transaction (one thread); reads see its own writes."""

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        """:meth:`put` of each item, in order (one call: LMDB runs the loop in C)."""
        ...

    def swap(self, key: bytes, value: bytes) -> bytes | None:
        """Put; returns the value it replaced."""
        ...

    def delete(self, key: bytes) -> None: ...

    def pop_range(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Delete the keys in ``[start, end)``, yielding each item as it goes."""
        ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...


class IndexKV(Protocol):
    """An ordered, transactional byte map (module docstring)."""

    def get(self, key: bytes) -> bytes | None:
        """The committed value of ``key``."""
        ...

    def range(self, start: bytes, end: bytes, limit: int = 0,
              reverse: bool = False) -> list[tuple[bytes, bytes]]:
        """Committed items with ``start <= key < end``, in key order (``reverse``:
        from the end), at most ``limit`` (0: all)."""
        ...

    def write(self) -> KVWrite:
        """Begin the write transaction (one at a time)."""
        ...

    def clear(self) -> None:
        """Delete everything (one committed transaction)."""
        ...

    def sync(self) -> None:
        """Make every commit so far durable (OSError if that fails)."""
        ...

    def close(self) -> None: ...


class _LmdbWrite:
    __slots__ = ("_txn",)

    def __init__(self, txn: object) -> None:
        self._txn = txn

    def get(self, key: bytes) -> bytes | None:
        return self._txn.get(key)  # type: ignore[attr-defined]

    def put(self, key: bytes, value: bytes) -> None:
        self._txn.put(key, value)  # type: ignore[attr-defined]

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        if items:
            self._txn.cursor().putmulti(  # type: ignore[attr-defined]
                items, dupdata=False, overwrite=True)

    def swap(self, key: bytes, value: bytes) -> bytes | None:
        return self._txn.replace(key, value)  # type: ignore[attr-defined]

    def delete(self, key: bytes) -> None:
        self._txn.delete(key)  # type: ignore[attr-defined]

    def pop_range(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        # In chunks, re-seeking each time: the caller writes between items, which
        # would leave a cursor held across the yields unpositioned.
        txn: Any = self._txn
        while True:
            chunk: list[tuple[bytes, bytes]] = []
            cursor = txn.cursor()
            if cursor.set_range(start):
                for key, value in cursor.iternext():
                    if key >= end:
                        break
                    chunk.append((key, value))
                    if len(chunk) >= _POP_CHUNK:
                        break
            if not chunk:
                return
            for key, _ in chunk:
                txn.delete(key)
            yield from chunk
            start = chunk[-1][0]

    def commit(self) -> None:
        self._txn.commit()  # type: ignore[attr-defined]

    def abort(self) -> None:
        self._txn.abort()  # type: ignore[attr-defined]


class LmdbKV:
    """:class:`IndexKV` on one LMDB environment: every commit durable (``sync=True,
    metasync=True``; module docstring); :meth:`sync` is ``env.sync(True)``; never
    ``writemap``, which can tear the file on a crash.  The map is
    :data:`LMDB_MAP_BYTES` of address space, so it never fills in practice; if it
    does, the write fails (and with it the checkpoint, and the journal)."""

    def __init__(self, path: Path) -> None:
        require_lmdb()  # a ConfigError naming the extra, not an ImportError's traceback
        import lmdb  # optional dependency: only a bookie with index_backend = "lmdb"

        self._lmdb = lmdb
        os.makedirs(path, exist_ok=True)
        try:
            self._env = lmdb.open(str(path), map_size=LMDB_MAP_BYTES, subdir=True,
                                  sync=True, metasync=True, readahead=False,
                                  max_dbs=0, max_readers=256)
        except lmdb.Error as exc:
            raise BookieIOError(f"cannot open the index {path}: {exc}") from exc

    def get(self, key: bytes) -> bytes | None:
        with self._env.begin() as txn:
            return txn.get(key)

    def range(self, start: bytes, end: bytes, limit: int = 0,
              reverse: bool = False) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        with self._env.begin() as txn:
            cursor = txn.cursor()
            if reverse:
                ok = cursor.set_range(end)
                ok = cursor.prev() if ok else cursor.last()
                while ok:
                    key = cursor.key()
                    if key < start:
                        break
                    out.append((key, cursor.value()))
                    if len(out) == limit:
                        break
                    ok = cursor.prev()
            else:
                ok = cursor.set_range(start)
                while ok:
                    key = cursor.key()
                    if key >= end:
                        break
                    out.append((key, cursor.value()))
                    if len(out) == limit:
                        break
                    ok = cursor.next()
        return out

    def write(self) -> KVWrite:
        return _LmdbWrite(self._env.begin(write=True))

    def clear(self) -> None:
        with self._env.begin(write=True) as txn:
            txn.drop(self._env.open_db(), delete=False)

    def sync(self) -> None:
        try:
            self._env.sync(True)
        except self._lmdb.Error as exc:
            raise OSError(f"lmdb sync failed: {exc}") from exc

    def close(self) -> None:
        self._env.close()


def open_lmdb(path: Path) -> IndexKV:
    return LmdbKV(path)
