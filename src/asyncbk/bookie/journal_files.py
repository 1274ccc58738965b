"""The journal's files on disk: listing them (replay, the shell, tests) and telling the
zeros allocated ahead of the writes from a torn tail.  (Old ones are removed without
stalling the disk by :mod:`.freeing`.)"""

from __future__ import annotations

from pathlib import Path

from .fileio import OS_FILE_IO, FileIO
from .journal_format import parse_journal_file_name

ZEROS_CHUNK_BYTES = 8 * 1024 * 1024
""":func:`zeros_only` reads this much at a time."""


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


def list_journal_files(directory: Path, io: FileIO = OS_FILE_IO) -> list[tuple[int, Path]]:
    """``(seq, path)`` of every journal file in ``directory``, by seq."""
    out: list[tuple[int, Path]] = []
    for name, _size in io.list_dir(directory):
        seq = parse_journal_file_name(name)
        if seq is not None:
            out.append((seq, Path(directory) / name))
    out.sort()
    return out
