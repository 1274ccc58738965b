"""LedgerStorage: journal + entry logs + index + checkpoints, and crash recovery."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncbk.bookie import fileio as fileio_mod
from asyncbk.bookie.journal_files import list_journal_files
from asyncbk.bookie.journal_format import encode_add
from asyncbk.bookie.storage import ENTRYLOG_DIR, LedgerStorage, read_checkpoint
from asyncbk.clock import ManualClock
from asyncbk.config import BookieConfig
from asyncbk.errors import (
    BadRequestError,
    BookieIOError,
    NoSuchEntryError,
    NoSuchLedgerError,
    TooManyRequestsError,
)

KEY = b"master-key"
BACKEND = {"index": "memory"}


@pytest.fixture(autouse=True, params=["memory", "lmdb"])
def index_backend(request: pytest.FixtureRequest) -> Any:
    """Every test here runs with both entry index backends (``config()``'s default)."""
    BACKEND["index"] = request.param
    yield request.param
    BACKEND["index"] = "memory"


def config(**kw: Any) -> BookieConfig:
    kw.setdefault("checkpoint_interval_s", 3600.0)
    kw.setdefault("index_backend", BACKEND["index"])
    return BookieConfig(**kw)


async def open_storage(root: Path, **kw: Any) -> LedgerStorage:
    clock = kw.pop("clock", None)
    return await LedgerStorage.open(root / "journal", root / "ledgers", config(**kw), clock=clock)


def body(ledger_id: int, entry_id: int) -> bytes:
    return f"{ledger_id}/{entry_id}|".encode() * (1 + (ledger_id * 7 + entry_id) % 40)


async def add_all(s: LedgerStorage, ledger_id: int, entry_ids: range) -> None:
    await asyncio.gather(*[s.add_entry(ledger_id, e, KEY, body(ledger_id, e)) for e in entry_ids])


def journal_files(root: Path) -> list[tuple[int, Path]]:
    return list_journal_files(root / "journal")


async def test_add_and_read(tmp_path: Path) -> None:
    s = await open_storage(tmp_path)
    try:
        await add_all(s, 1, range(10))
        for e in range(10):
            assert await s.read_entry(1, e) == body(1, e)
        assert await s.read_entry(1, -1) == body(1, 9)
        info = s.ledger(1)
        assert info is not None and info.master_key == KEY and info.last_entry_id == 9
        assert not info.fenced
        with pytest.raises(NoSuchLedgerError):
            await s.read_entry(2, 0)
        with pytest.raises(NoSuchEntryError):
            await s.read_entry(1, 10)
        assert s.ledger(2) is None
        stats = s.statistics()
        assert stats["entries"] == 10 and stats["ledgers"] == 1
        assert stats["journal"]["records"] == 11  # LEDGER_KEY + 10 ADD
    finally:
        await s.close()


async def test_entry_readable_when_future_resolves(tmp_path: Path) -> None:
    s = await open_storage(tmp_path)
    try:
        for e in range(20):
            fut = s.add_entry(3, e, KEY, body(3, e))
            with pytest.raises(NoSuchEntryError):
                await s.read_entry(3, e)  # not yet acknowledged, not yet readable
            await fut
            assert await s.read_entry(3, e) == body(3, e)
            assert await s.read_entry(3, -1) == body(3, e)
    finally:
        await s.close()


async def test_read_last_of_empty_ledger(tmp_path: Path) -> None:
    s = await open_storage(tmp_path)
    try:
        await s.fence(5, KEY)  # registers ledger 5 without entries
        info = s.ledger(5)
        assert info is not None and info.fenced and info.master_key == KEY
        with pytest.raises(NoSuchEntryError):
            await s.read_entry(5, -1)
    finally:
        await s.close()


async def test_overwrite_and_sparse_entries(tmp_path: Path) -> None:
    s = await open_storage(tmp_path)
    try:
        await s.add_entry(1, 5, KEY, b"first")
        await s.add_entry(1, 5, KEY, b"second")
        await s.add_entry(1, 2, KEY, b"two")
        assert await s.read_entry(1, 5) == b"second"
        assert await s.read_entry(1, -1) == b"second"
        with pytest.raises(NoSuchEntryError):
            await s.read_entry(1, 3)
        await s.add_entry(1, 0, KEY, b"")
        assert await s.read_entry(1, 0) == b""
    finally:
        await s.close()
    s = await open_storage(tmp_path)
    try:
        assert await s.read_entry(1, 5) == b"second"
        assert await s.read_entry(1, 0) == b""
        assert s.ledger(1).last_entry_id == 5  # type: ignore[union-attr]
    finally:
        await s.close()


async def test_bad_ids(tmp_path: Path) -> None:
    s = await open_storage(tmp_path)
    try:
        with pytest.raises(BadRequestError):
            s.add_entry(-1, 0, KEY, b"x")
        with pytest.raises(BadRequestError):
            s.add_entry(1, -2, KEY, b"x")
        assert s.ledger(1) is None
        with pytest.raises(NoSuchLedgerError):
            s.update_lac(9, 1)
        with pytest.raises(NoSuchLedgerError):
            s.write_explicit_lac(9, 1)
    finally:
        await s.close()


async def test_reopen_after_close_keeps_everything(tmp_path: Path) -> None:
    s = await open_storage(tmp_path)
    await add_all(s, 1, range(100))
    await add_all(s, 2, range(50))
    await s.fence(2, KEY)
    assert s.update_lac(1, 97)
    assert not s.update_lac(1, 50)
    await s.write_explicit_lac(2, 48)
    await s.close()
    await s.close()  # idempotent
    with pytest.raises(BookieIOError):
        s.add_entry(1, 100, KEY, b"x")
    with pytest.raises(BookieIOError):
        await s.read_entry(1, 0)

    s = await open_storage(tmp_path)
    try:
        assert s.statistics()["recovery"]["adds_replayed"] == 0  # all covered by the checkpoint
        for e in range(100):
            assert await s.read_entry(1, e) == body(1, e)
        assert await s.read_entry(2, -1) == body(2, 49)
        one, two = s.ledger(1), s.ledger(2)
        assert one is not None and two is not None
        assert one.lac == 97 and not one.fenced
        assert two.fenced and two.explicit_lac == 48 and two.lac == 48
        assert sorted(s.ledger_ids()) == [1, 2]
    finally:
        await s.close()


async def test_crash_without_close_keeps_acknowledged(tmp_path: Path) -> None:
    s = await open_storage(tmp_path)
    await add_all(s, 1, range(200))
    await s.fence(1, KEY)
    await s.write_explicit_lac(1, 150)
    await s.abort()  # no drain, no checkpoint: everything is in the journal only
    assert read_checkpoint(tmp_path / "ledgers")["journal_offset"] == 0  # type: ignore[index]

    s = await open_storage(tmp_path)
    try:
        rec = s.statistics()["recovery"]
        assert rec["adds_replayed"] == 200 and rec["bytes_cut"] == 0
        for e in range(200):
            assert await s.read_entry(1, e) == body(1, e)
        info = s.ledger(1)
        assert info is not None and info.fenced and info.explicit_lac == 150
        # the replay was checkpointed: the old journal file is gone
        assert [seq for seq, _ in journal_files(tmp_path)] == [2]
    finally:
        await s.abort()
    s = await open_storage(tmp_path)  # crash again right after recovery
    try:
        assert await s.read_entry(1, -1) == body(1, 199)
        assert s.statistics()["recovery"]["adds_replayed"] == 0
    finally:
        await s.close()


async def test_crash_with_adds_in_flight(tmp_path: Path) -> None:
    s = await open_storage(tmp_path)
    await add_all(s, 1, range(10))
    futs = [s.add_entry(1, e, KEY, body(1, e)) for e in range(10, 500)]
    await asyncio.sleep(0)
    await s.abort()
    acked = [e for e, f in zip(range(10, 500), futs, strict=True)
             if f.done() and not f.cancelled() and f.exception() is None]
    for f in futs:
        if f.done() and not f.cancelled():
            f.exception()  # retrieved
    s = await open_storage(tmp_path)
    try:
        for e in list(range(10)) + acked:
            assert await s.read_entry(1, e) == body(1, e)
    finally:
        await s.close()


async def test_torn_tail_garbage_is_cut(tmp_path: Path) -> None:
    # (a journal written without preallocation: its records end the file; the cut of a
    # torn record inside preallocated space is in test_journal_preallocation.py)
    s = await open_storage(tmp_path, journal_preallocate_bytes=0)
    await add_all(s, 1, range(30))
    await s.abort()
    ((_, path),) = journal_files(tmp_path)
    with path.open("ab") as fh:
        fh.write(b"\x07\x00\x00\x00garbage garbage garbage")
    s = await open_storage(tmp_path)
    try:
        rec = s.statistics()["recovery"]
        assert rec["bytes_cut"] == 27
        assert rec["adds_replayed"] == 30
        for e in range(30):
            assert await s.read_entry(1, e) == body(1, e)
    finally:
        await s.close()


async def test_torn_tail_mid_record_is_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = await open_storage(tmp_path, journal_preallocate_bytes=0)
    await add_all(s, 1, range(30))
    await s.abort()
    ((_, path),) = journal_files(tmp_path)
    last = encode_add(1, 29, body(1, 29))
    size = path.stat().st_size
    os.truncate(path, size - len(last) // 2)  # tear the last record in half

    # watch the cut happen: the file is truncated to the last good offset
    truncated: list[int] = []
    real_ftruncate = os.ftruncate

    def spy(fd: int, length: int) -> None:
        truncated.append(length)
        real_ftruncate(fd, length)

    monkeypatch.setattr(os, "ftruncate", spy)
    s = await open_storage(tmp_path)
    monkeypatch.undo()
    try:
        assert size - len(last) in truncated
        rec = s.statistics()["recovery"]
        assert rec["adds_replayed"] == 29
        assert rec["bytes_cut"] == len(last) - len(last) // 2
        for e in range(29):
            assert await s.read_entry(1, e) == body(1, e)
        with pytest.raises(NoSuchEntryError):
            await s.read_entry(1, 29)
        assert s.ledger(1).last_entry_id == 28  # type: ignore[union-attr]
        # new adds after the cut work and survive
        await s.add_entry(1, 29, KEY, b"again")
    finally:
        await s.abort()
    s = await open_storage(tmp_path)
    try:
        assert await s.read_entry(1, 29) == b"again"
    finally:
        await s.close()


async def test_records_after_a_torn_file_are_not_replayed(tmp_path: Path) -> None:
    s = await open_storage(tmp_path, journal_file_bytes_max=2000)
    await add_all(s, 1, range(5))
    for e in range(5, 60):
        await s.add_entry(1, e, KEY, body(1, e))  # one batch each: rotates files
    await s.abort()
    files = journal_files(tmp_path)
    assert len(files) >= 3
    # corrupt one byte in the middle file: it and everything after are cut
    _, middle = files[1]
    data = bytearray(middle.read_bytes())
    data[20] ^= 0xFF
    middle.write_bytes(bytes(data))
    s = await open_storage(tmp_path)
    try:
        rec = s.statistics()["recovery"]
        assert rec["journal_files_removed"] == len(files) - 2
        last = s.ledger(1).last_entry_id  # type: ignore[union-attr]
        assert 4 <= last < 59
        for e in range(last + 1):
            assert await s.read_entry(1, e) == body(1, e)
        for e in range(last + 1, 60):
            with pytest.raises(NoSuchEntryError):
                await s.read_entry(1, e)
    finally:
        await s.close()


async def test_fence_survives_restart(tmp_path: Path) -> None:
    s = await open_storage(tmp_path)
    await add_all(s, 7, range(3))
    fence = s.fence(7, KEY)
    assert s.ledger(7).fenced  # type: ignore[union-attr]  # at once, in memory
    await fence
    await s.fence(8, b"other-key")  # unknown ledger: registered by the fence
    await s.abort()
    s = await open_storage(tmp_path)
    try:
        assert s.ledger(7).fenced  # type: ignore[union-attr]
        eight = s.ledger(8)
        assert eight is not None and eight.fenced and eight.master_key == b"other-key"
        assert await s.read_entry(7, -1) == body(7, 2)
    finally:
        await s.close()


async def test_fence_resolves_after_earlier_adds_are_readable(tmp_path: Path) -> None:
    s = await open_storage(tmp_path)
    try:
        adds = [s.add_entry(1, e, KEY, body(1, e)) for e in range(100)]
        await s.fence(1, KEY)
        assert all(f.done() for f in adds)
        assert await s.read_entry(1, -1) == body(1, 99)
    finally:
        await s.close()


async def test_checkpoint_deletes_old_journal_files(tmp_path: Path) -> None:
    s = await open_storage(tmp_path, journal_file_bytes_max=4096)
    for e in range(100):
        await s.add_entry(1, e, KEY, body(1, e))
    assert len(journal_files(tmp_path)) > 3
    await s.checkpoint()
    assert len(journal_files(tmp_path)) == 1
    assert s.statistics()["journal_files_deleted"] > 0
    await add_all(s, 2, range(10))  # after the checkpoint: journal only
    await s.abort()
    s = await open_storage(tmp_path)
    try:
        rec = s.statistics()["recovery"]
        assert rec["adds_replayed"] == 10
        for e in range(100):
            assert await s.read_entry(1, e) == body(1, e)
        for e in range(10):
            assert await s.read_entry(2, e) == body(2, e)
    finally:
        await s.close()


async def test_checkpoint_without_changes_is_skipped(tmp_path: Path) -> None:
    s = await open_storage(tmp_path)
    try:
        await s.checkpoint()
        await s.checkpoint()
        assert s.statistics()["checkpoints_skipped"] == 2
        await add_all(s, 1, range(3))
        await s.checkpoint()
        assert s.statistics()["checkpoints"] == 2  # open + this one
        s.update_lac(1, 2)  # a LAC change alone is worth a checkpoint
        await s.checkpoint()
        assert s.statistics()["checkpoints"] == 3
    finally:
        await s.close()


async def test_entry_log_rotation(tmp_path: Path) -> None:
    s = await open_storage(tmp_path, entry_log_bytes_max=3000)
    await add_all(s, 1, range(100))
    for e in range(100, 120):
        await s.add_entry(1, e, KEY, body(1, e))
    await s.checkpoint()
    await add_all(s, 2, range(50))
    await s.abort()
    logs = sorted(os.listdir(tmp_path / "ledgers" / ENTRYLOG_DIR))
    assert len(logs) > 3
    s = await open_storage(tmp_path, entry_log_bytes_max=3000)
    try:
        for e in range(120):
            assert await s.read_entry(1, e) == body(1, e)
        for e in range(50):
            assert await s.read_entry(2, e) == body(2, e)
    finally:
        await s.close()


async def storage_with_corrupt_entry_2(tmp_path: Path) -> LedgerStorage:
    """Storage holding entries 0..2 of ledger 1, one bit of entry 2's body flipped."""
    s = await open_storage(tmp_path)
    await add_all(s, 1, range(3))
    await s.close()
    (log,) = (tmp_path / "ledgers" / ENTRYLOG_DIR).iterdir()
    data = bytearray(log.read_bytes())
    data[-3] ^= 0x01  # inside the body of entry 2
    log.write_bytes(bytes(data))
    return await open_storage(tmp_path)


async def test_corrupt_entry_log_is_detected_on_read(tmp_path: Path) -> None:
    s = await storage_with_corrupt_entry_2(tmp_path)
    try:
        assert await s.read_entry(1, 0) == body(1, 0)
        with pytest.raises(BookieIOError):
            await s.read_entry(1, 2)
    finally:
        await s.close()


async def test_read_entries_runs_across_logs_and_interleaving(tmp_path: Path) -> None:
    s = await open_storage(tmp_path, entry_log_bytes_max=3000)
    try:
        for e in range(60):  # two ledgers interleaved, over several entry logs
            await asyncio.gather(s.add_entry(1, e, KEY, body(1, e)),
                                 s.add_entry(2, e, KEY, body(2, e)))
        await add_all(s, 3, range(40))  # written alone: read back with few preads
        await s.add_entry(3, 41, KEY, body(3, 41))
        assert len(os.listdir(tmp_path / "ledgers" / ENTRYLOG_DIR)) > 3
        assert await s.read_entries(1, 0, 1000, 1 << 30) == [body(1, e) for e in range(60)]
        assert await s.read_entries(2, 10, 5, 1 << 30) == [body(2, e) for e in range(10, 15)]
        assert await s.read_entries(3, 0, 1000, 1 << 30) == [body(3, e) for e in range(40)]
        limit = len(body(3, 5)) + len(body(3, 6))
        assert await s.read_entries(3, 5, 1000, limit) == [body(3, 5), body(3, 6)]
        assert await s.read_entries(3, 5, 1000, 1) == [body(3, 5)]
        assert await s.read_entries(3, 41, 1000, 1 << 30) == [body(3, 41)]
        with pytest.raises(NoSuchEntryError):
            await s.read_entries(3, 40, 10, 1 << 30)
        with pytest.raises(NoSuchLedgerError):
            await s.read_entries(9, 0, 10, 1 << 30)
    finally:
        await s.close()


async def test_read_entries_detects_corruption(tmp_path: Path) -> None:
    s = await storage_with_corrupt_entry_2(tmp_path)
    try:
        assert await s.read_entries(1, 0, 2, 1 << 20) == [body(1, 0), body(1, 1)]
        with pytest.raises(BookieIOError, match="1/2 is corrupt"):
            await s.read_entries(1, 0, 3, 1 << 20)
    finally:
        await s.close()


async def test_queue_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = await open_storage(tmp_path, journal_queue_entries_max=4)
    release = asyncio.Event()
    loop = asyncio.get_running_loop()
    real = fileio_mod.fdatasync

    def slow(fd: int) -> None:
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(10)
        real(fd)

    monkeypatch.setattr(fileio_mod, "fdatasync", slow)
    try:
        futs = [s.add_entry(1, 0, KEY, b"a")]  # LEDGER_KEY + ADD
        futs += [s.add_entry(1, e, KEY, b"a") for e in (1, 2)]
        assert s.journal_queue_entries == 4
        with pytest.raises(TooManyRequestsError):
            s.add_entry(1, 3, KEY, b"a")
        with pytest.raises(TooManyRequestsError):
            s.add_entry(2, 0, KEY, b"a")
        assert s.ledger(2) is None  # a refused add registers nothing
        with pytest.raises(TooManyRequestsError):
            s.fence(1, KEY)
        assert not s.ledger(1).fenced  # type: ignore[union-attr]
        space = asyncio.create_task(s.wait_for_queue_space())
        await asyncio.sleep(0.01)
        assert not space.done()
        release.set()
        await asyncio.wait_for(space, 5)
        await asyncio.gather(*futs)
    finally:
        release.set()
        await s.close()


async def test_journal_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = await open_storage(tmp_path)
    await add_all(s, 1, range(5))

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "simulated")

    monkeypatch.setattr(fileio_mod, "fdatasync", broken)
    with pytest.raises(BookieIOError):
        await s.add_entry(1, 5, KEY, b"lost")
    with pytest.raises(BookieIOError):
        s.add_entry(1, 6, KEY, b"x")
    with pytest.raises(BookieIOError):
        s.fence(1, KEY)
    with pytest.raises(BookieIOError):
        await s.checkpoint()
    assert await s.read_entry(1, 4) == body(1, 4)  # reads still work
    await s.close()  # no final checkpoint after a failure
    monkeypatch.undo()
    s = await open_storage(tmp_path)
    try:
        for e in range(5):
            assert await s.read_entry(1, e) == body(1, e)
        # entry 5 reached the journal before its fsync failed: it may be there, never wrongly
        try:
            assert await s.read_entry(1, 5) == b"lost"
        except NoSuchEntryError:
            pass
    finally:
        await s.close()


async def test_periodic_checkpoint_and_disk_usage(tmp_path: Path) -> None:
    clock = ManualClock()
    s = await open_storage(tmp_path, clock=clock, checkpoint_interval_s=5.0)
    try:
        free, total = s.disk_usage()
        assert 0 < free <= total
        await add_all(s, 1, range(10))
        before = s.statistics()["checkpoints"]
        advanced = 0.0
        for _ in range(1000):
            if s.statistics()["checkpoints"] > before:
                break
            if clock._sleepers:  # housekeeping is asleep: move time on
                clock.advance(1.0)
                advanced += 1.0
            await asyncio.sleep(0.002)
        assert s.statistics()["checkpoints"] == before + 1
        assert advanced == 5.0
        index_bytes = 10 * 32 if BACKEND["index"] == "memory" else 0  # lmdb: no index.log
        assert read_checkpoint(tmp_path / "ledgers")["index_length"] == index_bytes  # type: ignore[index]
    finally:
        await s.close()


# --- randomized model check ---------------------------------------------------------

op_st = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 3), st.integers(1, 30)),
    st.tuples(st.just("fence"), st.integers(0, 3)),
    st.tuples(st.just("xlac"), st.integers(0, 3), st.integers(-1, 50)),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("crash"), st.integers(0, 40), st.booleans(), st.integers(0, 2**32)),
)


class Model:
    def __init__(self) -> None:
        self.attempted: dict[int, set[int]] = {}  # entries ever queued
        self.durable: dict[int, set[int]] = {}  # acknowledged, or seen after a recovery
        self.fenced: set[int] = set()
        self.xlac: dict[int, int] = {}
        self.next_id: dict[int, int] = {}

    def ack(self, ledger_id: int, entry_id: int) -> None:
        self.durable.setdefault(ledger_id, set()).add(entry_id)


async def check(s: LedgerStorage, m: Model) -> None:
    for ledger_id, entries in m.attempted.items():
        info = s.ledger(ledger_id)
        if m.durable.get(ledger_id) or ledger_id in m.fenced:
            assert info is not None
        if info is None:
            continue
        present = set()
        for e in entries:
            try:
                data = await s.read_entry(ledger_id, e)
            except NoSuchEntryError:
                assert e not in m.durable.get(ledger_id, set()), (ledger_id, e)
                continue
            assert data == body(ledger_id, e)
            present.add(e)
        assert info.last_entry_id == (max(present) if present else -1)
        # what a recovery shows is durable from then on
        m.durable.setdefault(ledger_id, set()).update(present)
        if ledger_id in m.fenced:
            assert info.fenced
        elif info.fenced:
            m.fenced.add(ledger_id)
        assert info.explicit_lac >= m.xlac.get(ledger_id, -1)
        m.xlac[ledger_id] = info.explicit_lac
    for ledger_id in s.ledger_ids():
        assert ledger_id in m.attempted


async def run_scenario(root: Path, ops: list[tuple[Any, ...]]) -> None:
    m = Model()
    kw = {"journal_file_bytes_max": 3000, "entry_log_bytes_max": 5000,
          "journal_group_entries_max": 8}
    s = await open_storage(root, **kw)
    try:
        for op in ops:
            kind = op[0]
            if kind == "add":
                _, ledger_id, n = op
                start = m.next_id.get(ledger_id, 0)
                m.next_id[ledger_id] = start + n
                m.attempted.setdefault(ledger_id, set()).update(range(start, start + n))
                await add_all(s, ledger_id, range(start, start + n))
                for e in range(start, start + n):
                    m.ack(ledger_id, e)
            elif kind == "fence":
                m.attempted.setdefault(op[1], set())
                await s.fence(op[1], KEY)
                m.fenced.add(op[1])
            elif kind == "xlac":
                if s.ledger(op[1]) is None:
                    continue
                await s.write_explicit_lac(op[1], op[2])
                m.xlac[op[1]] = max(m.xlac.get(op[1], -1), op[2])
            elif kind == "checkpoint":
                await s.checkpoint()
            elif kind == "reopen":
                await s.close()
                s = await open_storage(root, **kw)
                await check(s, m)
            elif kind == "crash":
                _, inflight, tear, seed = op
                rng = random.Random(seed)
                ledger_id = seed % 4
                start = m.next_id.get(ledger_id, 0)
                m.next_id[ledger_id] = start + inflight
                m.attempted.setdefault(ledger_id, set()).update(range(start, start + inflight))
                futs = [s.add_entry(ledger_id, e, KEY, body(ledger_id, e))
                        for e in range(start, start + inflight)]
                for _ in range(rng.randrange(3)):
                    await asyncio.sleep(0)
                await s.abort()
                # end of the last batch acknowledged: a power cut may lose anything after it
                synced_seq, synced_off = s.statistics()["journal"]["position"]
                for e, f in zip(range(start, start + inflight), futs, strict=True):
                    if f.exception() is None:
                        m.ack(ledger_id, e)
                if tear:  # lose unsynced journal bytes, as a power cut would
                    for seq, path in journal_files(root):
                        if seq == synced_seq:
                            size = path.stat().st_size
                            os.truncate(path, rng.randint(min(synced_off, size), size))
                        elif seq > synced_seq:
                            path.unlink()
                s = await open_storage(root, **kw)
                await check(s, m)
        await s.close()
        s = await open_storage(root, **kw)
        await check(s, m)
    finally:
        await s.close()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(op_st, min_size=1, max_size=25))
def test_random_operations_against_model(ops: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(run_scenario(Path(d), ops))


_CHILD = r"""
import asyncio, sys
from pathlib import Path
from asyncbk.bookie.storage import LedgerStorage
from asyncbk.config import BookieConfig

async def main(root):
    s = await LedgerStorage.open(root / "journal", root / "ledgers",
                                 BookieConfig(journal_file_bytes_max=20000,
                                              checkpoint_interval_s=0.05))
    async def writer(ledger_id):
        e = 0
        while True:
            await s.add_entry(ledger_id, e, b"k", b"%d/%d|" % (ledger_id, e) * 20)
            sys.stdout.write(f"ACK {ledger_id} {e}\n")
            sys.stdout.flush()
            e += 1
    await asyncio.gather(*[writer(i) for i in range(8)])

asyncio.run(main(Path(sys.argv[1])))
"""


async def test_sigkill_keeps_acknowledged(tmp_path: Path) -> None:
    """A real process killed with SIGKILL mid-stream (with checkpoints running)."""
    import signal
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, str(tmp_path), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    acked: list[tuple[int, int]] = []
    try:
        while len(acked) < 3000:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line, "child exited early"
            if line.startswith(b"ACK "):  # other lines are log output
                ledger_id, entry_id = map(int, line.split()[1:])
                acked.append((ledger_id, entry_id))
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    s = await open_storage(tmp_path)
    try:
        for ledger_id, entry_id in acked:
            assert await s.read_entry(ledger_id, entry_id) == b"%d/%d|" % (ledger_id, entry_id) * 20
        assert s.statistics()["recovery"]["adds_replayed"] > 0
    finally:
        await s.close()


async def test_checkpoint_fsyncs_do_not_stall_adds(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry-log and index fdatasyncs of a checkpoint run off the journal's writer
    thread: adds keep being acknowledged while they are stuck."""
    import threading

    release = threading.Event()
    stuck = threading.Event()
    real = fileio_mod.fdatasync

    def fdatasync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        if ENTRYLOG_DIR in target or target.endswith("index.log"):
            stuck.set()
            release.wait(30)
        real(fd)

    s = await open_storage(tmp_path, entry_log_bytes_max=4000)
    try:
        await add_all(s, 1, range(100))  # several rotations: finished logs wait for the checkpoint
        monkeypatch.setattr(fileio_mod, "fdatasync", fdatasync)
        checkpoint = asyncio.create_task(s.checkpoint())
        await asyncio.to_thread(stuck.wait, 10)
        assert stuck.is_set() and not checkpoint.done()
        async with asyncio.timeout(10):
            await add_all(s, 1, range(100, 200))  # acknowledged while the checkpoint is stuck
        assert not checkpoint.done()
        release.set()
        await checkpoint
        monkeypatch.setattr(fileio_mod, "fdatasync", real)
        await add_all(s, 1, range(200, 220))
        await s.abort()  # crash: the checkpoint and the journal give back everything
        s = await open_storage(tmp_path, entry_log_bytes_max=4000)
        for e in range(220):
            assert await s.read_entry(1, e) == body(1, e)
    finally:
        release.set()
        await s.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.integers(0, 50), st.integers(0, 20_000)),
                          st.integers(0, 5), st.integers(0, 2**32 - 1), st.integers(1, 2**31)),
                max_size=60))
def test_ledger_index_matches_a_dict(puts: list[tuple[int, int, int, int]]) -> None:
    from asyncbk.bookie.storage import LedgerIndex

    index, model = LedgerIndex(), {}
    for entry_id, log_id, offset, length in puts:
        assert index.put(entry_id, (log_id, offset, length)) == model.get(entry_id)
        model[entry_id] = (log_id, offset, length)
        assert len(index) == len(model)
        assert index.last == max(model)
    for entry_id in range(-1, 20_002):
        assert index.get(entry_id) == model.get(entry_id)


def test_ledger_index_absorbs_sparse_entries_as_the_dense_range_grows() -> None:
    from asyncbk.bookie.storage import INDEX_GAP_MAX, LedgerIndex

    index = LedgerIndex()
    far = INDEX_GAP_MAX + 100
    index.put(far, (1, 2, 3))
    index.put(far + 7, (1, 9, 3))
    for e in range(far):
        index.put(e, (0, e, 10))
    assert len(index) == far + 2 and index.last == far + 7
    assert index.get(far) == (1, 2, 3) and index.get(far + 7) == (1, 9, 3)
    assert index.get(far + 1) is None and index.get(far - 1) == (0, far - 1, 10)
    assert not index._sparse  # both now live in the arrays


def _entrylog_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "ledgers" / ENTRYLOG_DIR).iterdir())


async def test_deleted_ledger_stays_deleted_after_a_crash(tmp_path: Path) -> None:
    s = await open_storage(tmp_path)
    await add_all(s, 1, range(20))
    await add_all(s, 2, range(20))
    await s.checkpoint()  # ledger 1 is in the checkpoint
    await s.delete_ledger(1)
    with pytest.raises(NoSuchLedgerError):
        await s.read_entry(1, 0)
    assert s.ledger(1) is None and 1 not in s.ledger_ids()
    await s.abort()  # crash: only the journal knows of the deletion
    s = await open_storage(tmp_path)
    try:
        assert sorted(s.ledger_ids()) == [2]
        with pytest.raises(NoSuchLedgerError):
            await s.read_entries(1, 0, 10, 1 << 20)
        assert await s.read_entries(2, 0, 100, 1 << 20) == [body(2, e) for e in range(20)]
        await s.checkpoint()  # and once the journal is gone, the checkpoint knows
    finally:
        await s.close()
    s = await open_storage(tmp_path)
    try:
        assert sorted(s.ledger_ids()) == [2]
    finally:
        await s.close()


async def test_compaction_reclaims_space_while_adds_and_reads_go_on(tmp_path: Path) -> None:
    s = await open_storage(tmp_path, entry_log_bytes_max=20_000)
    try:
        for e in range(150):  # four ledgers interleaved over many small entry logs
            await asyncio.gather(*(s.add_entry(lid, e, KEY, body(lid, e)) for lid in (1, 2, 3, 4)))
        await s.checkpoint()
        for lid in (1, 2, 3):
            await s.delete_ledger(lid)
        usage = await s.entry_log_usage()
        assert len(usage) >= 3
        assert all(live < total / 2 for live, total in usage.values())
        before = _entrylog_bytes(tmp_path)

        async def writer() -> None:
            for e in range(300):
                await s.add_entry(5, e, KEY, body(5, e))

        async def reader() -> None:
            for _ in range(20):
                assert await s.read_entries(4, 0, 150, 1 << 30) == [body(4, e) for e in range(150)]
                await asyncio.sleep(0)

        freed = 0
        writing = asyncio.gather(writer(), reader())
        for log_id in sorted(usage):
            freed += await s.compact_entry_log(log_id)
        await writing
        after = _entrylog_bytes(tmp_path)
        compacted = sum(total for _, total in usage.values())
        assert freed >= 0.6 * compacted, (freed, compacted)  # about 3/4 of it was dead
        written = sum(len(body(5, e)) + 29 for e in range(300))  # ledger 5, meanwhile
        assert after <= before - freed + written, (before, after, freed, written)
        assert not set(usage) & set(await s.entry_log_usage())  # those logs are gone
        for lid, n in ((4, 150), (5, 300)):
            assert await s.read_entries(lid, 0, 1000, 1 << 30) == [body(lid, e) for e in range(n)]
        assert s.statistics()["compactions"] == len(usage)
        with pytest.raises(BadRequestError):
            await s.compact_entry_log(s.statistics()["entry_log_id"])
        await s.abort()  # crash right after: the moved entries were made durable
        s = await open_storage(tmp_path, entry_log_bytes_max=20_000)
        assert sorted(s.ledger_ids()) == [4, 5]
        for lid, n in ((4, 150), (5, 300)):
            assert await s.read_entries(lid, 0, 1000, 1 << 30) == [body(lid, e) for e in range(n)]
    finally:
        await s.close()


async def test_a_log_whose_deletion_a_crash_cut_short_is_deleted_next_time(
        tmp_path: Path) -> None:
    """Compaction deletes a log in steps (..freeing); a crash during those steps leaves
    it shorter, torn mid-record, with nothing live in it: the next compaction reads it
    up to the tear and deletes it.  A log torn where live entries are is still corrupt."""
    from asyncbk.bookie.storage.entrylog import entry_log_name

    s = await open_storage(tmp_path, entry_log_bytes_max=20_000)
    try:
        await add_all(s, 1, range(300))  # several logs of ledger 1 alone
        await add_all(s, 2, range(300))  # then several of ledger 2 alone
        await s.delete_ledger(1)
        await s.checkpoint()
        usage = await s.entry_log_usage()
        dead = min(log_id for log_id, (live, _) in usage.items() if live == 0)
        alive = max(log_id for log_id, (live, _) in usage.items() if live > 0)
        torn = {log_id: usage[log_id][1] // 2 + 7 for log_id in (dead, alive)}
        for log_id, length in torn.items():  # what a crash during deletion steps leaves
            with (tmp_path / "ledgers" / ENTRYLOG_DIR / entry_log_name(log_id)).open("r+b") as f:
                f.truncate(length)
        await s.abort()
        s = await open_storage(tmp_path, entry_log_bytes_max=20_000)
        assert (await s.entry_log_usage())[dead] == (0, torn[dead])
        assert await s.compact_entry_log(dead) == torn[dead]
        assert not (tmp_path / "ledgers" / ENTRYLOG_DIR / entry_log_name(dead)).exists()
        with pytest.raises(BookieIOError, match="corrupt"):
            await s.compact_entry_log(alive)
        assert (tmp_path / "ledgers" / ENTRYLOG_DIR / entry_log_name(alive)).exists()
    finally:
        await s.close()


def test_a_forgotten_entry_log_is_never_opened_again(tmp_path: Path) -> None:
    """A read that looked its entry up before compaction moved it, and reaches the old
    log after the log was retired, fails (the client reads another copy) rather than
    keep the deleted file open."""
    from asyncbk.bookie.storage.entrylog import EntryLogReader, entry_log_name

    (tmp_path / entry_log_name(5)).write_bytes(encode_add(1, 0, b"x" * 100))
    reader = EntryLogReader(tmp_path)
    try:
        reader.forget(5)
        with pytest.raises(BookieIOError, match="compacted away"):
            reader.read((5, 0, len(encode_add(1, 0, b"x" * 100))), 1, 0)
    finally:
        reader.close()


def test_ledger_index_absorbs_thousands_of_sparse_entries_without_recursion() -> None:
    """Entries copied to a new bookie from far into a ledger, out of order (as
    re-replication does): thousands go sparse, then the dense range reaches them."""
    from asyncbk.bookie.storage import INDEX_GAP_MAX, LedgerIndex

    index = LedgerIndex()
    first = INDEX_GAP_MAX * 3
    far = list(range(first, first + 20_000))
    for e in reversed(far):  # all beyond the dense range: sparse
        index.put(e, (1, e, 7))
    for e in range(first):  # the dense range grows up to them
        index.put(e, (0, e, 5))
    assert not index._sparse and len(index) == first + 20_000
    assert index.get(first + 19_999) == (1, first + 19_999, 7) and index.get(0) == (0, 0, 5)


# --- time from the injected clock ---------------------------------------------------


async def test_tombstones_age_on_the_injected_clock(tmp_path: Path) -> None:
    clock = ManualClock(start_s=1_000_000.0)
    s = await open_storage(tmp_path, clock=clock, gc_tombstone_s=100.0)
    try:
        await add_all(s, 1, range(3))
        await add_all(s, 2, range(3))
        await s.delete_ledger(1)
        await s.checkpoint()
        payload = read_checkpoint(tmp_path / "ledgers")
        assert payload is not None and payload["tombstones"] == [[1, 1_000_000_000]]
        clock.advance(99.0)
        assert s.is_deleted(1)  # 99 s on the clock: still refused
        clock.advance(1.0)
        assert not s.is_deleted(1)  # gc_tombstone_s on the clock: expired
        await add_all(s, 2, range(3, 4))  # something new, so the checkpoint is written
        await s.checkpoint()
        payload = read_checkpoint(tmp_path / "ledgers")
        assert payload is not None and payload["tombstones"] == []  # expired there too
    finally:
        await s.close()


async def test_a_replayed_deletion_is_dated_by_the_injected_clock(tmp_path: Path) -> None:
    clock = ManualClock(start_s=1_000_000.0)
    s = await open_storage(tmp_path, clock=clock, gc_tombstone_s=100.0)
    await add_all(s, 1, range(3))
    await s.checkpoint()
    await s.delete_ledger(1)
    await s.abort()  # only the journal knows of the deletion
    clock.advance(500.0)  # the restart comes later: the record carries no time
    s = await open_storage(tmp_path, clock=clock, gc_tombstone_s=100.0)
    try:
        assert s.ledger_ids() == [] and s.is_deleted(1)
        clock.advance(99.0)
        assert s.is_deleted(1)  # counted from the replay, on the clock
        clock.advance(1.0)
        assert not s.is_deleted(1)
    finally:
        await s.close()
