"""``--check-config`` of ``asyncbk bookie``, ``autorecovery`` and ``offload``: the
settings checked as a start checks them (options, the settings file, the environment,
and with mode ``files`` every file they name), nothing contacted; one OK line and exit
0, or one ``configuration refused`` line and exit 2; never a secret in either."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from asyncbk.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "docker" / "entrypoint.py"
UNREACHABLE = "etcds://127.0.0.1:1/asyncbk"
"""Nothing listens there: a check that tried to connect would fail or hang."""
TOKEN = "tok-3c1d9e0b7f2a4e6b8d5c"
PASSWORD = "pw-8f7e6d5c4b3a2918"
AWS_SECRET = "aws-secret-0a9b8c7d6e5f"
SECRETS = (TOKEN, PASSWORD, AWS_SECRET)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("ASYNCBK_", "AWS_")):
            monkeypatch.delenv(name)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """TLS material of one CA, a tokens file, etcd's password file, a rack file."""
    ca = trustme.CA()
    leaf = ca.issue_cert("bookie-0.bookies.test", "client.test")
    other = trustme.CA().issue_cert("bookie-0.bookies.test")
    out = {}
    for name, blob in (("cert", leaf.cert_chain_pems[0]), ("key", leaf.private_key_pem),
                       ("ca", ca.cert_pem), ("other_key", other.private_key_pem)):
        path = tmp_path / f"{name}.pem"
        blob.write_to_path(str(path))
        out[name] = str(path)
    for name, text in (("tokens", f"# bookie tokens\n{TOKEN}\n"), ("password", PASSWORD + "\n"),
                       ("empty", "# nothing\n"),
                       ("racks", "bookie-0.bookies.test /r1/z1\n"),
                       ("bad_racks", "bookie-0.bookies.test no-slash\n")):
        (tmp_path / name).write_text(text)
        out[name] = str(tmp_path / name)
    creds = tmp_path / "credentials"
    creds.write_text(f"AWS_ACCESS_KEY_ID=AKIDEXAMPLE\nAWS_SECRET_ACCESS_KEY={AWS_SECRET}\n")
    creds.chmod(0o600)
    out["credentials"] = str(creds)
    shared = tmp_path / "credentials-shared"
    shared.write_text(creds.read_text())
    shared.chmod(0o640)
    out["shared_credentials"] = str(shared)
    out["dir"] = str(tmp_path)
    return out


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    out, err = capsys.readouterr()
    for secret in SECRETS:
        assert secret not in out + err, (out, err)
    code = exit_.value.code
    assert isinstance(code, int)
    return code, out, err


def ok(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    (line,) = out.strip().splitlines()
    assert line.startswith(f"asyncbk {argv[0]}: configuration OK: "), line
    return line


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    (line,) = err.strip().splitlines()
    assert "Traceback" not in err and not out, (out, err)
    return line


def bookie(f: dict[str, str], *extra: str) -> list[str]:
    return ["bookie", "--metadata-uri", UNREACHABLE, "--port", "3181",
            "--host", "0.0.0.0", "--advertised-host", "bookie-0.bookies.test",
            "--journal-dir", f"{f['dir']}/j", "--ledger-dir", f"{f['dir']}/l", *extra]


def tls(f: dict[str, str]) -> list[str]:
    return ["--tls-cert", f["cert"], "--tls-key", f["key"], "--tls-ca", f["ca"]]


# ------------------------------------------------------------------ bookie


def test_a_full_bookie_passes_reading_every_file(capsys: pytest.CaptureFixture[str],
                                                 files: dict[str, str]) -> None:
    line = ok(capsys, *bookie(files, *tls(files), "--tls-require-client-cert",
                              "--auth-tokens-file", files["tokens"], "--etcd-user", "asyncbk",
                              "--etcd-password-file", files["password"], "--rack", "/r1/z1",
                              "--autorecovery", "--http-port", "8000", "--check-config"))
    assert ("bookie id bookie-0.bookies.test:3181, rack /r1/z1, metadata " + UNREACHABLE) in line
    assert "TLS mutual, tokens on, etcd TLS, etcd user, autorecovery on" in line
    assert line.endswith("named files read, directories checked")
    assert not Path(files["dir"], "j").exists(), "a check creates nothing"


def test_the_settings_file_and_the_options_are_read_as_a_start_reads_them(
        capsys: pytest.CaptureFixture[str], files: dict[str, str], tmp_path: Path) -> None:
    conf = tmp_path / "bookie.toml"
    conf.write_text('[bookie]\nhost = "0.0.0.0"\nport = 3181\njournal_dir = "/data/j"\n'
                    'ledger_dir = "/data/l"\nadvertised_host = "from-file"\n')
    line = ok(capsys, "bookie", "--config", str(conf), "--metadata-uri", UNREACHABLE,
              "--advertised-host", "from-option", "--check-config", "paths")
    assert "bookie id from-option:3181" in line
    conf.write_text('[bookie]\nport = 0\njournal_dir = "j"\nledger_dir = "l"\n')
    assert "--port is required" in refused(capsys, "bookie", "--config", str(conf),
                                       "--metadata-uri", UNREACHABLE, "--check-config")
    conf.write_text('[bookie]\nport = 3181\njournal_dir = "j"\nledger_dir = "l"\njournal_sinc = false\n')
    assert "unknown setting 'journal_sinc'" in refused(
        capsys, "bookie", "--config", str(conf), "--metadata-uri", UNREACHABLE,
        "--check-config")


@pytest.mark.parametrize(("extra", "why"), [
    (["--advertised-host", ""], "the bookie id would be 0.0.0.0:3181"),
    (["--rack", "zone-a"], "rack"),
    (["--tls-cert", "CERT"], "TLS needs both tls_cert_file and tls_key_file"),
    (["--tls-require-client-cert"], "tls_require_client_cert needs TLS"),
    (["--auth-tokens-file", "EMPTY"], "holds no token"),
    (["--tls-cert", "CERT", "--tls-key", "OTHER_KEY"], "TLS material unusable"),
    (["--tls-cert", "MISSING", "--tls-key", "KEY"], "no such file"),
    (["--etcd-user", "asyncbk"], "needs a password"),
    (["--etcd-password-file", "PASSWORD"], "etcd_password_file needs etcd_user"),
    (["--journal-dir", "TOKENS"], "exists and is not a directory"),
    (["--bookie-racks-file", "RACKS"], "give --autorecovery too"),
    (["--autorecovery", "--bookie-racks-file", "BAD_RACKS"], "bad_racks:1"),
    (["--autorecovery", "--rate", "-1"], "must be >= 0"),
    (["--offload-object-store", "s3://segments/p?endpoint=https://s3.test"],
     "no object store credentials"),
])
def test_a_bad_bookie_setting_is_refused_with_exit_2(capsys: pytest.CaptureFixture[str],
                                                     files: dict[str, str], extra: list[str],
                                                     why: str) -> None:
    extra = [files.get(a.lower(), a) for a in extra]
    extra = [str(Path(files["dir"]) / "missing.pem") if a == "MISSING" else a for a in extra]
    argv = bookie(files)
    if extra[0] == "--journal-dir":  # in place of the journal directory, not beside it
        argv[argv.index("--journal-dir") + 1] = extra[1]
        extra = []
    line = refused(capsys, *argv, *extra, "--check-config")
    assert why in line, line
    if "must be >= 0" not in why:  # argparse's own usage errors say "error: argument"
        assert line.startswith("asyncbk bookie: error: configuration refused ("), line


def test_without_a_bookie_id_or_metadata_the_check_fails(
        capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "bookie", "--port", "3181", "--check-config")
    assert "--metadata-uri is required" in line and "(CliError)" in line
    line = refused(capsys, "bookie", "--metadata-uri", "https://etcd:2379/x", "--port", "3181",
                   "--journal-dir", "j", "--ledger-dir", "l", "--check-config")
    assert "invalid metadata URI" in line and "(ConfigError)" in line


def test_paths_mode_reads_no_file_but_keeps_every_other_rule(
        capsys: pytest.CaptureFixture[str], files: dict[str, str]) -> None:
    absent = ["--tls-cert", "/run/tls/tls.crt", "--tls-key", "/run/tls/tls.key",
              "--tls-ca", "/run/tls/ca.crt", "--tls-require-client-cert",
              "--auth-tokens-file", "/run/tokens/tokens", "--etcd-user", "asyncbk",
              "--etcd-password-file", "/run/etcd/password"]
    line = ok(capsys, *bookie(files, *absent, "--check-config", "paths"))
    assert line.endswith("files checked as paths only, not read: journal_dir, ledger_dir, "
                         "tls_cert_file, tls_key_file, tls_ca_file, auth_tokens_file, "
                         "etcd_password_file"), line
    assert "no such file" in refused(capsys, *bookie(files, *absent, "--check-config"))
    without_key = [a for a in absent if a not in ("--tls-key", "/run/tls/tls.key")]
    assert "tls_key_file" in refused(capsys, *bookie(files, *without_key, "--check-config",
                                                     "paths"))
    plain = bookie(files, "--etcd-ca", "/run/etcd/ca.crt", "--check-config", "paths")
    plain[plain.index(UNREACHABLE)] = "etcd://127.0.0.1:1/asyncbk"
    assert "plain etcd://" in refused(capsys, *plain)


def test_the_password_may_come_from_the_environment(capsys: pytest.CaptureFixture[str],
                                                    files: dict[str, str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCBK_ETCD_PASSWORD", PASSWORD)
    ok(capsys, *bookie(files, "--etcd-user", "asyncbk", "--check-config"))
    ok(capsys, *bookie(files, "--etcd-user", "asyncbk", "--check-config", "paths"))


# ------------------------------------------------------------------ autorecovery


def autorecovery(*extra: str) -> list[str]:
    return ["autorecovery", "--metadata-uri", UNREACHABLE, *extra]


def test_autorecovery_checks_its_client_and_endpoint(capsys: pytest.CaptureFixture[str],
                                                     files: dict[str, str]) -> None:
    line = ok(capsys, *autorecovery(*tls(files), "--auth-token-file", files["tokens"],
                                    "--etcd-user", "asyncbk", "--etcd-password-file",
                                    files["password"], "--http-port", "8000",
                                    "--http-tls-cert", files["cert"], "--http-tls-key",
                                    files["key"], "--placement-policy", "rack-aware",
                                    "--bookie-racks-file", files["racks"], "--check-config"))
    assert ("TLS to bookies on, token file, etcd TLS, etcd user with a password file, "
            "HTTPS on 127.0.0.1:8000, placement rack-aware") in line, line
    assert ok(capsys, *autorecovery("--auth-token-file", "/absent/tokens", "--check-config",
                                    "paths")).endswith("not read: --auth-token-file")


@pytest.mark.parametrize(("extra", "why"), [
    (["--http-tls-cert", "CERT", "--http-port", "8000"], "both --http-tls-cert and"),
    (["--http-tls-cert", "CERT", "--http-tls-key", "KEY"], "give --http-port too"),
    (["--http-tls-cert", "CERT", "--http-tls-key", "OTHER_KEY", "--http-port", "8000"],
     "TLS material unusable"),
    (["--auth-token-file", "EMPTY"], "holds no token"),
    (["--tls-cert", "CERT"], "needs both its file and its key file"),
    (["--bookie-racks-file", "BAD_RACKS"], "bad_racks:1"),
    (["--etcd-password-file", "PASSWORD"], "needs --etcd-user"),
    (["--placement-policy", "rack-aware", "--min-racks-per-write-quorum", "0"], "must be >= 1"),
])
def test_a_bad_autorecovery_setting_is_refused(capsys: pytest.CaptureFixture[str],
                                               files: dict[str, str], extra: list[str],
                                               why: str) -> None:
    extra = [files.get(a.lower(), a) for a in extra]
    assert why in refused(capsys, *autorecovery(*extra, "--check-config"))


# ------------------------------------------------------------------ offload


def offload(*extra: str) -> list[str]:
    return ["offload", "--metadata-uri", UNREACHABLE, "--object-store",
            "s3://segments/prod?endpoint=https://s3.test", *extra]


def test_offload_checks_its_store_and_credentials(capsys: pytest.CaptureFixture[str],
                                                  files: dict[str, str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    line = ok(capsys, *offload("--credentials-file", files["credentials"], "--check-config"))
    assert "object store s3://segments/prod?endpoint=https://s3.test (credentials file)" in line
    assert "may be read by others" in refused(
        capsys, *offload("--credentials-file", files["shared_credentials"], "--check-config"))
    ok(capsys, *offload("--credentials-file", "/run/secrets/s3", "--check-config", "paths"))
    assert "no object store credentials" in refused(capsys, *offload("--check-config", "paths"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    assert "(credentials from AWS_*)" in ok(capsys, *offload("--check-config"))
    bad = offload("--check-config")
    bad[bad.index("--object-store") + 1] = "s3://key:secret@segments/prod"
    assert "do not put credentials in the URI" in refused(capsys, *bad)
    assert "must be > 0" in refused(capsys, *offload("--interval-s", "0", "--check-config"))


# ------------------------------------------------------------------ through the image's entrypoint


@pytest.fixture
def entrypoint_env(files: dict[str, str]) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASYNCBK_", "AWS_"))}
    env["PYTHONPATH"] = str(ROOT / "src")
    yield env


def test_the_environment_is_read_as_the_image_reads_it(files: dict[str, str],
                                                       entrypoint_env: dict[str, str]) -> None:
    env = {**entrypoint_env, "ASYNCBK_CONFIG": "", "ASYNCBK_METADATA_URI": UNREACHABLE,
           "ASYNCBK_HOST": "0.0.0.0", "ASYNCBK_ADVERTISED_HOST": "bookie-0.bookies.test",
           "ASYNCBK_PORT": "3181", "ASYNCBK_JOURNAL_DIR": f"{files['dir']}/j",
           "ASYNCBK_LEDGER_DIR": f"{files['dir']}/l", "ASYNCBK_TLS_CERT": files["cert"],
           "ASYNCBK_TLS_KEY": files["key"], "ASYNCBK_TLS_CA": files["ca"],
           "ASYNCBK_TLS_REQUIRE_CLIENT_CERT": "true", "ASYNCBK_AUTH_TOKENS_FILE": files["tokens"],
           "ASYNCBK_ETCD_USER": "asyncbk", "ASYNCBK_ETCD_PASSWORD_FILE": files["password"],
           "ASYNCBK_RACK": "/r1/z1"}
    r = subprocess.run([sys.executable, str(ENTRYPOINT), "bookie", "--check-config"], env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert "bookie id bookie-0.bookies.test:3181, rack /r1/z1" in r.stdout
    assert "TLS mutual, tokens on, etcd TLS, etcd user" in r.stdout
    env["ASYNCBK_RACK"] = "z1"
    r = subprocess.run([sys.executable, str(ENTRYPOINT), "bookie", "--check-config"], env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "configuration refused" in r.stderr, r.stderr
    for secret in SECRETS:
        assert secret not in r.stdout + r.stderr
