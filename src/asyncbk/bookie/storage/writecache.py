"""A write cache in front of the on-disk index: :class:`WriteCacheKV`, an
:class:`~.kv.IndexKV` over an inner one (LMDB; the simulator's SimKV), after
BookKeeper DbLedgerStorage's write cache.

Write transactions never touch the inner KV: a commit lands in an in-memory
ordered *overlay* (puts, and tombstones for deletions).  At a checkpoint the
overlay is *frozen* (:meth:`WriteCacheKV.freeze`, on the writer thread at the
checkpoint's capture, so it holds exactly the batches the mark covers) and a new
empty one takes the writes; :meth:`WriteCacheKV.flush` (the checkpoint's thread)
then writes the frozen overlays into the inner KV as ONE inner transaction,
committed durably (LMDB ``sync=True``) and synced, and only then drops them.  The
inner KV thus changes once per checkpoint, always by whole journal batches.

Reads merge, newest first: the commit being published (below), the current
overlay, the frozen ones (newest first), then the inner KV; a tombstone hides the
older layers' key.

Threads and visibility.  One lock guards the layers; it is held only for dict
operations on them (a point lookup; copying at most one chunk of a range; one
chunk of a commit), never across an inner-KV call or I/O.  A commit is *published*
whole: the transaction's own writes (an ordered map, built without the lock) are
pushed as the newest layer in one step, then merged into the current overlay in
chunks and popped; while merging, that layer stays on top with the same values,
so a reader sees every op of a committed transaction or none of it.  A freeze
waits for a publication in progress (``_publish``), so a frozen overlay, and thus
a flush, never holds part of a transaction.  A flush drops the frozen overlays
only after the inner commit returned, so the overlays plus the inner KV always
hold every committed write.  A range is read in rounds (up to 1024 keys of each
layer: one round unless the range is long or crosses many tombstones); a round
copies the overlays' part under the lock, then reads the inner KV, and is taken
again if a flush started meanwhile, so each round sees one committed state (a
later round may see a later one).  KVEntryIndex needs no more: the loop reads only
``E`` keys, an entry is acknowledged after its commit, and a deleted ledger is
hidden until its deletion is applied.

A flush that fails keeps the frozen overlays (reads still see them; the next flush
writes them again, idempotently) and raises OSError: the storage then fails the
journal, so no checkpoint covers what was not made durable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from sortedcontainers import SortedDict  # type: ignore[import-untyped]

from .kv import IndexKV

WRITE_CACHE_ENTRIES_MAX = 200_000
"""Default bound of the current overlay (keys, tombstones included)."""
_CHUNK = 1024
"""Items a range fetches from each layer per round; keys merged per lock hold."""
_CHUNK_MAX = 65536
_FETCH_ATTEMPTS = 4
"""Tries at a consistent range round (a flush under way each time: take the last)."""
_MISSING = object()

Item = tuple[bytes, bytes | None]
"""An overlay item: ``(key, value)``; value None is a tombstone."""


def _merged_range(fetch: Callable[[bytes, bytes, int, bool], list[list[Any]]],
                  start: bytes, end: bytes, limit: int, reverse: bool
                  ) -> list[tuple[bytes, bytes]]:
    """The live items of ``[start, end)``, at most ``limit`` (0: all), over layers
    (``fetch``: at most n items of each, newest layer first, the inner KV last).
    Fetched in rounds: a layer that returned n items may have more after its last
    one, so a round only settles keys up to the nearest such last key."""
    out: list[tuple[bytes, bytes]] = []
    n = limit if 0 < limit < _CHUNK else _CHUNK
    lo, hi = start, end
    while lo < hi:
        layers = fetch(lo, hi, n, reverse)
        horizon: bytes | None = None
        for items in layers:
            if len(items) >= n:
                last = items[n - 1][0]
                if horizon is None or (last > horizon if reverse else last < horizon):
                    horizon = last
        nonempty = [items for items in layers if items]
        if len(nonempty) <= 1:  # (the common case: nothing cached there) in order already
            pairs: list[Any] = nonempty[0] if nonempty else []
        else:
            merged: dict[bytes, bytes | None] = {}
            for items in reversed(layers):  # oldest first: newer layers overwrite
                for key, value in items:
                    if horizon is None or (key >= horizon if reverse else key <= horizon):
                        merged[key] = value
            pairs = sorted(merged.items(), reverse=reverse)
        for key, value in pairs:
            if value is not None:
                out.append((key, value))
                if len(out) == limit:
                    return out
        if horizon is None:
            return out
        if reverse:
            hi = horizon
        else:
            lo = horizon + b"\x00"
        n = min(n * 4, _CHUNK_MAX)
    return out


def _slice(layer: SortedDict, lo: bytes, hi: bytes, n: int, reverse: bool) -> list[Item]:
    if not layer:
        return []
    keys = islice(layer.irange(lo, hi, (True, False), reverse), n)
    return [(key, layer[key]) for key in keys]


class _CacheWrite:
    """A write transaction: its own writes in a dict (sorted when a range needs them
    and at commit), published at commit."""

    __slots__ = ("_kv", "_own", "_done")

    def __init__(self, kv: WriteCacheKV) -> None:
        self._kv = kv
        self._own: dict[bytes, bytes | None] = {}
        self._done = False

    def get(self, key: bytes) -> bytes | None:
        own = self._own
        if key in own:
            return own[key]
        return self._kv.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._own[bytes(key)] = bytes(value)

    def swap(self, key: bytes, value: bytes) -> bytes | None:
        old = self.get(key)
        self.put(key, value)
        return old

    def delete(self, key: bytes) -> None:
        self._own[bytes(key)] = None

    def _fetch(self, lo: bytes, hi: bytes, n: int, reverse: bool) -> list[list[Any]]:
        own = sorted((k, v) for k, v in self._own.items() if lo <= k < hi)  # (rare: pops)
        if reverse:
            own.reverse()
        return [own[:n], *self._kv._fetch(lo, hi, n, reverse)]

    def pop_range(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        while True:
            chunk = _merged_range(self._fetch, start, end, _CHUNK, False)
            if not chunk:
                return
            own = self._own
            for key, _ in chunk:
                own[key] = None
            yield from chunk
            start = chunk[-1][0] + b"\x00"

    def commit(self) -> None:
        kv = self._kv
        self._done = True
        try:
            if self._own:
                kv._publish(SortedDict(self._own))
        finally:
            kv._writing = False

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._kv._writing = False


class WriteCacheKV:
    """:class:`~.kv.IndexKV` over ``inner`` (module docstring).  ``entries_max``: the
    size of the current overlay past which :attr:`over_limit` says a checkpoint is
    due (the storage starts one; this class does not flush by itself)."""

    def __init__(self, inner: IndexKV, entries_max: int = WRITE_CACHE_ENTRIES_MAX) -> None:
        self.inner = inner
        self.entries_max = entries_max
        self._lock = threading.Lock()
        """Guards the layers below (short dict operations only)."""
        self._publish_lock = threading.Lock()
        """Held by a commit's publication and by :meth:`freeze`."""
        self._flush_lock = threading.Lock()
        """One flush (or clear) of the inner KV at a time."""
        self._publishing: SortedDict | None = None
        self._current: SortedDict = SortedDict()
        self._frozen: list[SortedDict] = []
        """Frozen overlays, oldest first, until a flush wrote them to the inner KV."""
        self._flush_gen = 0
        """Bumped when a flush starts writing the inner KV and when it is done."""
        self._writing = False
        self.flushes = 0
        self.flushed_keys = 0

    # --- sizes ---------------------------------------------------------------------

    @property
    def current_entries(self) -> int:
        """Keys (tombstones included) in the current overlay."""
        return len(self._current)

    @property
    def cached_entries(self) -> int:
        """Keys in every overlay (current and frozen)."""
        with self._lock:
            return len(self._current) + sum(len(layer) for layer in self._frozen)

    @property
    def over_limit(self) -> bool:
        """The current overlay holds more than ``entries_max`` keys."""
        return len(self._current) > self.entries_max

    # --- reads -----------------------------------------------------------------------

    def _layers(self) -> list[SortedDict]:
        """Newest first (call with the lock held)."""
        layers = [self._current, *reversed(self._frozen)]
        if self._publishing is not None:
            layers.insert(0, self._publishing)
        return layers

    def _fetch(self, lo: bytes, hi: bytes, n: int, reverse: bool) -> list[list[Any]]:
        """One round of a range: the layers' items under the lock, then the inner
        KV's.  Taken again if a flush started meanwhile (it may have written newer
        commits than the overlays copied into the inner KV), so a round is one
        consistent state; a flush already under way only writes frozen overlays,
        which the copy holds whole."""
        for _attempt in range(_FETCH_ATTEMPTS):
            with self._lock:
                gen = self._flush_gen
                layers: list[list[Any]] = [_slice(layer, lo, hi, n, reverse)
                                           for layer in self._layers()]
            layers.append(self.inner.range(lo, hi, n, reverse))
            if self._flush_gen == gen:
                break
        return layers

    def get(self, key: bytes) -> bytes | None:
        with self._lock:
            if self._publishing is not None:
                value = self._publishing.get(key, _MISSING)
                if value is not _MISSING:
                    return value
            value = self._current.get(key, _MISSING)
            if value is not _MISSING:
                return value
            for layer in reversed(self._frozen):
                value = layer.get(key, _MISSING)
                if value is not _MISSING:
                    return value
        return self.inner.get(key)

    def range(self, start: bytes, end: bytes, limit: int = 0,
              reverse: bool = False) -> list[tuple[bytes, bytes]]:
        return _merged_range(self._fetch, start, end, limit, reverse)

    # --- writes ----------------------------------------------------------------------

    def write(self) -> _CacheWrite:
        assert not self._writing, "one write transaction at a time"
        self._writing = True
        return _CacheWrite(self)

    def _publish(self, own: SortedDict) -> None:
        """Make a committed transaction's writes visible at once, then merge them
        into the current overlay a chunk per lock hold (module docstring)."""
        with self._publish_lock:
            with self._lock:
                self._publishing = own
            items = list(own.items())
            try:
                for i in range(0, len(items), _CHUNK):
                    with self._lock:
                        current = self._current
                        for key, value in items[i:i + _CHUNK]:
                            current[key] = value
            finally:
                with self._lock:
                    self._publishing = None

    def freeze(self) -> None:
        """Start a new empty overlay; the current one waits for :meth:`flush`.  On the
        writer thread at a checkpoint's capture, so it holds exactly the commits
        the checkpoint's mark covers."""
        with self._publish_lock, self._lock:
            if self._current:
                self._frozen.append(self._current)
                self._current = SortedDict()

    def flush(self) -> None:
        """Write every frozen overlay into the inner KV (one transaction, committed
        and synced), then drop them.  OSError if that fails (they are kept)."""
        with self._flush_lock:
            with self._lock:
                layers = list(self._frozen)
                if not layers:
                    return
                self._flush_gen += 1
            merged: dict[bytes, bytes | None] = {}
            for layer in layers:  # oldest first (frozen: nobody writes to them)
                merged.update(layer)
            try:
                w = self.inner.write()
                try:
                    for key in sorted(merged):
                        value = merged[key]
                        if value is None:
                            w.delete(key)
                        else:
                            w.put(key, value)
                    w.commit()
                except BaseException:
                    try:
                        w.abort()
                    except Exception:  # the commit's own error is the one to report
                        pass
                    raise
                self.inner.sync()
            except OSError:
                raise
            except Exception as exc:  # LMDB's own errors
                raise OSError(f"index write cache flush failed: {exc!r}") from exc
            with self._lock:
                del self._frozen[:len(layers)]
                self._flush_gen += 1
            self.flushes += 1
            self.flushed_keys += len(merged)

    def sync(self) -> None:
        """Make every commit so far durable: :meth:`freeze`, then :meth:`flush`."""
        self.freeze()
        self.flush()

    def clear(self) -> None:
        """Delete everything: the overlays, and the inner KV (cleared and synced at
        once).  At start-up only (no reads or writes meanwhile)."""
        with self._flush_lock:
            try:
                self.inner.clear()
                self.inner.sync()
            except OSError:
                raise
            except Exception as exc:
                raise OSError(f"index clear failed: {exc!r}") from exc
            with self._publish_lock, self._lock:
                self._current = SortedDict()
                self._frozen = []
                self._flush_gen += 1

    def close(self) -> None:
        """Close the inner KV; what the overlays held and no flush wrote is gone (as
        at a crash: the journal after the last checkpoint has it)."""
        self.inner.close()
