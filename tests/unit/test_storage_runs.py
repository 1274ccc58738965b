"""A batch of adds as one unit on the bookie: its ADD records journalled as one run
(``Journal.append_run``), written to the entry log in one write when they fit
(``EntryLogWriter.append_run``) and indexed at once (``LedgerIndex.put_run``); the
bytes on disk are those of the records one by one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncbk.bookie.journal_format import encode_add, encode_add_run
from asyncbk.bookie.storage import LedgerIndex, LedgerStorage
from asyncbk.config import BookieConfig
from asyncbk.errors import TooManyRequestsError

from .test_journal import held_in_fsync, read_journal, started

KEY = b"k"


def run_of(ledger_id: int, ids: list[int], size: int = 10) -> tuple[bytes, int]:
    run, sizes = encode_add_run(ledger_id, ids, [b"%d" % i * size for i in ids])
    return run, len(sizes)


async def test_a_run_counts_as_its_records_and_writes_them_in_order(tmp_path: Path) -> None:
    j = await started(tmp_path)
    futs: list[asyncio.Future[Any]] = []
    futs.append(j.append(encode_add(1, 0, b"a")))
    run, count = run_of(1, list(range(1, 101)))
    futs.append(j.append_run(run, count, None))
    futs.append(j.append(encode_add(1, 101, b"z")))
    done: list[Any] = []
    again, count2 = run_of(2, [7, 8, 9])
    j.append_run_then(again, count2, None, done.append)
    syncs = await asyncio.gather(*futs)
    assert len(done) == 1 and done[0].records >= 3
    stats = j.statistics()
    assert stats["records"] == 105 and stats["queue_entries"] == 0
    assert sum(s.records for s in {id(s): s for s in syncs}.values()) <= 105
    await j.close()
    records = read_journal(tmp_path)
    assert [(r.ledger_id, r.entry_id) for r in records] == (  # type: ignore[union-attr]
        [(1, e) for e in range(102)] + [(2, 7), (2, 8), (2, 9)])


async def test_a_run_is_never_split_across_group_commits(tmp_path: Path) -> None:
    j = await started(tmp_path, journal_group_entries_max=8)
    runs = [run_of(1, list(range(i * 20, i * 20 + 20))) for i in range(3)]
    await asyncio.gather(*(j.append_run(run, count, None) for run, count in runs))
    stats = j.statistics()
    assert stats["records"] == 60
    assert stats["batch_records_max"] >= 20  # (a whole run, past the limit of 8)
    assert stats["flush_reasons"]["entries"] >= 2
    await j.close()


async def test_a_full_queue_refuses_a_run_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    j, sync, first = await held_in_fsync(tmp_path, monkeypatch, journal_queue_entries_max=10)
    run, count = run_of(1, list(range(1, 11)))  # 1 in flight + 10 > 10
    with pytest.raises(TooManyRequestsError):
        j.append_run(run, count, None)
    assert j.statistics()["queue_entries"] == 1
    fits, n = run_of(1, list(range(1, 10)))
    fut = j.append_run(fits, n, None)
    sync.release.set()
    await asyncio.gather(first, fut)
    with pytest.raises(ValueError):
        j.append_run(b"", 0, None)
    await j.close()


@settings(max_examples=150, deadline=None)
@given(runs=st.lists(st.tuples(
    st.booleans(),
    st.lists(st.integers(0, 6000), min_size=1, max_size=12),
    st.integers(0, 3)), max_size=25))
def test_put_run_matches_put_for_each(runs: list[tuple[bool, list[int], int]]) -> None:
    index, model = LedgerIndex(), LedgerIndex()
    for consecutive, ids, log_id in runs:
        if consecutive:  # (the usual run: the next entries of the dense range)
            ids = list(range(len(model._lengths), len(model._lengths) + len(ids)))
        offsets = [100 * i for i in range(len(ids))]
        sizes = [10 + i for i in range(len(ids))]
        replaced = index.put_run(ids, log_id, offsets, sizes)
        expected = [old for old in (model.put(e, (log_id, o, n))
                                    for e, o, n in zip(ids, offsets, sizes, strict=True))
                    if old is not None]
        assert replaced == expected
        assert len(index) == len(model) and index.last == model.last
    assert list(index.items()) == list(model.items())


@pytest.mark.parametrize("backend", ["memory", "lmdb"])
async def test_runs_across_entry_log_rotations_read_back_after_a_crash(
        tmp_path: Path, backend: str) -> None:
    config = BookieConfig(entry_log_bytes_max=4096, checkpoint_interval_s=3600.0,
                          index_backend=backend)

    def body(e: int) -> bytes:
        return b"%05d" % e * (20 + e % 50)

    s = await LedgerStorage.open(tmp_path / "j", tmp_path / "l", config)
    chunks, start = [], 0
    for n in [3, 30, 5, 40, 2, 25] * 10:  # (runs that fit in the log being written, and not)
        chunks.append(list(range(start, min(start + n, 300))))
        start += n
        if start >= 300:
            break
    await asyncio.gather(*(s.add_entries(5, ids, KEY, [body(e) for e in ids]) for ids in chunks))
    await s.add_entries(5, [3, 3], KEY, [b"again", b"twice"])  # (re-adds: the last wins)
    for e in (0, 29, 30, 150, 299):
        assert await s.read_entry(5, e) == body(e)
    assert await s.read_entry(5, 3) == b"twice"
    logs = [p for p in (tmp_path / "l").rglob("*.log") if p.parent.name == "entrylog"]
    assert len(logs) > 5  # (rotated inside runs)
    await s.abort()  # a crash: nothing checkpointed, the journal is replayed
    s = await LedgerStorage.open(tmp_path / "j", tmp_path / "l", config)
    try:
        for e in (0, 29, 30, 150, 299):
            assert await s.read_entry(5, e) == body(e)
        assert await s.read_entry(5, 3) == b"twice"
        assert await s.read_entry(5, -1) == body(299)
    finally:
        await s.close()
