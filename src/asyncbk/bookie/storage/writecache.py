"""A write cache in front of the on-disk index: :class:`WriteCacheKV`, an
:class:`~.kv.IndexKV` over an inner one (LMDB; the simulator's SimKV), after
BookKeeper DbLedgerStorage's write cache.

Write transactions never touch the inner KV: a commit lands in an in-memory
*layer* (puts, and tombstones for deletions).  Once the current layer holds
``layer_keys_max`` keys (:data:`LAYER_KEYS_MAX`, about 1 MiB of LMDB pages) the
commit that filled it *freezes* it and a new empty layer takes the next
transactions; a checkpoint freezes it too, at its capture, so the frozen layers
hold exactly the batches its mark covers.  :meth:`WriteCacheKV.flush` (a worker
thread: in the background as layers freeze, and before a checkpoint is written)
then writes the frozen layers into the inner KV, oldest first, each as ONE inner
transaction committed durably (LMDB ``sync=True``) and synced, and drops each
only after that.  The inner KV thus always changes by whole journal batches, in
order, and each of its synced commits is small: a flush is never a burst of tens
of megabytes that the journal's fdatasyncs queue behind on a shared disk.

Reads merge, newest first: the commit being published (below), the current
layer, the frozen ones (newest first), then the inner KV; a tombstone hides the
older layers' key.

A layer is a dict (point reads, O(1)) and its keys, sorted lazily: the keys a
commit adds are appended unsorted, and sorted in (one merge of two sorted runs)
only when a range needs the order; a flush writes a layer in the order its keys
came (LMDB dirties the same pages either way).  No step works on more than a layer
(a range's sort) or :data:`_CHUNK` keys (a publication step, a flush's batch of
puts) while holding the GIL in one C call, so the loop never waits long.  (The
previous single overlay was a SortedDict merged into a dict and sorted at each
checkpoint's flush: 100 ms of CPU in one call for 200,000 keys, during which the
bookie's event loop could not run.)

Threads and visibility.  One lock guards the layers; it is held only for dict and
list operations on them (a point lookup; copying at most one chunk of a range;
one chunk of a commit; sorting a layer's new keys), never across an inner-KV call
or I/O.  A commit is *published* whole: the transaction's own writes are pushed as
the newest layer in one step, then merged into the current layer in chunks and
popped; while merging, that layer stays on top with the same values, so a reader
sees every op of a committed transaction or none of it.  A freeze waits for a
publication in progress (``_publish_lock``), so a frozen layer, and thus an inner
transaction, never holds part of a transaction.  A flush drops a frozen layer only
after the inner commit returned, so the layers plus the inner KV always hold every
committed write.  A range is read in rounds (up to 1024 keys of each layer: one
round unless the range is long or crosses many tombstones); a round copies the
layers' part under the lock, then reads the inner KV, and is taken again if a
flush started or ended meanwhile, so each round sees one committed state (a later
round may see a later one).  KVEntryIndex needs no more: the loop reads only ``E``
keys, an entry is acknowledged after its commit, and a deleted ledger is hidden
until its deletion is applied.

A flush that fails keeps the layer it was writing and those after it (reads still
see them; the next flush writes them again, idempotently) and raises OSError: the
storage then fails the journal, so no checkpoint covers what was not made durable.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from .kv import IndexKV

WRITE_CACHE_ENTRIES_MAX = 200_000
"""Default bound of the keys cached (every layer, tombstones included)."""
LAYER_KEYS_MAX = 16_384
"""Keys a layer takes before the commit that filled it freezes it for a flush: the
most one inner transaction writes but for a single larger commit (about 8,000
entries: some 1 MiB of LMDB pages, synced in one commit)."""
_CHUNK = 1024
"""Items a range fetches from each layer per round; keys merged per lock hold; puts
handed to the inner KV per call during a flush."""
_CHUNK_MAX = 65536
_FETCH_ATTEMPTS = 4
"""Tries at a consistent range round (a flush under way each time: take the last)."""
_MISSING = object()

Item = tuple[bytes, bytes | None]
"""A layer's item: ``(key, value)``; value None is a tombstone."""


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


class _Layer:
    """An ordered map of byte keys for a cache layer: values in a dict; the keys in a
    sorted list plus the keys added since it was last sorted (callers hold the cache's
    lock, except on a layer nobody else can see yet)."""

    __slots__ = ("data", "seq", "tombstones", "_sorted", "_unsorted")

    def __init__(self, data: dict[bytes, bytes | None] | None = None, seq: int = 0,
                 tombstones: int = 0) -> None:
        self.data: dict[bytes, bytes | None] = data if data is not None else {}
        self.seq = seq
        """Its place among the frozen layers (set at the freeze)."""
        self.tombstones = tombstones
        """At least the number of tombstones it holds (0: none, so a flush hands its
        items to the inner KV as they are)."""
        self._sorted: list[bytes] = []
        self._unsorted: list[bytes] = list(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def merge(self, items: dict[bytes, bytes | None], tombstones: int) -> None:
        """Put ``items`` (newer than what the layer holds; at most ``tombstones`` of
        them tombstones)."""
        self.tombstones += tombstones
        data = self.data
        self._unsorted.extend(set(items).difference(data))  # O(len(items)), in C
        data.update(items)

    def keys(self) -> list[bytes]:
        """Every key, sorted (the new keys are sorted in now: one merge of two runs)."""
        if self._unsorted:
            keys = self._sorted + self._unsorted
            keys.sort()
            self._sorted = keys
            self._unsorted = []
        return self._sorted

    def slice(self, lo: bytes, hi: bytes, n: int, reverse: bool) -> list[Item]:
        """At most ``n`` items of ``[lo, hi)`` in key order (``reverse``: from the end)."""
        if not self.data:
            return []
        keys = self.keys()
        i, j = bisect_left(keys, lo), bisect_left(keys, hi)
        chosen = keys[max(i, j - n):j][::-1] if reverse else keys[i:min(j, i + n)]
        data = self.data
        return [(key, data[key]) for key in chosen]


class _CacheWrite:
    """A write transaction: its own writes in a dict (sorted when a range needs them),
    published at commit."""

    __slots__ = ("_kv", "_own", "_done", "_deletes")

    def __init__(self, kv: WriteCacheKV) -> None:
        self._kv = kv
        self._own: dict[bytes, bytes | None] = {}
        self._done = False
        self._deletes = 0

    def get(self, key: bytes) -> bytes | None:
        own = self._own
        if key in own:
            return own[key]
        return self._kv.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._own[bytes(key)] = bytes(value)

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        self._own.update(items)

    def swap(self, key: bytes, value: bytes) -> bytes | None:
        old = self.get(key)
        self.put(key, value)
        return old

    def delete(self, key: bytes) -> None:
        self._own[bytes(key)] = None
        self._deletes += 1

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
            self._deletes += len(chunk)
            yield from chunk
            start = chunk[-1][0] + b"\x00"

    def commit(self) -> None:
        kv = self._kv
        self._done = True
        try:
            if self._own:
                kv._publish(self._own, self._deletes)
        finally:
            kv._writing = False

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._kv._writing = False


class WriteCacheKV:
    """:class:`~.kv.IndexKV` over ``inner`` (module docstring).  ``entries_max``: the
    keys cached (every layer) past which :attr:`over_limit` says a checkpoint is due
    (the storage starts one; this class never flushes by itself); ``layer_keys_max``:
    the size at which a commit freezes the current layer."""

    def __init__(self, inner: IndexKV, entries_max: int = WRITE_CACHE_ENTRIES_MAX,
                 layer_keys_max: int | None = None) -> None:
        self.inner = inner
        self.entries_max = entries_max
        self.layer_keys_max = (layer_keys_max if layer_keys_max is not None
                               else min(LAYER_KEYS_MAX, max(1, entries_max // 4)))
        """A commit that fills the current layer to this many keys freezes it (default:
        :data:`LAYER_KEYS_MAX`, or a quarter of a smaller ``entries_max``)."""
        self._lock = threading.Lock()
        """Guards the layers below (short dict and list operations only)."""
        self._publish_lock = threading.Lock()
        """Held by a commit's publication and by :meth:`freeze`."""
        self._flush_lock = threading.Lock()
        """One inner transaction (a layer's flush, or a clear) at a time."""
        self._publishing: _Layer | None = None
        self._current = _Layer()
        self._frozen: list[_Layer] = []
        """Frozen layers, oldest first, until a flush wrote them to the inner KV."""
        self._frozen_keys = 0
        self._frozen_seq = 0
        """Layers frozen so far (the last frozen layer's ``seq``)."""
        self._flush_gen = 0
        """Bumped when a flush starts writing the inner KV and when it is done."""
        self._writing = False
        self.commits = 0
        """Transactions committed with any write."""
        self.freezes = 0
        self.flushes = 0
        """Inner transactions written by flushes (one per frozen layer)."""
        self.flushed_keys = 0

    # --- sizes ---------------------------------------------------------------------

    @property
    def current_entries(self) -> int:
        """Keys (tombstones included) in the current layer."""
        return len(self._current)

    @property
    def frozen_entries(self) -> int:
        """Keys in the frozen layers: what the next flush writes."""
        return self._frozen_keys

    @property
    def cached_entries(self) -> int:
        """Keys in every layer (current and frozen)."""
        return len(self._current) + self._frozen_keys

    @property
    def over_limit(self) -> bool:
        """The layers hold more than ``entries_max`` keys."""
        return self.cached_entries > self.entries_max

    # --- reads -----------------------------------------------------------------------

    def _layers(self) -> list[_Layer]:
        """Newest first (call with the lock held)."""
        layers = [self._current, *reversed(self._frozen)]
        if self._publishing is not None:
            layers.insert(0, self._publishing)
        return layers

    def _fetch(self, lo: bytes, hi: bytes, n: int, reverse: bool) -> list[list[Any]]:
        """One round of a range: the layers' items under the lock, then the inner
        KV's.  Taken again if a flush started or ended meanwhile (it may have written
        newer commits than the layers copied into the inner KV), so a round is one
        consistent state; a flush already under way only writes a frozen layer,
        which the copy holds whole."""
        for _attempt in range(_FETCH_ATTEMPTS):
            with self._lock:
                gen = self._flush_gen
                layers: list[list[Any]] = [layer.slice(lo, hi, n, reverse)
                                           for layer in self._layers()]
            layers.append(self.inner.range(lo, hi, n, reverse))
            if self._flush_gen == gen:
                break
        return layers

    def get(self, key: bytes) -> bytes | None:
        with self._lock:
            for layer in self._layers():
                value = layer.data.get(key, _MISSING)
                if value is not _MISSING:
                    return value  # type: ignore[return-value]
        return self.inner.get(key)

    def range(self, start: bytes, end: bytes, limit: int = 0,
              reverse: bool = False) -> list[tuple[bytes, bytes]]:
        return _merged_range(self._fetch, start, end, limit, reverse)

    # --- writes ----------------------------------------------------------------------

    def write(self) -> _CacheWrite:
        assert not self._writing, "one write transaction at a time"
        self._writing = True
        return _CacheWrite(self)

    def _publish(self, own: dict[bytes, bytes | None], tombstones: int) -> None:
        """Make a committed transaction's writes visible at once, then merge them
        into the current layer a chunk per lock hold (module docstring); freeze the
        layer if that filled it."""
        with self._publish_lock:
            if len(own) <= _CHUNK:
                with self._lock:  # one step: no need to publish it apart
                    self._current.merge(own, tombstones)
            else:
                layer = _Layer(own, tombstones=tombstones)
                with self._lock:
                    self._publishing = layer
                try:
                    items = iter(own.items())
                    while chunk := dict(islice(items, _CHUNK)):
                        with self._lock:
                            self._current.merge(chunk, tombstones)
                            tombstones = 0
                finally:
                    with self._lock:
                        self._publishing = None
            self.commits += 1
            if len(self._current) >= self.layer_keys_max:
                self._freeze_locked()

    def freeze(self) -> None:
        """Start a new empty layer; the current one waits for :meth:`flush`.  On the
        writer thread at a checkpoint's capture, so the frozen layers hold exactly
        the commits the checkpoint's mark covers."""
        with self._publish_lock:
            self._freeze_locked()

    def _freeze_locked(self) -> None:
        """:meth:`freeze`, with the publication lock held."""
        with self._lock:
            layer = self._current
            if layer:
                self._frozen_seq += 1
                layer.seq = self._frozen_seq
                self._frozen.append(layer)
                self._frozen_keys += len(layer)
                self._current = _Layer()
                self.freezes += 1

    def flush(self) -> None:
        """Write the layers frozen so far into the inner KV, oldest first, one inner
        transaction (committed and synced) each, dropping each once written.  OSError
        if one fails (it and the later ones are kept)."""
        with self._lock:
            last = self._frozen_seq
        while True:
            with self._flush_lock:
                with self._lock:
                    if not self._frozen or self._frozen[0].seq > last:
                        return
                    layer = self._frozen[0]
                    self._flush_gen += 1
                try:
                    self._write_inner(layer.data, layer.tombstones)  # (frozen: no writes)
                finally:
                    with self._lock:
                        self._flush_gen += 1
                with self._lock:
                    del self._frozen[0]  # (only a flush drops one, under the flush lock)
                    self._frozen_keys -= len(layer)
                self.flushes += 1
                self.flushed_keys += len(layer)

    def _write_inner(self, data: dict[bytes, bytes | None], tombstones: int) -> None:
        """One inner transaction with ``data`` (``tombstones``: 0 if it has none),
        committed and synced; OSError if that fails (LMDB's own errors too).  In the
        order the keys came, not sorted: LMDB dirties the same pages either way, and a
        sort of a layer would hold the GIL (and so the loop) for milliseconds in one
        call."""
        try:
            w = self.inner.write()
            try:
                items = iter(data.items())
                while chunk := list(islice(items, _CHUNK)):
                    if not tombstones:
                        w.put_many(chunk)  # type: ignore[arg-type]
                        continue
                    puts: list[tuple[bytes, bytes]] = []
                    for key, value in chunk:
                        if value is None:
                            w.delete(key)
                        else:
                            puts.append((key, value))
                    w.put_many(puts)
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

    def sync(self) -> None:
        """Make every commit so far durable: :meth:`freeze`, then :meth:`flush`."""
        self.freeze()
        self.flush()

    def clear(self) -> None:
        """Delete everything: the layers, and the inner KV (cleared and synced at
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
                self._current = _Layer()
                self._frozen = []
                self._frozen_keys = 0
                self._flush_gen += 1

    def close(self) -> None:
        """Close the inner KV; what the layers held and no flush wrote is gone (as at
        a crash: the journal after the last checkpoint has it)."""
        self.inner.close()
