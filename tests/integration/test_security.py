"""TLS and token authentication with real processes: a cluster with TLS (mutual)
and a token end to end, and every way in without the right credentials refused.

Certificates are made on the fly (``trustme``); no key is committed."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import trustme

from asyncbk.client.client import BookKeeper
from asyncbk.errors import BKError, MetadataError, UnauthorizedAccessError
from asyncbk.net.security import client_context
from asyncbk.proto import (
    AuthRequest,
    AuthResponse,
    FrameDecoder,
    ReadRequest,
    ReadResponse,
    Status,
    decode_response,
    encode_request,
)
from asyncbk.testing import LocalCluster
from asyncbk.types import parse_bookie_id

from .clitools import cli_env

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]

TOKEN = "tok-3f9a1c"
FAST = {"lost_bookie_delay": 2, "audit_interval": 5, "open_ledger_grace": 3, "rate": 0}


@pytest.fixture
async def secure(tmp_path: Path):  # type: ignore[no-untyped-def]
    async with LocalCluster(bookies=4, data_dir=tmp_path / "cluster", tls=True,
                            auth_token=TOKEN, etcd_auth=True) as c:
        assert c.metadata_uri.startswith("etcds://")
        yield c


async def _refused(bk: BookKeeper, ledger_id: int) -> None:
    """Reading ``ledger_id`` through ``bk`` fails, bounded, and returns no data."""
    async with asyncio.timeout(30):
        with pytest.raises(BKError):
            rh = await bk.open_ledger(ledger_id, recovery=False)
            await rh.read_unconfirmed(0, 0)


async def _exchange(host: str, port: int, ctx: ssl.SSLContext,
                    requests: list[bytes]) -> tuple[list[object], bool]:
    """Send raw frames over TLS; the decoded answers, and whether the bookie closed."""
    reader, writer = await asyncio.open_connection(host, port, ssl=ctx, server_hostname=host)
    try:
        for frame in requests:
            writer.write(frame)
        await writer.drain()
        decoder = FrameDecoder(1 << 20)
        answers: list[object] = []
        closed = False
        async with asyncio.timeout(15):
            while len(answers) < len(requests):
                data = await reader.read(65536)
                if not data:
                    closed = True
                    break
                answers += [decode_response(b) for b in decoder.feed(data)]
            if not closed:
                with pytest.raises((TimeoutError, ConnectionError)):
                    async with asyncio.timeout(1):
                        closed = not await reader.read(1)
                        raise ConnectionError
        return answers, closed
    finally:
        writer.close()


async def test_a_tls_cluster_with_a_token_works_end_to_end(secure: LocalCluster) -> None:
    """Writes, reads, recovery, streams and auto-recovery over mutual TLS with a token,
    etcd over mutual TLS with its own user and password; neither the token nor the
    password is in any process's arguments or log."""
    bk = await secure.client()
    good = secure.client_ssl_context()
    lh = await bk.create_ledger(3, 2, 2, password=b"pw")
    data = [b"entry %d" % i for i in range(300)]
    await asyncio.gather(*(lh.append(d) for d in data))
    other = await secure.client()
    rh = await other.open_ledger(lh.id, password=b"pw")  # recovery: fences the writer
    assert [e.data for e in await rh.read(0, 299)] == data
    ns = await bk.namespace("sec", create=True, ensemble_size=3, write_quorum=2, ack_quorum=2)
    await ns.create_stream("s")
    async with await ns.open_writer("s") as w:
        await w.write(b"over tls")
    async with await ns.open_reader("s") as r:
        assert (await r.read_next()).data == b"over tls"
    # auto-recovery (its own process, with the cluster's client TLS and token file)
    md = await bk.ledger_metadata(lh.id)
    victim = next(b for b in secure.bookies if b.id == md.ensembles[0][1][0])
    ar = await secure.start_autorecovery(**FAST)
    assert ar.http_url.startswith("https://")
    async with aiohttp.ClientSession() as http, \
            http.get(f"{ar.http_url}/api/v1/autorecovery/status", ssl=good) as resp:
        assert resp.status == 200 and (await resp.json())["id"] == ar.id
    victim.kill()
    async with asyncio.timeout(90):
        while victim.id in (await bk.ledger_metadata(lh.id)).all_bookies():  # noqa: ASYNC110
            await asyncio.sleep(0.5)
    rh = await (await secure.client()).open_ledger(lh.id, password=b"pw")
    assert [e.data for e in await rh.read(0, 299)] == data

    def token_shown() -> list[str]:
        cmdlines = [Path(f"/proc/{p.pid}/cmdline").read_text()
                    for p in [*secure.bookies, *secure.autorecovery] if p.running]
        logs = [p.read_text(errors="replace") for p in secure.data_dir.rglob("*.log")]
        assert cmdlines and logs
        secrets = [TOKEN, secure.etcd_password or "?"]
        return [text for text in cmdlines + logs if any(x in text for x in secrets)]

    assert await asyncio.to_thread(token_shown) == []


async def test_clients_without_the_right_credentials_get_nothing(secure: LocalCluster,
                                                                tmp_path: Path) -> None:
    """No token, a wrong token, no TLS, no client certificate, or a certificate of
    another CA: each is refused and reads nothing; the cluster keeps serving."""
    bk = await secure.client()
    lh = await bk.create_ledger(3, 3, 2)
    await lh.append(b"secret data")
    await lh.close()
    assert secure.tls is not None
    good = secure.client_ssl_context()
    other_ca = trustme.CA()
    stranger = other_ca.issue_cert("asyncbk-client")
    stranger_files = []
    for name, blob in (("cert.pem", stranger.cert_chain_pems[0].bytes()),
                       ("key.pem", stranger.private_key_pem.bytes())):
        (tmp_path / name).write_bytes(blob)
        stranger_files.append(str(tmp_path / name))
    attempts = {
        "no token": {"ssl": good},
        "wrong token": {"ssl": good, "token": "not-" + TOKEN},
        "no TLS": {"token": TOKEN},
        "no client certificate": {"ssl": client_context(str(secure.tls.ca)), "token": TOKEN},
        "certificate of another CA": {"ssl": client_context(str(secure.tls.ca),
                                                            *stranger_files), "token": TOKEN},
    }
    for what, security in attempts.items():
        if what in ("no TLS", "certificate of another CA", "no client certificate"):
            # etcd (TLS, client certificates required) refuses these already.
            with pytest.raises(MetadataError):
                await BookKeeper.connect(secure.metadata_uri, metadata_timeout_s=5.0,
                                         etcd_user=secure.etcd_user,
                                         etcd_password=secure.etcd_password,
                                         **security)  # type: ignore[arg-type]
        # Past etcd with good credentials there, the bookies still refuse.
        intruder = await BookKeeper.connect(secure.metadata_uri, etcd_ssl=good,
                                            etcd_user=secure.etcd_user,
                                            etcd_password=secure.etcd_password,
                                            **security)  # type: ignore[arg-type]
        try:
            await _refused(intruder, lh.id)
        except AssertionError:
            raise AssertionError(f"{what}: the read was not refused") from None
        finally:
            await intruder.close()
    rh = await bk.open_ledger(lh.id)
    assert [e.data for e in await rh.read(0, 0)] == [b"secret data"]


def _stranger_files(tmp_path: Path) -> list[str]:
    """A client certificate and key of a CA the bookies do not trust."""
    stranger = trustme.CA().issue_cert("asyncbk-client")
    files = []
    for name, blob in (("cert.pem", stranger.cert_chain_pems[0].bytes()),
                       ("key.pem", stranger.private_key_pem.bytes())):
        (tmp_path / name).write_bytes(blob)
        files.append(str(tmp_path / name))
    return files


async def test_refused_credentials_fail_fast_naming_the_bookie(secure: LocalCluster,
                                                               tmp_path: Path) -> None:
    """A wrong token, a client certificate of another CA, none, or no TLS at all: the
    first append, open and read each fail within seconds with UnauthorizedAccessError
    naming a bookie and the cause (not NotEnoughBookiesError a minute later), with no
    ensemble change and no bookie quarantined; meanwhile a client with the right
    credentials keeps writing to the same bookies without an ensemble change."""
    bk = await secure.client()
    assert secure.tls is not None
    good = secure.client_ssl_context()
    closed = await bk.create_ledger(3, 3, 2)
    await closed.append(b"secret data")
    await closed.close()
    abandoned = await bk.create_ledger(3, 3, 2)  # left open: opening it recovers it
    await abandoned.append(b"open data")
    writer = await bk.create_ledger(3, 3, 2)
    written = 0
    stop = asyncio.Event()

    async def keep_writing() -> None:
        nonlocal written
        while not stop.is_set():
            await asyncio.gather(*(writer.append(b"w") for _ in range(20)))
            written += 20

    attempts: dict[str, tuple[dict[str, object], str]] = {
        "wrong token": ({"ssl": good, "token": "not-" + TOKEN}, "token"),
        "certificate of another CA": ({"ssl": client_context(
            str(secure.tls.ca), *_stranger_files(tmp_path)), "token": TOKEN}, "certificate"),
        "no client certificate": ({"ssl": client_context(str(secure.tls.ca)),
                                   "token": TOKEN}, "certificate"),
        "no TLS": ({"token": TOKEN}, "serves TLS"),
    }
    task = asyncio.create_task(keep_writing())
    try:
        for what, (security, cause) in attempts.items():
            before = written
            intruder = await BookKeeper.connect(secure.metadata_uri, etcd_ssl=good,
                                                etcd_user=secure.etcd_user,
                                                etcd_password=secure.etcd_password,
                                                **security)  # type: ignore[arg-type]
            try:
                lh = await intruder.create_ledger(3, 3, 2)  # (metadata only: no bookie yet)

                async def append() -> None:
                    await lh.append(b"x")  # noqa: B023 (awaited in this iteration)

                async def open_recovering() -> None:
                    await intruder.open_ledger(abandoned.id)  # noqa: B023

                async def open_tailing() -> None:
                    await intruder.open_ledger(abandoned.id, recovery=False)  # noqa: B023

                async def read() -> None:
                    rh = await intruder.open_ledger(closed.id)  # noqa: B023
                    await rh.read(0, 0)

                for op in (append, open_recovering, open_tailing, read):
                    started = time.monotonic()
                    with pytest.raises(UnauthorizedAccessError) as info:
                        async with asyncio.timeout(30):
                            await op()
                    elapsed = time.monotonic() - started
                    message = str(info.value)
                    assert elapsed < 10, f"{what}, {op.__name__}: {elapsed:.1f}s"
                    assert cause in message, f"{what}, {op.__name__}: {message}"
                    assert any(f"bookie {b.id}" in message for b in secure.bookies), message
                    assert TOKEN not in message
                assert lh.ensemble_changes == 0 and intruder.stats.ensemble_changes == 0
                assert intruder.quarantine.active() == set(), what
            finally:
                await intruder.close()
            async with asyncio.timeout(30):  # the good writer went on meanwhile
                while written <= before + 20:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    assert writer.ensemble_changes == 0 and bk.stats.ensemble_changes == 0
    assert bk.quarantine.active() == set()
    rh = await bk.open_ledger(closed.id)
    assert [e.data for e in await rh.read(0, 0)] == [b"secret data"]


async def test_the_bookie_refuses_requests_before_auth_and_closes(secure: LocalCluster) -> None:
    """On the wire: requests before AUTH are answered UNAUTHORIZED with no data, and
    the 16th closes the connection; a wrong token closes it at once; the right one
    opens it."""
    bk = await secure.client()
    lh = await bk.create_ledger(3, 3, 2)
    await lh.append(b"secret data")
    host, port = parse_bookie_id(lh.metadata.ensembles[0][1][0])  # holds entry 0
    ctx = secure.client_ssl_context()
    assert ctx is not None
    reads = [encode_request(ReadRequest(i, lh.id, 0, 0, b"")) for i in range(1, 17)]
    answers, closed = await _exchange(host, port, ctx, reads)
    assert closed and len(answers) == 16
    assert all(isinstance(a, ReadResponse) and a.status == Status.UNAUTHORIZED and not a.body
               for a in answers)
    wrong = [encode_request(AuthRequest(1, b"nope")), reads[1]]
    answers, closed = await _exchange(host, port, ctx, wrong)
    assert closed and answers == [AuthResponse(1, Status.UNAUTHORIZED)]
    right = [encode_request(AuthRequest(1, TOKEN.encode())), reads[1]]
    answers, _ = await _exchange(host, port, ctx, right)
    assert answers[0] == AuthResponse(1, Status.OK)
    assert isinstance(answers[1], ReadResponse) and answers[1].body  # served


async def test_the_shell_needs_the_tls_options_and_the_token_file(secure: LocalCluster) -> None:
    """``asyncbk shell listbookies`` answers with the cluster's client options and is
    refused without them (the token from a file, never argv)."""
    def shell(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "asyncbk", "shell", "listbookies",
                               "--metadata-uri", secure.metadata_uri, *extra],
                              capture_output=True, text=True, env=cli_env(), timeout=60)

    ok = await asyncio.to_thread(shell, *secure.client_options())
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert len(lines) == len(secure.bookies) and not any("no answer" in ln for ln in lines)
    # without them etcd (TLS, client certificates required) refuses, in one line
    refused = await asyncio.to_thread(shell)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "TLS" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    # with etcd's TLS and user only, the registry (in etcd) is listed, but no bookie answers
    assert secure.tls is not None and secure.etcd_user is not None
    refused = await asyncio.to_thread(
        shell, "--etcd-ca", str(secure.tls.ca), "--etcd-cert", str(secure.tls.client_cert),
        "--etcd-key", str(secure.tls.client_key), "--etcd-user", secure.etcd_user,
        "--etcd-password-file", str(secure.data_dir / "tls" / "etcd-password"))
    assert TOKEN not in refused.stdout + refused.stderr
    lines = refused.stdout.splitlines()
    assert len(lines) == len(secure.bookies) and all("no answer" in ln for ln in lines)


async def test_the_admin_endpoint_is_https_and_asks_for_the_token(secure: LocalCluster) -> None:
    """HTTPS with the bookie's certificate; /metrics and /healthz open to probes, every
    other route (reads and changes) 401 without ``Authorization: Bearer <token>``."""
    import aiohttp

    bookie = secure.bookies[0]
    assert bookie.http_url.startswith("https://")
    assert secure.tls is not None
    ctx = client_context(str(secure.tls.ca))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
        for path in ("/healthz", "/metrics"):
            async with s.get(bookie.http_url + path) as r:
                assert r.status == 200, path
        for method, path in (("GET", "/api/v1/bookie/state"), ("GET", "/api/v1/bookie/info"),
                             ("PUT", "/api/v1/bookie/gc"), ("PUT", "/api/v1/bookie/state")):
            async with s.request(method, bookie.http_url + path) as r:
                assert r.status == 401, (method, path)
                assert "Bearer" in (await r.json())["error"]
            async with s.request(method, bookie.http_url + path,
                                 headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 401, (method, path)
        async with s.get(bookie.http_url + "/api/v1/bookie/state", headers=auth) as r:
            assert r.status == 200 and "state" in await r.json()
        async with s.put(bookie.http_url + "/api/v1/bookie/gc", headers=auth) as r:
            assert r.status != 401
    # plain HTTP to the HTTPS port gets nothing
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientError):
            async with asyncio.timeout(10), \
                    s.get(bookie.http_url.replace("https", "http") + "/metrics") as r:
                await r.read()


@pytest.mark.parametrize(("flags", "words"), [
    (["--auth-tokens-file", "{tmp}/missing"], "tokens file"),
    (["--auth-tokens-file", "{tmp}/empty"], "holds no token"),
    (["--tls-cert", "{tmp}/empty", "--tls-key", "{tmp}/empty"], "TLS material unusable"),
    (["--tls-cert", "{tmp}/empty"], "needs both"),
    (["--tls-require-client-cert"], "needs TLS"),
])
def test_bad_security_settings_stop_the_bookie_with_one_line(tmp_path: Path, flags: list[str],
                                                             words: str) -> None:
    """Said before the bookie reaches for etcd or its disks, in one line, exit 1."""
    (tmp_path / "empty").write_text("\n")
    argv = [a.format(tmp=tmp_path) for a in flags]
    r = subprocess.run([sys.executable, "-m", "asyncbk", "bookie", "--metadata-uri",
                        "etcd://127.0.0.1:1/x", "--port", "23456", "--journal-dir",
                        str(tmp_path / "j"), "--ledger-dir", str(tmp_path / "l"), *argv],
                       capture_output=True, text=True, env=cli_env(), timeout=60)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "etcd" not in lines[0], r.stderr
    assert not (tmp_path / "j").exists()


async def test_decommission_reaches_a_bookie_with_tls_and_a_token(secure: LocalCluster) -> None:
    """``shell decommission`` switches the bookie read-only through its HTTPS admin
    endpoint with the command's CA and token (a bookie with a tokens file asks for it),
    then copies what it holds; without the token, one line says what to give."""
    bk = await secure.client()
    lh = await bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"p")
    for i in range(20):
        await lh.append(b"e%d" % i)
    await lh.close()
    leaving = secure.bookies[0]
    options = secure.client_options()
    token_at = options.index("--auth-token-file")
    without_token = options[:token_at] + options[token_at + 2:]

    def decommission(*opts: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "asyncbk", "shell", "decommission",
                               leaving.id, "--metadata-uri", secure.metadata_uri, *opts],
                              capture_output=True, text=True, env=cli_env(), timeout=120)

    refused = await asyncio.to_thread(decommission, *without_token)
    assert refused.returncode == 1
    assert "refused this command's token" in refused.stderr and "--auth-token-file" in \
        refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and TOKEN not in refused.stderr
    done = await asyncio.to_thread(decommission, *options)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "is read-only" in done.stdout and "deleted the cookie" in done.stdout
    assert leaving.id not in (await bk.ledger_metadata(lh.id)).all_bookies()
    rh = await bk.open_ledger(lh.id, password=b"p")
    assert [e.data for e in await rh.read(0, 19)] == [b"e%d" % i for i in range(20)]
