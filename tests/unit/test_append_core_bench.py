"""benchmarks/append_core.py drives the ledger handle's per-entry classes in the handle's
order, without sockets: it must still run against them (a renamed method or a changed
signature stops it here first), complete every entry it submits, and time each step."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.modules import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "append_core.py"


@pytest.fixture(scope="module")
def append_core() -> ModuleType:
    return load_script(BENCH, "append_core_bench")


@pytest.mark.parametrize("inflight", [1, 3, 256])
def test_every_window_completes_and_each_step_is_timed(append_core: ModuleType,
                                                       inflight: int) -> None:
    out = append_core.measure(windows=5, inflight=inflight, size=100)
    assert set(out) == {"submit", "frame", "complete", "total"}
    assert all(v > 0 for v in out.values())
    assert out["total"] == pytest.approx(out["submit"] + out["frame"] + out["complete"])
