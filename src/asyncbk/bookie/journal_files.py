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

DELETE_STEP_BYTES = 4 * 1024 * 1024
"""Journal files are truncated this much at a time before they are unlinked."""

DELETE_PAUSE_S = 0.01
"""The pause after each step: journal files are freed at about 300 MB/s (measured),
about four times the fastest a bookie's journal has written here."""


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
                       pause_s: float = DELETE_PAUSE_S) -> None:
    """Unlink a large file without long filesystem stalls.  Freeing 256 MB at once held
    up concurrent fdatasyncs of the journal on the same disk by tens of ms; so did 16 MB
    steps 2 ms apart on a file system that discards freed blocks (``-o discard``): each
    step's discards went with the next commit, which the journal's next fdatasync waited
    for (5-20 ms each, for as long as the deletion lasted).  4 MB steps 10 ms apart keep
    each commit's share small."""
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
