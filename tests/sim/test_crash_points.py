"""Power cuts at every point: the real bookie storage, crashed just before its k-th
file operation, for every k of a fixed workload (or an even sample of them).

The random seeds of :mod:`test_storage_crashes` crash at random moments; this walks
the moments one by one.  A workload (adds to three ledgers, fences, explicit LACs, a
deletion and re-creation, with small journal and entry-log files and frequent
checkpoints, so rotations, flushes, checkpoints and journal trimming all happen) is
first run to the end to count its file operations; then, for each chosen k, it runs
again, identical up to the k-th operation, where the machine dies (unsynced data
lost, or torn for odd k).  After the restart (the real recovery) the same checks as
the random seeds: every acknowledged add reads back, nothing reads that was never
written, acknowledged fences and explicit LACs are kept.

CRASH_POINTS picks how many points per backend (default 60, evenly spread; ``all``:
every one) and CRASH_WORKLOADS how many workloads (default 1; each its own seed);
``nox -s sim`` runs every point of 20 workloads.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from asyncbk.config import BookieConfig
from asyncbk.errors import BKError
from asyncbk.testing.sim import SIM_STORAGE_CONFIG

from .test_storage_crashes import _Run, drive

WORKLOAD_SEED = 20261123
OPERATIONS = 160
POINTS = os.environ.get("CRASH_POINTS", "60")
WORKLOADS = int(os.environ.get("CRASH_WORKLOADS", "1"))


class _CutRun(_Run):
    """One run of the workload, cut just before file operation ``cut_at`` (None: not)."""

    def __init__(self, backend: str, cut_at: int | None, workload: int = 0) -> None:
        super().__init__(WORKLOAD_SEED + workload, backend)
        self.delete_roll = 0.95  # deletions enough to rewrite index.log
        self.cut_at = cut_at
        self.workload_ops = 0
        """File operations up to the end of the first process (its close, or the cut)."""

    async def run(self) -> None:
        config = BookieConfig(**{
            **SIM_STORAGE_CONFIG, "journal_file_bytes_max": 2048,
            "entry_log_bytes_max": 2048, "entry_log_flush_bytes": 1024,
            "checkpoint_interval_s": 0.02, "index_backend": self.backend,
            "index_write_cache_entries_max": 16,  # (lmdb: layers of 4 keys)
            "index_log_compaction_bytes_min": 0}).validate()  # (memory: rewritten often)
        if self.cut_at is not None:
            self.fs.power_cut_after(self.cut_at, torn=self.cut_at % 2 == 1,
                                    then=self.kv.crash if self.kv is not None else None)
        storage = await self.open(config)
        pending: list[asyncio.Future[None]] = []
        for i in range(OPERATIONS):
            if self.fs.crashes:
                break
            try:
                fut = self.operate(storage)
            except BKError:
                await asyncio.sleep(0.002)
                continue
            if fut is not None:
                pending.append(fut)
            if i % 3 == 0:
                await asyncio.sleep(0.004)
        await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 60)
        self.note(storage)
        try:
            if not self.fs.crashes:
                await storage.close()
        except (OSError, BKError):
            if not self.fs.crashes:  # a failure of its own, not the cut's
                raise
        if self.fs.crashes:
            await storage.abort()
        self.workload_ops = self.fs.ops
        storage = await self.open(config)
        try:
            await self.check(storage)
        finally:
            await storage.close()


def _run(backend: str, cut_at: int | None, workload: int = 0) -> _CutRun:
    run = _CutRun(backend, cut_at, workload)
    drive(run)
    return run


def _points(total: int) -> list[int]:
    if POINTS == "all":
        return list(range(1, total + 1))
    n = max(1, min(total, int(POINTS)))
    return sorted({1 + (total - 1) * i // max(1, n - 1) for i in range(n)})


@pytest.mark.parametrize("workload", range(WORKLOADS))
@pytest.mark.parametrize("backend", ["memory", "lmdb"])
def test_a_power_cut_before_any_file_operation_loses_nothing_acknowledged(
        backend: str, workload: int) -> None:
    whole = _run(backend, None, workload)
    assert not whole.violations, whole.violations
    total = whole.workload_ops
    assert whole.stats["acked"] > 10 and total > 150, (whole.stats, total)  # a real workload
    failures = []
    for k in _points(total):
        r = _run(backend, k, workload)
        if not r.fs.crashes:
            failures.append(f"cut at operation {k} of {total} never happened")
        elif r.violations:
            failures.append(f"cut at operation {k} of {total} (torn={k % 2 == 1}): "
                            f"{r.violations[0]}; replay: _run({backend!r}, {k}, {workload})")
    assert not failures, f"{len(failures)} of {len(_points(total))} points:\n" + "\n".join(
        failures[:5])


@pytest.mark.parametrize("backend", ["memory", "lmdb"])
def test_the_workloads_reach_the_index_background_work(backend: str) -> None:
    """The cuts above strike the index's background work (lmdb: layer flushes;
    memory: index.log rewrites) because the workloads do it: the default workload
    always, and nearly every one of many (a workload's deletions may all come too late
    for a rewrite: 19 of the first 20 rewrite index.log)."""
    key = "index_background_flushes" if backend == "lmdb" else "index_log_compactions"
    without = [w for w in range(max(WORKLOADS, 1))
               if _run(backend, None, w).stats[key] == 0]
    assert 0 not in without, f"the default workload never reaches {key}"
    assert len(without) <= WORKLOADS // 10, f"workloads without {key}: {without}"
