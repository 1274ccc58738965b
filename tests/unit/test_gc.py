"""The bookie's garbage collector on a manual clock: rounds and compaction intervals
follow the injected clock, not real time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from asyncbk.bookie.gc import GarbageCollector
from asyncbk.bookie.storage import COMPACTION_READ_GRACE_S, LedgerStorage
from asyncbk.clock import ManualClock
from asyncbk.config import BookieConfig
from asyncbk.log import get_logger

KEY = b"master-key"


class ListedLedgers:
    """The one metadata call a collector makes with gc_drop_ledgers_not_in_ensemble off."""

    def __init__(self, ids: set[int]) -> None:
        self.ids = ids

    async def iter_ledger_ids(self, page_size: int = 1000) -> AsyncIterator[int]:
        for ledger_id in sorted(self.ids):
            yield ledger_id


def sleeping_until(clock: ManualClock, due_s: float) -> bool:
    """Whether something sleeps on ``clock`` until ``due_s``."""
    return any(t == due_s and not fut.done() for t, fut in clock._sleepers)


async def until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10.0  # a real-time guard only against hanging
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


async def open_storage(root: Path, clock: ManualClock, **kw: Any) -> LedgerStorage:
    kw.setdefault("checkpoint_interval_s", 3600.0)
    cfg = BookieConfig(gc_drop_ledgers_not_in_ensemble=False, **kw)
    return await LedgerStorage.open(root / "journal", root / "ledgers", cfg, clock=clock)


def collector(s: LedgerStorage, listed: set[int], clock: ManualClock | None = None
              ) -> GarbageCollector:
    return GarbageCollector(s, ListedLedgers(listed), "127.0.0.1:3181",  # type: ignore
                            s.config, lambda: None, get_logger(component="gc-test"), clock=clock)


async def test_rounds_come_every_gc_interval_on_the_storage_clock(tmp_path: Path) -> None:
    clock = ManualClock()
    s = await open_storage(tmp_path, clock, gc_interval_s=60.0)
    gc = collector(s, {2})  # ledger 1 was deleted; the collector takes the storage's clock
    for lid in (1, 2):
        await s.add_entry(lid, 0, KEY, b"x")
    task = asyncio.create_task(gc.run_forever())
    try:
        start = clock.monotonic_s()
        await until(lambda: sleeping_until(clock, start + 60.0), "the collector to sleep")
        await asyncio.sleep(0.05)  # real time passing changes nothing
        clock.advance(59.0)
        await asyncio.sleep(0.05)
        assert gc.runs == 0 and s.ledger(1) is not None
        clock.advance(1.0)
        await until(lambda: gc.runs == 1, "a round after 60 s on the clock")
        assert s.ledger(1) is None and s.ledger_ids() == [2]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await s.close()


async def test_minor_compaction_waits_its_interval_on_the_injected_clock(tmp_path: Path) -> None:
    clock = ManualClock()
    s = await open_storage(tmp_path, clock, entry_log_bytes_max=4000,
                           minor_compaction_threshold=0.6, minor_compaction_interval_s=3600.0,
                           compaction_rate_bytes_per_s=0)
    try:
        for e in range(60):  # two ledgers interleaved over several small entry logs
            for lid in (1, 2):
                await s.add_entry(lid, e, KEY, b"y" * 100)
        gc = collector(s, {2}, clock)
        got = await gc.run_once()  # ledger 1 goes; no compaction yet (interval not passed)
        assert got == {"deleted": 1, "dropped": 0, "bytes_freed": 0}
        usage = await s.entry_log_usage()
        assert len(usage) >= 3 and all(live < 0.6 * total for live, total in usage.values())
        clock.advance(3600.0)
        round_ = asyncio.create_task(gc.run_once())
        # the compaction gives reads of the old logs two grace periods, on the clock too:
        # to those that looked the old place up, then to those that took its descriptor
        # (the clock moves only when something sleeps a grace period on it)
        advanced = 0
        while not round_.done():
            await until(lambda: round_.done() or sleeping_until(
                clock, clock.monotonic_s() + COMPACTION_READ_GRACE_S),
                "the compaction's grace periods")
            if not round_.done():
                clock.advance(COMPACTION_READ_GRACE_S)
                advanced += 1
        assert advanced >= 2
        got = round_.result()
        assert got["deleted"] == 0 and got["bytes_freed"] > 0
        assert not set(usage) & set(await s.entry_log_usage())
        assert await s.read_entries(2, 0, 100, 1 << 20) == [b"y" * 100] * 60
    finally:
        await s.close()
