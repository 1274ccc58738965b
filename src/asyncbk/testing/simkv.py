"""An in-memory :class:`~asyncbk.bookie.storage.kv.IndexKV` with LMDB's crash
semantics, for the simulator (no files, no threads, deterministic).

:class:`SimKVStore` is one bookie's index "disk": it survives the bookie's crashes.
Commits are atomic and not durable; :meth:`SimKV.sync` makes every commit so far
durable.  :meth:`SimKVStore.crash` leaves the state of the last sync or of any later
commit, drawn from the seeded RNG: never a torn transaction.  With a
:class:`~asyncbk.testing.simfs.SimFileSystem` attached, a sync consumes its pending
fsync failures (:meth:`~asyncbk.testing.simfs.SimFileSystem.fail_fsyncs`): it raises
EIO and the commits since the last sync may or may not survive a crash, as after
any failed sync.

The storage runs it behind its real write cache
(:class:`~asyncbk.bookie.storage.writecache.WriteCacheKV`), which commits here only
when it flushes a frozen layer (in the background as layers fill, before each
checkpoint, in start-up work) and syncs right after each commit: commit plus sync is one LMDB commit with ``sync=True`` (durable once it
returned), and a sync that fails is such a commit failing in its fsync (its
transaction may or may not survive a crash; the cache keeps the data and the
storage fails the journal).  The draw among commits without a sync is kept for
direct users of the seam; the cache never leaves a commit unsynced on purpose.
"""

from __future__ import annotations

import bisect
import errno
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_DELETED = None


class SimKVStore:
    """The durable side: what the last sync kept, the commits since, the live state."""

    def __init__(self, rng: random.Random, fs: Any = None) -> None:
        self.rng = rng
        self.fs = fs
        self._synced: dict[bytes, bytes] = {}
        self._commits: list[dict[bytes, bytes | None]] = []
        self.data: dict[bytes, bytes] = {}
        self.keys: list[bytes] = []
        self._handle: SimKV | None = None
        self.crashes = 0
        self.syncs = 0

    def open(self, path: Path | None = None) -> SimKV:
        """A handle for a new process (the previous one is dead)."""
        if self._handle is not None:
            self._handle.alive = False
        self._handle = SimKV(self)
        return self._handle

    def crash(self) -> None:
        """The machine dies: keep the synced state plus a random prefix of the commits."""
        self.crashes += 1
        if self._handle is not None:
            self._handle.alive = False
            self._handle = None
        keep = self.rng.randint(0, len(self._commits))
        state = dict(self._synced)
        for changes in self._commits[:keep]:
            _apply(state, changes)
        self._synced = state
        self._commits = []
        self.data = dict(state)
        self.keys = sorted(state)

    def _commit(self, changes: dict[bytes, bytes | None]) -> None:
        self._commits.append(changes)
        data, keys = self.data, self.keys
        for key, value in changes.items():
            if value is None:
                if data.pop(key, None) is not None:
                    del keys[bisect.bisect_left(keys, key)]
            else:
                if key not in data:
                    bisect.insort(keys, key)
                data[key] = value

    def _sync(self) -> None:
        fs = self.fs
        if fs is not None and fs.take_fsync_failure():
            raise OSError(errno.EIO, "sim: index sync failed")
        self.syncs += 1
        for changes in self._commits:
            _apply(self._synced, changes)
        self._commits = []


def _apply(state: dict[bytes, bytes], changes: dict[bytes, bytes | None]) -> None:
    for key, value in changes.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value


class _SimWrite:
    def __init__(self, kv: SimKV) -> None:
        self._kv = kv
        self._changes: dict[bytes, bytes | None] = {}

    def get(self, key: bytes) -> bytes | None:
        if key in self._changes:
            return self._changes[key]
        return self._kv.store.data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._changes[key] = bytes(value)

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        for key, value in items:
            self.put(key, value)

    def swap(self, key: bytes, value: bytes) -> bytes | None:
        old = self.get(key)
        self.put(key, value)
        return old

    def delete(self, key: bytes) -> None:
        self._changes[key] = _DELETED

    def pop_range(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        store = self._kv.store
        keys = store.keys[bisect.bisect_left(store.keys, start):bisect.bisect_left(store.keys, end)]
        keys = sorted(set(keys) | {k for k in self._changes if start <= k < end})
        for key in keys:
            value = self.get(key)
            if value is not None:
                self._changes[key] = _DELETED
                yield key, value

    def commit(self) -> None:
        self._kv.check()
        self._kv.store._commit(self._changes)
        self._kv.writing = False

    def abort(self) -> None:
        self._kv.writing = False


class SimKV:
    """A process's handle on a :class:`SimKVStore` (dead after a crash)."""

    def __init__(self, store: SimKVStore) -> None:
        self.store = store
        self.alive = True
        self.writing = False

    def check(self) -> None:
        if not self.alive:
            raise OSError(errno.EIO, "sim: the machine crashed")

    def get(self, key: bytes) -> bytes | None:
        self.check()
        return self.store.data.get(key)

    def range(self, start: bytes, end: bytes, limit: int = 0,
              reverse: bool = False) -> list[tuple[bytes, bytes]]:
        self.check()
        keys, data = self.store.keys, self.store.data
        lo, hi = bisect.bisect_left(keys, start), bisect.bisect_left(keys, end)
        chosen = keys[lo:hi]
        if reverse:
            chosen = chosen[::-1]
        if limit:
            chosen = chosen[:limit]
        return [(k, data[k]) for k in chosen]

    def write(self) -> _SimWrite:
        self.check()
        assert not self.writing, "one write transaction at a time"
        self.writing = True
        return _SimWrite(self)

    def clear(self) -> None:
        w = self.write()
        for key in list(self.store.keys):
            w.delete(key)
        w.commit()

    def sync(self) -> None:
        self.check()
        self.store._sync()

    def close(self) -> None:
        self.alive = False
