"""``index_backend = "lmdb"`` without the ``lmdb`` package: one clear line naming the
extra, from the configuration, the storage and the ``asyncbk bookie`` command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from asyncbk.bookie.storage import LedgerStorage
from asyncbk.cli.common import EXIT_ERROR
from asyncbk.cli.main import main
from asyncbk.config import BookieConfig
from asyncbk.errors import ConfigError

HINT = "pip install 'asyncbk[lmdb]'"


@pytest.fixture
def no_lmdb(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import lmdb`` fails as where the package is not installed."""
    monkeypatch.setitem(sys.modules, "lmdb", None)
    with pytest.raises(ImportError):
        import lmdb  # noqa: F401


def test_the_config_names_the_extra(no_lmdb: None) -> None:
    with pytest.raises(ConfigError) as err:
        BookieConfig(index_backend="lmdb").validate()
    message = str(err.value)
    assert HINT in message and "lmdb" in message and "\n" not in message
    assert err.value.__cause__ is None and err.value.__suppress_context__
    BookieConfig().validate()  # the memory backend needs nothing more


async def test_the_storage_refuses_before_any_work(no_lmdb: None, tmp_path: Path) -> None:
    """A config built without validate() still gets the same error, before any file is
    made."""
    with pytest.raises(ConfigError, match=r"asyncbk\[lmdb\]"):
        await LedgerStorage.open(tmp_path / "j", tmp_path / "l",
                                 BookieConfig(index_backend="lmdb"))
    assert not (tmp_path / "j").exists() and not (tmp_path / "l").exists()


def test_the_bookie_command_prints_one_line(no_lmdb: None, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bookie.toml"
    config.write_text('index_backend = "lmdb"\n')
    with pytest.raises(SystemExit) as exited:
        main(["bookie", "--config", str(config), "--metadata-uri", "etcd://127.0.0.1:1",
              "--port", "3181", "--journal-dir", str(tmp_path / "j"),
              "--ledger-dir", str(tmp_path / "l")])
    assert exited.value.code == EXIT_ERROR
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith("asyncbk bookie: error:") and HINT in lines[0]
    assert "Traceback" not in out.err and out.out == ""
    assert not (tmp_path / "j").exists()
