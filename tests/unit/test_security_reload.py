"""Reloading TLS material and tokens while a server runs (asyncbk.net.security), over
real loopback TLS with throw-away certificates (``trustme``): new connections get the
new certificate, unusable files keep the old material (and say why, with no secret in
the log), polling notices changed files, revoked tokens close their connections; and
the stand-alone auto-recovery endpoint over HTTPS."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import structlog
import trustme
from structlog.testing import capture_logs

from asyncbk.autorecovery.http import AutoRecoveryHttpServer
from asyncbk.autorecovery.service import AutoRecovery, AutoRecoveryConfig
from asyncbk.clock import ManualClock
from asyncbk.meta.memory import MemoryMetadataStore
from asyncbk.net.http import AdminHttp
from asyncbk.net.security import (
    RELOAD_CHECK_S,
    Credential,
    CredentialReloader,
    LiveServerTLS,
    client_context,
    load_tokens,
    server_context,
)
from asyncbk.net.server import BookieListener, ServerConnection, token_digest
from asyncbk.proto import (
    AuthRequest,
    AuthResponse,
    FrameDecoder,
    ReadLacRequest,
    ReadLacResponse,
    Request,
    Response,
    Status,
    decode_response,
    encode_request,
)

pytestmark = [pytest.mark.usefixtures("loop_errors"), pytest.mark.timeout(60)]

SECRET_TOKEN = "s3cr3t-tok-91f2"


# ---------------------------------------------------------------- helpers

class Pki:
    """A CA and files of its certificates under ``dir``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = trustme.CA()
        self.ca_file = directory / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.cert_file, self.key_file = directory / "server.pem", directory / "server.key"
        self.issued = self.issue()

    def issue(self, ca: trustme.CA | None = None) -> trustme.LeafCert:
        """A new server certificate for 127.0.0.1 written over the server's files."""
        leaf = (ca or self.ca).issue_cert("127.0.0.1", "localhost")
        leaf.cert_chain_pems[0].write_to_path(str(self.cert_file))
        leaf.private_key_pem.write_to_path(str(self.key_file))
        self.issued = leaf
        return leaf

    def server_ctx(self) -> ssl.SSLContext:
        return server_context(str(self.cert_file), str(self.key_file))

    def client_ctx(self) -> ssl.SSLContext:
        return client_context(str(self.ca_file))


def der(leaf: trustme.LeafCert) -> bytes:
    return ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())


async def served_cert(port: int, ctx: ssl.SSLContext) -> bytes:
    """The certificate a new connection to ``port`` is shown (DER)."""
    async with asyncio.timeout(10):
        _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        cert = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert cert is not None
        return bytes(cert)
    finally:
        writer.close()


async def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def tokens_credential(path: Path, applied: list[list[bytes]]) -> Credential:
    return Credential("tokens", (str(path),), lambda: load_tokens(str(path)), applied.append)


def rendered(logs: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join(repr(entry) for entry in logs)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


class Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


@pytest.fixture
async def tls_server(pki: Pki) -> AsyncIterator[tuple[LiveServerTLS, int]]:
    live = LiveServerTLS(pki.server_ctx())
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0,
                                                            ssl=live.context)
    try:
        yield live, server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


# ---------------------------------------------------------------- LiveServerTLS

async def test_new_connections_get_the_new_certificate_old_ones_carry_on(
        pki: Pki, tls_server: tuple[LiveServerTLS, int]) -> None:
    live, port = tls_server
    first = pki.issued
    assert await served_cert(port, pki.client_ctx()) == der(first)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=pki.client_ctx())
    try:
        second = pki.issue()
        live.swap(pki.server_ctx())
        assert await served_cert(port, pki.client_ctx()) == der(second)
        # the connection made before the swap still works, with its certificate
        assert writer.get_extra_info("ssl_object").getpeercert(True) == der(first)
        writer.write(b"ping")
        async with asyncio.timeout(5):
            assert await reader.readexactly(4) == b"ping"
    finally:
        writer.close()


async def test_a_new_ca_checks_client_certificates_of_new_connections(tmp_path: Path) -> None:
    """The swapped context's CA is what checks client certificates (mutual TLS)."""
    pki = Pki(tmp_path)
    client_leaf = pki.ca.issue_cert("client")
    client_leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    client_leaf.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    client = client_context(str(pki.ca_file), str(tmp_path / "client.pem"),
                            str(tmp_path / "client.key"))
    live = LiveServerTLS(server_context(str(pki.cert_file), str(pki.key_file),
                                        str(pki.ca_file), require_client_cert=True))
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0,
                                                            ssl=live.context)
    port = server.sockets[0].getsockname()[1]

    async def echoes() -> bool:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        try:
            writer.write(b"x")
            async with asyncio.timeout(5):
                return await reader.read(1) == b"x"  # TLS 1.3: refusal shows on read
        except (ssl.SSLError, ConnectionError):
            return False
        finally:
            writer.close()

    try:
        assert await echoes()
        other = trustme.CA()  # the CA file now names another CA only
        other.cert_pem.write_to_path(str(tmp_path / "other-ca.pem"))
        live.swap(server_context(str(pki.cert_file), str(pki.key_file),
                                 str(tmp_path / "other-ca.pem"), require_client_cert=True))
        assert not await echoes()
    finally:
        server.close()
        await server.wait_closed()


# ---------------------------------------------------------------- CredentialReloader

async def test_good_tls_material_swaps_bad_keeps_the_old(
        pki: Pki, tls_server: tuple[LiveServerTLS, int]) -> None:
    live, port = tls_server
    first = pki.issued
    cred = Credential("TLS material", (str(pki.cert_file), str(pki.key_file)),
                      pki.server_ctx, live.swap)
    reloader = CredentialReloader([cred])
    await reloader.snapshot()
    try:
        # a key that is not the certificate's: refused, the old certificate served
        other = pki.ca.issue_cert("127.0.0.1")
        key_text = other.private_key_pem.bytes()
        other.private_key_pem.write_to_path(str(pki.key_file))
        with capture_logs() as logs:
            reloader.log = structlog.get_logger("test")
            assert await reloader.reload() == {"TLS material": False}
        assert live.current is live.context
        assert await served_cert(port, pki.client_ctx()) == der(first)
        [warning] = [e for e in logs if e["log_level"] == "warning"]
        assert "TLS material not reloaded: the old stays in use" in warning["event"]
        assert "unusable" in warning["error"]
        for line in key_text.decode().splitlines()[1:-1]:
            assert line not in rendered(logs)
        # a half-written (garbage) key: refused too, nothing of it in the log
        pki.key_file.write_text("-----BEGIN PRIVATE KEY-----\nTOPSECRETKEYBYTES\n"
                                "-----END PRIVATE KEY-----\n")
        with capture_logs() as logs:
            reloader.log = structlog.get_logger("test")
            assert await reloader.reload() == {"TLS material": False}
        assert "TOPSECRETKEYBYTES" not in rendered(logs)
        assert await served_cert(port, pki.client_ctx()) == der(first)
        # a certificate gone: refused
        pki.cert_file.unlink()
        assert await reloader.reload() == {"TLS material": False}
        # good material: swapped, said once
        second = pki.issue()
        with capture_logs() as logs:
            reloader.log = structlog.get_logger("test")
            assert await reloader.reload() == {"TLS material": True}
        assert [e["event"] for e in logs] == ["TLS material reloaded"]
        assert await served_cert(port, pki.client_ctx()) == der(second)
        assert (reloader.reloads, reloader.failures) == (1, 3)
    finally:
        await reloader.close()


async def test_bad_tokens_files_keep_the_old_tokens_and_log_no_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{SECRET_TOKEN}\n")
    applied: list[list[bytes]] = []
    reloader = CredentialReloader([tokens_credential(path, applied)])
    bad_contents = [b"", b"# only a comment\n\n",
                    f"{SECRET_TOKEN}-new\n".encode() + b"\xff\xfe not utf-8\n"]
    with capture_logs() as logs:
        reloader.log = structlog.get_logger("test")
        for content in bad_contents:
            path.write_bytes(content)
            assert await reloader.reload() == {"tokens": False}
        path.unlink()
        assert await reloader.reload() == {"tokens": False}
        path.write_text(f"# rotated\n{SECRET_TOKEN}-2\n\n{SECRET_TOKEN}-3\n")
        assert await reloader.reload() == {"tokens": True}
    assert applied == [[f"{SECRET_TOKEN}-2".encode(), f"{SECRET_TOKEN}-3".encode()]]
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 4
    assert all(e["event"] == "tokens not reloaded: the old stays in use" for e in warnings)
    assert "holds no token" in warnings[0]["error"]
    assert "no such file" in warnings[3]["error"]
    assert [e["event"] for e in logs if e["log_level"] == "info"] == ["tokens reloaded"]
    assert SECRET_TOKEN not in rendered(logs)


async def test_polling_reloads_what_changed_and_only_that(tmp_path: Path) -> None:
    clock = ManualClock()
    tokens, other = tmp_path / "tokens", tmp_path / "other"
    tokens.write_text("t1\n")
    other.write_text("o1\n")
    applied: list[list[bytes]] = []
    applied_other: list[list[bytes]] = []
    reloader = CredentialReloader([tokens_credential(tokens, applied),
                                   Credential("other", (str(other),),
                                              lambda: load_tokens(str(other)),
                                              applied_other.append)],
                                  clock=clock)
    await reloader.snapshot()
    reloader.start()
    try:
        async def tick() -> None:
            before = reloader.reloads + reloader.failures
            await wait_for(lambda: bool(clock._sleepers))  # the poller sleeps
            clock.advance(RELOAD_CHECK_S)
            await wait_for(lambda: not clock._sleepers or
                           reloader.reloads + reloader.failures > before, 2.0)
            await asyncio.sleep(0.2)  # a check that finds nothing has nothing to await

        await tick()
        assert applied == [] and applied_other == []  # nothing changed: nothing read
        tokens.write_text("t2 \n")  # size changes
        await tick()
        await wait_for(lambda: applied == [[b"t2"]])
        assert applied_other == []
        tokens.write_text("")  # unusable: refused once, not at every tick
        await tick()
        await wait_for(lambda: reloader.failures == 1)
        await tick()
        assert reloader.failures == 1
        replacement = tmp_path / "tokens.new"  # renamed over (a new inode)
        replacement.write_text("t3\n")
        os.replace(replacement, tokens)
        await tick()
        await wait_for(lambda: applied == [[b"t2"], [b"t3"]])
        assert applied_other == []
    finally:
        await reloader.close()
    assert reloader._poll_task is None


async def test_a_change_between_snapshot_and_first_read_is_caught(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "tokens"
    path.write_text("t1\n")
    applied: list[list[bytes]] = []
    reloader = CredentialReloader([tokens_credential(path, applied)], clock=clock)
    await reloader.snapshot()
    path.write_text("t22\n")  # after the snapshot, before the server started
    reloader.start()
    try:
        await wait_for(lambda: bool(clock._sleepers))
        clock.advance(RELOAD_CHECK_S)
        await wait_for(lambda: applied == [[b"t22"]])
    finally:
        await reloader.close()


async def test_requests_reload_everything_and_coalesce(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("t1\n")
    applied: list[list[bytes]] = []
    reloader = CredentialReloader([tokens_credential(path, applied)], clock=ManualClock())
    reloader.request_reload()  # not started: ignored (said in the log)
    await asyncio.sleep(0.05)
    assert applied == []
    await reloader.snapshot()
    reloader.start()
    try:
        for _ in range(5):  # a burst of SIGHUPs: one running, one more queued
            reloader.request_reload()
        await wait_for(lambda: reloader._request_task is not None
                       and reloader._request_task.done())
        assert 1 <= len(applied) <= 2
        assert applied[-1] == [b"t1"]  # unchanged files are read anyway on request
    finally:
        await reloader.close()
    assert reloader._request_task is None and not reloader.started


# ---------------------------------------------------------------- tokens in servers

class Answerer:
    def handle(self, request: Request, conn: ServerConnection) -> None:
        conn.respond(ReadLacResponse(request.request_id, Status.OK, 1, -1, -1))


async def test_new_tokens_take_effect_and_revoked_ones_lose_their_connections() -> None:
    listener = BookieListener(Answerer(), frame_bytes_max=1 << 20,
                              write_buffer_bytes_high=1 << 20, connections_max=8,
                              tokens=[b"t1", b"t2"])
    port = await listener.start("127.0.0.1", 0)

    async def session(token: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                             list[Response]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(encode_request(AuthRequest(1, token))
                     + encode_request(ReadLacRequest(2, 1)))
        return reader, writer, await answers(reader, 2)

    async def answers(reader: asyncio.StreamReader, n: int) -> list[Response]:
        decoder, out = FrameDecoder(1 << 20), list[Response]()
        async with asyncio.timeout(5):
            while len(out) < n:
                data = await reader.read(65536)
                if not data:
                    break
                out += [decode_response(b) for b in decoder.feed(data)]
        return out

    writers = []
    try:
        r1, w1, got = await session(b"t1")
        writers.append(w1)
        assert [a.status for a in got] == [Status.OK, Status.OK]
        r2, w2, got = await session(b"t2")
        writers.append(w2)
        assert listener.set_tokens([b"t2", b"t3"]) == 1
        async with asyncio.timeout(5):
            assert await r1.read() == b""  # t1's connection: closed
        w2.write(encode_request(ReadLacRequest(3, 1)))  # t2's: carries on
        assert [a.status for a in await answers(r2, 1)] == [Status.OK]
        r3, w3, got = await session(b"t3")
        writers.append(w3)
        assert [a.status for a in got] == [Status.OK, Status.OK]
        r4, w4, got = await session(b"t1")
        writers.append(w4)
        assert isinstance(got[0], AuthResponse) and got[0].status == Status.UNAUTHORIZED
        # a connection keeps a digest of its token, not the token
        digests = {c.token_digest for c in listener.connections} - {None}
        assert digests == {token_digest(b"t2"), token_digest(b"t3")}
        assert not [v for c in listener.connections for v in vars(c).values()
                    if v in (b"t2", b"t3")]
    finally:
        for w in writers:
            w.close()
        await listener.close()


async def test_admin_http_checks_the_tokens_of_the_moment_over_https(pki: Pki) -> None:
    live = LiveServerTLS(pki.server_ctx())
    http = AdminHttp("127.0.0.1", 0, [], [], ssl_context=live.context, tokens=[b"t1"],
                     open_reads=False)
    port = await http.start()
    url = f"https://127.0.0.1:{port}/metrics"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            async def status(token: str) -> int:
                async with s.get(url, ssl=pki.client_ctx(),
                                 headers={"Authorization": f"Bearer {token}"}) as r:
                    return r.status

            assert (await status("t1"), await status("t2")) == (200, 401)
            http.set_tokens([b"t2"])
            assert (await status("t1"), await status("t2")) == (401, 200)
        first = pki.issued
        assert await served_cert(port, pki.client_ctx()) == der(first)
        second = pki.issue()
        live.swap(pki.server_ctx())
        assert await served_cert(port, pki.client_ctx()) == der(second)
    finally:
        await http.close()


# ---------------------------------------------------------------- auto-recovery HTTPS

async def test_standalone_autorecovery_endpoint_over_https(pki: Pki) -> None:
    ar = AutoRecovery(SimpleNamespace(meta=MemoryMetadataStore()), AutoRecoveryConfig(),
                      "ar-https", clock=ManualClock())
    server = AutoRecoveryHttpServer(ar, "127.0.0.1", 0, ssl_context=pki.server_ctx())
    port = await server.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            async with s.get(f"https://127.0.0.1:{port}/api/v1/autorecovery/status",
                             ssl=pki.client_ctx()) as r:
                assert r.status == 200
                assert (await r.json())["id"] == "ar-https"
            async with s.get(f"https://127.0.0.1:{port}/metrics", ssl=pki.client_ctx()) as r:
                assert r.status == 200
                assert "asyncbk_autorecovery_is_auditor" in await r.text()
            with pytest.raises(aiohttp.ClientError):  # plain HTTP is not answered
                async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                    await r.read()
        assert await served_cert(port, pki.client_ctx()) == der(pki.issued)
    finally:
        await server.close()
