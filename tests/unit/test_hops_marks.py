"""benchmarks/hops.py puts its timestamp marks into a copy of the sources by finding
anchors in the code: each anchor must still be there exactly once, and the marked
copy must still compile, or the benchmark stops (here it fails first)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

import pytest

from tests.modules import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "hops.py"


@pytest.fixture(scope="module")
def hops() -> ModuleType:
    return load_script(BENCH, "hops_bench")


def test_every_mark_lands_once_and_the_copy_compiles(hops: ModuleType, tmp_path: Path) -> None:
    src = hops.instrumented_copy(tmp_path)
    pkg = src / "asyncbk"
    placed: dict[str, int] = {}
    for rel in {rel for rel, *_ in hops.MARKS}:
        text = (pkg / rel).read_text()
        ast.parse(text)  # still Python
        for _, _, name, _ in hops.MARKS:
            placed[name] = placed.get(name, 0) + text.count(f"_hops_mark({name!r})")
    assert placed == {name: 1 for _, _, name, _ in hops.MARKS}
    # every hop starts and ends at a mark the copy has (or the workload's own)
    names = set(placed) | {"c_resumed", "c_recv2"}
    assert {a for a, _, _ in hops.HOPS} | {b for _, b, _ in hops.HOPS} <= names
    # and every step of a pipelined window (the next window's writes end it)
    steps = {a for a, _, _ in hops.WINDOW_STEPS} | {b for _, b, _ in hops.WINDOW_STEPS}
    assert steps <= set(placed) | {"c_next"}


def test_a_moved_anchor_stops_the_benchmark_with_a_message(
        hops: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hops, "MARKS", [("bookie/journal.py", "no such code", "x", "before")])
    with pytest.raises(SystemExit, match="the anchor for x is not exactly once"):
        hops.instrumented_copy(tmp_path)
