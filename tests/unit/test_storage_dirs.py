"""Several ledger directories per bookie (MultiDirStorage over real LedgerStorages):
whole ledgers per directory, placement, reopen, full directories, GC's view,
journal directories, expansion."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from asyncbk.bookie.journal_files import list_journal_files
from asyncbk.bookie.storage import ENTRYLOG_DIR
from asyncbk.bookie.storage.directories import (
    LOG_ID_BITS,
    MultiDirStorage,
    journal_dir_of,
    open_storage,
)
from asyncbk.bookie.storage.ledger_storage import LedgerStorage
from asyncbk.config import BookieConfig
from asyncbk.errors import ConfigError, NoSuchLedgerError

KEY = b"k"


@pytest.fixture(params=["memory", "lmdb"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def config(root: Path, ledgers: int, journals: int = 1, **kw: Any) -> BookieConfig:
    kw.setdefault("checkpoint_interval_s", 3600.0)
    return BookieConfig(
        journal_dir=",".join(str(root / f"j{i}") for i in range(journals)),
        ledger_dir=",".join(str(root / f"l{i}") for i in range(ledgers)), **kw).validate()


async def open_dirs(cfg: BookieConfig) -> MultiDirStorage:
    s = await open_storage(cfg)
    assert isinstance(s, MultiDirStorage)
    return s


def body(ledger_id: int, entry_id: int) -> bytes:
    return f"{ledger_id}:{entry_id}".encode() * 20


async def write(s: MultiDirStorage, ledger_id: int, entries: int) -> None:
    await asyncio.gather(*(s.add_entry(ledger_id, e, KEY, body(ledger_id, e))
                           for e in range(entries)))


def holder(s: MultiDirStorage, ledger_id: int) -> int:
    d = s.directory_of(ledger_id)
    assert d is not None
    return [p.ledger_dir for p in s.per_directory].index(d)


async def test_ledgers_spread_whole_over_directories_and_survive_reopen(
        tmp_path: Path, backend: str) -> None:
    cfg = config(tmp_path, 3, 3, index_backend=backend)
    s = await open_dirs(cfg)
    for lid in range(1, 10):
        await write(s, lid, 5)
    assert [p.ledger_count for p in s.per_directory] == [3, 3, 3]
    where = {lid: holder(s, lid) for lid in range(1, 10)}
    assert where == {lid: (lid - 1) % 3 for lid in range(1, 10)}  # fewest, first on a tie
    for lid, i in where.items():  # whole ledgers: only their own directory has them
        for j, part in enumerate(s.per_directory):
            assert (part.ledger(lid) is not None) == (i == j)
    await s.close()
    for i in range(3):
        assert any((tmp_path / f"l{i}" / ENTRYLOG_DIR).iterdir())
        assert list_journal_files(tmp_path / f"j{i}")
    s = await open_dirs(cfg)
    try:
        assert {lid: holder(s, lid) for lid in range(1, 10)} == where
        for lid in range(1, 10):
            assert await s.read_entries(lid, 0, 100, 1 << 20) == [body(lid, e) for e in range(5)]
        await write(s, 4, 7)  # more of a known ledger: the same directory
        assert holder(s, 4) == where[4]
        assert sorted(s.ledger_ids()) == list(range(1, 10))
        with pytest.raises(NoSuchLedgerError):
            await s.read_entry(99, 0)
        assert s.ledger(99) is None and s.directory_of(99) is None
    finally:
        await s.close()


async def test_journal_directories_fewer_than_ledger_directories(tmp_path: Path) -> None:
    cfg = config(tmp_path, 3, 1)
    assert journal_dir_of([tmp_path / "j0"], 0) == tmp_path / "j0"
    assert journal_dir_of([tmp_path / "j0"], 2) == tmp_path / "j0" / "ledgers-2"
    s = await open_dirs(cfg)
    for lid in range(3):
        await write(s, lid, 3)
    assert [p.journal_dir for p in s.per_directory] == [
        tmp_path / "j0", tmp_path / "j0" / "ledgers-1", tmp_path / "j0" / "ledgers-2"]
    await s.abort()  # a crash: everything comes back from the journals
    s = await open_dirs(cfg)
    try:
        for lid in range(3):
            assert await s.read_entries(lid, 0, 10, 1 << 20) == [body(lid, e) for e in range(3)]
    finally:
        await s.close()


async def test_a_full_directory_takes_no_adds_and_no_new_ledgers(tmp_path: Path) -> None:
    s = await open_dirs(config(tmp_path, 2))
    try:
        await write(s, 1, 2)
        await write(s, 2, 2)
        full = s.per_directory[holder(s, 1)]
        full.full = True
        assert s.is_full(1) and not s.is_full(2)
        assert not s.is_full(3)  # a new ledger would go to the other one
        for lid in (3, 4, 5):
            await write(s, lid, 1)
            assert s.directory_of(lid) != full.ledger_dir
        assert await s.read_entry(1, 1) == body(1, 1)  # reads go on
        for p in s.per_directory:
            p.full = True
        assert s.is_full(6) and s.is_full(2)
    finally:
        await s.close()


async def test_deleted_ledgers_stay_in_their_directory(tmp_path: Path) -> None:
    cfg = config(tmp_path, 2, gc_tombstone_s=3600)
    s = await open_dirs(cfg)
    await write(s, 1, 3)
    await write(s, 2, 3)
    d = holder(s, 2)
    await s.delete_ledger(2)
    assert s.is_deleted(2) and s.ledger(2) is None
    await s.close()
    s = await open_dirs(cfg)
    try:
        assert s.is_deleted(2) and holder(s, 2) == d  # the tombstone routes it back
        assert sorted(s.ledger_ids()) == [1]
        await s.delete_ledger(77)  # unknown: nothing to do
    finally:
        await s.close()


async def test_gc_sees_one_storage_with_directory_qualified_log_ids(tmp_path: Path) -> None:
    cfg = config(tmp_path, 2, entry_log_bytes_max=4096)
    s = await open_dirs(cfg)
    try:
        for lid in (1, 2, 3, 4):
            await write(s, lid, 40)
        await s.checkpoint()
        usage = await s.entry_log_usage()
        assert {log_id >> LOG_ID_BITS for log_id in usage} == {0, 1}
        for lid in (1, 2):  # one ledger of each directory
            await s.delete_ledger(lid)
        usage = await s.entry_log_usage()
        dead = [log_id for log_id, (live, total) in usage.items() if total and live == 0]
        assert {log_id >> LOG_ID_BITS for log_id in dead} == {0, 1}
        assert await s.compact_entry_logs(dead) > 0
        after = await s.entry_log_usage()
        assert not set(dead) & set(after)
        for lid in (3, 4):
            assert await s.read_entries(lid, 0, 100, 1 << 20) == [body(lid, e)
                                                                 for e in range(40)]
    finally:
        await s.close()


async def test_statistics_merge_the_directories(tmp_path: Path) -> None:
    s = await open_dirs(config(tmp_path, 2))
    try:
        for lid in (1, 2, 3):
            await write(s, lid, 4)
        st = s.statistics()
        assert st["ledgers"] == 3 and st["entries"] == 12 and st["adds"] == 12
        assert st["journal"]["records"] == sum(
            p.statistics()["journal"]["records"] for p in s.per_directory)
        assert [d["ledgers"] for d in st["directories"]] == [2, 1]
        assert st["journal"]["failed"] is False
        free, total = s.disk_usage()  # both on one file system: counted once
        assert total == s.per_directory[0].disk_usage()[1]
    finally:
        await s.close()


async def test_an_appended_directory_takes_new_ledgers_until_caught_up(tmp_path: Path) -> None:
    s = await open_dirs(config(tmp_path, 2))
    for lid in range(4):
        await write(s, lid, 2)
    await s.close()
    s = await open_dirs(config(tmp_path, 3))
    try:
        assert [p.ledger_count for p in s.per_directory] == [2, 2, 0]
        for lid in (10, 11):
            await write(s, lid, 2)
            assert holder(s, lid) == 2
        await write(s, 12, 2)
        assert holder(s, 12) == 0
        for lid in range(4):
            assert await s.read_entry(lid, 1) == body(lid, 1)
    finally:
        await s.close()


async def test_one_directory_opens_a_plain_ledger_storage(tmp_path: Path) -> None:
    s = await open_storage(config(tmp_path, 1))
    try:
        assert isinstance(s, LedgerStorage) and s.per_directory == (s,)
    finally:
        await s.close()


@pytest.mark.parametrize(("journal_dir", "ledger_dir", "message"), [
    ("j1,j2", "l1", "more journal directories"),
    ("j", "l1,,l2", "empty directory"),
    ("j", "l1,l1", "given once"),
    ("l1", "l1,l2", "given once"),
])
def test_bad_directory_lists_are_refused(journal_dir: str, ledger_dir: str,
                                         message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BookieConfig(journal_dir=journal_dir, ledger_dir=ledger_dir).validate()
