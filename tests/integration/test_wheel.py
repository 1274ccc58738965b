"""The distribution: an sdist and a wheel built by the standard front end (``python -m
build``, isolated), the wheel installed with the ``standalone`` extra into a fresh
virtualenv (nothing from this checkout on its path), and that install run: ``asyncbk
--version``, then ``asyncbk standalone`` with a client script using the public API
and ``asyncbk shell simpletest``, all from the fresh environment.

Needs pip to reach the package index (the isolated build installs setuptools, the
venv installs asyncbk's dependencies; pip's cache makes repeat runs quick)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncbk._version import __version__
from asyncbk.testing.cluster import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 300
INSTALL_TIMEOUT_S = 400
READY_TIMEOUT_S = 90
STOP_TIMEOUT_S = 30

CLIENT_SCRIPT = '''\
import asyncio, sys
import asyncbk

async def main(uri: str) -> None:
    async with await asyncbk.BookKeeper.connect(uri) as bk:
        lh = await bk.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1,
                                    password=b"pw")
        futures = [lh.append(b"wheel %d" % i) for i in range(5)]
        assert [await f for f in futures] == list(range(5))
        await lh.close()
        rh = await bk.open_ledger(lh.id, password=b"pw")
        data = [e.data for e in await rh.read(0, rh.last_add_confirmed)]
        assert data == [b"wheel %d" % i for i in range(5)], data
        print("read back", len(data), "entries from", asyncbk.__file__)

asyncio.run(main(sys.argv[1]))
'''


def _clean_env(venv: Path | None = None) -> dict[str, str]:
    """The environment of a child: nothing of this checkout or this venv on its paths."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "MYPYPATH")}
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    return env


def _run(cmd: list[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def _source_copy(dest: Path) -> Path:
    """The files a checkout holds (tracked, or new and not ignored) copied to ``dest``,
    so the build neither sees local leftovers (caches, venvs, data) nor writes into the
    working tree."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the source files cannot be told from leftovers")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True,
                            timeout=60, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src = REPO / name
        if src.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel): the sdist built from the sources, the wheel built from the sdist
    (``python -m build`` without --sdist/--wheel does exactly that), so a file missing
    from the sdist is missing from the wheel too.  Built with ``ASYNCBK_COMPILE=1`` as
    on a machine without a C compiler (``CC`` names none): the compiled build falls back
    to the pure-Python wheel, the default build, which must work everywhere (CI's own
    install is the compiled build, checked by tests/unit/test_compiled.py)."""
    pytest.importorskip("build")
    root = tmp_path_factory.mktemp("dist")
    src = _source_copy(root / "src")
    out = root / "out"
    t0 = time.monotonic()
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(src)], BUILD_TIMEOUT_S,
         env={**_clean_env(), "ASYNCBK_COMPILE": "1", "CC": "asyncbk-test-no-such-compiler"})
    sys.stderr.write(f"build: {time.monotonic() - t0:.1f}s\n")
    sdists = list(out.glob("asyncbk-*.tar.gz"))
    wheels = list(out.glob("asyncbk-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, list(out.iterdir())
    return sdists[0], wheels[0]


def test_the_wheel_holds_the_package_and_its_marker(dists: tuple[Path, Path]) -> None:
    _, wheel = dists
    assert wheel.name == f"asyncbk-{__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert "asyncbk/py.typed" in names
    assert "asyncbk/__init__.py" in names and "asyncbk/cli/main.py" in names
    assert "asyncbk/bookie/journal_format.py" in names
    assert "asyncbk/_compiled_modules.txt" in names
    assert not [n for n in names if n.endswith((".so", ".c"))], names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "docs/"))], names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    meta = zipfile.ZipFile(wheel).read(f"asyncbk-{__version__}.dist-info/METADATA").decode()
    for extra in ("standalone", "lmdb", "spark", "otel"):
        assert f"Provides-Extra: {extra}" in meta
    entry = zipfile.ZipFile(wheel).read(
        f"asyncbk-{__version__}.dist-info/entry_points.txt").decode()
    assert "asyncbk = asyncbk.cli.main:main" in entry


def test_the_sdist_holds_what_a_build_needs(dists: tuple[Path, Path]) -> None:
    sdist, _ = dists
    top = f"asyncbk-{__version__}/"
    with tarfile.open(sdist) as tar:
        names = {n.removeprefix(top) for n in tar.getnames()}
    for needed in ("pyproject.toml", "setup.py", "README.md", "PKG-INFO",
                   "src/asyncbk/__init__.py", "src/asyncbk/py.typed",
                   "src/asyncbk/_compiled_modules.txt", "src/asyncbk/cli/shell.py"):
        assert needed in names, f"{needed} missing from the sdist"
    assert not [n for n in names if "__pycache__" in n or ".venv" in n or "/.git/" in n]


@pytest.fixture(scope="module")
def venv(dists: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel and its ``standalone`` extra installed."""
    _, wheel = dists
    path = tmp_path_factory.mktemp("venv") / "venv"
    t0 = time.monotonic()
    _run([sys.executable, "-m", "venv", str(path)], 120, env=_clean_env())
    _run([str(path / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
          "--quiet", f"{wheel}[standalone]"], INSTALL_TIMEOUT_S, env=_clean_env(path))
    sys.stderr.write(f"venv and install: {time.monotonic() - t0:.1f}s\n")
    return path


def test_the_installed_command_runs(venv: Path, tmp_path: Path) -> None:
    done = _run([str(venv / "bin" / "asyncbk"), "--version"], 60, cwd=tmp_path,
                env=_clean_env(venv))
    assert done.stdout.strip() == (f"asyncbk {__version__} (pure Python (no compiled modules; "
                                   "ASYNCBK_COMPILE=1 at install compiles them))")
    where = _run([str(venv / "bin" / "python"), "-c",
                  "import asyncbk, sys; print(asyncbk.__file__); print(sys.prefix)"], 60,
                 cwd=tmp_path, env=_clean_env(venv)).stdout.split()
    assert Path(where[0]).resolve().is_relative_to(venv.resolve()), where
    assert Path(where[0]).with_name("py.typed").is_file()


@pytest.fixture
def standalone(venv: Path, tmp_path: Path) -> Iterator[str]:
    """``asyncbk standalone`` of the fresh venv (one bookie, free ports), until its ready
    line; its metadata URI.  Stopped with SIGTERM, SIGKILL after a bound."""
    log = (tmp_path / "standalone.out").open("w+")
    proc = subprocess.Popen(
        [str(venv / "bin" / "asyncbk"), "standalone", "--bookies", "1", "--data-dir",
         str(tmp_path / "data"), "--etcd-port", str(free_port())],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, env=_clean_env(venv),
        text=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        uri = ""
        while True:
            log.seek(0)
            text = log.read()
            for line in text.splitlines():
                if line.startswith("metadata URI:"):
                    uri = line.split(":", 1)[1].strip()
            if uri and "ready; press Ctrl-C" in text:
                break
            assert proc.poll() is None, f"standalone exited ({proc.returncode}):\n{text}"
            assert time.monotonic() < deadline, f"standalone not ready:\n{text}"
            time.sleep(0.2)
        yield uri
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()  # its etcd and bookies die with it (PR_SET_PDEATHSIG)
                proc.wait()
        log.seek(0)
        text = log.read()
        log.close()
    assert proc.returncode == 0, f"standalone did not stop cleanly on SIGTERM:\n{text}"


def test_a_standalone_cluster_from_the_wheel(venv: Path, standalone: str,
                                             tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(CLIENT_SCRIPT)
    env = _clean_env(venv)
    done = _run([str(venv / "bin" / "python"), str(script), standalone], 120,
                cwd=tmp_path, env=env)
    assert "read back 5 entries from" in done.stdout, done.stdout
    assert str(venv.resolve()) in done.stdout or str(venv) in done.stdout, done.stdout
    done = _run([str(venv / "bin" / "asyncbk"), "shell", "simpletest", "--metadata-uri",
                 standalone, "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1",
                 "--entries", "20"], 120, cwd=tmp_path, env=env)
    assert "wrote and read back 20 entries" in done.stdout and "OK" in done.stdout
