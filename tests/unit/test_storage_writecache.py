"""The on-disk index's write cache (:class:`WriteCacheKV`): against a dict model, a
failed flush, readers racing a writer and its flushes, and the storage's early
checkpoint when the cache passes its bound."""

from __future__ import annotations

import random
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncbk.bookie.storage import LedgerStorage
from asyncbk.bookie.storage import writecache as writecache_mod
from asyncbk.bookie.storage.kv import LmdbKV
from asyncbk.bookie.storage.writecache import WriteCacheKV
from asyncbk.config import BookieConfig
from asyncbk.errors import ConfigError
from asyncbk.testing.simkv import SimKVStore

KEY = b"master-key"


def _k(i: int) -> bytes:
    return b"k%03d" % i


# --- against a model ---------------------------------------------------------------

keys = st.integers(0, 25)
cache_ops = st.lists(st.one_of(
    st.tuples(st.just("put"), keys, st.binary(max_size=2)),
    st.tuples(st.just("swap"), keys, st.binary(max_size=2)),
    st.tuples(st.just("del"), keys),
    st.tuples(st.just("pop"), keys, keys),
    st.tuples(st.just("wget"), keys),
    st.tuples(st.just("commit")),
    st.tuples(st.just("abort")),
    st.tuples(st.just("get"), keys),
    st.tuples(st.just("range"), keys, keys, st.integers(0, 6), st.booleans()),
    st.tuples(st.just("freeze")),
    st.tuples(st.just("flush")),
    st.tuples(st.just("sync")),
), max_size=80)


def _model_range(model: dict[bytes, bytes], lo: bytes, hi: bytes, limit: int,
                 reverse: bool) -> list[tuple[bytes, bytes]]:
    out = sorted((k, v) for k, v in model.items() if lo <= k < hi)
    if reverse:
        out.reverse()
    return out[:limit] if limit else out


@settings(max_examples=300, deadline=None)
@given(cache_ops, st.sampled_from([1, 2, 3, 1024]), st.sampled_from([1, 3, 8, 16384]))
def test_the_cache_behaves_as_a_sorted_map(ops: list[tuple[Any, ...]], chunk: int,
                                           layer_keys: int) -> None:
    """Random transactions, reads (ranges with limits, reversed) and freezes / flushes
    at random points, with tiny range chunks (many rounds, tombstones hiding inner
    keys) and tiny layers (frozen by the commit that fills them): every answer is the
    model's, and a flush leaves in the inner KV exactly the state at the last freeze,
    one inner transaction per frozen layer."""
    saved = writecache_mod._CHUNK, writecache_mod._CHUNK_MAX
    writecache_mod._CHUNK, writecache_mod._CHUNK_MAX = chunk, max(chunk, 4)
    try:
        inner = SimKVStore(random.Random(0)).open()
        kv = WriteCacheKV(inner, entries_max=10, layer_keys_max=layer_keys)
        committed: dict[bytes, bytes] = {}
        frozen: dict[bytes, bytes] | None = None
        w = kv.write()
        txn = dict(committed)
        for op in ops:
            kind = op[0]
            if kind == "put":
                w.put(_k(op[1]), op[2])
                txn[_k(op[1])] = op[2]
            elif kind == "swap":
                assert w.swap(_k(op[1]), op[2]) == txn.get(_k(op[1]))
                txn[_k(op[1])] = op[2]
            elif kind == "del":
                w.delete(_k(op[1]))
                txn.pop(_k(op[1]), None)
            elif kind == "pop":
                lo, hi = _k(op[1]), _k(op[2])
                expect = _model_range(txn, lo, hi, 0, False)
                got = []
                for item in w.pop_range(lo, hi):
                    got.append(item)
                    w.put(b"zz", b"written between the items")  # as the index does
                    txn[b"zz"] = b"written between the items"
                assert got == expect
                for k, _ in expect:
                    del txn[k]
            elif kind == "wget":
                assert w.get(_k(op[1])) == txn.get(_k(op[1]))
            elif kind in ("commit", "abort"):
                if kind == "commit":
                    freezes = kv.freezes
                    w.commit()
                    committed = dict(txn)
                    if kv.freezes != freezes:  # the commit filled its layer
                        assert kv.current_entries == 0
                        frozen = dict(committed)
                else:
                    w.abort()
                w = kv.write()
                txn = dict(committed)
            elif kind == "get":
                assert kv.get(_k(op[1])) == committed.get(_k(op[1]))
            elif kind == "range":
                lo, hi = _k(op[1]), _k(op[2])
                assert kv.range(lo, hi, op[3], op[4]) == _model_range(committed, lo, hi,
                                                                      op[3], op[4])
            elif kind == "freeze":
                kv.freeze()
                frozen = dict(committed)
            elif kind == "flush":
                layers, flushes = len(kv._frozen), kv.flushes
                kv.flush()
                assert kv.flushes == flushes + layers and kv.frozen_entries == 0
                if frozen is not None:
                    assert dict(inner.range(b"", b"\xff")) == frozen
                    frozen = None
            else:
                kv.sync()
                frozen = None
                assert dict(inner.range(b"", b"\xff")) == committed
                assert kv.cached_entries == 0
            assert kv.over_limit == (kv.cached_entries > 10)
            assert kv.current_entries < layer_keys  # (a commit that fills it freezes it)
        w.commit()
        committed = txn
        assert kv.range(b"", b"\xff") == sorted(committed.items())
        assert kv.range(b"", b"\xff", 3, reverse=True) == sorted(committed.items())[::-1][:3]
        kv.sync()
        assert inner.range(b"", b"\xff") == sorted(committed.items())
    finally:
        writecache_mod._CHUNK, writecache_mod._CHUNK_MAX = saved


def test_limit_counts_live_items_past_many_tombstones() -> None:
    """A range whose first inner keys are all deleted in the cache still finds
    ``limit`` live ones (fetched from the inner KV round after round)."""
    inner = SimKVStore(random.Random(0)).open()
    kv = WriteCacheKV(inner)
    w = kv.write()
    for i in range(5000):
        w.put(b"k%05d" % i, b"v")
    w.commit()
    kv.sync()
    w = kv.write()
    for i in range(4990):
        w.delete(b"k%05d" % i)
    w.commit()
    assert kv.range(b"k", b"l", 3) == [(b"k%05d" % i, b"v") for i in (4990, 4991, 4992)]
    assert kv.range(b"k", b"l", 2, reverse=True) == [(b"k04999", b"v"), (b"k04998", b"v")]
    assert kv.range(b"k", b"k04990", 1) == [] and kv.get(b"k00007") is None
    assert len(kv.range(b"k", b"l")) == 10


def test_clear_empties_cache_and_inner() -> None:
    store = SimKVStore(random.Random(0))
    kv = WriteCacheKV(store.open())
    for value in (b"1", b"2"):
        w = kv.write()
        w.put(b"a", value)
        w.put(b"b" + value, value)
        w.commit()
        kv.sync() if value == b"1" else kv.freeze()
    kv.clear()
    assert kv.range(b"", b"\xff") == [] and kv.get(b"a") is None and kv.cached_entries == 0
    store.crash()  # the clear was durable
    assert store.open().range(b"", b"\xff") == []


# --- durability and a failed flush --------------------------------------------------


class _FailingFs:
    """What SimKVStore asks of a SimFileSystem: pending fsync failures."""

    def __init__(self) -> None:
        self.pending = 0
        self.fsync_failures = 0

    def take_fsync_failure(self) -> bool:
        if self.pending > 0:
            self.pending -= 1
            self.fsync_failures += 1
            return True
        return False


def test_a_flush_is_durable_across_a_crash() -> None:
    """Commit to the cache, sync: the inner KV's commit survives a crash (any draw)."""
    for seed in range(20):
        store = SimKVStore(random.Random(seed))
        kv = WriteCacheKV(store.open())
        w = kv.write()
        w.put(b"a", b"1")
        w.commit()
        kv.sync()
        w = kv.write()
        w.put(b"a", b"2")  # only in the cache: lost with the process
        w.commit()
        store.crash()
        assert WriteCacheKV(store.open()).get(b"a") == b"1"


def test_a_failed_flush_keeps_the_data_readable_and_raises() -> None:
    fs = _FailingFs()
    store = SimKVStore(random.Random(3), fs)
    kv = WriteCacheKV(store.open())
    w = kv.write()
    w.put(b"a", b"1")
    w.put(b"b", b"1")
    w.commit()
    kv.sync()
    w = kv.write()
    w.put(b"a", b"2")
    w.delete(b"b")
    w.commit()
    fs.pending = 1
    with pytest.raises(OSError):
        kv.sync()
    assert kv.get(b"a") == b"2" and kv.get(b"b") is None
    assert kv.range(b"", b"\xff") == [(b"a", b"2")]
    assert kv.cached_entries == 2  # the frozen overlay is kept
    w = kv.write()  # writes go on above it
    w.put(b"c", b"3")
    w.commit()
    assert kv.range(b"", b"\xff") == [(b"a", b"2"), (b"c", b"3")]
    kv.sync()  # a later flush writes both overlays
    assert kv.cached_entries == 0
    assert store.open().range(b"", b"\xff") == [(b"a", b"2"), (b"c", b"3")]


def test_an_inner_error_becomes_oserror(tmp_path: Path) -> None:
    """LMDB's own errors (a full map, say) surface as OSError, data kept."""
    inner = LmdbKV(tmp_path / "kv")

    class _Broken:
        def __init__(self, real: Any) -> None:
            self.real = real

        def put(self, key: bytes, value: bytes) -> None:
            raise inner._lmdb.MapFullError("full")

        def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
            raise inner._lmdb.MapFullError("full")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

    kv = WriteCacheKV(inner)
    w = kv.write()
    w.put(b"a", b"1")
    w.commit()
    real_write = inner.write
    inner.write = lambda: _Broken(real_write())  # type: ignore[method-assign]
    with pytest.raises(OSError, match="flush failed"):
        kv.sync()
    assert kv.get(b"a") == b"1"
    inner.write = real_write  # type: ignore[method-assign]
    kv.sync()
    assert inner.get(b"a") == b"1"
    kv.close()


# --- threads ----------------------------------------------------------------------------


def test_readers_see_only_whole_committed_transactions(tmp_path: Path) -> None:
    """A writer thread commits a, b, c = i and n<i> in each transaction (deleting
    n<i-50>) and syncs now and then, a flusher thread freezes and flushes; meanwhile
    reads on this thread: every value read is committed and never older than one
    read before, and a range sees one committed state (whole transactions)."""
    inner = LmdbKV(tmp_path / "kv")
    kv = WriteCacheKV(inner)
    n_txns = 3000
    done = threading.Event()
    errors: list[BaseException] = []
    committed = [-1]

    def writer() -> None:
        try:
            for i in range(n_txns):
                w = kv.write()
                for key in (b"a", b"b", b"c"):
                    w.put(key, b"%06d" % i)
                w.put(b"n%06d" % i, b"x")
                if i >= 50:
                    w.delete(b"n%06d" % (i - 50))
                w.commit()
                committed[0] = i
                if i % 97 == 0:
                    kv.sync()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            done.set()

    def flusher() -> None:
        try:
            while not done.is_set():
                kv.freeze()
                kv.flush()
        except BaseException as exc:
            errors.append(exc)

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    threads = [threading.Thread(target=writer), threading.Thread(target=flusher)]
    try:
        for t in threads:
            t.start()
        last = -1
        reads = 0
        while not done.is_set() or reads < 100:
            reads += 1
            top = committed[0]
            value = kv.get(b"a")
            seen = -1 if value is None else int(value)
            assert last <= seen, "a read went back in time"
            assert seen <= committed[0] + 1  # at most the commit being published
            last = seen
            items = kv.range(b"a", b"d")
            values = {v for _, v in items}
            assert len(items) in (0, 3) and len(values) <= 1, items
            if items:
                assert int(items[0][1]) >= top
            live = [int(k[1:]) for k, _ in kv.range(b"n", b"o")]  # one round: one state
            if live:
                assert live == list(range(max(0, live[-1] - 49), live[-1] + 1)), live
                assert live[-1] >= top
            back = kv.range(b"n", b"o", 1, reverse=True)
            assert back == [] or int(back[0][0][1:]) >= seen
    finally:
        for t in threads:
            t.join()
        sys.setswitchinterval(old_interval)
    assert not errors, errors
    kv.sync()
    assert inner.get(b"a") == b"%06d" % (n_txns - 1)
    assert len(inner.range(b"n", b"o")) == 50
    kv.close()


# --- in the storage ------------------------------------------------------------------------


def test_the_bound_is_validated() -> None:
    with pytest.raises(ConfigError):
        BookieConfig(index_write_cache_entries_max=0).validate()


async def test_index_reaches_lmdb_only_at_checkpoints(tmp_path: Path) -> None:
    config = BookieConfig(checkpoint_interval_s=3600.0, index_backend="lmdb")
    s = await LedgerStorage.open(tmp_path / "j", tmp_path / "l", config)
    try:
        cache = s._kv_cache
        assert cache is not None
        for e in range(20):
            await s.add_entry(1, e, KEY, b"body %d" % e)
        assert cache.inner.range(b"E", b"F") == []  # only in the write cache
        assert await s.read_entry(1, 19) == b"body 19"
        flushes = cache.flushes
        await s.checkpoint()
        assert cache.flushes == flushes + 1 and cache.cached_entries == 0
        assert len(cache.inner.range(b"E", b"F")) == 20
        assert await s.read_entry(1, 19) == b"body 19"
    finally:
        await s.close()


async def test_a_full_cache_starts_a_checkpoint_early(tmp_path: Path) -> None:
    """Past index_write_cache_entries_max keys the storage checkpoints on its own (one
    at a time), which keeps the cache near its bound; every entry reads back, also
    after a kill and a restart."""
    config = BookieConfig(checkpoint_interval_s=3600.0, index_backend="lmdb",
                          index_write_cache_entries_max=100)
    s = await LedgerStorage.open(tmp_path / "j", tmp_path / "l", config)
    try:
        for first in range(0, 1000, 20):
            await asyncio_gather([s.add_entry(ledger, e, KEY, b"%d/%d" % (ledger, e))
                                  for ledger in (1, 2) for e in range(first, first + 20)])
        stats = s.statistics()
        # (how often depends on the machine: one at a time, while batches go on)
        assert stats["checkpoints_early"] >= 2
        assert stats["checkpoints"] >= stats["checkpoints_early"]
        assert stats["index_cache_keys_max"] < 3000  # not the 4000 keys written
        for ledger in (1, 2):
            assert await s.read_entries(ledger, 0, 1000, 1 << 30) == [
                b"%d/%d" % (ledger, e) for e in range(1000)]
    finally:
        await s.abort()
    s = await LedgerStorage.open(tmp_path / "j", tmp_path / "l", config)
    try:
        for ledger in (1, 2):
            assert await s.read_entries(ledger, 0, 1000, 1 << 30) == [
                b"%d/%d" % (ledger, e) for e in range(1000)]
        assert s.statistics()["recovery"]["adds_replayed"] < 2000
    finally:
        await s.close()


async def asyncio_gather(futs: list[Any]) -> None:
    import asyncio
    await asyncio.gather(*futs)
