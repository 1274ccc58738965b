"""Checkpoints against cancellation and failed entry log syncs, on the simulated file
system (:mod:`asyncbk.testing.simfs`): a checkpoint's mark never covers entry log
bytes that were not made durable, so a crash after it loses no acknowledged entry."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from asyncbk.bookie.storage import LedgerStorage
from asyncbk.clock import LOOP_CLOCK
from asyncbk.config import BookieConfig
from asyncbk.errors import BookieIOError
from asyncbk.testing.sim import QuietLog, run_sim
from asyncbk.testing.simfs import InlineOffload, SimFileSystem
from asyncbk.testing.simkv import SimKVStore

JOURNAL = Path("/bookie/journal")
LEDGERS = Path("/bookie/ledgers")
KEY = b"k" * 20


class _Disk:
    """One bookie's simulated disk (and index store), reopened after each crash."""

    def __init__(self, backend: str) -> None:
        self.fs = SimFileSystem(random.Random(1))
        self.offload = InlineOffload(self.fs.rng)
        self.kv = SimKVStore(random.Random(2), self.fs) if backend == "lmdb" else None
        self.config = BookieConfig(
            entry_log_bytes_max=512, entry_log_flush_bytes=0, checkpoint_interval_s=3600.0,
            index_backend=backend).validate()

    async def open(self) -> LedgerStorage:
        return await LedgerStorage.open(
            JOURNAL, LEDGERS, self.config, log=QuietLog(), clock=LOOP_CLOCK,
            io=self.fs.mount(), offload=self.offload,
            kv_open=self.kv.open if self.kv is not None else None)

    def crash(self) -> None:
        self.fs.crash(torn=False)
        if self.kv is not None:
            self.kv.crash()

    def checkpoint_bytes(self) -> bytes | None:
        return self.fs.durable_bytes(LEDGERS / "checkpoint")


def _body(entry_id: int) -> bytes:
    return b"%d|" % entry_id + bytes([entry_id]) * 150


async def _add(storage: LedgerStorage, count: int) -> None:
    """Acknowledged adds spread over several entry logs (512 bytes each)."""
    await asyncio.gather(*[storage.add_entry(1, e, KEY, _body(e)) for e in range(count)])


async def _read_back(storage: LedgerStorage, count: int) -> list[Any]:
    out: list[Any] = []
    for e in range(count):
        try:
            out.append(await storage.read_entry(1, e))
        except BookieIOError as exc:
            out.append(exc)
    return out


@pytest.mark.parametrize("backend", ["memory", "lmdb"])
def test_a_cancelled_checkpoint_still_syncs_the_entry_logs_it_took(
        backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint whose caller is cancelled once it has taken the finished entry logs
    (as closing cancels the housekeeping task) still syncs them: the next checkpoint,
    which no longer has them to sync, must not mark them unsynced."""
    disk = _Disk(backend)

    async def main() -> list[Any]:
        storage = await disk.open()
        await _add(storage, 12)
        assert storage.statistics()["entry_log_id"] >= 2  # logs were finished
        capture = storage._checkpointer.capture
        task: asyncio.Task[None] | None = None

        def capture_then_cancel(*args: Any) -> Any:
            work = capture(*args)
            assert task is not None
            asyncio.get_running_loop().call_soon(task.cancel)
            return work

        monkeypatch.setattr(storage._checkpointer, "capture", capture_then_cancel)
        task = asyncio.get_running_loop().create_task(storage.checkpoint())
        with pytest.raises(asyncio.CancelledError):
            await task
        monkeypatch.setattr(storage._checkpointer, "capture", capture)
        await storage.close()  # its final checkpoint trims the journal
        disk.crash()
        storage = await disk.open()
        try:
            return await _read_back(storage, 12)
        finally:
            await storage.close()

    assert run_sim(main) == [_body(e) for e in range(12)]


@pytest.mark.parametrize("backend", ["memory", "lmdb"])
def test_a_checkpoint_waiting_behind_a_failed_sync_writes_no_mark(backend: str) -> None:
    """A checkpoint that waited for the lock while another one's entry log fdatasync
    failed (that one failed the journal) refuses: it would mark the logs the failed
    one took, whose data may be lost, and trim the journal that still has them."""
    disk = _Disk(backend)

    async def main() -> tuple[list[Any], list[Any], bool]:
        storage = await disk.open()
        await _add(storage, 12)
        before = disk.checkpoint_bytes()
        disk.fs.fail_fsyncs(1)  # the first checkpoint's first entry log fdatasync
        results = await asyncio.gather(storage.checkpoint(), storage.checkpoint(),
                                       return_exceptions=True)
        assert storage.journal_failed
        marked = disk.checkpoint_bytes() != before
        disk.crash()
        await storage.abort()
        storage = await disk.open()
        try:
            return await _read_back(storage, 12), results, marked
        finally:
            await storage.close()

    read, results, marked = run_sim(main)
    assert read == [_body(e) for e in range(12)]
    assert [type(r) for r in results] == [BookieIOError, BookieIOError], results
    assert not marked
