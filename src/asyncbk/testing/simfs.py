"""A simulated file system for the real journal and storage in the simulator.

:class:`SimFileSystem` holds one bookie's disks; it survives the bookie's crashes.
The storage reaches it through a :class:`SimMount` (:meth:`SimFileSystem.mount`), a
:class:`~asyncbk.bookie.fileio.FileIO`; a crash kills every mount (the dead process's
descriptors and calls fail with ``EIO``, closing them does nothing), and the restarted
bookie mounts anew.

What is durable, as on POSIX with a cautious reading:

* a file's content as of its last :meth:`~SimMount.fdatasync`; what was written (or
  cut) since is *unsynced*: reads see it, a crash may lose it;
* a directory's entries (creations, renames, removals) as of its last
  :meth:`~SimMount.fsync_dir`; a crash brings back the entries of that moment (a
  file created since vanishes, one removed since comes back, a rename is undone);
  directories themselves are durable once made.

:meth:`SimFileSystem.crash` applies a crash, per file, from the seeded RNG: without
``torn``, every unsynced write is lost; with ``torn``, a random prefix of the file's
unsynced writes survives, the last of them possibly cut at a random byte (the disk
wrote back part of the page cache, in order).

Faults on demand: :meth:`SimFileSystem.fail_fsyncs` makes the next fdatasyncs raise
``EIO``; after such a failure the file's unsynced data is in an unknown state, here
(chosen by the RNG) either durable after all or lost for good: the file's length
reached the disk but not the bytes (zeros there after a crash), and no later fsync
writes them (Linux marks the pages clean), though reads still see them (cached).
:meth:`SimFileSystem.set_full` makes writes raise ``ENOSPC``.
:meth:`SimFileSystem.set_usage` makes the disk *look* that full to the bookie's disk
watch (``disk_usage``; writes still succeed): it turns read-only above its
threshold and writable again below its low mark.
:meth:`SimFileSystem.fail_directory` makes one directory fail: every write,
fsync, creation, rename or removal under it raises ``EIO`` (reads are served; an
fsync that fails leaves the data durable or lost, as above) until
:meth:`SimFileSystem.heal_directories` (the disk was replaced or repaired).
:meth:`SimFileSystem.wipe` removes everything under a directory (a wiped disk).

:meth:`SimFileSystem.lock` is the bookie's directory lock on these disks: a second
process refuses to start on them while the first runs; a crash releases it.

:class:`InlineOffload` is the :class:`~asyncbk.bookie.fileio.Offload` of a simulated
run: no threads; a call waits a simulated delay (so an fsync takes virtual time and
group commit still forms groups), then runs on the loop.  A one-thread worker runs
its calls one at a time, in order, as the journal's writer thread does.

Everything is deterministic from the RNG: nothing iterates in hash order.
"""

from __future__ import annotations

import asyncio
import errno
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from ..errors import CookieError

T = TypeVar("T")

CAPACITY_BYTES = 100 << 30


@dataclass(eq=False)
class _File:
    number: int
    durable: bytearray = field(default_factory=bytearray)
    data: bytearray = field(default_factory=bytearray)
    """What reads see: the durable content with the unsynced operations applied."""
    unsynced: list[tuple[str, int, bytes]] = field(default_factory=list)
    """("w", offset, bytes) and ("t", length, b"") since the last fdatasync, in order."""


@dataclass
class _Dir:
    entries: dict[str, _File] = field(default_factory=dict)
    durable: dict[str, _File] = field(default_factory=dict)


@dataclass
class _Open:
    file: _File
    mount: SimMount
    writable: bool
    path: PurePosixPath


def _apply(buf: bytearray, op: tuple[str, int, bytes]) -> None:
    kind, at, data = op
    if kind == "w":
        if len(buf) < at:
            buf.extend(bytes(at - len(buf)))
        buf[at:at + len(data)] = data
    else:
        del buf[at:]
        if len(buf) < at:
            buf.extend(bytes(at - len(buf)))


class SimFileSystem:
    """One bookie's simulated disks (module docstring)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._dirs: dict[str, _Dir] = {"/": _Dir()}
        self._files: list[_File] = []  # every file ever made, by number (crash order)
        self._fds: dict[int, _Open] = {}
        self._next_fd = 3
        self._file_numbers = 0
        self._mounts: list[SimMount] = []
        """The mounts of the processes running on these disks (a crash kills them all)."""
        self._fsync_failures = 0
        self._full = False
        self._usage: float | None = None
        self._failing: list[PurePosixPath] = []
        self._locked: dict[str, SimDirectoryLock] = {}
        """Locked directory -> the lock (of a live process) holding it."""
        self._cut: tuple[int, bool, Callable[[], None] | None] | None = None
        self.ops = 0
        """File operations so far (every call of a mount counts one)."""
        self.crashes = 0
        self.fsync_failures = 0
        """fdatasyncs failed on purpose so far."""
        self.fsyncs = 0

    # --- faults ---------------------------------------------------------------------

    def mount(self) -> SimMount:
        """A new :class:`~asyncbk.bookie.fileio.FileIO` on these disks (one process)."""
        mount = SimMount(self)
        self._mounts.append(mount)
        return mount

    def crash(self, torn: bool) -> None:
        """The machine dies: mounts die, unsynced data and directory changes are lost
        (with ``torn``, some survive: module docstring)."""
        self.crashes += 1
        for mount in self._mounts:
            mount.alive = False
        self._mounts = []
        self._fds.clear()
        self._locked.clear()  # the process that held the directory lock is gone
        rng = self.rng
        for f in self._files:
            if f.unsynced:
                keep = rng.randint(0, len(f.unsynced)) if torn else 0
                for op in f.unsynced[:keep]:
                    _apply(f.durable, op)
                if torn and keep < len(f.unsynced) and f.unsynced[keep][0] == "w":
                    kind, at, data = f.unsynced[keep]
                    cut = rng.randint(0, len(data))
                    if cut:
                        _apply(f.durable, (kind, at, data[:cut]))
                f.unsynced = []
            f.data = bytearray(f.durable)
        for d in self._dirs.values():
            d.entries = dict(d.durable)
        live = {id(f) for d in self._dirs.values() for f in d.entries.values()}
        self._files = [f for f in self._files if id(f) in live]

    def power_cut_after(self, ops: int, torn: bool,
                        then: Callable[[], None] | None = None) -> None:
        """The machine dies just before the ``ops``-th file operation from now (1: the
        next one): :meth:`crash` (``torn``), then ``then()`` (e.g. the index store's
        crash), and that operation and every later one of the mount fail with EIO."""
        if ops < 1:
            raise ValueError("ops must be >= 1")
        self._cut = (ops, torn, then)

    def fail_fsyncs(self, count: int = 1) -> None:
        """The next ``count`` fdatasyncs raise ``EIO`` (module docstring)."""
        self._fsync_failures += count

    def set_full(self, full: bool) -> None:
        """Writes raise ``ENOSPC`` while full."""
        self._full = full

    def set_usage(self, fraction: float | None) -> None:
        """The disk looks ``fraction`` full to ``disk_usage`` (None: what the files
        take, of :data:`CAPACITY_BYTES`); writes are not refused."""
        self._usage = fraction

    def fail_directory(self, path: Path | str) -> None:
        """Every write, fsync, creation, rename or removal under ``path`` raises EIO
        from now on (module docstring)."""
        self._failing.append(PurePosixPath(path))

    def heal_directories(self) -> None:
        """No directory fails any more."""
        self._failing = []

    @property
    def failing_directories(self) -> list[PurePosixPath]:
        """The directories failing now (:meth:`fail_directory`)."""
        return list(self._failing)

    def failing(self, path: Path | str | PurePosixPath) -> bool:
        """Whether ``path`` is under a failing directory."""
        p = PurePosixPath(path)
        return any(p == d or d in p.parents for d in self._failing)

    def wipe(self, path: Path | str) -> None:
        """Remove every file and directory under ``path`` (the directory stays, empty),
        durably: a wiped or replaced disk."""
        top = PurePosixPath(path)
        for name in list(self._dirs):
            p = PurePosixPath(name)
            if top in p.parents:
                del self._dirs[name]
        if str(top) in self._dirs:
            self._dirs[str(top)] = _Dir()
        live = {id(f) for d in self._dirs.values() for f in d.entries.values()}
        self._files = [f for f in self._files if id(f) in live]

    def take_fsync_failure(self) -> bool:
        """Consume one pending fsync failure (:meth:`fail_fsyncs`), if any."""
        if self._fsync_failures > 0:
            self._fsync_failures -= 1
            self.fsync_failures += 1
            return True
        return False

    def disk_usage(self, path: Path | str) -> tuple[int, int]:
        """``(free, total)`` bytes of these disks, as ``statvfs`` would say (the
        bookie's disk probe; not a file operation of a mount)."""
        if self._usage is not None:
            return int(CAPACITY_BYTES * (1 - self._usage)), CAPACITY_BYTES
        return max(0, CAPACITY_BYTES - self.used_bytes()), CAPACITY_BYTES

    def lock(self, directories: Sequence[Path]) -> SimDirectoryLock:
        """The bookie's directory lock over these disks (module docstring)."""
        return SimDirectoryLock(self, [str(d) for d in directories])

    # --- inspection (tests) -----------------------------------------------------------

    def durable_bytes(self, path: Path | str) -> bytes | None:
        """What a crash right now without ``torn`` would leave at ``path``."""
        d = self._dirs.get(str(PurePosixPath(path).parent))
        f = d.durable.get(PurePosixPath(path).name) if d is not None else None
        return bytes(f.durable) if f is not None else None

    def used_bytes(self) -> int:
        return sum(len(f.data) for f in self._files)

    # --- internals for SimMount -------------------------------------------------------

    def _split(self, path: Path | str) -> tuple[_Dir, str]:
        p = PurePosixPath(path)
        d = self._dirs.get(str(p.parent))
        if d is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", str(p.parent))
        return d, p.name

    def _lookup(self, path: Path | str) -> _File:
        d, name = self._split(path)
        f = d.entries.get(name)
        if f is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
        return f

    def _new_fd(self, f: _File, mount: SimMount, writable: bool,
                path: PurePosixPath) -> int:
        fd = self._next_fd
        self._next_fd += 1
        self._fds[fd] = _Open(f, mount, writable, path)
        return fd

    def _new_file(self) -> _File:
        self._file_numbers += 1
        f = _File(self._file_numbers)
        self._files.append(f)
        return f


class SimMount:
    """:class:`~asyncbk.bookie.fileio.FileIO` of one (simulated) process on a
    :class:`SimFileSystem`; dead after the file system's crash."""

    def __init__(self, fs: SimFileSystem) -> None:
        self.fs = fs
        self.alive = True

    def _check(self) -> None:
        fs = self.fs
        fs.ops += 1
        cut = fs._cut
        if cut is not None and self.alive:
            left, torn, then = cut
            if left > 1:
                fs._cut = (left - 1, torn, then)
            else:
                fs._cut = None
                fs.crash(torn)
                if then is not None:
                    then()
        if not self.alive:
            raise OSError(errno.EIO, "sim: the machine crashed")

    def _open(self, fd: int) -> _Open:
        self._check()
        o = self.fs._fds.get(fd)
        if o is None or o.mount is not self:
            raise OSError(errno.EBADF, "sim: bad file descriptor")
        return o

    def _check_path(self, path: Path | PurePosixPath) -> None:
        if self.fs.failing(path):
            raise OSError(errno.EIO, "sim: the directory's disk fails", str(path))

    def create(self, path: Path, *, exclusive: bool) -> int:
        self._check()
        self._check_path(path)
        d, name = self.fs._split(path)
        f = d.entries.get(name)
        if f is not None:
            if exclusive:
                raise FileExistsError(errno.EEXIST, "file exists", str(path))
            self._record(f, ("t", 0, b""))
        else:
            f = d.entries[name] = self.fs._new_file()
        return self.fs._new_fd(f, self, True, PurePosixPath(path))

    def open_append(self, path: Path) -> int:
        self._check()
        d, name = self.fs._split(path)
        f = d.entries.get(name)
        if f is None:
            self._check_path(path)
            f = d.entries[name] = self.fs._new_file()
        return self.fs._new_fd(f, self, True, PurePosixPath(path))

    def open_read(self, path: Path) -> int:
        self._check()
        return self.fs._new_fd(self.fs._lookup(path), self, False, PurePosixPath(path))

    def _record(self, f: _File, op: tuple[str, int, bytes]) -> None:
        _apply(f.data, op)
        f.unsynced.append(op)

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        o = self._open(fd)
        if not o.writable:
            raise OSError(errno.EBADF, "sim: not open for writing")
        self._check_path(o.path)
        if self.fs._full:
            raise OSError(errno.ENOSPC, "sim: no space left on device")
        self._record(o.file, ("w", len(o.file.data), bytes(data)))

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        o = self._open(fd)
        if not o.writable:
            raise OSError(errno.EBADF, "sim: not open for writing")
        self._check_path(o.path)
        if self.fs._full and offset + len(data) > len(o.file.data):
            raise OSError(errno.ENOSPC, "sim: no space left on device")
        self._record(o.file, ("w", offset, bytes(data)))

    def preallocate(self, fd: int, length: int) -> None:
        o = self._open(fd)
        if not o.writable:
            raise OSError(errno.EBADF, "sim: not open for writing")
        self._check_path(o.path)
        if length > len(o.file.data):
            if self.fs._full:
                raise OSError(errno.ENOSPC, "sim: no space left on device")
            self._record(o.file, ("t", length, b""))  # (zeros, as a truncate that extends)

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        return bytes(self._open(fd).file.data[offset:offset + length])

    def start_writeback(self, fd: int, offset: int, length: int) -> None:
        """A hint, as on a real disk: nothing is durable before :meth:`fdatasync` (a
        crash may still lose or keep the unsynced writes, as it would without it)."""
        self._open(fd)

    def fdatasync(self, fd: int) -> None:
        o = self._open(fd)
        f = o.file
        fs = self.fs
        fs.fsyncs += 1
        if fs.failing(o.path) or fs.take_fsync_failure():
            if f.unsynced and fs.rng.random() < 0.5:
                for op in f.unsynced:  # written back after all
                    _apply(f.durable, op)
            else:
                # Lost: the size reached the disk, the pages did not (zeros there),
                # and they never will (marked clean); reads still see them, cached.
                for kind, at, data in f.unsynced:
                    _apply(f.durable, (kind, at, bytes(len(data))))
            f.unsynced = []
            raise OSError(errno.EIO, "sim: fsync failed")
        # What was written since the last fdatasync, not the whole cached content:
        # pages lost at an earlier failure stay lost (clean in the cache).
        for op in f.unsynced:
            _apply(f.durable, op)
        f.unsynced = []

    def truncate(self, fd: int, length: int) -> None:
        o = self._open(fd)
        if not o.writable:
            raise OSError(errno.EBADF, "sim: not open for writing")
        self._check_path(o.path)
        self._record(o.file, ("t", length, b""))

    def size(self, fd: int) -> int:
        return len(self._open(fd).file.data)

    def dup(self, fd: int) -> int:
        o = self._open(fd)
        return self.fs._new_fd(o.file, self, o.writable, o.path)

    def close(self, fd: int) -> None:
        if not self.alive:
            return  # the crash closed everything
        try:
            self._open(fd)
        except OSError:
            if not self.alive:
                return  # the machine died at this very call (power_cut_after)
            raise
        del self.fs._fds[fd]

    def read_file(self, path: Path) -> bytes:
        self._check()
        return bytes(self.fs._lookup(path).data)

    def file_size(self, path: Path) -> int:
        self._check()
        return len(self.fs._lookup(path).data)

    def replace(self, src: Path, dst: Path) -> None:
        self._check()
        self._check_path(src)
        self._check_path(dst)
        sd, sname = self.fs._split(src)
        dd, dname = self.fs._split(dst)
        f = sd.entries.get(sname)
        if f is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(src))
        del sd.entries[sname]
        dd.entries[dname] = f

    def unlink(self, path: Path, *, missing_ok: bool = False) -> None:
        self._check()
        self._check_path(path)
        d, name = self.fs._split(path)
        if d.entries.pop(name, None) is None and not missing_ok:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path))

    def list_dir(self, path: Path) -> list[tuple[str, int]]:
        self._check()
        d = self.fs._dirs.get(str(PurePosixPath(path)))
        if d is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", str(path))
        return [(name, len(f.data)) for name, f in sorted(d.entries.items())]

    def makedirs(self, path: Path) -> None:
        self._check()
        if str(PurePosixPath(path)) not in self.fs._dirs:
            self._check_path(path)
        p = PurePosixPath(path)
        for each in [*reversed(p.parents), p]:
            self.fs._dirs.setdefault(str(each), _Dir())

    def fsync_dir(self, path: Path) -> None:
        self._check()
        self._check_path(path)
        d = self.fs._dirs.get(str(PurePosixPath(path)))
        if d is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", str(path))
        d.durable = dict(d.entries)

    def disk_usage(self, path: Path) -> tuple[int, int]:
        self._check()
        return self.fs.disk_usage(path)


class SimDirectoryLock:
    """The directory lock of one (simulated) process (:meth:`SimFileSystem.lock`)."""

    def __init__(self, fs: SimFileSystem, directories: list[str]) -> None:
        self._fs = fs
        self._dirs = directories
        self._held: list[str] = []

    def acquire(self) -> None:
        for d in self._dirs:
            if d in self._fs._locked:
                self.release()
                raise CookieError(
                    f"{d} is in use by another running bookie process; stop it first "
                    "(two processes must never share a bookie's directories)")
            self._fs._locked[d] = self
            self._held.append(d)

    def release(self) -> None:
        held, self._held = self._held, []
        for d in held:
            if self._fs._locked.get(d) is self:  # (a crash released it already)
                del self._fs._locked[d]


# --- offload ------------------------------------------------------------------------


class _InlineWorker:
    def __init__(self, offload: InlineOffload, threads: int) -> None:
        self._offload = offload
        self._slots = asyncio.Lock() if threads == 1 else asyncio.Semaphore(threads)
        self._submitted: set[asyncio.Task[None]] = set()

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        async with self._slots:  # FIFO: one-thread workers keep their order
            return await self._offload.run(fn, *args)

    def submit(self, fn: Callable[..., T], args: tuple[Any, ...],
               done: Callable[[T | None, BaseException | None], None]) -> None:
        # a task per call, owned here (awaited by shutdown, cancelled by abandon); it
        # queues on the same FIFO lock as run(), at once, so the order holds
        task = asyncio.get_running_loop().create_task(self._call(fn, args, done))
        self._submitted.add(task)
        task.add_done_callback(self._submitted.discard)

    async def _call(self, fn: Callable[..., T], args: tuple[Any, ...],
                    done: Callable[[T | None, BaseException | None], None]) -> None:
        async with self._slots:
            try:
                result = await self._offload.run(fn, *args)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                done(None, exc)
            else:
                done(result, None)

    async def shutdown(self) -> None:
        if self._submitted:
            await asyncio.wait(list(self._submitted))
        async with self._slots:  # the calls under way are done
            pass

    def abandon(self) -> None:
        for task in list(self._submitted):
            task.cancel()


class InlineOffload:
    """:class:`~asyncbk.bookie.fileio.Offload` without threads (module docstring):
    each call waits a delay drawn from ``delay_s`` on the loop's (virtual) clock,
    then runs inline."""

    def __init__(self, rng: random.Random, delay_s: tuple[float, float] = (0.0001, 0.002)
                 ) -> None:
        self.rng = rng
        self.delay_s = delay_s

    def worker(self, name: str, threads: int) -> _InlineWorker:
        return _InlineWorker(self, threads)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        await asyncio.sleep(self.rng.uniform(*self.delay_s))
        return fn(*args)


__all__ = ["CAPACITY_BYTES", "InlineOffload", "SimDirectoryLock", "SimFileSystem", "SimMount"]
