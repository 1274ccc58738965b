"""journal_files.py: old journal files are freed in steps (each step's freed blocks go
with one file-system commit, which a journal's fdatasync on the same disk waits for),
and only files before the checkpoint's are removed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncbk.bookie import journal_files
from asyncbk.bookie.fileio import OS_FILE_IO, OsFileIO
from asyncbk.bookie.journal_files import list_journal_files, shrink_then_unlink
from asyncbk.bookie.journal_format import journal_file_name

MIB = 1 << 20


class RecordingIO(OsFileIO):
    """The real file calls, each truncation's new size recorded."""

    def __init__(self) -> None:
        self.truncated: list[int] = []

    def truncate(self, fd: int, length: int) -> None:
        self.truncated.append(length)
        super().truncate(fd, length)


def test_a_large_file_is_cut_in_steps_then_unlinked(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(journal_files.time, "sleep", slept.append)
    path = tmp_path / journal_file_name(1)
    path.write_bytes(b"x" * 123)
    with path.open("r+b") as f:
        f.truncate(10 * MIB + 123)
    io = RecordingIO()
    shrink_then_unlink(io, path, step=4 * MIB, pause_s=0.01)
    assert not path.exists()
    assert io.truncated == [6 * MIB + 123, 2 * MIB + 123]  # (the rest goes with the unlink)
    assert slept == [0.01, 0.01]


def test_the_default_steps_are_small_and_spaced() -> None:
    # 16 MB steps 2 ms apart held the journal's fdatasyncs 5-20 ms each on a disk
    # mounted with discard (benchmarks/README.md, speed round three, fourth session).
    assert journal_files.DELETE_STEP_BYTES <= 4 * MIB
    assert journal_files.DELETE_PAUSE_S >= 0.01
    defaults: Any = shrink_then_unlink.__defaults__
    assert defaults == (journal_files.DELETE_STEP_BYTES, journal_files.DELETE_PAUSE_S)


def test_a_small_or_missing_file_is_unlinked_without_steps(tmp_path: Path) -> None:
    path = tmp_path / journal_file_name(2)
    path.write_bytes(b"y" * 1000)
    io = RecordingIO()
    shrink_then_unlink(io, path, step=4 * MIB, pause_s=0.0)
    assert not path.exists() and io.truncated == []
    shrink_then_unlink(io, path, step=4 * MIB, pause_s=0.0)  # gone already: nothing
    assert io.truncated == []


def test_files_are_listed_by_sequence_and_others_ignored(tmp_path: Path) -> None:
    for seq in (3, 1, 0x10):
        (tmp_path / journal_file_name(seq)).write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not a journal file")
    assert [seq for seq, _ in list_journal_files(tmp_path, OS_FILE_IO)] == [1, 3, 0x10]
