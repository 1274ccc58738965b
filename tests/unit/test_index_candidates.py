"""The entry-index candidates of benchmarks/index_candidates.py, checked against
a dict model at a tiny size: put_batch / get / range / delete_ledger, and the
same answers after close and reopen."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from tests.modules import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "index_candidates.py"


def _load() -> Any:
    return load_script(BENCH, "index_candidates", register=True)


ic = _load()

NEEDS = {"sqlite": "sqlite3", "lmdb": "lmdb", "lmdb-writemap": "lmdb",
         "rocksdict-wal": "rocksdict", "rocksdict-nowal": "rocksdict"}


def test_every_backend_is_covered() -> None:
    assert set(NEEDS) == set(ic.BACKENDS)


def _check(ix: Any, model: dict[tuple[int, int], tuple[int, int, int]],
           ledgers: list[int], rng: random.Random) -> None:
    for (lg, e), loc in rng.sample(sorted(model.items()), min(300, len(model))):
        assert ix.get(lg, e) == loc
    assert ix.get(ledgers[0], 10**9) is None
    assert ix.get(max(ledgers) + 1, 0) is None
    for lg in ledgers:
        want = sorted((e, *loc) for (lg2, e), loc in model.items() if lg2 == lg)
        assert [tuple(r) for r in ix.range(lg, 0, 2**62)] == want
        if want:
            a, b = want[len(want) // 3][0], want[2 * len(want) // 3][0]
            assert [tuple(r) for r in ix.range(lg, a, b)] == [w for w in want if a <= w[0] <= b]
        assert ix.range(lg, 10**9, 10**9 + 5) == []


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_backend_matches_dict_model(name: str, tmp_path: Path) -> None:
    pytest.importorskip(NEEDS[name], reason=f"{NEEDS[name]} is not installed")
    rng = random.Random(13)
    nledgers, n = 7, 2000
    # ledger ids that straddle byte boundaries, so byte order must equal numeric order
    ledgers = sorted({1, 255, 256, *(ic.ledger_of(k) for k in range(nledgers - 3))})
    model: dict[tuple[int, int], tuple[int, int, int]] = {}
    ix = ic.open_backend(name, tmp_path / "ix")
    next_entry = dict.fromkeys(ledgers, 0)
    for b0 in range(0, n, 250):
        items = []
        for i in range(b0, b0 + 250):
            lg = ledgers[i % len(ledgers)]
            e = next_entry[lg]
            next_entry[lg] += 1 if i % 17 else 300  # a gap now and then
            items.append((lg, e, i // 500, i * 1100, 1000 + i % 64))
        ix.put_batch(items)
        for lg, e, log, off, ln in items:
            model[(lg, e)] = (log, off, ln)
        if b0 % 1000 == 750:
            ix.sync()
    # an overwrite (compaction moves an entry): the later location wins
    lg0 = ledgers[0]
    ix.put_batch([(lg0, 0, 99, 12345, 77)])
    model[(lg0, 0)] = (99, 12345, 77)
    _check(ix, model, ledgers, rng)

    gone = ledgers[1::2]
    for lg in gone:
        ix.delete_ledger(lg)
        model = {k: v for k, v in model.items() if k[0] != lg}
    ix.delete_ledger(123456789)  # not there: a no-op
    ix.sync()
    _check(ix, model, ledgers, rng)
    for lg in gone:
        assert ix.range(lg, 0, 2**62) == []

    ix.close()
    ix = ic.open_backend(name, tmp_path / "ix")
    _check(ix, model, ledgers, rng)
    if hasattr(ix, "compact"):
        ix.compact()
        _check(ix, model, ledgers, rng)
    ix.close()


def test_run_backend_tiny(tmp_path: Path) -> None:
    """The measurement driver itself runs end to end (sqlite: always there)."""
    res = ic.run_backend("sqlite", tmp_path, entries=2000, ledgers=10, batch=100,
                         sync_every=500, lookups=200, ranges=20, range_len=10,
                         journal_entries=500, journal_seconds=0.2, delete_fraction=0.9)
    for key in ("write_ops_s", "get_hit_ops_s", "range_ops_s", "reopen_s",
                "space_after_delete_mb", "journal_drop_pct", "rss_peak_mb"):
        assert key in res
    assert not (tmp_path / "a").exists()


def test_crash_test_tiny(tmp_path: Path) -> None:
    """SIGKILL a sqlite writer and reopen: opens, nothing returned from put_batch lost."""
    out = ic.crash_test("sqlite", tmp_path, kill_after_s=0.5, ledgers=10, batch=100,
                        sync_every=500)
    assert out["opens"], out
    assert out["lost_after_put"] == 0 and out["prefix_of_write_order"], out
