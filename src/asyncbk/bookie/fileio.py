"""The seams under the journal and the ledger storage: file operations (:class:`FileIO`)
and "run this blocking function off the loop" (:class:`Offload`).

The bookie runs :class:`OsFileIO` and :class:`ThreadOffload`: the ``os`` calls and
worker threads it always used.  The simulator runs the same journal and storage over
:class:`~asyncbk.testing.simfs.SimFileSystem` (torn writes, lost unsynced writes, fsync
failures) and :class:`~asyncbk.testing.simfs.InlineOffload` (no threads: the function
runs on the loop after a simulated delay).

:class:`FileIO` is the operations the storage uses, no more.  It is descriptor-based.
Every writer here appends: :meth:`FileIO.write` writes at the descriptor's position,
which is the end of the file (files are opened at their end, and
:meth:`FileIO.truncate` leaves the position at the new end).  Durability is as on
POSIX: data is durable after :meth:`FileIO.fdatasync` of its file; a creation,
rename or removal after :meth:`FileIO.fsync_dir` of its directory.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import queue
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

_FDATASYNC: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_SYNC_FILE_RANGE_WRITE = 2
"""``SYNC_FILE_RANGE_WRITE`` (linux/fs.h): start writing the range's dirty pages."""


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """Linux's ``sync_file_range`` through ctypes (the ``os`` module has none), or None
    where the system has no such call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _sync_file_range()


class FileIO(Protocol):
    """File operations of the journal and the ledger storage (module docstring).
    Errors are ``OSError`` (``FileNotFoundError``, ``FileExistsError``, ``EIO``,
    ``ENOSPC``...), as the ``os`` calls raise them."""

    def create(self, path: Path, *, exclusive: bool) -> int:
        """Open for writing a new file (``exclusive``: FileExistsError if it exists)
        or an emptied one (not ``exclusive``: truncated if it exists)."""
        ...

    def open_append(self, path: Path) -> int:
        """Open for reading and writing at its end; created (empty) if missing."""
        ...

    def open_read(self, path: Path) -> int:
        """Open read-only; FileNotFoundError if missing."""
        ...

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data`` at the end of the file."""
        ...

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write all of ``data`` at ``offset`` (over zeros :meth:`preallocate` put there)."""
        ...

    def preallocate(self, fd: int, length: int) -> None:
        """Make the file ``length`` bytes long, the new bytes zeros and their blocks
        allocated, so that later writes there change no file size and an ``fdatasync``
        has no size to make durable."""
        ...

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        """Up to ``length`` bytes from ``offset`` (fewer at the end of the file)."""
        ...

    def fdatasync(self, fd: int) -> None:
        """Make the file's data durable."""
        ...

    def start_writeback(self, fd: int, offset: int, length: int) -> None:
        """Start writing the range's data to the disk without waiting for it (a hint:
        durable only after :meth:`fdatasync`; nothing where the system cannot)."""
        ...

    def truncate(self, fd: int, length: int) -> None:
        """Cut the file to ``length`` bytes; later writes go at ``length``."""
        ...

    def size(self, fd: int) -> int:
        """The file's length in bytes."""
        ...

    def dup(self, fd: int) -> int:
        """A second descriptor of the same open file (closed on its own)."""
        ...

    def close(self, fd: int) -> None: ...

    def read_file(self, path: Path) -> bytes:
        """The whole file; FileNotFoundError if missing."""
        ...

    def file_size(self, path: Path) -> int:
        """The length of the file at ``path``; FileNotFoundError if missing."""
        ...

    def replace(self, src: Path, dst: Path) -> None:
        """Rename ``src`` to ``dst`` atomically, replacing ``dst``."""
        ...

    def unlink(self, path: Path, *, missing_ok: bool = False) -> None: ...

    def list_dir(self, path: Path) -> list[tuple[str, int]]:
        """``(name, size in bytes)`` of each file in the directory, in no order."""
        ...

    def makedirs(self, path: Path) -> None:
        """Create the directory and its parents if missing."""
        ...

    def fsync_dir(self, path: Path) -> None:
        """Make the creations, renames and removals in the directory durable."""
        ...

    def disk_usage(self, path: Path) -> tuple[int, int]:
        """``(free bytes, total bytes)`` of the file system holding ``path``."""
        ...


def fdatasync(fd: int) -> None:
    """``os.fdatasync`` (``os.fsync`` where there is none).  Looked up at each call
    by :class:`OsFileIO`, so tests can replace it (``monkeypatch.setattr(fileio,
    "fdatasync", ...)``) to make the real disk slow or failing."""
    _FDATASYNC(fd)


def start_writeback(fd: int, offset: int, length: int) -> None:
    """``sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE)`` where Linux has it
    (nothing elsewhere); OSError if the file system refuses it.  Looked up at each call
    by :class:`OsFileIO` (tests replace it)."""
    fn = _SYNC_FILE_RANGE
    if fn is not None and fn(fd, offset, length, _SYNC_FILE_RANGE_WRITE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sync_file_range: {os.strerror(err)}")


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """``os.write`` until everything is written (a regular-file write may be short).
    Looked up at each call by :class:`OsFileIO` (tests replace it)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(f"os.write wrote {n} bytes")
        view = view[n:]


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """``os.pwrite`` until everything is written at ``offset``.  Looked up at each call
    by :class:`OsFileIO` (tests replace it)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(f"os.pwrite wrote {n} bytes")
        view = view[n:]
        offset += n


class OsFileIO:
    """:class:`FileIO` on the real file system (``os`` calls)."""

    def create(self, path: Path, *, exclusive: bool) -> int:
        flags = os.O_WRONLY | os.O_CREAT | _O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
        return os.open(path, flags, 0o644)

    def open_append(self, path: Path) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o644)
        try:
            os.lseek(fd, 0, os.SEEK_END)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_read(self, path: Path) -> int:
        return os.open(path, os.O_RDONLY | _O_CLOEXEC)

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        write_all(fd, data)

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        pwrite_all(fd, data, offset)

    def preallocate(self, fd: int, length: int) -> None:
        size = os.fstat(fd).st_size
        if length > size:
            os.posix_fallocate(fd, size, length - size)

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        return os.pread(fd, length, offset)

    def fdatasync(self, fd: int) -> None:
        fdatasync(fd)

    def start_writeback(self, fd: int, offset: int, length: int) -> None:
        start_writeback(fd, offset, length)

    def truncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)
        os.lseek(fd, length, os.SEEK_SET)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def dup(self, fd: int) -> int:
        return os.dup(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def read_file(self, path: Path) -> bytes:
        return Path(path).read_bytes()

    def file_size(self, path: Path) -> int:
        return os.stat(path).st_size

    def replace(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def unlink(self, path: Path, *, missing_ok: bool = False) -> None:
        Path(path).unlink(missing_ok=missing_ok)

    def list_dir(self, path: Path) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for entry in os.scandir(path):
            try:
                out.append((entry.name, entry.stat().st_size))
            except FileNotFoundError:  # removed meanwhile
                continue
        return out

    def makedirs(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def disk_usage(self, path: Path) -> tuple[int, int]:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


OS_FILE_IO = OsFileIO()


# --- offload ------------------------------------------------------------------------


class Worker(Protocol):
    """Where blocking calls run off the loop: a pool of ``threads`` threads, FIFO
    (with one thread, calls run one at a time in the order they were made)."""

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` off the loop; its result or exception."""
        ...

    def submit(self, fn: Callable[..., T], args: tuple[Any, ...],
               done: Callable[[T | None, BaseException | None], None]) -> None:
        """``fn(*args)`` off the loop, in order with :meth:`run`; then ``done(result,
        None)`` or ``done(None, exception)`` is called on the calling loop (a callback,
        not a future to await: the journal's group commits)."""
        ...

    async def shutdown(self) -> None:
        """Wait for the calls under way, then release the threads."""
        ...

    def abandon(self) -> None:
        """Release the threads without waiting (a call under way finishes alone)."""
        ...


class Offload(Protocol):
    """Makes :class:`Worker` s, and runs one-off blocking calls off the loop."""

    def worker(self, name: str, threads: int) -> Worker: ...

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` off the loop (``asyncio.to_thread``)."""
        ...


class _ThreadWorker:
    """Threads serving a FIFO queue (``queue.SimpleQueue``); each call's result comes
    back to the caller's loop with one ``call_soon_threadsafe``: lighter than
    ``run_in_executor`` (no concurrent future chained to an asyncio one), which the
    journal pays once per group commit."""

    def __init__(self, name: str, threads: int) -> None:
        self._name = name
        self._count = threads
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._shut = False

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        if self._shut:
            raise RuntimeError("cannot schedule new calls after shutdown")
        if not self._threads:
            self._start()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._queue.put((loop, fut, fn, args, None))
        return await fut

    def submit(self, fn: Callable[..., T], args: tuple[Any, ...],
               done: Callable[[T | None, BaseException | None], None]) -> None:
        if self._shut:
            raise RuntimeError("cannot schedule new calls after shutdown")
        if not self._threads:
            self._start()
        self._queue.put((asyncio.get_running_loop(), None, fn, args, done))

    def _start(self) -> None:
        for i in range(self._count):
            thread = threading.Thread(target=self._serve, name=f"{self._name}_{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is None:
                return
            loop, fut, fn, args, done = item
            result = None
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller, as run_in_executor does
                if done is None:
                    _hand_back(loop, _set_exception, fut, exc)
                else:
                    _hand_back(loop, done, None, exc)
            else:
                if done is None:
                    _hand_back(loop, _set_result, fut, result)
                else:
                    _hand_back(loop, done, result, None)
            del item, fut, fn, args, done, result

    async def shutdown(self) -> None:
        self._shut = True
        for _ in self._threads:
            self._queue.put(None)  # after every call queued so far
        threads, self._threads = self._threads, []
        # Joining idle threads is quick but still blocking: off the loop.
        await asyncio.to_thread(_join_all, threads)

    def abandon(self) -> None:
        self._shut = True
        for _ in self._threads:
            self._queue.put(None)
        self._threads = []


def _join_all(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join()


def _hand_back(loop: asyncio.AbstractEventLoop, setter: Callable[..., None], first: Any,
               second: object) -> None:
    try:
        loop.call_soon_threadsafe(setter, first, second)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass


def _set_result(fut: asyncio.Future[Any], value: object) -> None:
    if not fut.done():  # (the caller may have been cancelled)
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


class ThreadOffload:
    """:class:`Offload` with real threads (a queue served by threads, ``asyncio.to_thread``)."""

    def worker(self, name: str, threads: int) -> Worker:
        return _ThreadWorker(name, threads)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.to_thread(fn, *args)


THREAD_OFFLOAD = ThreadOffload()
