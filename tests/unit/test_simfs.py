"""The simulated file system: durability after fsync, crash semantics, faults."""

from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest

from asyncbk.bookie.fileio import FileIO, Offload
from asyncbk.testing.sim import run_sim
from asyncbk.testing.simfs import InlineOffload, SimFileSystem, SimMount

D = Path("/disk/dir")
F = D / "f"


def fresh(seed: int = 0) -> tuple[SimFileSystem, SimMount]:
    fs = SimFileSystem(random.Random(seed))
    io = fs.mount()
    _typed: FileIO = io  # the seam's protocol, checked by mypy
    _offload: Offload = InlineOffload(fs.rng)
    io.makedirs(D)
    return fs, io


def test_reads_see_unsynced_writes_and_a_crash_loses_them() -> None:
    fs, io = fresh()
    fd = io.create(F, exclusive=True)
    io.fsync_dir(D)
    io.write(fd, b"hello")
    assert io.pread(fd, 10, 0) == b"hello" and io.size(fd) == 5
    fs.crash(torn=False)
    io2 = fs.mount()
    assert io2.read_file(F) == b""


def test_synced_data_and_fsynced_entries_survive() -> None:
    fs, io = fresh()
    fd = io.create(F, exclusive=True)
    io.write(fd, b"abc")
    io.fdatasync(fd)
    io.fsync_dir(D)
    io.write(fd, b"def")
    fs.crash(torn=False)
    assert fs.mount().read_file(F) == b"abc"


def test_a_file_whose_directory_was_not_synced_vanishes() -> None:
    fs, io = fresh()
    fd = io.create(F, exclusive=True)
    io.write(fd, b"abc")
    io.fdatasync(fd)
    fs.crash(torn=True)
    with pytest.raises(FileNotFoundError):
        fs.mount().read_file(F)


def test_unsynced_unlink_and_rename_are_undone() -> None:
    fs, io = fresh()
    for name, body in (("a", b"A"), ("b", b"B")):
        fd = io.create(D / name, exclusive=True)
        io.write(fd, body)
        io.fdatasync(fd)
        io.close(fd)
    io.fsync_dir(D)
    io.unlink(D / "a")
    io.replace(D / "b", D / "c")
    assert sorted(n for n, _ in io.list_dir(D)) == ["c"]
    fs.crash(torn=False)
    io2 = fs.mount()
    assert io2.list_dir(D) == [("a", 1), ("b", 1)]
    io2.replace(D / "b", D / "a")
    io2.fsync_dir(D)
    fs.crash(torn=False)
    assert fs.mount().list_dir(D) == [("a", 1)]


def test_torn_crash_keeps_a_prefix_of_the_unsynced_writes() -> None:
    seen = set()
    for seed in range(200):
        fs, io = fresh(seed)
        fd = io.create(F, exclusive=True)
        io.write(fd, b"base")
        io.fdatasync(fd)
        io.fsync_dir(D)
        io.write(fd, b"1111")
        io.write(fd, b"2222")
        fs.crash(torn=True)
        got = fs.mount().read_file(F)
        assert (b"base11112222").startswith(got) and got.startswith(b"base")
        seen.add(len(got))
    assert seen == set(range(4, 13))  # every prefix, cut inside a write too


def test_truncate_is_unsynced_until_fdatasync() -> None:
    fs, io = fresh()
    fd = io.open_append(F)
    io.write(fd, b"0123456789")
    io.fdatasync(fd)
    io.fsync_dir(D)
    io.truncate(fd, 4)
    io.write(fd, b"xy")
    assert io.read_file(F) == b"0123xy"
    fs.crash(torn=False)
    assert fs.mount().read_file(F) == b"0123456789"


def test_fsync_failure_leaves_the_data_kept_or_lost_and_raises_eio() -> None:
    outcomes = set()
    for seed in range(40):
        fs, io = fresh(seed)
        fd = io.create(F, exclusive=True)
        io.fsync_dir(D)
        io.write(fd, b"data")
        fs.fail_fsyncs(1)
        with pytest.raises(OSError) as err:
            io.fdatasync(fd)
        assert err.value.errno == errno.EIO
        io.fdatasync(fd)  # the next one works, and does not bring lost data back
        assert io.read_file(F) == b"data"  # cached
        fs.crash(torn=True)
        now = fs.mount().read_file(F)
        outcomes.add(now)
    assert outcomes == {bytes(4), b"data"}


def _lose_a_write(seed: int) -> tuple[SimFileSystem, SimMount, int] | None:
    """``b"data"`` written to F and its fdatasync failed; None if the data was kept."""
    fs, io = fresh(seed)
    fd = io.create(F, exclusive=True)
    io.fsync_dir(D)
    io.write(fd, b"data")
    fs.fail_fsyncs(1)
    with pytest.raises(OSError):
        io.fdatasync(fd)
    if fs.durable_bytes(F) == b"data":
        return None
    return fs, io, fd


def test_lost_data_stays_lost_after_later_writes_are_synced() -> None:
    """The pages lost at a failed fsync are clean: a later fdatasync of the same file
    writes what was written since, not them."""
    outcomes = set()
    for seed in range(20):
        lost = _lose_a_write(seed)
        if lost is None:
            continue
        fs, io, fd = lost
        io.write(fd, b"more")
        io.fdatasync(fd)
        assert io.read_file(F) == b"datamore"  # cached
        fs.crash(torn=False)
        outcomes.add(fs.mount().read_file(F))
    assert outcomes == {bytes(4) + b"more"}


def test_a_file_truncated_or_recreated_after_lost_data_keeps_its_new_data() -> None:
    """Lost data belongs to the file (the inode), not to its name: cutting it off, or
    unlinking the file and creating another under the same name, leaves nothing of
    it to lose."""
    for seed in range(20):
        for how in ("truncate", "recreate"):
            lost = _lose_a_write(seed)
            if lost is None:
                continue
            fs, io, fd = lost
            if how == "truncate":
                io.truncate(fd, 0)
            else:
                io.close(fd)
                io.unlink(F)
                fd = io.create(F, exclusive=True)
            io.write(fd, b"new")
            io.fdatasync(fd)
            io.fsync_dir(D)
            fs.crash(torn=False)
            assert fs.mount().read_file(F) == b"new", (seed, how)


def test_dead_mount_fails_and_closing_is_a_no_op() -> None:
    fs, io = fresh()
    fd = io.create(F, exclusive=True)
    fs.crash(torn=False)
    with pytest.raises(OSError):
        io.write(fd, b"x")
    with pytest.raises(OSError):
        io.list_dir(D)
    io.close(fd)
    fd2 = fs.mount().create(F, exclusive=True)  # the creation was lost with the crash
    assert fd2 != fd


def test_disk_full_and_exclusive_create() -> None:
    fs, io = fresh()
    fd = io.create(F, exclusive=True)
    with pytest.raises(FileExistsError):
        io.create(F, exclusive=True)
    fs.set_full(True)
    with pytest.raises(OSError) as err:
        io.write(fd, b"x")
    assert err.value.errno == errno.ENOSPC
    fs.set_full(False)
    io.write(fd, b"x")
    free, total = io.disk_usage(D)
    assert free == total - 1


def test_inline_offload_keeps_one_thread_workers_in_order_and_takes_virtual_time() -> None:
    async def main() -> tuple[list[int], float]:
        import asyncio

        offload = InlineOffload(random.Random(1), (0.001, 0.01))
        worker = offload.worker("w", 1)
        order: list[int] = []
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.gather(*[worker.run(order.append, i) for i in range(20)])
        await worker.shutdown()
        return order, loop.time() - t0

    order, took = run_sim(main)
    assert order == list(range(20))
    assert 0.02 <= took <= 0.2


def test_a_power_cut_strikes_just_before_the_chosen_operation() -> None:
    fs, io = fresh()
    fd = io.create(F, exclusive=True)
    io.fsync_dir(D)
    crashed: list[bool] = []
    fs.power_cut_after(3, torn=False, then=lambda: crashed.append(True))
    io.write(fd, b"abc")  # 1
    io.fdatasync(fd)  # 2
    before = fs.ops
    with pytest.raises(OSError) as exc:
        io.write(fd, b"def")  # 3: the machine dies first
    assert exc.value.errno == errno.EIO and crashed == [True] and fs.crashes == 1
    assert fs.ops == before + 1
    io.close(fd)  # closing after the cut is quiet, as for a crash
    assert fs.mount().read_file(F) == b"abc"  # the synced part, nothing of the cut write
    with pytest.raises(ValueError):
        fs.power_cut_after(0, torn=False)
