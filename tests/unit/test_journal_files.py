"""journal_files.py: journal files are listed by sequence, other files ignored."""

from __future__ import annotations

from pathlib import Path

from asyncbk.bookie.fileio import OS_FILE_IO
from asyncbk.bookie.journal_files import list_journal_files
from asyncbk.bookie.journal_format import journal_file_name


def test_files_are_listed_by_sequence_and_others_ignored(tmp_path: Path) -> None:
    for seq in (3, 1, 0x10):
        (tmp_path / journal_file_name(seq)).write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not a journal file")
    assert [seq for seq, _ in list_journal_files(tmp_path, OS_FILE_IO)] == [1, 3, 0x10]
