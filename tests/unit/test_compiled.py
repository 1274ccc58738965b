"""The two builds: compiled per-entry modules (Cython) and their pure-Python sources.

The pure sources are the reference: the property tests of every compiled module run
against them too, in a process with ``ASYNCBK_PURE=1`` (the rest of the suite runs the
build that is installed; CI installs the compiled one and sets
``ASYNCBK_EXPECT_COMPILED=1``, so a build that silently fell back to pure Python fails
here rather than passing slowly).
"""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest

import asyncbk
from asyncbk.build import PURE_ENV, build_info, compiled_module_names

ROOT = Path(__file__).resolve().parents[2]

# the property tests (hypothesis) of the compiled modules
PROPERTY_TESTS = [
    "tests/unit/test_framing.py", "tests/unit/test_messages.py", "tests/unit/test_digest.py",
    "tests/unit/test_quorum.py", "tests/unit/test_write_path.py",
    "tests/unit/test_journal_format.py", "tests/unit/test_storage.py",
    "tests/unit/test_storage_index.py", "tests/unit/test_storage_writecache.py",
    "tests/unit/test_fuzz_props.py", "tests/unit/test_pending.py", "tests/unit/test_outbox.py",
    "tests/unit/test_storage_runs.py",
]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (PURE_ENV, "ASYNCBK_EXPECT_COMPILED")}
    env.update(extra)
    return env


def test_every_listed_module_exists_as_source() -> None:
    pkg = Path(asyncbk.__file__).parent
    names = compiled_module_names()
    assert len(names) == len(set(names)) and names
    for name in names:
        parts = name.split(".")
        assert parts[0] == "asyncbk"
        assert pkg.joinpath(*parts[1:]).with_suffix(".py").is_file(), name


def test_the_build_is_what_ci_expects() -> None:
    info = build_info()
    if os.environ.get("ASYNCBK_EXPECT_COMPILED", "") not in ("", "0"):
        assert info.kind == "compiled", info.describe()
    # whichever it is, the description matches where the modules load from
    for name in info.compiled:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        assert spec.origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert set(info.compiled) | set(info.pure) == set(compiled_module_names())


def test_asyncbk_pure_loads_every_module_from_source() -> None:
    code = ("import importlib, asyncbk.build as b\n"
            "for n in b.compiled_module_names():\n"
            "    m = importlib.import_module(n)\n"
            "    assert m.__file__.endswith('.py'), m.__file__\n"
            "print(b.build_info().describe())\n")
    done = subprocess.run([sys.executable, "-c", code], env=_env(**{PURE_ENV: "1"}),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pure Python (ASYNCBK_PURE is set)"


def test_version_says_which_build() -> None:
    installed = subprocess.run(
        [sys.executable, "-c", "from asyncbk.build import build_info as b; "
         "print(b().describe())"], env=_env(), capture_output=True, text=True, timeout=60)
    assert installed.returncode == 0, installed.stderr
    for extra, expect in (({PURE_ENV: "1"}, "pure Python (ASYNCBK_PURE is set)"),
                          ({}, installed.stdout.strip())):
        done = subprocess.run([sys.executable, "-m", "asyncbk", "--version"], env=_env(**extra),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"asyncbk {asyncbk.__version__} ("), done.stdout
        assert expect in done.stdout


def test_property_tests_pass_against_the_pure_sources() -> None:
    """The reference: the same property tests, every listed module from its source."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         "-o", "addopts=", *PROPERTY_TESTS],
        env=_env(**{PURE_ENV: "1"}), cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


def test_a_stale_compiled_module_gives_way_to_its_source(tmp_path: Path) -> None:
    """An edited source in an editable install, not rebuilt: the finder imports the
    source (with a warning), never the older compiled module."""
    import time
    import warnings

    from asyncbk.build import SourceFinder

    source = tmp_path / "mod.py"
    source.write_text("X = 1\n")
    ext = tmp_path / ("mod" + importlib.machinery.EXTENSION_SUFFIXES[0])
    ext.write_bytes(b"")
    now = time.time()
    finder = SourceFinder(frozenset({"pkg.mod"}), pure=False)
    os.utime(ext, (now, now))
    os.utime(source, (now - 60, now - 60))
    assert finder.find_spec("pkg.mod", [str(tmp_path)]) is None  # fresh: the extension
    assert finder.find_spec("pkg.other", [str(tmp_path)]) is None  # not listed
    os.utime(source, (now + 60, now + 60))  # edited after the build
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = finder.find_spec("pkg.mod", [str(tmp_path)])
    assert spec is not None and spec.origin == str(source)
    assert finder.stale == ["pkg.mod"]
    assert any("older than" in str(w.message) and "rebuild" in str(w.message)
               for w in caught)
    pure = SourceFinder(frozenset({"pkg.mod"}), pure=True)
    os.utime(source, (now - 60, now - 60))
    spec = pure.find_spec("pkg.mod", [str(tmp_path)])
    assert spec is not None and spec.origin == str(source)  # ASYNCBK_PURE: always


def test_the_logged_build_reads_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a bookie or client logs at start (on the event loop) comes from memory:
    the modules it imported, the list read when asyncbk was imported."""
    import asyncbk.build as build
    import asyncbk.proto.framing  # noqa: F401  (a listed module, imported)

    def no_finding(*args: object, **kwargs: object) -> None:
        raise AssertionError("find_spec called")

    monkeypatch.setattr(importlib.util, "find_spec", no_finding)
    monkeypatch.setattr(build, "_said", False)
    logged: list[tuple[str, dict[str, object]]] = []

    class Log:
        def info(self, event: str, **kw: object) -> None:
            logged.append((event, kw))

        warning = info

    info = build.log_build_once(Log())
    assert info is not None and "asyncbk.proto.framing" in info.compiled + info.pure
    assert logged and logged[0][0].startswith("asyncbk")
    assert build.log_build_once(Log()) is None and len(logged) == 1  # once per process
