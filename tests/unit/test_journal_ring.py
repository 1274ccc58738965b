"""The journal through io_uring (``journal_io``, :mod:`asyncbk.bookie.uring`): the
loop submits each batch's write linked to its fdatasync, the writer thread does the
sink's work beside them, and a batch is acknowledged only once both are done.  Real
rings on real files; the rings below only hold back or misdirect what the real one
is given."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from asyncbk.bookie.journal import Journal
from asyncbk.bookie.journal_files import list_journal_files
from asyncbk.bookie.journal_format import decode_records
from asyncbk.bookie.uring import OnSynced, RingUnavailable, RingWrite, SyncRing, open_ring
from asyncbk.config import BookieConfig
from asyncbk.errors import BookieIOError, ConfigError

from .test_journal import read_journal, rec

MIB = 1 << 20


class HeldRing(SyncRing):
    """A real ring whose completions are handed on only once ``release`` is set."""

    def __init__(self, loop: asyncio.AbstractEventLoop, lib: Any) -> None:
        super().__init__(loop, lib)
        self.release = asyncio.Event()
        self.completed = asyncio.Event()
        self.held: list[asyncio.Task[None]] = []

    def write_then_fdatasync(self, fd: int, buf: bytes, offset: int, done: OnSynced) -> None:
        def hold(result: RingWrite) -> None:
            self.completed.set()
            self.held.append(asyncio.ensure_future(self._hand_on(done, result)))

        super().write_then_fdatasync(fd, buf, offset, hold)

    async def _hand_on(self, done: OnSynced, result: RingWrite) -> None:
        await self.release.wait()
        done(result)

    async def wait_idle(self) -> None:
        await super().wait_idle()
        await asyncio.gather(*self.held)  # (what the real ring completed is handed on)


class MisdirectedRing(SyncRing):
    """A real ring that, from its ``good``-th batch on, writes to a descriptor opened
    read-only: the kernel fails the write (EBADF) and cancels the linked sync."""

    def __init__(self, loop: asyncio.AbstractEventLoop, lib: Any, good: int,
                 path: Path) -> None:
        super().__init__(loop, lib)
        self.good = good
        self.read_only = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)

    def write_then_fdatasync(self, fd: int, buf: bytes, offset: int, done: OnSynced) -> None:
        if self.good <= 0:
            fd = self.read_only
        self.good -= 1
        super().write_then_fdatasync(fd, buf, offset, done)

    def close(self) -> None:
        super().close()
        os.close(self.read_only)


def liburing() -> Any:
    import liburing as lib

    return lib


async def ring_journal(directory: Path, make_ring: Any, sink: Any = None,
                       **config: Any) -> Journal:
    await asyncio.to_thread(directory.mkdir, exist_ok=True)
    j = Journal(directory, BookieConfig(journal_io="uring", **config), first_seq=1,
                sink=sink, ring_opener=make_ring)
    await j.start()
    assert j.io_mode == "uring"
    return j


async def test_the_ring_writes_at_the_offsets_given_and_syncs(tmp_path: Path) -> None:
    ring = open_ring(asyncio.get_running_loop())
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"a" * 100, 0)
        for buf, offset in ((b"BBBB", 10), (b"C" * 5000, 8192)):
            fut: asyncio.Future[RingWrite] = asyncio.get_running_loop().create_future()
            ring.write_then_fdatasync(fd, buf, offset, fut.set_result)
            result = await asyncio.wait_for(fut, 10)
            assert result.error is None and result.write_s >= 0 and result.fsync_s >= 0
        data = (tmp_path / "f").read_bytes()
        assert data[:20] == b"a" * 10 + b"BBBB" + b"a" * 6
        assert data[8192:] == b"C" * 5000
        assert ring.in_flight == 0
    finally:
        await ring.wait_idle()
        ring.close()
        os.close(fd)


async def test_a_failed_write_cancels_its_sync_and_says_why(tmp_path: Path) -> None:
    ring = open_ring(asyncio.get_running_loop())
    fd = os.open(tmp_path / "f", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fut: asyncio.Future[RingWrite] = asyncio.get_running_loop().create_future()
        ring.write_then_fdatasync(fd, b"x" * 10, 0, fut.set_result)
        result = await asyncio.wait_for(fut, 10)
        assert isinstance(result.error, OSError) and result.error.errno == errno.EBADF
        assert "journal write" in str(result.error)
    finally:
        ring.close()
        os.close(fd)


async def test_a_batch_is_acknowledged_only_once_its_sync_completed(tmp_path: Path) -> None:
    """The sink's work (on the writer thread) is done while the write and sync are still
    held: the batch's futures wait for the sync all the same."""
    applied = threading.Event()

    class Sink:
        def apply_in_writer(self, records: list[bytes], items: list[Any]) -> Any:
            applied.set()
            return len(records)

        def apply_on_loop(self, items: list[Any], result: Any) -> None:
            pass

    rings: list[HeldRing] = []

    def make(loop: asyncio.AbstractEventLoop) -> SyncRing:
        rings.append(HeldRing(loop, liburing()))
        return rings[0]

    j = await ring_journal(tmp_path, make, sink=Sink())
    futs = [j.append(rec(i), item=i) for i in range(5)]
    ring = rings[0]
    await asyncio.wait_for(ring.completed.wait(), 10)  # written and synced, held
    await asyncio.to_thread(applied.wait, 10)
    await asyncio.sleep(0.05)
    assert applied.is_set() and not any(f.done() for f in futs)
    ring.release.set()
    await asyncio.wait_for(asyncio.gather(*futs), 10)
    assert j.statistics()["ring_batches"] == 1
    await j.close()
    assert read_journal(tmp_path) == [decode_records(rec(i))[0][0] for i in range(5)]


async def test_stop_now_waits_for_the_ring_and_acknowledges_nothing(tmp_path: Path) -> None:
    rings: list[HeldRing] = []

    def make(loop: asyncio.AbstractEventLoop) -> SyncRing:
        rings.append(HeldRing(loop, liburing()))
        return rings[0]

    j = await ring_journal(tmp_path, make)
    futs = [j.append(rec(i)) for i in range(3)]
    await asyncio.wait_for(rings[0].completed.wait(), 10)
    stop = asyncio.create_task(j.stop_now())
    await asyncio.sleep(0.05)
    assert not stop.done()  # the ring still holds the batch
    rings[0].release.set()
    await asyncio.wait_for(stop, 10)
    for fut in futs:
        with pytest.raises(BookieIOError):
            await fut
    await j.close()


async def test_a_failed_ring_write_fails_the_journal(tmp_path: Path) -> None:
    def make(loop: asyncio.AbstractEventLoop) -> SyncRing:
        return MisdirectedRing(loop, liburing(), good=2, path=tmp_path / "other")

    j = await ring_journal(tmp_path / "j", make)
    for i in range(2):
        await j.append(rec(i))
    with pytest.raises(BookieIOError, match="Bad file descriptor"):
        await j.append(rec(2))
    assert j.failed and j.writer_failed  # (a checkpoint refuses to run)
    with pytest.raises(BookieIOError):
        j.append(rec(3))
    await j.close()
    # what was acknowledged is there; the failed batch never reached the file
    assert read_journal(tmp_path / "j") == [decode_records(rec(i))[0][0] for i in range(2)]


async def test_space_is_allocated_ahead_so_batches_stay_on_the_ring(tmp_path: Path) -> None:
    """Preallocation runs on the writer thread between ring batches, and a new file is
    the thread's; everything else goes through the ring."""
    j = await ring_journal(tmp_path, open_ring, journal_preallocate_bytes=64 * 1024,
                           journal_file_bytes_max=MIB)
    size = len(rec(0))
    n = (3 * MIB) // size
    for first in range(0, n, 100):
        await asyncio.gather(*[j.append(rec(i)) for i in range(first, min(n, first + 100))])
    stats = j.statistics()
    files = list_journal_files(tmp_path)
    assert len(files) >= 3
    # the thread wrote only the batches that opened a file, or that crossed the
    # file's end (allocated no further than journal_file_bytes_max)
    assert stats["ring_batches"] > 0.9 * stats["batches"]
    assert stats["batches"] - stats["ring_batches"] <= 2 * (len(files) - 1)
    await j.close()
    for _, path in files:  # each file ends at its last record
        data = path.read_bytes()
        assert decode_records(data)[1] == len(data)
    assert len(read_journal(tmp_path)) == n


async def test_uring_asked_for_and_missing_is_a_clear_error(tmp_path: Path) -> None:
    def missing(loop: asyncio.AbstractEventLoop) -> SyncRing:
        raise RingUnavailable("the liburing package is not installed")

    j = Journal(tmp_path, BookieConfig(journal_io="uring"), first_seq=1, ring_opener=missing)
    with pytest.raises(ConfigError, match="set journal_io to 'auto' or 'thread'"):
        await j.start()
    await j.close()
    await asyncio.to_thread((tmp_path / "a").mkdir)
    auto = Journal(tmp_path / "a", BookieConfig(journal_io="auto"), first_seq=1,
                   ring_opener=missing)
    await auto.start()
    assert auto.io_mode == "thread"
    await auto.append(rec(0))
    await auto.close()


def test_journal_io_is_checked() -> None:
    with pytest.raises(ConfigError, match="journal_io must be one of auto, uring, thread"):
        BookieConfig(journal_io="ring").validate()
