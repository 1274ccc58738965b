"""The entry index backends: the on-disk one (LMDB, and the simulator's SimKV), the
re-created-ledger replay, the migration from index.log and the refusal back."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncbk.bookie.storage import INDEX_RECORD, LedgerStorage, read_checkpoint
from asyncbk.bookie.storage import ledger_storage as ledger_storage_mod
from asyncbk.bookie.storage.index import deletion_marker, index_log_ops
from asyncbk.bookie.storage.kv import LmdbKV
from asyncbk.bookie.storage.kvindex import KVEntryIndex
from asyncbk.config import BookieConfig
from asyncbk.errors import BookieIOError, ConfigError, NoSuchEntryError, NoSuchLedgerError
from asyncbk.testing.simkv import SimKVStore

KEY = b"master-key"


def config(backend: str, **kw: Any) -> BookieConfig:
    return BookieConfig(checkpoint_interval_s=3600.0, index_backend=backend,
                        entry_log_bytes_max=4000, journal_file_bytes_max=3000, **kw)


async def open_storage(root: Path, backend: str) -> LedgerStorage:
    return await LedgerStorage.open(root / "journal", root / "ledgers", config(backend))


def body(ledger_id: int, entry_id: int, gen: int = 0) -> bytes:
    return f"{gen}:{ledger_id}/{entry_id}|".encode() * (1 + (ledger_id * 7 + entry_id) % 30)


async def add(s: LedgerStorage, ledger_id: int, entry_ids: range, gen: int = 0) -> None:
    for e in entry_ids:
        await s.add_entry(ledger_id, e, KEY, body(ledger_id, e, gen))


# --- the re-created ledger ------------------------------------------------------------


@pytest.mark.parametrize("backend", ["memory", "lmdb"])
@pytest.mark.parametrize("checkpoint_between", [False, True])
async def test_a_re_created_ledger_never_gets_its_old_entries_back(
        tmp_path: Path, backend: str, checkpoint_between: bool) -> None:
    """Deleted (GC), re-created with the same id and fewer entries, crashed: the old
    entries stay gone (memory: index.log's deletion marker; lmdb: the replayed
    deletion)."""
    s = await open_storage(tmp_path, backend)
    await add(s, 7, range(10))
    await s.checkpoint()  # the old entries are in index.log / the synced index
    await s.delete_ledger(7)
    if checkpoint_between:
        await s.checkpoint()
    await add(s, 7, range(3), gen=1)
    await s.abort()
    for _ in range(2):  # the crash, then a clean reopen
        s = await open_storage(tmp_path, backend)
        try:
            assert s.entry_ids(7) == [0, 1, 2]
            assert s.ledger(7).last_entry_id == 2  # type: ignore[union-attr]
            for e in range(3):
                assert await s.read_entry(7, e) == body(7, e, 1)
            with pytest.raises(NoSuchEntryError):
                await s.read_entry(7, 5)
        finally:
            await s.close()


@pytest.mark.parametrize("backend", ["memory", "lmdb"])
async def test_re_created_while_the_deletion_is_in_flight(tmp_path: Path, backend: str) -> None:
    """Delete and re-create without waiting: the old adds' results reach the loop after
    the re-creation and must not land in the new ledger."""
    s = await open_storage(tmp_path, backend)
    try:
        olds = [s.add_entry(3, e, KEY, body(3, e)) for e in range(5)]
        deleted = s.delete_ledger(3)
        news = [s.add_entry(3, e, KEY, body(3, e, 1)) for e in range(2)]
        for f in [*olds, deleted, *news]:
            await f
        assert s.entry_ids(3) == [0, 1]
        assert s.ledger(3).last_entry_id == 1  # type: ignore[union-attr]
        assert await s.read_entry(3, 1) == body(3, 1, 1)
    finally:
        await s.close()


def index_log(root: Path) -> list[tuple[int, ...]]:
    return list(INDEX_RECORD.iter_unpack((root / "ledgers" / "index.log").read_bytes()))


MARKER_7 = (7, -1, 0, 0, 0)


async def test_index_log_gets_a_deletion_marker_only_when_a_deleted_id_returns(
        tmp_path: Path) -> None:
    """A deletion alone writes nothing to index.log (the format of earlier versions);
    the re-created ledger's first record is preceded by the marker, once."""
    s = await open_storage(tmp_path, "memory")
    await add(s, 7, range(4))
    await add(s, 8, range(2))
    await s.delete_ledger(7)
    await s.delete_ledger(8)
    await s.checkpoint()
    assert [r[:2] for r in index_log(tmp_path)] == [(7, e) for e in range(4)] + [(8, 0), (8, 1)]
    await add(s, 7, range(2), gen=1)
    await add(s, 7, range(2, 3), gen=1)
    await s.close()
    records = index_log(tmp_path)
    assert records[6] == MARKER_7 and records.count(MARKER_7) == 1
    assert [r[:2] for r in records[7:]] == [(7, 0), (7, 1), (7, 2)]
    assert read_checkpoint(tmp_path / "ledgers")["index_length"] == 10 * INDEX_RECORD.size  # type: ignore[index]


@pytest.mark.parametrize("crash", [False, True])
async def test_re_created_after_a_restart(tmp_path: Path, crash: bool) -> None:
    """The deletion is behind a checkpoint and a restart (as with an index.log written
    by an earlier version, which has no markers): the re-creation still gets one."""
    s = await open_storage(tmp_path, "memory")
    await add(s, 7, range(10))
    await s.delete_ledger(7)
    await s.close()
    assert MARKER_7 not in index_log(tmp_path)
    s = await open_storage(tmp_path, "memory")
    assert s.statistics()["recovery"]["deleted_ledgers_dropped"] == 1
    await add(s, 7, range(3), gen=1)
    await (s.abort() if crash else s.close())
    for _ in range(2):
        s = await open_storage(tmp_path, "memory")
        try:
            assert s.entry_ids(7) == [0, 1, 2]
            assert await s.read_entry(7, 2) == body(7, 2, 1)
        finally:
            await s.close()
    assert index_log(tmp_path).count(MARKER_7) == 1


@pytest.mark.parametrize("backend", ["memory", "lmdb"])
async def test_re_created_by_a_fence_alone(tmp_path: Path, backend: str) -> None:
    """Re-created without an add (a fence registers it): no old entry either."""
    s = await open_storage(tmp_path, backend)
    await add(s, 7, range(5))
    await s.checkpoint()
    await s.delete_ledger(7)
    await s.checkpoint()
    await s.fence(7, KEY)
    await s.checkpoint()
    await s.abort()
    s = await open_storage(tmp_path, backend)
    try:
        assert s.entry_ids(7) == []
        assert s.ledger(7).last_entry_id == -1  # type: ignore[union-attr]
        assert s.ledger(7).fenced  # type: ignore[union-attr]
        with pytest.raises(NoSuchEntryError):
            await s.read_entry(7, 0)
    finally:
        await s.close()


def test_index_log_ops_read_a_deletion_marker_and_refuse_near_misses() -> None:
    put = INDEX_RECORD.pack(7, 0, 0, 0, 40)
    ops = list(index_log_ops(put + deletion_marker(7) + INDEX_RECORD.pack(7, 1, 0, 40, 40), 0))
    assert ops == [("put", 7, 0, (0, 0, 40)), ("del", 7), ("put", 7, 1, (0, 40, 40))]
    for bad in [(-7, -1, 0, 0, 0), (7, -1, 0, 0, 40), (7, -1, 1, 0, 0), (7, -1, 0, 8, 0),
                (7, -2, 0, 0, 0)]:
        with pytest.raises(BookieIOError, match="record 1 is corrupt"):
            list(index_log_ops(put + INDEX_RECORD.pack(*bad), 1))


# --- migration and refusal --------------------------------------------------------------


async def _write_memory_bookie(root: Path) -> dict[tuple[int, int], bytes]:
    """A bookie data dir written by the memory backend: several ledgers, overwrites, a
    deletion, entry log rotations, a checkpoint in the middle and a journal tail."""
    s = await open_storage(root, "memory")
    expected: dict[tuple[int, int], bytes] = {}
    for ledger_id in (1, 2, 3):
        await add(s, ledger_id, range(20))
        expected.update({(ledger_id, e): body(ledger_id, e) for e in range(20)})
    await s.delete_ledger(2)
    expected = {k: v for k, v in expected.items() if k[0] != 2}
    await s.checkpoint()
    await add(s, 1, range(20, 30))
    await add(s, 3, range(5), gen=1)  # overwrites
    expected.update({(1, e): body(1, e) for e in range(20, 30)})
    expected.update({(3, e): body(3, e, 1) for e in range(5)})
    await s.abort()  # no final checkpoint: the migration replays a journal tail too
    assert (root / "ledgers" / "index.log").exists()
    return expected


async def _check_all(s: LedgerStorage, expected: dict[tuple[int, int], bytes]) -> None:
    for (ledger_id, entry_id), data in expected.items():
        assert await s.read_entry(ledger_id, entry_id) == data
    assert sorted(s.ledger_ids()) == [1, 3]
    with pytest.raises(NoSuchLedgerError):
        await s.read_entry(2, 0)
    assert s.statistics()["entries"] == len(expected)


async def test_migration_from_index_log(tmp_path: Path) -> None:
    expected = await _write_memory_bookie(tmp_path)
    s = await open_storage(tmp_path, "lmdb")
    try:
        assert s.statistics()["recovery"]["index_migrated_records"] > 0
        await _check_all(s, expected)
    finally:
        await s.close()
    ledgers = tmp_path / "ledgers"
    assert not (ledgers / "index.log").exists()
    assert (ledgers / "index.lmdb").is_dir()
    assert read_checkpoint(ledgers)["index"] == "lmdb"  # type: ignore[index]
    s = await open_storage(tmp_path, "lmdb")  # and again, with nothing to migrate
    try:
        assert "index_migrated_records" not in s.statistics()["recovery"]
        await _check_all(s, expected)
    finally:
        await s.close()
    with pytest.raises(ConfigError, match='index_backend = "lmdb"'):
        await open_storage(tmp_path, "memory")


@pytest.mark.parametrize("checkpoint_after", [False, True])
async def test_migration_keeps_a_re_created_ledger_without_its_old_entries(
        tmp_path: Path, checkpoint_after: bool) -> None:
    """The re-creation's marker in the migrated index.log prefix (or, re-created after
    the checkpoint, the replay) keeps the old entries out of the on-disk index."""
    s = await open_storage(tmp_path, "memory")
    await add(s, 7, range(10))
    await s.delete_ledger(7)
    await s.checkpoint()
    await add(s, 7, range(3), gen=1)
    if checkpoint_after:
        await s.checkpoint()
        assert MARKER_7 in index_log(tmp_path)
    await s.abort()
    for _ in range(2):  # the migration, then a plain open
        s = await open_storage(tmp_path, "lmdb")
        try:
            assert s.entry_ids(7) == [0, 1, 2]
            assert s.ledger(7).last_entry_id == 2  # type: ignore[union-attr]
            assert await s.read_entry(7, 2) == body(7, 2, 1)
            assert s.statistics()["entries"] == 3
        finally:
            await s.close()
    assert not (tmp_path / "ledgers" / "index.log").exists()


@pytest.mark.parametrize("fail_at", ["checkpoint", "remove"])
async def test_a_crash_during_the_migration_runs_it_again(
        tmp_path: Path, fail_at: str, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = await _write_memory_bookie(tmp_path)
    with monkeypatch.context() as m:
        if fail_at == "checkpoint":  # before the checkpoint naming the new index
            async def boom(self: LedgerStorage) -> None:
                raise OSError("crash")
            m.setattr(LedgerStorage, "checkpoint", boom)
        else:  # after it, before index.log is removed
            def boom2(io: Any, ledger_dir: Path) -> None:
                raise OSError("crash")
            m.setattr(ledger_storage_mod, "remove_index_log", boom2)
        with pytest.raises(OSError):
            await open_storage(tmp_path, "lmdb")
    assert (tmp_path / "ledgers" / "index.log").exists()
    s = await open_storage(tmp_path, "lmdb")
    try:
        await _check_all(s, expected)
    finally:
        await s.close()
    assert not (tmp_path / "ledgers" / "index.log").exists()


# --- the KV seam: LMDB and SimKV agree; SimKV's crashes -----------------------------------

kv_ops = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 30), st.binary(max_size=3)),
    st.tuples(st.just("del"), st.integers(0, 30)),
    st.tuples(st.just("pop"), st.integers(0, 30), st.integers(0, 30)),
    st.tuples(st.just("commit")),
), max_size=40)


def _k(i: int) -> bytes:
    return b"k%03d" % i


def _drive(kv: Any, ops: list[tuple[Any, ...]]) -> list[Any]:
    out: list[Any] = []
    w = kv.write()
    for op in ops:
        if op[0] == "put":
            out.append(w.swap(_k(op[1]), op[2]))
        elif op[0] == "del":
            w.delete(_k(op[1]))
        elif op[0] == "pop":
            out.append(list(w.pop_range(_k(op[1]), _k(op[2]))))
        else:
            w.commit()
            out.append(kv.range(b"", b"z"))
            out.append(kv.range(_k(5), _k(20), 3, reverse=True))
            w = kv.write()
    w.commit()
    out.append(kv.range(b"", b"z"))
    return out


@settings(max_examples=60, deadline=None)
@given(kv_ops)
def test_lmdb_and_simkv_agree(ops: list[tuple[Any, ...]]) -> None:
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        lmdb_kv = LmdbKV(Path(d) / "kv")
        try:
            assert _drive(lmdb_kv, ops) == _drive(SimKVStore(random.Random(0)).open(), ops)
        finally:
            lmdb_kv.close()


def test_simkv_crash_keeps_the_synced_state_or_a_later_commit() -> None:
    seen = set()
    for seed in range(40):
        store = SimKVStore(random.Random(seed))
        kv = store.open()
        for i in range(4):
            w = kv.write()
            w.put(b"a", b"%d" % i)
            w.put(b"b", b"%d" % i)  # a transaction never tears: a == b
            w.commit()
            if i == 1:
                kv.sync()
        store.crash()
        kv = store.open()
        a, b = kv.get(b"a"), kv.get(b"b")
        assert a == b and a in (b"1", b"2", b"3")
        seen.add(a)
        store.crash()
        with pytest.raises(OSError):  # the dead process's handle
            kv.get(b"a")
    assert seen == {b"1", b"2", b"3"}


async def test_kv_index_reads_a_ledger_in_runs() -> None:
    index = KVEntryIndex(SimKVStore(random.Random(1)).open())
    index.apply([("put", 5, e, (0, 100 * e, 50)) for e in (0, 1, 2, 4)]
                + [("put", 6, 0, (1, 0, 40))])
    assert list(index.run(5, 0, 10)) == [(0, 0, 50), (0, 100, 50), (0, 200, 50)]
    assert index.last_entry_id(5) == 4 and index.last_entry_id(7) == -1
    assert index.ledger_ids() == [5, 6] and len(index) == 5
    assert index.live_bytes() == {0: 200, 1: 40}
    live = index.apply([("del", 5), ("put", 5, 0, (1, 40, 30))])
    assert live == {0: -200, 1: 30} and len(index) == 2
    assert index.truncate(1, 40) == 1 and index.get(5, 0) is None and len(index) == 1
