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

BOTTOM = {"errors", "types", "config", "clock", "log", "stats", "_version", "topology", "build",
          "backoff", "tracing"}
# layer -> the asyncbk subpackages/modules it may import
ALLOWED: dict[str, set[str]] = {
    "proto": BOTTOM | {"proto"},
    "meta": BOTTOM | {"meta"},
    "net": BOTTOM | {"net", "proto"},
    "tiered": BOTTOM | {"tiered"},
    "client": BOTTOM | {"client", "net", "proto", "meta", "tiered"},
    "bookie": BOTTOM | {"bookie", "net", "proto", "meta"},
    "autorecovery": BOTTOM | {"autorecovery", "client", "net", "proto", "meta"},
    # streams and namespaces, on the ledger client
    "stream": BOTTOM | {"stream", "client", "net", "proto", "meta", "tiered"},
    # the local-cluster runner that ships to users (asyncbk standalone, asyncbk bench)
    "local": BOTTOM | {"local", "stream", "client", "bookie", "net", "proto", "meta",
                       "tiered"},
    # the simulator runs auto-recovery workers beside its bookies
    "testing": BOTTOM | {"testing", "local", "stream", "client", "bookie", "net", "proto",
                         "meta", "autorecovery", "tiered", "offload"},
    "spark": BOTTOM | {"spark", "stream", "client", "net", "proto", "meta", "tiered"},
    "offload": BOTTOM | {"offload", "tiered", "stream", "client", "net", "proto", "meta",
                         "autorecovery"},
    # cli runs clusters through local/, never through the test harnesses
    "cli": BOTTOM | {"cli", "local", "stream", "client", "bookie", "net", "proto", "meta",
                     "autorecovery", "tiered", "offload"},
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


SANS_IO_FORBIDDEN_MODULES = frozenset({
    "asyncio", "socket", "selectors", "select", "ssl", "uvloop", "aiohttp", "aiofiles",
    "subprocess", "threading", "multiprocessing", "concurrent", "os", "shutil",
    "tempfile", "pathlib", "signal", "mmap", "time",
})
"""Modules that do I/O (or wait on it); proto/ imports none of them."""


def sans_io_violations(source: str, filename: str = "<source>") -> list[str]:
    """Where ``source`` imports an I/O module (at any depth: in functions too, and
    ``from x import y`` / ``import x.y`` forms) or calls the builtin ``open``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [node.module]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "open":
            found.append(f"{filename}:{node.lineno} calls open()")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "__import__":
            found.append(f"{filename}:{node.lineno} calls __import__()")
        for module in modules:
            if module.split(".")[0] in SANS_IO_FORBIDDEN_MODULES:
                found.append(f"{filename}:{node.lineno} imports {module}")
    return found


def test_proto_is_sans_io() -> None:
    violations = []
    for path in sorted((PKG / "proto").rglob("*.py")):
        violations += sans_io_violations(path.read_text(), str(path.relative_to(ROOT)))
    assert not violations, "proto/ must stay sans-I/O:\n" + "\n".join(violations)


@pytest.mark.parametrize("source", [
    "def f():\n    import asyncio\n    return asyncio.sleep(0)\n",
    "from socket import socket\n",
    "import selectors as s\n",
    "import uvloop, struct\n",
    "from asyncio.streams import open_connection\n",
    "class C:\n    def load(self, p):\n        with open(p) as f:\n            return f.read()\n",
])
def test_sans_io_check_catches(source: str) -> None:
    """The checker itself fails on what it must forbid (else the test above proves
    nothing), however the import is written."""
    assert sans_io_violations(source)


def test_sans_io_check_allows_pure_code() -> None:
    assert not sans_io_violations("import struct\nfrom dataclasses import dataclass\n"
                                  "import msgpack\nx = 'open(' + 'import asyncio'\n")


def _tool(name: str) -> str:
    exe = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} is not installed; install the test extra: pip install -e '.[test]'")
    return exe


def test_ruff() -> None:
    r = subprocess.run([_tool("ruff"), "check", "src", "tests", "benchmarks", "noxfile.py"],
                       cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy() -> None:
    r = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def _module_name(path: Path, root: Path = PKG) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(n) for n in ast.walk(node))
    return inside


def import_graph(root: Path = PKG) -> dict[str, set[str]]:
    """Module -> the asyncbk modules it imports, at module level or inside functions
    (a lazy import is still a dependency); ``if TYPE_CHECKING:`` imports are left out.
    ``from pkg import name`` counts as importing ``pkg`` and, where ``name`` is a
    submodule, that submodule."""
    paths = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in paths.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                deps.update(c for c in [target, *(f"{target}.{a.name}" for a in node.names)]
                            if c in paths)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in paths)
        deps.discard(mod)
        graph[mod] = deps
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_in_any_package() -> None:
    """Within and across packages, no module imports (even lazily) a module that
    imports it back: each package reads bottom-up."""
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_cycle_check_catches_a_cycle(tmp_path: Path) -> None:
    """The checker itself finds a cycle made through a package's __init__ and a lazy
    import (else the test above proves nothing), and ignores TYPE_CHECKING imports."""
    pkg = tmp_path / "asyncbk" / "p"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import A\n")
    (pkg / "a.py").write_text("class A:\n    def f(self):\n        from . import b\n")
    (pkg / "b.py").write_text("from asyncbk.p import A\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from .d import D\n")
    (pkg / "d.py").write_text("from .c import *\n")
    cycles = import_cycles(import_graph(tmp_path / "asyncbk"))
    assert cycles == [["asyncbk.p", "asyncbk.p.a", "asyncbk.p.b"]]


def private_imports(root: Path = PKG) -> list[str]:
    """``from asyncbk.x import _name``: one module taking another's private name."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "")
                                                     .startswith("asyncbk")):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(root.parent)}:{node.lineno} imports "
                                     f"{node.module}.{alias.name}")
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    """A private name another module needs is that module's public API, or it sits in
    the wrong module."""
    found = private_imports()
    assert not found, "\n".join(found)
