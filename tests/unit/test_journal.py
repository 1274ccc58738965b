"""Group-commit journal writer."""

from __future__ import annotations

import asyncio
import errno
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from asyncbk.bookie import fileio as fileio_mod
from asyncbk.bookie.journal import Journal
from asyncbk.bookie.journal_files import list_journal_files
from asyncbk.bookie.journal_format import AddRecord, Record, decode_records, encode_add
from asyncbk.bookie.journal_writer import EARLY_WRITEBACK_BYTES_MIN
from asyncbk.config import BookieConfig
from asyncbk.errors import BookieIOError, TooManyRequestsError


def rec(i: int, size: int = 10) -> bytes:
    return encode_add(1, i, b"x" * size)


async def started(directory: Path, sink: Any = None, **config: Any) -> Journal:
    j = Journal(directory, BookieConfig(**config), first_seq=1, sink=sink)
    await j.start()
    return j


def read_journal(directory: Path) -> list[Record]:
    out: list[Record] = []
    for _, path in list_journal_files(directory):
        data = path.read_bytes()
        records, good = decode_records(data)
        assert data[good:].count(0) == len(data) - good  # (zeros allocated ahead, if any)
        out.extend(records)
    return out


class BlockingSync:
    """Replaces fileio.fdatasync: the first ``block`` calls wait for ``release``."""

    def __init__(self, block: int = 1, fail: bool = False) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0
        self.block = block
        self.fail = fail

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.calls <= self.block:
            self.entered.set()
            assert self.release.wait(10), "test never released the fsync"
        if self.fail:
            raise OSError(errno.EIO, "simulated fsync failure")

    async def wait_entered(self) -> None:
        for _ in range(1000):
            if self.entered.is_set():
                return
            await asyncio.sleep(0.005)
        raise AssertionError("fsync never entered")


async def test_concurrent_appends_group_commit(tmp_path: Path) -> None:
    j = await started(tmp_path)
    futs = [j.append(rec(i)) for i in range(3000)]
    await asyncio.gather(*futs)
    stats = j.statistics()
    assert stats["records"] == 3000
    assert stats["batches"] < 3000
    assert stats["queue_entries"] == 0
    assert stats["fsync_histogram"]["+Inf"] == stats["batches"]  # cumulative buckets
    assert j.batch_records.count == stats["batches"]
    assert j.batch_records.sum == 3000
    await j.close()
    assert read_journal(tmp_path) == [AddRecord(1, i, b"x" * 10) for i in range(3000)]


async def test_flush_reason_entries(tmp_path: Path) -> None:
    j = await started(tmp_path, journal_group_entries_max=10)
    await asyncio.gather(*[j.append(rec(i)) for i in range(95)])
    reasons = j.statistics()["flush_reasons"]
    assert reasons["entries"] == 9
    assert reasons["queue_empty"] == 1
    assert j.statistics()["batch_records_max"] == 10
    await j.close()


async def test_flush_reason_bytes(tmp_path: Path) -> None:
    j = await started(tmp_path, journal_group_bytes_max=3 * len(rec(0)))
    await asyncio.gather(*[j.append(rec(i)) for i in range(10)])
    reasons = j.statistics()["flush_reasons"]
    assert reasons["bytes"] == 3
    assert reasons["queue_empty"] == 1
    await j.close()


async def test_flush_reason_wait_time(tmp_path: Path) -> None:
    j = await started(tmp_path, journal_flush_when_queue_empty=False,
                      journal_group_wait_ms_max=200.0)
    t0 = time.monotonic()
    futs = [j.append(rec(0))]
    await asyncio.sleep(0.005)
    futs.append(j.append(rec(1)))  # joins the same group: the oldest has not waited 200 ms
    await asyncio.gather(*futs)
    assert time.monotonic() - t0 >= 0.15
    stats = j.statistics()
    assert stats["batches"] == 1
    assert stats["flush_reasons"]["wait_time"] == 1
    await j.close()


async def test_wait_mode_flushes_early_at_entries_limit(tmp_path: Path) -> None:
    j = await started(tmp_path, journal_flush_when_queue_empty=False,
                      journal_group_wait_ms_max=10_000.0, journal_group_entries_max=4)
    await asyncio.wait_for(asyncio.gather(*[j.append(rec(i)) for i in range(8)]), 5)
    assert j.statistics()["flush_reasons"]["entries"] == 2
    # a lone record waiting for its group is flushed by close
    fut = j.append(rec(9))
    await j.close()
    assert fut.done() and fut.exception() is None
    assert j.statistics()["flush_reasons"]["close"] == 1


async def test_futures_pending_until_fsync_and_next_batch_groups(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sync = BlockingSync()
    writes: list[int] = []
    real_pwrite_all = fileio_mod.pwrite_all

    def counting_pwrite_all(fd: int, data: Any, offset: int) -> None:
        writes.append(len(data))
        real_pwrite_all(fd, data, offset)

    monkeypatch.setattr(fileio_mod, "fdatasync", sync)
    monkeypatch.setattr(fileio_mod, "pwrite_all", counting_pwrite_all)
    j = await started(tmp_path)
    first = j.append(rec(0))
    await sync.wait_entered()
    later = [j.append(rec(i)) for i in range(1, 101)]  # queue up behind the fsync
    await asyncio.sleep(0.05)
    assert not first.done()
    assert not any(f.done() for f in later)
    assert j.queue_entries == 101
    sync.release.set()
    await asyncio.gather(first, *later)
    stats = j.statistics()
    assert stats["batches"] == 2  # all 100 went into one group commit
    assert writes == [len(rec(0)), 100 * len(rec(0))]  # one write per batch
    await j.close()


async def test_fsync_failure_fails_batch_and_later_appends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sync = BlockingSync(fail=True)
    monkeypatch.setattr(fileio_mod, "fdatasync", sync)
    j = await started(tmp_path)
    first = j.append(rec(0))
    await sync.wait_entered()
    queued = j.append(rec(1))
    sync.release.set()
    with pytest.raises(BookieIOError):
        await first
    with pytest.raises(BookieIOError):
        await queued
    assert j.failed and j.statistics()["failed"]
    with pytest.raises(BookieIOError):
        j.append(rec(2))
    assert j.statistics()["batches"] == 0
    await j.wait_for_space()  # does not hang on a failed journal
    await j.close()


@pytest.mark.parametrize("preallocate", [16 << 20, 0])
async def test_write_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             preallocate: int) -> None:
    def broken(fd: int, data: Any, offset: int = 0) -> None:
        raise OSError(errno.ENOSPC, "disk full")

    j = await started(tmp_path, journal_preallocate_bytes=preallocate)
    monkeypatch.setattr(fileio_mod, "pwrite_all" if preallocate else "write_all", broken)
    with pytest.raises(BookieIOError):
        await j.append(rec(0))
    with pytest.raises(BookieIOError):
        j.append(rec(1))
    await j.close()


async def held_in_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                        **config: Any) -> tuple[Journal, BlockingSync, asyncio.Future[Any]]:
    """A journal whose first batch, one record (``rec(0)``), is held in its fsync until
    ``sync.release`` is set: the journal, the fsync, that record's future."""
    sync = BlockingSync()
    monkeypatch.setattr(fileio_mod, "fdatasync", sync)
    j = await started(tmp_path, **config)
    first = j.append(rec(0))
    await sync.wait_entered()
    return j, sync, first


async def test_queue_bound_and_wait_for_space(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    j, sync, first = await held_in_fsync(tmp_path, monkeypatch, journal_queue_entries_max=8)
    futs = [first]
    futs += [j.append(rec(i)) for i in range(1, 8)]  # 1 in flight + 7 queued = the bound
    with pytest.raises(TooManyRequestsError):
        j.append(rec(8))
    with pytest.raises(TooManyRequestsError):
        j.ensure_room(1)
    waiter = asyncio.create_task(j.wait_for_space())
    await asyncio.sleep(0.02)
    assert not waiter.done()
    sync.release.set()
    await asyncio.wait_for(waiter, 5)
    await asyncio.gather(*futs)
    await j.append(rec(9))
    await j.close()


async def test_wait_for_space_cancellation_leaves_no_waiter(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sync = BlockingSync()
    monkeypatch.setattr(fileio_mod, "fdatasync", sync)
    j = await started(tmp_path, journal_queue_entries_max=4)
    futs = [j.append(rec(i)) for i in range(4)]
    await sync.wait_entered()
    waiter = asyncio.create_task(j.wait_for_space())
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert j._space_waiters == []
    sync.release.set()
    await asyncio.gather(*futs)
    await j.close()


async def test_rotation(tmp_path: Path) -> None:
    size = len(rec(0))
    j = await started(tmp_path, journal_file_bytes_max=3 * size)
    for i in range(10):
        await j.append(rec(i))
    await j.close()
    files = list_journal_files(tmp_path)
    assert [seq for seq, _ in files] == [1, 2, 3, 4]
    assert j.statistics()["files_created"] == 4
    assert read_journal(tmp_path) == [AddRecord(1, i, b"x" * 10) for i in range(10)]


async def test_close_drains_then_refuses(tmp_path: Path) -> None:
    j = await started(tmp_path)
    futs = [j.append(rec(i)) for i in range(50)]
    await j.close()
    assert all(f.done() and f.exception() is None for f in futs)
    with pytest.raises(BookieIOError):
        j.append(rec(51))
    await j.close()  # idempotent
    assert len(read_journal(tmp_path)) == 50


async def test_stop_now_fails_pending(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sync = BlockingSync()
    monkeypatch.setattr(fileio_mod, "fdatasync", sync)
    j = await started(tmp_path)
    first = j.append(rec(0))
    await sync.wait_entered()
    queued = j.append(rec(1))
    stopping = asyncio.create_task(j.stop_now())
    await asyncio.sleep(0.02)
    assert not stopping.done()  # waits for the thread to finish the in-flight batch
    sync.release.set()
    await stopping
    for fut in (first, queued):
        with pytest.raises(BookieIOError):
            await fut
    await j.close()


async def test_no_sync_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(fileio_mod, "fdatasync", calls.append)
    j = await started(tmp_path, journal_sync=False)
    await asyncio.gather(*[j.append(rec(i)) for i in range(10)])
    assert calls == []
    await j.close()


async def test_sink_runs_on_writer_thread_before_futures_resolve(tmp_path: Path) -> None:
    events: list[Any] = []

    class Sink:
        def apply_in_writer(self, records: list[bytes], items: list[Any]) -> Any:
            events.append(("thread", threading.current_thread().name, list(items)))
            return len(records)

        def apply_on_loop(self, items: list[Any], result: Any) -> None:
            events.append(("loop", result, [f.done() for f in futs]))

    j = await started(tmp_path, sink=Sink())
    futs = [j.append(rec(i), item=i) for i in range(3)]
    await asyncio.gather(*futs)
    assert events[0][0] == "thread" and events[0][1].startswith("asyncbk-journal")
    assert events[0][2] == [0, 1, 2]
    assert events[1] == ("loop", 3, [False, False, False])
    await j.close()


async def test_sink_runs_while_the_disk_writes_the_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch is written, its write-back started (from EARLY_WRITEBACK_BYTES_MIN on),
    the sink run, and only then is it fdatasync'd: the disk writes while the thread
    copies to the entry log, and nothing resolves before the sync."""
    events: list[Any] = []
    real_writeback = fileio_mod.start_writeback

    def writeback(fd: int, offset: int, length: int) -> None:
        real_writeback(fd, offset, length)  # (the real call: Linux takes it)
        events.append(("writeback", offset, length))

    monkeypatch.setattr(fileio_mod, "start_writeback", writeback)
    monkeypatch.setattr(fileio_mod, "fdatasync", lambda fd: events.append(("fdatasync",)))

    class Sink:
        def apply_in_writer(self, records: list[bytes], items: list[Any]) -> Any:
            events.append(("sink", len(records)))
            return "applied"

        def apply_on_loop(self, items: list[Any], result: Any) -> None:
            events.append(("loop", result))

    j = await started(tmp_path, sink=Sink())
    events.clear()  # (the file's creation)
    size = len(rec(0, EARLY_WRITEBACK_BYTES_MIN))
    await j.append(rec(0, EARLY_WRITEBACK_BYTES_MIN))
    await asyncio.gather(*[j.append(rec(i, 3000)) for i in range(1, 4)])  # (small)
    await asyncio.gather(*[j.append(rec(i, EARLY_WRITEBACK_BYTES_MIN // 2)) for i in (4, 5)])
    small, half = len(rec(0, 3000)), len(rec(0, EARLY_WRITEBACK_BYTES_MIN // 2))
    assert events == [("writeback", 0, size), ("sink", 1), ("fdatasync",), ("loop", "applied"),
                      ("sink", 3), ("fdatasync",), ("loop", "applied"),
                      ("writeback", size + 3 * small, 2 * half), ("sink", 2), ("fdatasync",),
                      ("loop", "applied")]
    await j.close()


async def test_a_file_system_refusing_early_writeback_syncs_without_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def refused(fd: int, offset: int, length: int) -> None:
        calls.append(offset)
        raise OSError(errno.EINVAL, "sync_file_range: Invalid argument")

    monkeypatch.setattr(fileio_mod, "start_writeback", refused)
    syncs = []
    monkeypatch.setattr(fileio_mod, "fdatasync", syncs.append)

    class Sink:
        def apply_in_writer(self, records: list[bytes], items: list[Any]) -> Any:
            return None

        def apply_on_loop(self, items: list[Any], result: Any) -> None:
            pass

    j = await started(tmp_path, sink=Sink())
    for i in range(3):
        await j.append(rec(i, EARLY_WRITEBACK_BYTES_MIN))
    assert calls == [0]  # tried once, then no more
    assert len(syncs) >= 3 and not j.failed
    await j.close()
    assert [r.entry_id for r in read_journal(tmp_path)] == [0, 1, 2]  # type: ignore[union-attr]


async def test_no_sync_mode_starts_no_writeback(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(fileio_mod, "start_writeback", lambda fd, o, n: calls.append(o))

    class Sink:
        def apply_in_writer(self, records: list[bytes], items: list[Any]) -> Any:
            return None

        def apply_on_loop(self, items: list[Any], result: Any) -> None:
            pass

    j = await started(tmp_path, sink=Sink(), journal_sync=False)
    await asyncio.gather(*[j.append(rec(i, EARLY_WRITEBACK_BYTES_MIN)) for i in range(5)])
    assert calls == []
    await j.close()


async def test_sink_failure_fails_journal(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[int] = []
    monkeypatch.setattr(fileio_mod, "fdatasync", syncs.append)

    class Sink:
        def apply_in_writer(self, records: list[bytes], items: list[Any]) -> Any:
            raise OSError(errno.EIO, "entry log broken")

        def apply_on_loop(self, items: list[Any], result: Any) -> None:
            raise AssertionError("not reached")

    j = await started(tmp_path, sink=Sink())
    syncs.clear()  # (the file's creation)
    with pytest.raises(BookieIOError):
        await j.append(rec(0))
    assert j.failed
    assert syncs == []  # (the failed batch is never synced: nothing of it is acknowledged)
    await j.close()


async def test_cancelled_caller_future_is_still_written(tmp_path: Path) -> None:
    j = await started(tmp_path)
    fut = j.append(rec(0))
    fut.cancel()
    await j.append(rec(1))
    await j.close()
    assert len(read_journal(tmp_path)) == 2


async def test_append_batch_one_future_for_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's one future resolves only once every record is fsynced, even when the
    records go out in two group commits; a batch that does not fit is refused whole."""
    sync = BlockingSync()
    monkeypatch.setattr(fileio_mod, "fdatasync", sync)
    j = await started(tmp_path, journal_group_entries_max=4, journal_queue_entries_max=12)
    first = j.append(rec(0))
    await sync.wait_entered()
    batch = j.append_batch([rec(i) for i in range(1, 7)], [None] * 6)  # 4 + 2
    assert j.queue_entries == 7
    with pytest.raises(TooManyRequestsError):
        j.append_batch([rec(i) for i in range(7, 13)], [None] * 6)  # 7 + 6 > 12
    assert j.queue_entries == 7  # nothing of it was queued
    with pytest.raises(ValueError):
        j.append_batch([], [])
    sync.release.set()
    await first
    await asyncio.wait_for(batch, 5)
    assert j.statistics()["batches"] == 3  # 1, then the batch as 4 + 2
    assert j.statistics()["records"] == 7 and j.queue_entries == 0
    await j.close()


async def test_append_batch_fails_whole_on_fsync_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sync = BlockingSync(fail=True)
    monkeypatch.setattr(fileio_mod, "fdatasync", sync)
    j = await started(tmp_path)
    first = j.append(rec(0))
    await sync.wait_entered()
    batch = j.append_batch([rec(1), rec(2)], [None, None])
    sync.release.set()
    with pytest.raises(BookieIOError):
        await first
    with pytest.raises(BookieIOError):
        await batch
    with pytest.raises(BookieIOError):
        j.append_batch([rec(3)], [None])
    await j.close()


async def test_a_failing_callback_leaves_the_batch_s_other_waiters_completed(
        tmp_path: Path) -> None:
    j = await started(tmp_path)
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    got: list[Any] = []
    try:
        def broken(outcome: Any) -> None:
            raise RuntimeError("a bug in the caller")

        j.append_batch_then([rec(0)], [None], broken)
        j.append_batch_then([rec(1)], [None], got.append)
        fut = j.append(rec(2))
        await asyncio.wait_for(fut, 10)
        assert len(got) == 1 and not isinstance(got[0], BaseException)
        assert got[0].records >= 2  # one group commit covered them
        assert [type(c["exception"]) for c in reported] == [RuntimeError]
        assert not j.failed
    finally:
        loop.set_exception_handler(None)
        await j.close()
