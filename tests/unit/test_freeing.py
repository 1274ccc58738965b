"""freeing.py: large files (old journal files, compacted entry logs) are freed in
steps, each step's freed blocks going with one file-system commit, which a journal's
fdatasync on the same disk waits for; from a worker thread, or from a coroutine whose
pauses are the injected clock's."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from asyncbk.bookie import freeing
from asyncbk.bookie.fileio import OsFileIO, ThreadOffload
from asyncbk.bookie.freeing import shrink_then_unlink, shrink_then_unlink_paced
from asyncbk.bookie.journal_format import journal_file_name

MIB = 1 << 20


class RecordingIO(OsFileIO):
    """The real file calls, each truncation's new size recorded, the descriptors opened
    for writing and not closed yet, and the directories fsynced."""

    def __init__(self) -> None:
        self.truncated: list[int] = []
        self.open_fds: set[int] = set()
        self.dirs_synced: list[Path] = []

    def truncate(self, fd: int, length: int) -> None:
        self.truncated.append(length)
        super().truncate(fd, length)

    def open_append(self, path: Path) -> int:
        fd = super().open_append(path)
        self.open_fds.add(fd)
        return fd

    def close(self, fd: int) -> None:
        self.open_fds.discard(fd)
        super().close(fd)

    def fsync_dir(self, path: Path) -> None:
        self.dirs_synced.append(path)
        super().fsync_dir(path)


def sized_file(path: Path, size: int) -> Path:
    path.write_bytes(b"x" * 123)
    with path.open("r+b") as f:
        f.truncate(size)
    return path


def test_a_large_file_is_cut_in_steps_then_unlinked(tmp_path: Path) -> None:
    # The pause is passed in: patching time.sleep would also count the sleeps of
    # threads other tests left running.
    slept: list[float] = []
    path = sized_file(tmp_path / journal_file_name(1), 10 * MIB + 123)
    io = RecordingIO()
    shrink_then_unlink(io, path, step=4 * MIB, pause_s=0.01, pause=slept.append)
    assert not path.exists()
    assert io.truncated == [6 * MIB + 123, 2 * MIB + 123]  # (the rest goes with the unlink)
    assert slept == [0.01, 0.01]


def test_the_default_steps_are_small_and_spaced() -> None:
    # 16 MB steps 2 ms apart held the journal's fdatasyncs 5-20 ms each on a disk
    # mounted with discard (benchmarks/README.md, speed round three, fourth session).
    assert freeing.DELETE_STEP_BYTES <= 4 * MIB
    assert freeing.DELETE_PAUSE_S >= 0.01
    defaults: Any = shrink_then_unlink.__defaults__
    assert defaults == (freeing.DELETE_STEP_BYTES, freeing.DELETE_PAUSE_S, time.sleep)


def test_a_small_or_missing_file_is_unlinked_without_steps(tmp_path: Path) -> None:
    path = tmp_path / journal_file_name(2)
    path.write_bytes(b"y" * 1000)
    io = RecordingIO()
    shrink_then_unlink(io, path, step=4 * MIB, pause_s=0.0)
    assert not path.exists() and io.truncated == []
    shrink_then_unlink(io, path, step=4 * MIB, pause_s=0.0)  # gone already: nothing
    assert io.truncated == []


async def test_from_a_coroutine_the_steps_run_on_the_worker_and_pause_on_its_clock(
        tmp_path: Path) -> None:
    path = sized_file(tmp_path / "0000000000000001.log", 10 * MIB + 123)
    io = RecordingIO()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    worker = ThreadOffload().worker("test-freeing", 1)
    try:
        await shrink_then_unlink_paced(worker, io, path, sleep, step=4 * MIB, pause_s=0.01)
    finally:
        await worker.shutdown()
    assert not path.exists()
    assert io.truncated == [6 * MIB + 123, 2 * MIB + 123]
    assert slept == [0.01, 0.01]
    assert io.dirs_synced == [tmp_path]  # the removal is durable
    assert not io.open_fds


async def test_a_cancelled_deletion_leaves_the_file_shorter_and_no_descriptor_open(
        tmp_path: Path) -> None:
    path = sized_file(tmp_path / "0000000000000002.log", 20 * MIB)
    io = RecordingIO()
    paused = asyncio.Event()

    async def hang(seconds: float) -> None:
        paused.set()
        await asyncio.Event().wait()

    async def no_pause(seconds: float) -> None:
        return None

    worker = ThreadOffload().worker("test-freeing", 1)
    try:
        task = asyncio.create_task(
            shrink_then_unlink_paced(worker, io, path, hang, step=4 * MIB, pause_s=0.01))
        await asyncio.wait_for(paused.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert path.stat().st_size == 16 * MIB  # one step cut, the file still there
        assert not io.open_fds
        await shrink_then_unlink_paced(worker, io, path, no_pause, step=4 * MIB)
        assert not path.exists()  # deleting it again finishes the job
    finally:
        await worker.shutdown()
