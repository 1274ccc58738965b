"""The journal allocates zeros ahead of its writes (``journal_preallocate_bytes``): the
zeros only ever follow the last record of the last file, a replay cuts them without
calling them torn, a torn record written into them is still cut as one, and a disk
that cannot allocate gets plain appends."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from asyncbk.bookie import fileio as fileio_mod
from asyncbk.bookie.journal_files import list_journal_files
from asyncbk.bookie.journal_format import decode_records
from asyncbk.bookie.storage import LedgerStorage
from asyncbk.config import BookieConfig

from .test_journal import rec, started

KEY = b"k"
MIB = 1 << 20


def body(e: int) -> bytes:
    return b"%06d" % e * 30


def config(**kw: Any) -> BookieConfig:
    kw.setdefault("checkpoint_interval_s", 3600.0)
    return BookieConfig(**kw)


def records_end(path: Path) -> tuple[int, int]:
    """(end of the file's records, file size); asserts only zeros follow them."""
    data = path.read_bytes()
    _, good = decode_records(data)
    assert data[good:].count(0) == len(data) - good
    return good, len(data)


async def test_zeros_follow_the_records_and_a_graceful_close_cuts_them(tmp_path: Path) -> None:
    j = await started(tmp_path, journal_preallocate_bytes=MIB)
    await j.append(rec(0))
    ((_, path),) = list_journal_files(tmp_path)
    good, size = records_end(path)
    assert good == len(rec(0)) and size == good + MIB  # allocated ahead of the write
    for i in range(1, 50):
        await j.append(rec(i))
    assert path.stat().st_size == size  # written into the zeros: the size stays
    await j.close()
    assert path.stat().st_size == 50 * len(rec(0))  # ends at its last record


async def test_a_full_file_is_cut_to_its_records_before_the_next_starts(tmp_path: Path) -> None:
    j = await started(tmp_path, journal_preallocate_bytes=MIB, journal_file_bytes_max=1000)
    for i in range(200):
        await j.append(rec(i))
    files = list_journal_files(tmp_path)
    assert len(files) > 3
    for _, path in files[:-1]:
        good, size = records_end(path)
        assert good == size, f"{path.name}: zeros before the next file"
    good, size = records_end(files[-1][1])
    assert size > good  # the last one still has its zeros
    await j.stop_now()


async def test_a_crash_replays_every_entry_and_the_zeros_are_no_torn_tail(
        tmp_path: Path) -> None:
    cfg = config(journal_preallocate_bytes=MIB, journal_file_bytes_max=64 * 1024)
    s = await LedgerStorage.open(tmp_path / "j", tmp_path / "l", cfg)
    for first in range(0, 600, 50):
        await s.add_entries(3, list(range(first, first + 50)), KEY,
                            [body(e) for e in range(first, first + 50)])
    await s.abort()  # a crash: the last file ends in zeros
    s = await LedgerStorage.open(tmp_path / "j", tmp_path / "l", cfg)
    try:
        rec_ = s.statistics()["recovery"]
        assert rec_["bytes_cut"] == 0 and rec_["journal_files_removed"] == 0
        assert rec_["bytes_preallocated"] > 0
        assert rec_["adds_replayed"] == 600
        for e in (0, 299, 599):
            assert await s.read_entry(3, e) == body(e)
    finally:
        await s.close()


async def test_a_torn_record_inside_the_zeros_is_cut_as_torn(tmp_path: Path) -> None:
    cfg = config(journal_preallocate_bytes=MIB)
    s = await LedgerStorage.open(tmp_path / "j", tmp_path / "l", cfg)
    await s.add_entries(3, list(range(20)), KEY, [body(e) for e in range(20)])
    await s.abort()
    ((_, path),) = list_journal_files(tmp_path / "j")
    good, size = records_end(path)
    with path.open("r+b") as fh:  # half a record where the next batch would have gone
        fh.seek(good)
        fh.write(b"\x40\x00\x00\x00" + b"half a record")
    s = await LedgerStorage.open(tmp_path / "j", tmp_path / "l", cfg)
    try:
        rec_ = s.statistics()["recovery"]
        assert rec_["bytes_cut"] == size - good and rec_["bytes_preallocated"] == 0
        assert rec_["adds_replayed"] == 20
        assert await s.read_entry(3, 19) == body(19)
        await s.add_entries(3, [20, 21], KEY, [body(20), body(21)])  # and writing goes on
        assert await s.read_entry(3, 21) == body(21)
    finally:
        await s.close()


async def test_a_disk_that_cannot_allocate_gets_plain_appends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(self: Any, fd: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "no space for the zeros")

    monkeypatch.setattr(fileio_mod.OsFileIO, "preallocate", no_space)
    j = await started(tmp_path, journal_preallocate_bytes=MIB)
    for i in range(10):
        await j.append(rec(i))
    ((_, path),) = list_journal_files(tmp_path)
    assert records_end(path) == (10 * len(rec(0)), 10 * len(rec(0)))
    await j.close()


def test_preallocation_is_checked() -> None:
    from asyncbk.errors import ConfigError

    with pytest.raises(ConfigError, match="journal_preallocate_bytes"):
        BookieConfig(journal_preallocate_bytes=-1).validate()
    assert BookieConfig(journal_preallocate_bytes=0).validate().journal_preallocate_bytes == 0
