"""Which build of asyncbk is running: compiled per-entry modules, or pure Python.

The modules named in ``_compiled_modules.txt`` are compiled with Cython when the package
is installed on a machine with a C compiler (setup.py); their ``.py`` sources are the
reference implementation and the fallback.  ``ASYNCBK_PURE=1`` in the environment makes
a process (and the bookies it starts, which inherit it) import the pure-Python sources
even where compiled modules are installed: the property tests and the benchmarks run
both builds that way.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

PURE_ENV = "ASYNCBK_PURE"
_LIST = Path(__file__).with_name("_compiled_modules.txt")


def compiled_module_names() -> tuple[str, ...]:
    """The modules the build compiles when it can, in the order the list gives."""
    names = []
    for line in _LIST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return tuple(names)


def pure_requested() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the ``.py`` source of each listed module before the import system's own
    finders see its compiled extension beside it."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names or not path:
            return None
        leaf = fullname.rpartition(".")[2]
        for entry in path:
            candidate = os.path.join(entry, leaf + ".py")
            if os.path.isfile(candidate):
                return importlib.util.spec_from_file_location(fullname, candidate)
        return None


def install_pure_finder() -> None:
    """Make the listed modules import from source (idempotent).  Called by
    ``asyncbk/__init__`` when ``ASYNCBK_PURE`` is set, before any of them is imported."""
    if not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder(frozenset(compiled_module_names())))


@dataclass(frozen=True, slots=True)
class BuildInfo:
    compiled: tuple[str, ...]  # listed modules that load from a compiled extension
    pure: tuple[str, ...]      # listed modules that load from their .py source
    forced_pure: bool          # ASYNCBK_PURE is set

    @property
    def kind(self) -> str:
        if not self.compiled:
            return "pure"
        return "compiled" if not self.pure else "partly compiled"

    def describe(self) -> str:
        total = len(self.compiled) + len(self.pure)
        if not self.compiled:
            why = (f"{PURE_ENV} is set" if self.forced_pure
                   else "no compiled modules: installed without Cython or a C compiler")
            return f"pure Python ({why})"
        if self.pure:
            return (f"partly compiled: {len(self.compiled)} of {total} modules "
                    f"(pure: {', '.join(self.pure)})")
        return f"compiled: {total} of {total} per-entry modules (Cython)"


def build_info() -> BuildInfo:
    """Where each listed module loads from, without importing any of them."""
    compiled: list[str] = []
    pure: list[str] = []
    for name in compiled_module_names():
        spec = importlib.util.find_spec(name)
        origin = (spec.origin or "") if spec is not None else ""
        if origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            compiled.append(name)
        else:
            pure.append(name)
    return BuildInfo(tuple(compiled), tuple(pure), pure_requested())


_said = False


def log_build_once(log: Any) -> BuildInfo | None:
    """Say once per process, in the log, when a bookie or client runs without its
    compiled modules (a warning: it works, slower).  Returns the info the first time."""
    global _said
    if _said:
        return None
    _said = True
    info = build_info()
    if info.kind != "compiled":
        log.warning("asyncbk runs without its compiled modules", build=info.describe())
    return info
