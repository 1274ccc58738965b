"""The static tier, run as tests: import direction, ruff, mypy."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "asyncbk"

BOTTOM = {"errors", "types", "config", "clock", "log", "stats", "_version"}
# layer -> the asyncbk subpackages/modules it may import
ALLOWED: dict[str, set[str]] = {
    "proto": BOTTOM | {"proto"},
    "meta": BOTTOM | {"meta"},
    "net": BOTTOM | {"net", "proto"},
    "client": BOTTOM | {"client", "net", "proto", "meta"},
    "bookie": BOTTOM | {"bookie", "net", "proto", "meta"},
    "autorecovery": BOTTOM | {"autorecovery", "client", "net", "proto", "meta"},
    "testing": BOTTOM | {"testing", "client", "bookie", "net", "proto", "meta"},
    "cli": BOTTOM | {"cli", "testing", "client", "bookie", "net", "proto", "meta",
                     "autorecovery"},
}
for _m in BOTTOM:
    ALLOWED[_m] = BOTTOM


def _imports(path: Path) -> set[str]:
    """First component under asyncbk of every asyncbk import in ``path``."""
    rel = path.relative_to(PKG).with_suffix("").parts
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel[: len(rel) - node.level])
                target = base + (node.module.split(".") if node.module else [])
                if not target:
                    out.update(alias.name for alias in node.names)
                else:
                    out.add(target[0])
            elif node.module and node.module.startswith("asyncbk."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("asyncbk."):
                    out.add(alias.name.split(".")[1])
    return out


def test_imports_point_down_only() -> None:
    violations = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        layer = rel.parts[0].removesuffix(".py")
        if layer in ("__init__", "__main__"):
            continue
        allowed = ALLOWED.get(layer)
        assert allowed is not None, f"{rel}: layer {layer!r} has no import rule"
        bad = _imports(path) - allowed
        if bad:
            violations.append(f"{rel} imports {sorted(bad)}")
    assert not violations, "\n".join(violations)


def test_proto_is_sans_io() -> None:
    for path in (PKG / "proto").rglob("*.py"):
        text = path.read_text()
        for word in ("import asyncio", "import socket", "open("):
            assert word not in text, f"{path.name} uses {word!r}; proto/ must stay sans-I/O"


def _tool(name: str) -> str:
    exe = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} is not installed; install the test extra: pip install -e '.[test]'")
    return exe


def test_ruff() -> None:
    r = subprocess.run([_tool("ruff"), "check", "src", "tests", "noxfile.py"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy() -> None:
    r = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
