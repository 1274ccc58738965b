"""The storage package's modules use each other only through public names: a private
name (``_x``) imported from a sibling module means the boundary between them is wrong."""

from __future__ import annotations

import ast
from pathlib import Path

STORAGE = Path(__file__).resolve().parents[2] / "src" / "asyncbk" / "bookie" / "storage"


def private_imports(source: str) -> list[str]:
    """``from .x import _y`` and ``from ..x import _y`` (in functions too) in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            found += [f"line {node.lineno}: from {'.' * node.level}{node.module or ''} "
                      f"import {alias.name}"
                      for alias in node.names if alias.name.startswith("_")]
    return found


def test_no_private_name_crosses_a_storage_module() -> None:
    violations = [f"{path.name}: {hit}" for path in sorted(STORAGE.glob("*.py"))
                  for hit in private_imports(path.read_text())]
    assert not violations, "\n".join(violations)


def test_the_check_catches_a_private_import() -> None:
    assert private_imports("def f():\n    from .entrylog import _Writer\n")
    assert not private_imports("from .entrylog import EntryLogWriter\nimport _thread\n")
