"""Removing large files without stalling the disk's other writers: old journal files
(a checkpoint's ``delete_files_before``) and compacted entry logs.

Unlinking a large file frees all its blocks in one file-system commit.  A journal's
``fdatasync`` on the same disk waits for that commit: freeing 256 MB journal files at
once held it up by tens of ms; unlinking a 1 GiB entry log at once, 41-84 ms (on a
file system mounted with ``-o discard``, where every freed block is also discarded
with the commit).  So a large file is cut from its end in steps, with a pause after
each, and only then unlinked.  16 MB steps 2 ms apart still held each journal
``fdatasync`` 5-20 ms for as long as a deletion lasted; 4 MB steps 10 ms apart
(about 300 MB/s, four times the fastest a bookie's journal has written here) keep
each commit's share small (benchmarks/README.md, speed round three).

Two drivers share the steps: :func:`shrink_then_unlink` for a worker thread (the
checkpoint's), :func:`shrink_then_unlink_paced` for a coroutine whose file calls run
on a :class:`~.fileio.Worker` and whose pauses are the injected clock's (compaction).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from .fileio import FileIO, Worker

DELETE_STEP_BYTES = 4 * 1024 * 1024
"""A large file is truncated this much at a time before it is unlinked."""

DELETE_PAUSE_S = 0.01
"""The pause after each step."""


def cut_step(io: FileIO, path: Path, step: int) -> bool:
    """Cut ``step`` bytes off the end of ``path`` (opened for this step only, so a
    deletion stopped between steps leaves no descriptor behind); False, with nothing
    cut, when it is missing or at most ``step`` bytes long: the rest goes with the
    unlink."""
    try:
        fd = io.open_append(path)
    except FileNotFoundError:
        return False
    try:
        size = io.size(fd)
        if size <= step:
            return False
        io.truncate(fd, size - step)
        return True
    finally:
        io.close(fd)


def shrink_then_unlink(io: FileIO, path: Path, step: int = DELETE_STEP_BYTES,
                       pause_s: float = DELETE_PAUSE_S,
                       pause: Callable[[float], None] = time.sleep) -> None:
    """Remove ``path`` in steps (module docstring), pausing the calling thread with
    ``pause(pause_s)`` after each: a worker thread, never the event loop.  (A worker
    thread letting the real disk breathe is not behaviour in time, so the default is
    the real ``time.sleep``, not the injected clock.)"""
    while cut_step(io, path, step):
        pause(pause_s)
    io.unlink(path, missing_ok=True)


async def shrink_then_unlink_paced(worker: Worker, io: FileIO, path: Path,
                                   sleep: Callable[[float], Awaitable[None]],
                                   step: int = DELETE_STEP_BYTES,
                                   pause_s: float = DELETE_PAUSE_S) -> None:
    """:func:`shrink_then_unlink` from a coroutine: each step a call on ``worker``
    (whose threads are never held for the pauses), each pause ``sleep(pause_s)``; the
    directory is fsynced after the unlink.  A cancelled deletion leaves the file
    shorter, in place, with no descriptor open, nor one closed under a step still
    running."""
    while await worker.run(cut_step, io, path, step):
        await sleep(pause_s)
    await worker.run(unlink_durably, io, path)


def unlink_durably(io: FileIO, path: Path) -> None:
    """Remove ``path`` if it is there, durably (its directory fsynced)."""
    io.unlink(path, missing_ok=True)
    io.fsync_dir(path.parent)
