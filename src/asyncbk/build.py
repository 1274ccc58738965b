"""Which build of asyncbk is running: pure Python (the default), or compiled per-entry
modules.

The modules named in ``_compiled_modules.txt`` are compiled with Cython when the package
is installed with ``ASYNCBK_COMPILE=1`` on a machine with a C compiler (setup.py); their
``.py`` sources are the reference implementation and the fallback.  ``ASYNCBK_PURE=1`` in the environment makes
a process (and the bookies it starts, which inherit it) import the pure-Python sources
even where compiled modules are installed: the property tests and the benchmarks run
both builds that way.  A compiled module older than its source (a source edited in an
editable install and not rebuilt) is not imported either: its source is, with a
warning saying how to rebuild.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

PURE_ENV = "ASYNCBK_PURE"
_LIST = Path(__file__).with_name("_compiled_modules.txt")


@functools.cache
def compiled_module_names() -> tuple[str, ...]:
    """The modules the build compiles when it can, in the order the list gives (read
    once, when ``asyncbk`` is imported)."""
    names = []
    for line in _LIST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return tuple(names)


def pure_requested() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


class SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the ``.py`` source of a listed module, before the import system's own
    finders see its compiled extension beside it, when the pure build is asked for or
    the extension is older than the source."""

    def __init__(self, names: frozenset[str], pure: bool) -> None:
        self.names = names
        self.pure = pure
        self.stale: list[str] = []

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names or not path:
            return None
        leaf = fullname.rpartition(".")[2]
        for entry in path:
            source = os.path.join(entry, leaf + ".py")
            if not os.path.isfile(source):
                continue
            if not self.pure and not self._stale(entry, leaf, source):
                return None  # the extension, found by the path finder as usual
            if not self.pure:
                self.stale.append(fullname)
                warnings.warn(f"{fullname}: the compiled module is older than {source}; "
                              "using the source (rebuild: python -m pip install -e . or "
                              "python setup.py build_ext --inplace)", stacklevel=2)
            return importlib.util.spec_from_file_location(fullname, source)
        return None

    @staticmethod
    def _stale(entry: str, leaf: str, source: str) -> bool:
        mtime = os.stat(source).st_mtime
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            ext = os.path.join(entry, leaf + suffix)
            if os.path.isfile(ext):
                return os.stat(ext).st_mtime < mtime
        return False


def install_finder() -> None:
    """Called by ``asyncbk/__init__`` before any listed module is imported (idempotent):
    with ``ASYNCBK_PURE`` set the listed modules import from source; otherwise only a
    stale compiled module does."""
    if not any(isinstance(f, SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, SourceFinder(frozenset(compiled_module_names()),
                                              pure_requested()))


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
                   else "no compiled modules; ASYNCBK_COMPILE=1 at install compiles them")
            return f"pure Python ({why})"
        if self.pure:
            return (f"partly compiled: {len(self.compiled)} of {total} modules "
                    f"(pure: {', '.join(self.pure)})")
        return f"compiled: {total} of {total} per-entry modules (Cython)"


def build_info(*, loaded_only: bool = False) -> BuildInfo:
    """Where each listed module loads from, without importing any of them (finding
    one not imported yet reads its directory); ``loaded_only``: only the modules this
    process has imported, from memory (what a running bookie or client logs)."""
    compiled: list[str] = []
    pure: list[str] = []
    for name in compiled_module_names():
        module = sys.modules.get(name)
        if module is None and loaded_only:
            continue
        spec = module.__spec__ if module is not None else importlib.util.find_spec(name)
        origin = (spec.origin or "") if spec is not None else ""
        if origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            compiled.append(name)
        else:
            pure.append(name)
    return BuildInfo(tuple(compiled), tuple(pure), pure_requested())


_said = False


def log_build_once(log: Any) -> BuildInfo | None:
    """Say once per process, in the log, which build runs (an info line; a warning when
    only some of the listed modules are compiled, or a compiled module is stale).
    Returns the info the first time."""
    global _said
    if _said:
        return None
    _said = True
    info = build_info(loaded_only=True)  # (no file system access: called on the loop)
    if info.kind == "partly compiled":
        log.warning("asyncbk runs partly compiled", build=info.describe())
    else:
        log.info("asyncbk build", build=info.describe())
    return info
