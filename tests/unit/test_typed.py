"""The installed package is typed (PEP 561): mypy, run on a user's code from outside
the repository, reads asyncbk's own annotations through its ``py.typed`` marker,
rather than skipping it as untyped (every asyncbk name then ``Any``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import asyncbk

pytest.importorskip("mypy")

SNIPPET = '''\
import asyncbk
from asyncbk import BookKeeper, LedgerEntry, Position
from asyncbk.errors import BKError, LedgerFencedError


async def use(bk: BookKeeper) -> None:
    lh = await bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    reveal_type(lh)
    fut = lh.append(b"payload")
    entry_id = await fut
    reveal_type(entry_id)
    rh = await bk.open_ledger(lh.id, password=b"", recovery=False)
    entries = await rh.read(0, rh.last_add_confirmed)
    reveal_type(entries)
    first: LedgerEntry = entries[0]
    reveal_type(Position.parse("1:0:0"))
    lh.append("not bytes")  # the deliberate error: append takes bytes
    err: BKError = LedgerFencedError("x")
    name: str = first.entry_id  # the deliberate error 2: an entry id is an int
    print(first, err, name, asyncbk.__version__)
'''


def _mypy(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "user_code.py").write_text(SNIPPET)
    (tmp_path / "mypy.ini").write_text("[mypy]\n")  # no project settings (mypy_path = src)
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--no-incremental",
         "--cache-dir", os.devnull, "--python-executable", sys.executable, "user_code.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


def test_the_installed_package_is_where_mypy_looks(tmp_path: Path) -> None:
    """The check below is about the installed package: asyncbk is imported from an
    installed location (a wheel, or the editable install's path entry), and the run
    happens outside the source tree."""
    package = Path(asyncbk.__file__).parent
    assert (package / "py.typed").is_file(), "no py.typed marker next to asyncbk/__init__.py"
    assert not tmp_path.resolve().is_relative_to(package.parent.parent.resolve())


def test_mypy_sees_asyncbks_types(tmp_path: Path) -> None:
    done = _mypy(tmp_path)
    out = done.stdout + done.stderr
    assert "missing library stubs or py.typed marker" not in out, out
    assert "import-untyped" not in out and "import-not-found" not in out, out
    # reveal_type shows asyncbk's own classes, not Any
    assert 'Revealed type is "asyncbk.client.ledger.LedgerHandle"' in out, out
    assert 'Revealed type is "builtins.int"' in out or 'Revealed type is "int"' in out, out
    assert "list[asyncbk.types.LedgerEntry]" in out, out
    assert 'Revealed type is "asyncbk.stream.position.Position"' in out, out
    # the deliberate errors are reported against asyncbk's signatures
    assert 'Argument 1 to "append" of "LedgerHandle" has incompatible type "str"; ' \
        'expected "bytes"' in out, out
    assert 'Incompatible types in assignment (expression has type "int", variable has ' \
        'type "str")' in out, out
    assert done.returncode == 1, out
    assert "Found 2 errors in 1 file" in out, out
