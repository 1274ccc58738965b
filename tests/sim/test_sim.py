"""Seeded simulations of writers, recoverers and readers over faulty bookies.

The default run checks SIM_SEEDS seeds (500 unless the environment says more; with
the 500 of test_storage_crashes.py, 1,000 in all); ``nox -s sim`` runs 10,000.  The
bookies are whole (their composition root, BookieServer) on simulated disks
(asyncbk.testing.simfs), with an auto-recovery worker beside them.  A failure names
its seed and prints the event trace; ``python -m asyncbk.testing.simulation --seed N
-v`` replays it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from asyncbk.testing.simulation import run_simulation

SEEDS = int(os.environ.get("SIM_SEEDS", "500"))
FIRST = int(os.environ.get("SIM_FIRST_SEED", "0"))
CHUNK = 50


@pytest.mark.parametrize("start", range(FIRST, FIRST + SEEDS, CHUNK))
def test_seeds(start: int) -> None:
    failures = []
    for seed in range(start, min(start + CHUNK, FIRST + SEEDS)):
        result = run_simulation(seed)
        if not result.ok:
            failures.append(result)
    if failures:
        r = failures[0]
        trace = "\n".join(r.trace[-60:])
        pytest.fail(
            f"{len(failures)} seed(s) failed: {[f.seed for f in failures]}\n"
            f"seed {r.seed} {r.config}: {r.violations}\n"
            f"replay: python -m asyncbk.testing.simulation --seed {r.seed} -v\n"
            f"last events:\n{trace}")


@pytest.mark.parametrize("seed", [18, 1701, 4867])
def test_seeds_that_found_bugs(seed: int) -> None:
    """Seeds beyond the default range that once failed (tests/sim/README.md)."""
    result = run_simulation(seed)
    assert result.ok, (result.violations, "\n".join(result.trace[-40:]))


def test_same_seed_same_run() -> None:
    """Whole-bookie runs replay from their seed: the same seed twice gives the same
    event trace (the bookies' state changes included), a different seed another."""
    traces = {}
    for seed in (3, 18, 99):
        a, b = run_simulation(seed), run_simulation(seed)
        assert a.trace == b.trace and a.acked == b.acked and a.stats == b.stats
        assert any(" -> " in line for line in a.trace), "no bookie state change traced"
        traces[seed] = a.trace
    assert len({tuple(t) for t in traces.values()}) == len(traces)


def test_the_runs_exercise_faults() -> None:
    """The seeds do what they claim: crashes, torn writes, partitions, writer kills,
    concurrent recoveries, ensemble changes, full disks, maintenance, failing ledger
    directories, bookies lost for good and re-replicated, and garbage-collected
    ledgers all happen in the first 100."""
    totals: dict[str, int] = {}
    for seed in range(100):
        for k, v in run_simulation(seed).stats.items():
            totals[k] = totals.get(k, 0) + v
    for key in ("crashes", "torn", "partitions", "link_resets", "refusals", "writer_killed",
                "recovery_attempts", "ensemble_changes", "disk_full", "maintenance",
                "read_only_probes", "dir_failures", "bookies_lost", "rereplicated",
                "gc_deleted"):
        assert totals[key] > 0, f"no run had any {key}: {totals}"


def test_a_seed_replays_in_another_process() -> None:
    """Nothing in a run depends on the process: not on string hashing (another
    PYTHONHASHSEED) nor on where objects land in memory (a set of watchers woken in
    address order once made two processes diverge on seed 37)."""
    code = ("import hashlib, sys\n"
            "from asyncbk.testing.simulation import run_simulation\n"
            "for seed in (5, 37, 41):\n"
            "    r = run_simulation(seed)\n"
            "    print(seed, hashlib.sha256('\\n'.join(r.trace).encode()).hexdigest())\n")
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=300, check=True)
        outputs.append([line for line in done.stdout.splitlines() if line[:1].isdigit()])
    assert outputs[0] == outputs[1] and len(outputs[0]) == 3


def test_the_command_is_quiet_unless_verbose() -> None:
    """`python -m asyncbk.testing.simulation` prints a line a seed and the total; the
    warnings of the injected faults (fenced writers...) only with -v."""
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "asyncbk.testing.simulation",
                               "--seeds", "2", *args], capture_output=True, text=True,
                              timeout=300, check=True)

    quiet = run()
    assert quiet.stderr == ""
    lines = quiet.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["seed 0", "seed 1"]
    assert lines[2:] == ["2 passed, 0 failed"]
    loud = run("-v")
    assert "warning" in loud.stderr  # seeds 0 and 1 fence a writer (see the quiet run)
    assert len(loud.stdout.splitlines()) > 20  # the traces
