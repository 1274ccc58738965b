"""``index.log`` (the in-memory index's file) is rewritten at checkpoints once most of
it is dead, so it stays bounded under a write/delete workload; the rewrite is
crash-safe at every step (here the interrupted steps are replayed by hand; the
crash-point walk and the storage seeds cut it at every file operation)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from asyncbk.bookie.fileio import OS_FILE_IO
from asyncbk.bookie.storage import INDEX_FILE, INDEX_RECORD, LedgerStorage, read_checkpoint
from asyncbk.bookie.storage import checkpointer as checkpointer_mod
from asyncbk.bookie.storage.checkpoint import CHECKPOINT_VERSION, CHECKPOINT_VERSION_INDEX_FILE
from asyncbk.bookie.storage.index import index_log_ops
from asyncbk.bookie.storage.indexlog import (
    INDEX_COMPACT_FILE,
    compaction_due,
    write_compacted_index,
)
from asyncbk.config import BookieConfig
from asyncbk.errors import ConfigError

KEY = b"master-key"
BYTES_MIN = 32 * 1024  # 1,024 records


def config(**kw: Any) -> BookieConfig:
    kw.setdefault("index_log_compaction_bytes_min", BYTES_MIN)
    return BookieConfig(checkpoint_interval_s=3600.0, **kw).validate()


async def open_storage(root: Path, **kw: Any) -> LedgerStorage:
    return await LedgerStorage.open(root / "j", root / "l", config(**kw))


def body(ledger_id: int, entry_id: int) -> bytes:
    return b"%d/%d" % (ledger_id, entry_id)


async def churn(s: LedgerStorage, rounds: int, first_ledger: int = 100) -> None:
    """Ledger 1 grows by 20 entries a round; each round a ledger of 200 entries is
    written and deleted: most of index.log goes dead."""
    for r in range(rounds):
        ledger = first_ledger + r
        await asyncio.gather(*(s.add_entries(ledger, list(range(e, e + 50)), KEY,
                                             [body(ledger, i) for i in range(e, e + 50)])
                               for e in range(0, 200, 50)))
        info = s.ledger(1)
        first = info.last_entry_id + 1 if info is not None else 0
        await s.add_entries(1, list(range(first, first + 20)), KEY,
                            [body(1, e) for e in range(first, first + 20)])
        await s.delete_ledger(ledger)
        await s.checkpoint()


def index_size(root: Path) -> int:
    return (root / "l" / INDEX_FILE).stat().st_size


async def test_index_log_stays_bounded_under_writes_and_deletes(tmp_path: Path) -> None:
    """60 rounds write 13,200 index records (422 KB), 1,200 of them live at the end:
    the file stays within a few times the compaction bound, and every entry reads back,
    after a graceful restart and after a crash."""
    s = await open_storage(tmp_path)
    try:
        sizes = []
        for _ in range(6):
            await churn(s, 10, first_ledger=100 + len(sizes) * 10)
            sizes.append(await asyncio.to_thread(index_size, tmp_path))
        assert max(sizes) <= 3 * BYTES_MIN, sizes  # (without compaction: 422 KB)
        stats = s.statistics()
        assert stats["index_log_compactions"] >= 3, stats
        assert await s.read_entries(1, 0, 10_000, 1 << 30) == [body(1, e) for e in range(1200)]
        assert sorted(s.ledger_ids()) == [1]
    finally:
        await s.close()
    s = await open_storage(tmp_path)
    try:
        # the start loads the rewritten file, not the 13,200 records written
        assert s.statistics()["recovery"]["entries_indexed"] < 3 * BYTES_MIN // INDEX_RECORD.size
        await churn(s, 5, first_ledger=1000)
    finally:
        await s.abort()
    s = await open_storage(tmp_path)
    try:
        assert await s.read_entries(1, 0, 10_000, 1 << 30) == [body(1, e) for e in range(1300)]
        assert sorted(s.ledger_ids()) == [1]
        payload = await asyncio.to_thread(read_checkpoint, tmp_path / "l")
        assert payload is not None and payload["version"] == CHECKPOINT_VERSION
        assert "index_file" not in payload
    finally:
        await s.close()


def test_the_setting_is_validated() -> None:
    with pytest.raises(ConfigError):
        BookieConfig(index_log_compaction_bytes_min=-1).validate()


def test_compaction_is_due_once_half_the_records_are_dead() -> None:
    record = INDEX_RECORD.size
    assert not compaction_due(1000 * record, 600, 0)
    assert compaction_due(1000 * record, 500, 0)
    assert not compaction_due(1000 * record, 0, 1000 * record + 1)  # too small yet
    assert not compaction_due(0, 0, 0)


@pytest.mark.parametrize("crash_after", ["written", "switched", "named", "renamed"])
async def test_a_crash_at_each_step_of_the_rewrite_loses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_after: str) -> None:
    """The bookie dies after each step of a rewrite (module docstring of .indexlog):
    the restart finds a checkpoint and the file it covers, and every entry."""
    s = await open_storage(tmp_path, index_log_compaction_bytes_min=1 << 40)  # not yet
    try:
        await churn(s, 8)
        assert s.statistics()["index_log_compactions"] == 0
        steps = {"written": 0, "switched": 0, "named": 0, "renamed": 0}

        class _Died(Exception):
            pass

        def stop_at(step: str) -> None:
            steps[step] += 1
            if step == crash_after:
                raise _Died(step)

        real_write = checkpointer_mod.write_compacted_index
        real_rename = checkpointer_mod.finish_rename
        real_switch = s._writer.switch_index
        real_renamed = s._writer.index_renamed

        def write_compacted(*args: Any) -> int:
            length = real_write(*args)
            stop_at("written")
            return length

        def switch(*args: Any) -> None:
            real_switch(*args)
            stop_at("switched")

        def rename(*args: Any) -> None:
            stop_at("named")  # (the checkpoint naming the new file is written by now)
            real_rename(*args)

        def renamed(*args: Any) -> None:
            real_renamed(*args)
            stop_at("renamed")

        monkeypatch.setattr(checkpointer_mod, "write_compacted_index", write_compacted)
        monkeypatch.setattr(checkpointer_mod, "finish_rename", rename)
        monkeypatch.setattr(s._writer, "switch_index", switch)
        monkeypatch.setattr(s._writer, "index_renamed", renamed)
        s._checkpointer._config = config(index_log_compaction_bytes_min=0)
        await s.add_entries(1, [160], KEY, [body(1, 160)])
        with pytest.raises(_Died):
            await s.checkpoint()
        await s.add_entries(1, [161], KEY, [body(1, 161)])  # after the step, journaled
        files = {p.name for p in (tmp_path / "l").iterdir()}
        payload = read_checkpoint(tmp_path / "l")
        assert payload is not None
        if crash_after in ("written", "switched"):
            assert INDEX_COMPACT_FILE in files and payload["version"] == CHECKPOINT_VERSION
        elif crash_after == "named":
            assert INDEX_COMPACT_FILE in files
            assert payload["version"] == CHECKPOINT_VERSION_INDEX_FILE
            assert payload["index_file"] == INDEX_COMPACT_FILE
        else:
            assert INDEX_COMPACT_FILE not in files
    finally:
        await s.abort()
        monkeypatch.undo()
    s = await open_storage(tmp_path, index_log_compaction_bytes_min=1 << 40)  # recovery only
    try:
        assert await s.read_entries(1, 0, 1000, 1 << 30) == [body(1, e) for e in range(162)]
        assert sorted(s.ledger_ids()) == [1]
        assert not (tmp_path / "l" / INDEX_COMPACT_FILE).exists()
        await s.checkpoint()
    finally:
        await s.close()
    records = list(index_log_ops((tmp_path / "l" / INDEX_FILE).read_bytes(), 1 << 30))
    if crash_after in ("named", "renamed"):  # the rewrite counts: 162 live, few dead
        assert len(records) < 200, len(records)


def test_the_rewrite_keeps_what_a_load_would_index(tmp_path: Path) -> None:
    """Superseded records, deletion markers and ledgers the checkpoint does not know:
    the rewrite has one record per entry the load of the original would index."""
    pack = INDEX_RECORD.pack
    records = [pack(1, 0, 0, 0, 40), pack(1, 1, 0, 40, 40), pack(2, 0, 0, 80, 40),
               pack(1, 0, 0, 120, 40),  # entry 1/0 written again
               pack(3, 0, 0, 160, 40), pack(3, -1, 0, 0, 0),  # ledger 3: deletion marker
               pack(3, 5, 0, 200, 40), pack(4, 0, 0, 240, 40)]  # ledger 4: unknown
    (tmp_path / INDEX_FILE).write_bytes(b"".join(records))
    length = write_compacted_index(OS_FILE_IO, tmp_path, len(records) * INDEX_RECORD.size,
                                   {1, 2, 3}, 0)
    got = (tmp_path / INDEX_COMPACT_FILE).read_bytes()
    assert length == len(got) == 4 * INDEX_RECORD.size
    assert list(INDEX_RECORD.iter_unpack(got)) == [
        (1, 0, 0, 120, 40), (1, 1, 0, 40, 40), (2, 0, 0, 80, 40), (3, 5, 0, 200, 40)]
