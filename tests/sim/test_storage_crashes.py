"""The real bookie storage, crashed over and over on a simulated file system.

Each seed opens a :class:`LedgerStorage` on a :class:`SimFileSystem` and, for a few
rounds, writes (adds to a few ledgers, fences, explicit LACs; checkpoints, journal and
entry log rotations come with the small sizes) while faults strike: the machine
crashes at a random moment (unsynced writes lost, or torn), an fdatasync fails with
EIO (its data then kept or lost for good), the disk fills up; or the round ends with
a clean close.  After each restart (the real recovery) the checks:

1. every add acknowledged so far reads back with its bytes (invariant 1 on one disk);
2. every entry stored reads back with the bytes once appended under its id (no
   corruption, no entry made up);
3. an acknowledged fence is still there, an acknowledged explicit LAC not lower;
4. a ledger deleted (acknowledged) and re-created under the same id never reads an
   entry of before its deletion.

Every seed runs with both entry index backends: ``memory`` (index.log) and ``lmdb``
(the on-disk index: the real write cache over a :class:`~asyncbk.testing.simkv.SimKV`,
crashed with the file system: the cache is lost, the SimKV keeps its last flush).

SIM_SEEDS seeds (500 unless the environment says more; ``nox -s sim`` runs 10,000),
from SIM_FIRST_SEED.  A failure names its seed; ``run_storage_crashes(seed)``
replays it.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any

import pytest

from asyncbk.bookie.storage import LedgerStorage
from asyncbk.clock import LOOP_CLOCK
from asyncbk.config import BookieConfig
from asyncbk.errors import BKError
from asyncbk.testing.sim import SIM_STORAGE_CONFIG, QuietLog, SimEventLoop
from asyncbk.testing.simfs import InlineOffload, SimFileSystem
from asyncbk.testing.simkv import SimKVStore

SEEDS = int(os.environ.get("SIM_SEEDS", "500"))
FIRST = int(os.environ.get("SIM_FIRST_SEED", "0"))
CHUNK = 100
KEY = b"k" * 20
JOURNAL = Path("/bookie/journal")
LEDGERS = Path("/bookie/ledgers")


class _Run:
    def __init__(self, seed: int, backend: str = "memory") -> None:
        self.seed = seed
        self.backend = backend
        self.rng = random.Random(seed)
        self.fs = SimFileSystem(random.Random(self.rng.getrandbits(64)))
        self.offload = InlineOffload(self.fs.rng)
        self.kv = (SimKVStore(random.Random(self.rng.getrandbits(64)), self.fs)
                   if backend == "lmdb" else None)
        self.gen: dict[int, int] = {}
        """Each ledger's generation: +1 at each deletion issued (entry ids restart at 0)."""
        self.deleted_gen: dict[int, int] = {}
        """The highest generation of each ledger whose deletion was acknowledged."""
        self.appended: dict[tuple[int, int], dict[int, bytes]] = {}
        self.acked: dict[tuple[int, int], bytes] = {}
        self.fenced: set[int] = set()
        self.lacs: dict[int, int] = {}
        self.next_entry: dict[int, int] = {}
        self.violations: list[str] = []
        self.trace: list[str] = []
        self.stats = {"rounds": 0, "crashes": 0, "torn": 0, "fsync_failures": 0,
                      "disk_full": 0, "closes": 0, "acked": 0, "failed_starts": 0,
                      "deletes": 0, "index_background_flushes": 0,
                      "index_log_compactions": 0}
        self.delete_roll = 0.985
        """An operation rolling above this deletes its ledger."""

    def log(self, text: str) -> None:
        self.trace.append(f"{asyncio.get_running_loop().time():9.4f} {text}")

    async def run(self) -> None:
        rng = self.rng
        config = BookieConfig(**{
            **SIM_STORAGE_CONFIG,
            "journal_file_bytes_max": rng.choice([512, 4096, 16384]),
            "entry_log_bytes_max": rng.choice([512, 4096, 16384]),
            "entry_log_flush_bytes": rng.choice([0, 1024, 8192]),
            "checkpoint_interval_s": rng.choice([0.02, 0.1, 0.5]),
            "journal_flush_when_queue_empty": rng.random() < 0.7,
            "index_backend": self.backend,
            # (its own draws: the other choices stay those of the seed before)
            "index_write_cache_entries_max": random.Random(self.seed).choice([8, 64, 200_000]),
            "index_log_compaction_bytes_min": random.Random(-1 - self.seed).choice(
                [0, 0, 2048, 16 << 20]),
        }).validate()
        for _ in range(rng.randint(2, 5)):
            self.stats["rounds"] += 1
            storage = await self.open(config)
            assert (storage._kv_cache is not None) == (self.backend == "lmdb")
            recovery = storage.statistics()["recovery"]
            self.log(f"open: {({k: n for k, n in recovery.items() if k != 'recovery_s'})}")
            await self.check(storage)
            if self.violations:
                await storage.close()
                return
            await self.round(storage)
        storage = await self.open(config)
        await self.check(storage)
        await storage.close()

    async def open(self, config: BookieConfig) -> LedgerStorage:
        """Start the storage (the real recovery); a start that fails (an fsync failing
        during recovery) is a process that exits: the next start retries."""
        for _attempt in range(5):
            try:
                return await LedgerStorage.open(JOURNAL, LEDGERS, config, log=QuietLog(),
                                                clock=LOOP_CLOCK, io=self.fs.mount(),
                                                offload=self.offload,
                                                kv_open=self.kv.open if self.kv else None)
            except (OSError, BKError) as exc:
                self.stats["failed_starts"] += 1
                self.log(f"start failed: {type(exc).__name__}: {exc}")
                self.crash(torn=self.rng.random() < 0.5)
        raise AssertionError("the storage did not start in 5 attempts")

    async def round(self, storage: LedgerStorage) -> None:
        rng = self.rng
        loop = asyncio.get_running_loop()
        end_at = loop.time() + rng.uniform(0.0, 1.0)
        faults_at = sorted(loop.time() + rng.uniform(0.0, 1.0) for _ in range(rng.randint(0, 2)))
        pending: list[asyncio.Future[None]] = []
        while loop.time() < end_at:
            if faults_at and loop.time() >= faults_at[0]:
                faults_at.pop(0)
                if rng.random() < 0.7:
                    self.stats["fsync_failures"] += 1
                    self.log("the next fsync fails")
                    self.fs.fail_fsyncs(1)
                else:
                    self.stats["disk_full"] += 1
                    self.log("disk full for a while")
                    self.fs.set_full(True)
                    loop.call_later(rng.uniform(0.0, 0.2), self.fs.set_full, False)
            try:
                fut = self.operate(storage)
            except BKError as exc:
                self.log(f"refused: {type(exc).__name__}: {exc}")
                await asyncio.sleep(rng.uniform(0.001, 0.05))
                continue
            if fut is not None:
                pending.append(fut)
            if rng.random() < 0.3:
                await asyncio.sleep(rng.uniform(0.0, 0.01))
        self.note(storage)
        if rng.random() < 0.2:
            self.stats["closes"] += 1
            self.log("close")
            await storage.close()
        else:
            torn = rng.random() < 0.6
            self.stats["crashes"] += 1
            self.stats["torn"] += torn
            self.log(f"crash torn={torn}")
            self.crash(torn)
            await storage.abort()
        self.fs.set_full(False)
        await asyncio.gather(*pending, return_exceptions=True)

    def note(self, storage: LedgerStorage) -> None:
        """Count what the storage did in the background this round."""
        stats = storage.statistics()
        for key in ("index_background_flushes", "index_log_compactions"):
            self.stats[key] += stats[key]

    def crash(self, torn: bool) -> None:
        self.fs.crash(torn)
        if self.kv is not None:
            self.kv.crash()

    def operate(self, storage: LedgerStorage) -> asyncio.Future[None] | None:
        rng = self.rng
        ledger_id = rng.randint(1, 3)
        roll = rng.random()
        if roll < 0.9:
            if ledger_id in self.fenced:
                return None
            entry_id = self.next_entry.get(ledger_id, 0)
            self.next_entry[ledger_id] = entry_id + 1
            gen = self.gen.get(ledger_id, 0)
            body = b"%d:%d:%d:%d:" % (self.seed, gen, ledger_id, entry_id) + bytes(
                [entry_id % 251]) * rng.randint(0, 300)
            self.appended.setdefault((ledger_id, entry_id), {})[gen] = body
            fut = storage.add_entry(ledger_id, entry_id, KEY, body)

            def on_add(f: asyncio.Future[None], key: tuple[int, int] = (ledger_id, entry_id),
                       body: bytes = body, gen: int = gen) -> None:
                if gen != self.gen.get(key[0], 0):
                    return  # its ledger was deleted since: no longer expected
                if not f.cancelled() and f.exception() is None:
                    self.acked[key] = body
                    self.stats["acked"] += 1
            fut.add_done_callback(on_add)
            return fut
        if storage.ledger(ledger_id) is None:
            return None
        gen = self.gen.get(ledger_id, 0)
        if roll > self.delete_roll:  # delete it: re-created by the next add, entry ids from 0
            self.gen[ledger_id] = gen + 1
            self.next_entry[ledger_id] = 0
            self.fenced.discard(ledger_id)
            self.lacs.pop(ledger_id, None)
            for key in [k for k in self.acked if k[0] == ledger_id]:
                del self.acked[key]
            fut = storage.delete_ledger(ledger_id)
            self.stats["deletes"] += 1
            self.log(f"delete {ledger_id} gen {gen}")

            def on_delete(f: asyncio.Future[None], ledger_id: int = ledger_id,
                          gen: int = gen) -> None:
                if not f.cancelled() and f.exception() is None:
                    self.deleted_gen[ledger_id] = max(gen, self.deleted_gen.get(ledger_id, -1))
            fut.add_done_callback(on_delete)
            return fut
        if roll < 0.93:
            fut = storage.fence(ledger_id, KEY)

            def on_fence(f: asyncio.Future[None], ledger_id: int = ledger_id,
                         gen: int = gen) -> None:
                if gen == self.gen.get(ledger_id, 0) and not f.cancelled() \
                        and f.exception() is None:
                    self.fenced.add(ledger_id)
            fut.add_done_callback(on_fence)
            return fut
        lac = self.next_entry.get(ledger_id, 0) - 1
        fut = storage.write_explicit_lac(ledger_id, lac)

        def on_lac(f: asyncio.Future[None], ledger_id: int = ledger_id, lac: int = lac,
                   gen: int = gen) -> None:
            if gen == self.gen.get(ledger_id, 0) and not f.cancelled() and f.exception() is None:
                self.lacs[ledger_id] = max(lac, self.lacs.get(ledger_id, -1))
        fut.add_done_callback(on_lac)
        return fut

    async def check(self, storage: LedgerStorage) -> None:
        v = self.violations
        for (ledger_id, entry_id), body in sorted(self.acked.items()):
            try:
                got: Any = await storage.read_entry(ledger_id, entry_id)
            except BKError as exc:
                got = exc
            if got != body:
                v.append(f"acknowledged entry {ledger_id}/{entry_id} reads {got!r:.60}")
                return
        for ledger_id in storage.ledger_ids():
            for entry_id in storage.entry_ids(ledger_id):
                try:
                    got = await storage.read_entry(ledger_id, entry_id)
                except BKError as exc:
                    got = exc
                gens = self.appended.get((ledger_id, entry_id), {})
                gone = self.deleted_gen.get(ledger_id, -1)
                if got not in [b for g, b in gens.items() if g > gone]:
                    v.append(f"stored entry {ledger_id}/{entry_id} reads {got!r:.60}, "
                             f"appended {gens!r:.60}, generations <= {gone} deleted")
                    return
        for ledger_id in sorted(self.fenced):
            info = storage.ledger(ledger_id)
            if info is None or not info.fenced:
                v.append(f"acknowledged fence of ledger {ledger_id} lost")
        for ledger_id, lac in sorted(self.lacs.items()):
            info = storage.ledger(ledger_id)
            if info is None or info.explicit_lac < lac:
                v.append(f"acknowledged explicit LAC {lac} of ledger {ledger_id} lost: {info}")


def run_storage_crashes(seed: int, backend: str = "memory") -> _Run:
    """One seeded run (module docstring)."""
    return drive(_Run(seed, backend))


def drive(run: _Run) -> _Run:
    """Run ``run`` on a simulated loop; a crash or hang of the run is a violation."""
    loop = SimEventLoop()
    try:
        loop.run_until_complete(asyncio.wait_for(run.run(), 600))
    except Exception as exc:
        run.violations.append(f"run failed: {type(exc).__name__}: {exc}")
    finally:
        loop.close()
    return run


@pytest.mark.parametrize("backend", ["memory", "lmdb"])
@pytest.mark.parametrize("start", range(FIRST, FIRST + SEEDS, CHUNK))
def test_storage_crash_seeds(start: int, backend: str) -> None:
    failures = [r for r in (run_storage_crashes(seed, backend)
                            for seed in range(start, min(start + CHUNK, FIRST + SEEDS)))
                if r.violations]
    if failures:
        r = failures[0]
        pytest.fail(f"{len(failures)} seed(s) failed: {[f.seed for f in failures]}\n"
                    f"seed {r.seed}: {r.violations}\n"
                    f"replay: run_storage_crashes({r.seed}, {backend!r}) in {__name__}\n"
                    "last events:\n" + "\n".join(r.trace[-40:]))


REGRESSION_SEEDS = [
    # A checkpoint whose caller was cancelled (closing cancels the housekeeping task)
    # after it had taken the finished entry logs for their fdatasync dropped them
    # unsynced; the close's checkpoint then marked them and trimmed the journal, and
    # a later crash lost acknowledged entries.
    (1239, "memory"), (6034, "memory"), (1586, "lmdb"), (2362, "lmdb"), (2464, "lmdb"),
    (4504, "lmdb"), (5722, "lmdb"), (9712, "lmdb"),
    # A checkpoint waiting for the lock while an entry log flush's fdatasync failed
    # wrote its mark anyway, over the logs the flush had taken.
    (2278, "lmdb"),
]
"""Seeds that once failed (from 10,000-seed runs), replayed on every run."""


@pytest.mark.parametrize(("seed", "backend"), REGRESSION_SEEDS)
def test_storage_crash_regression_seeds(seed: int, backend: str) -> None:
    r = run_storage_crashes(seed, backend)
    assert not r.violations, (f"seed {seed}: {r.violations}\nlast events:\n"
                              + "\n".join(r.trace[-40:]))


@pytest.mark.parametrize("backend", ["memory", "lmdb"])
def test_storage_crash_runs_exercise_faults(backend: str) -> None:
    """The seeds do what they claim: crashes (torn too), fsync failures, full disks,
    clean closes, checkpoints and rotations across restarts, in the first 50; with
    lmdb, the index write cache's layers written to the KV in the background (so the
    KV is often ahead of the checkpoint when the machine dies); with memory, index.log
    rewritten at checkpoints (so crashes strike its steps)."""
    totals: dict[str, int] = {}
    for seed in range(50):
        for k, n in run_storage_crashes(seed, backend).stats.items():
            totals[k] = totals.get(k, 0) + n
    for key in ("crashes", "torn", "fsync_failures", "disk_full", "closes", "acked",
                "deletes", "index_background_flushes" if backend == "lmdb"
                else "index_log_compactions"):
        assert totals[key] > 0, f"no run had any {key}: {totals}"


@pytest.mark.parametrize("backend", ["memory", "lmdb"])
def test_same_seed_same_run(backend: str) -> None:
    a, b = run_storage_crashes(7, backend), run_storage_crashes(7, backend)
    assert a.trace == b.trace and a.stats == b.stats
