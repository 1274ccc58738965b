"""Loading a script that is not part of a package (a benchmark, a generator, an image's
entry point) as a module, for the tests that call its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str, *, register: bool = False) -> ModuleType:
    """The module in ``path``, executed under ``name`` (``register``: also put in
    ``sys.modules`` first, as dataclasses and pickling need)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
