"""The shape of the stream layer and the Spark package, checked on their source:
no import cycle inside either package, no private name of another module used,
and the parts below the namespace (writer, reader, adoption, retention, the
segment ledger's life, Spark's planner) depend on the StreamContext, never on
the Namespace or on each other's insides."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "src" / "asyncbk"


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def import_graph(root: Path, submodules: bool) -> dict[str, set[str]]:
    """Module -> the modules of ``root`` it imports, at module or function level (not
    under ``if TYPE_CHECKING:``).  ``from . import x``: an import of the package's
    ``__init__``, or with ``submodules`` of the submodule ``x`` where there is one."""
    paths = {_module_name(root, p): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out: set[str] = set()

        def visit(node: ast.AST, package: str = package, out: set[str] = out) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _type_checking(child):
                    for stmt in child.orelse:
                        visit(stmt)
                    continue
                if isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = package.split(".")
                        base = base[:len(base) - (child.level - 1)]
                        target = ".".join(base + ([child.module] if child.module else []))
                    else:
                        target = child.module or ""
                    for alias in child.names:
                        sub = f"{target}.{alias.name}"
                        out.add(sub if submodules and sub in paths else target)
                elif isinstance(child, ast.Import):
                    out.update(alias.name for alias in child.names)
                visit(child)

        visit(ast.parse(path.read_text(), str(path)))
        graph[name] = {m for m in out if m in paths and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def private_uses(root: Path) -> list[str]:
    """``from m import _x`` and ``obj._x`` for any ``obj`` but ``self`` and ``cls``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                found += [f"{path.name}:{node.lineno}: from {node.module} import {a.name}"
                          for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                    and not node.attr.startswith("__") \
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("package", ["stream", "spark"])
@pytest.mark.parametrize("submodules", [False, True])
def test_no_import_cycle(package: str, submodules: bool) -> None:
    assert cycles(import_graph(PKG / package, submodules)) == []


@pytest.mark.parametrize("package", ["stream", "spark"])
def test_no_private_name_of_another_module(package: str) -> None:
    assert private_uses(PKG / package) == []


STREAM_ORDER = ["__init__", "metrics", "client", "namespace", "writer", "adopt", "retention",
                "subscription", "reader", "cursor", "segment_ledger", "context", "cas", "meta",
                "codec",
                "position", "stats"]
"""The modules of ``asyncbk.stream``, each importing only modules after it (the
order docs/streams.md gives)."""


def test_the_stream_modules_import_in_one_direction() -> None:
    graph = import_graph(PKG / "stream", submodules=True)
    names = {m.removeprefix("stream").lstrip(".") or "__init__": m for m in graph}
    assert sorted(names) == sorted(STREAM_ORDER), "place a new module in STREAM_ORDER"
    short = {full: name for name, full in names.items()}
    wrong = [f"{mod} imports {dep}" for mod in STREAM_ORDER
             for dep in sorted(short[d] for d in graph[names[mod]])
             if STREAM_ORDER.index(dep) <= STREAM_ORDER.index(mod)]
    assert wrong == []


@functools.cache
def _whole_package() -> dict[str, set[str]]:
    return import_graph(PKG, submodules=True)


@pytest.mark.parametrize("module", ["stream/writer.py", "stream/reader.py", "stream/adopt.py",
                                    "stream/retention.py", "stream/segment_ledger.py",
                                    "stream/context.py", "spark/plan.py",
                                    "spark/source.py"])
def test_the_parts_below_the_namespace_take_the_context(module: str) -> None:
    graph = _whole_package()
    name = "asyncbk." + module.removesuffix(".py").replace("/", ".")
    deps = graph[name]
    assert "asyncbk.stream.namespace" not in deps and "asyncbk.stream.client" not in deps
    assert "asyncbk.stream" not in deps, "the package's __init__ imports everything"
    if module in ("stream/reader.py", "stream/adopt.py", "stream/retention.py"):
        assert "asyncbk.stream.writer" not in deps
    source = (PKG / module).read_text()
    assert "Namespace" not in source.replace("~asyncbk.stream.namespace.Namespace", "")


# --------------------------------------------------------------------------- the checkers


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_cycle_check_finds_cycles_however_imported(tmp_path: Path) -> None:
    """Else the tests above prove nothing: a lazy import in a function counts, one under
    TYPE_CHECKING does not, and ``from . import x`` counts as an import of the
    package in the strict reading."""
    root = _tree(tmp_path, {
        "__init__.py": "from .a import A\n",
        "a.py": "from . import c\nA = 1\ndef f():\n    from .b import B\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n"
                "def g():\n    from .a import A\n",
        "c.py": "X = 1\n",
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import X\n",
    })
    assert cycles(import_graph(root, submodules=True)) == [["pkg.a", "pkg.b"]]
    assert cycles(import_graph(root, submodules=False)) == [["pkg", "pkg.a", "pkg.b"]]
    assert import_graph(root, submodules=True)["pkg.d"] == set()


def test_the_private_name_check_finds_them(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "a.py": "from .b import _helper\n",
        "c.py": "def f(w):\n    return w._take_sm(1)\n",
        "d.py": "class D:\n    def f(self):\n        return self._x, self.__class__\n",
    })
    assert private_uses(root) == ["a.py:1: from b import _helper", "c.py:2: w._take_sm"]
