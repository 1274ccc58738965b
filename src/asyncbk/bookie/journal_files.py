"""The journal's files on disk: listing them (replay, the shell, tests), telling the
zeros allocated ahead of the writes from a torn tail, and removing old ones without
stalling the disk (the journal's ``delete_files_before``)."""

from __future__ import annotations

import time
from pathlib import Path

from .fileio import OS_FILE_IO, FileIO
from .journal_format import parse_journal_file_name

ZEROS_CHUNK_BYTES = 8 * 1024 * 1024
""":func:`zeros_only` reads this much at a time."""

DELETE_STEP_BYTES = 16 * 1024 * 1024
"""Journal files are truncated this much at a time before they are unlinked."""


def zeros_only(io: FileIO, path: Path, start: int, end: int) -> bool:
    """Whether bytes ``start`` to ``end`` of the file are all zeros: after the last
    record of the last journal file, that is the space the writer allocated ahead of
    itself (``journal_preallocate_bytes``), not a torn write."""
    fd = io.open_read(path)
    try:
        while start < end:
            data = io.pread(fd, min(ZEROS_CHUNK_BYTES, end - start), start)
            if not data or data.count(0) != len(data):
                return False
            start += len(data)
        return True
    finally:
        io.close(fd)


def shrink_then_unlink(io: FileIO, path: Path, step: int = DELETE_STEP_BYTES,
                       pause_s: float = 0.002) -> None:
    """Unlink a large file without one long filesystem stall: freeing 256 MB at once
    held up concurrent fdatasyncs of the journal on the same disk by tens of ms."""
    try:
        fd = io.open_append(path) if io.file_size(path) > step else -1
    except FileNotFoundError:
        return
    if fd >= 0:
        try:
            size = io.size(fd)
            while size > step:
                size -= step
                io.truncate(fd, size)
                # A worker thread (never the loop) letting the real disk breathe: not
                # behaviour in time, so not the injected clock.
                time.sleep(pause_s)
        finally:
            io.close(fd)
    io.unlink(path, missing_ok=True)


def list_journal_files(directory: Path, io: FileIO = OS_FILE_IO) -> list[tuple[int, Path]]:
    """``(seq, path)`` of every journal file in ``directory``, by seq."""
    out: list[tuple[int, Path]] = []
    for name, _size in io.list_dir(directory):
        seq = parse_journal_file_name(name)
        if seq is not None:
            out.append((seq, Path(directory) / name))
    out.sort()
    return out
