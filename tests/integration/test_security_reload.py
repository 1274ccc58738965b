"""A running bookie process takes a new tokens file and a renewed certificate on
SIGHUP, without a restart: new connections use them, a removed token is refused and
its connections closed, and unusable files keep the old material in use.

Certificates are made on the fly (``trustme``); no key is committed."""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trustme

from asyncbk.client.client import BookKeeper
from asyncbk.net.security import client_context
from asyncbk.proto import (
    AuthRequest,
    FrameDecoder,
    ReadLacRequest,
    Response,
    Status,
    decode_response,
    encode_request,
)
from asyncbk.testing import LocalCluster
from asyncbk.types import parse_bookie_id

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors"),
              pytest.mark.timeout(90)]

OLD_TOKEN = "tok-old-5d2f0a"
NEW_TOKEN = "tok-new-8e31c7"


class Session:
    """A raw connection to a bookie that sent AUTH (and one request)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder(1 << 20)
        self.closed = False

    @classmethod
    async def open(cls, bookie_id: str, ctx: ssl.SSLContext, token: str) -> Session:
        host, port = parse_bookie_id(bookie_id)
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection(host, port, ssl=ctx,
                                                           server_hostname=host)
        session = cls(reader, writer)
        writer.write(encode_request(AuthRequest(1, token.encode()))
                     + encode_request(ReadLacRequest(2, 1)))
        return session

    async def answers(self, n: int) -> list[Response]:
        """Up to ``n`` answers; fewer if the bookie closes the connection."""
        out: list[Response] = []
        async with asyncio.timeout(10):
            while len(out) < n:
                data = await self.reader.read(65536)
                if not data:
                    self.closed = True
                    break
                out += [decode_response(b) for b in self.decoder.feed(data)]
        return out

    def close(self) -> None:
        self.writer.close()


def authenticated(answers: list[Response]) -> bool:
    """AUTH accepted, and the request after it answered (no such ledger: fine)."""
    return (len(answers) == 2 and answers[0].status == Status.OK
            and answers[1].status != Status.UNAUTHORIZED)


async def auth_status(bookie_id: str, ctx: ssl.SSLContext, token: str) -> Status:
    session = await Session.open(bookie_id, ctx, token)
    try:
        answers = await session.answers(1)
        assert answers, "the bookie closed the connection without answering AUTH"
        return Status(answers[0].status)
    finally:
        session.close()


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 15.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.1)


async def log_has(path: Path, text: str, count: int = 1) -> bool:
    return (await asyncio.to_thread(path.read_text, errors="replace")).count(text) >= count


async def write_and_read(bk: BookKeeper) -> None:
    """A ledger E1 W1 A1 on the one bookie: append, read back."""
    async with asyncio.timeout(20):
        lh = await bk.create_ledger(1, 1, 1, password=b"pw")
        await lh.append(b"after reload")
        assert [e.data for e in await lh.read(0, 0)] == [b"after reload"]
        await lh.close()


async def test_sighup_reloads_the_tokens(tmp_path: Path) -> None:
    async with LocalCluster(bookies=1, tls=True, auth_token=OLD_TOKEN,
                            data_dir=tmp_path) as cluster:
        bookie = cluster.bookies[0]
        assert bookie.pid is not None
        ctx = cluster.client_ssl_context()
        assert ctx is not None
        tokens_file = cluster.data_dir / "tls" / "tokens"
        before = await Session.open(bookie.id, ctx, OLD_TOKEN)  # authenticated, kept open
        try:
            assert authenticated(await before.answers(2))

            # an unusable tokens file: refused, the old token still works
            tokens_file.write_text("# nothing yet\n")
            os.kill(bookie.pid, signal.SIGHUP)
            await eventually(lambda: log_has(bookie.log_path, "tokens not reloaded"))
            assert await auth_status(bookie.id, ctx, OLD_TOKEN) == Status.OK

            tokens_file.write_text(f"{NEW_TOKEN}\n")
            os.kill(bookie.pid, signal.SIGHUP)
            await eventually(lambda: log_has(bookie.log_path, "tokens reloaded"))
            assert await auth_status(bookie.id, ctx, NEW_TOKEN) == Status.OK
            assert await auth_status(bookie.id, ctx, OLD_TOKEN) == Status.UNAUTHORIZED
            # the connection made with the removed token was closed
            assert await before.answers(1) == [] and before.closed
        finally:
            before.close()

        bk = await BookKeeper.connect(cluster.metadata_uri, ssl=cluster.client_ssl_context(),
                                      token=NEW_TOKEN)
        try:
            await write_and_read(bk)
        finally:
            await bk.close()

        def shown() -> list[str]:
            text = bookie.log_path.read_text(errors="replace")
            return [t for t in (OLD_TOKEN, NEW_TOKEN) if t in text]

        assert await asyncio.to_thread(shown) == []


async def test_sighup_renews_the_certificate_of_new_connections(tmp_path: Path) -> None:
    # The bookie gets its own copy of the certificate and key (etcd, in the same
    # cluster, serves the cluster's files: they stay as they are).
    async with LocalCluster(bookies=0, tls=True, auth_token=OLD_TOKEN,
                            data_dir=tmp_path) as cluster:
        assert cluster.tls is not None
        own = cluster.data_dir / "bookie-tls"
        own.mkdir(mode=0o700)
        cert, key = own / "bookie.pem", own / "bookie.key"
        cert.write_bytes(cluster.tls.server_cert.read_bytes())
        key.write_bytes(cluster.tls.server_key.read_bytes())
        cluster.bookie_config.update(tls_cert_file=str(cert), tls_key_file=str(key))
        bookie = await cluster.add_bookie()
        assert bookie.pid is not None

        # the new certificate comes from another CA, which clients are told to trust
        other_ca = trustme.CA()
        both_cas = own / "cas.pem"
        both_cas.write_bytes(cluster.tls.ca.read_bytes() + other_ca.cert_pem.bytes())
        ctx = client_context(str(both_cas), str(cluster.tls.client_cert),
                             str(cluster.tls.client_key))
        host, port = parse_bookie_id(bookie.id)

        async def served(port: int = port) -> bytes:
            """The certificate a new connection is shown (the bookie protocol's port,
            else the admin endpoint's)."""
            async with asyncio.timeout(10):
                _r, writer = await asyncio.open_connection(host, port, ssl=ctx,
                                                           server_hostname=host)
            try:
                der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
                assert der is not None
                return bytes(der)
            finally:
                writer.close()

        first = await served()
        assert first == ssl.PEM_cert_to_DER_cert(cluster.tls.server_cert.read_text())
        assert await served(bookie.http_port) == first
        before = await Session.open(bookie.id, ctx, OLD_TOKEN)
        try:
            assert authenticated(await before.answers(2))

            # a key that is not the certificate's: refused, the old certificate served
            leaf = other_ca.issue_cert("127.0.0.1", "localhost")
            leaf.cert_chain_pems[0].write_to_path(str(cert))
            os.kill(bookie.pid, signal.SIGHUP)
            await eventually(lambda: log_has(bookie.log_path, "TLS material not reloaded"))
            assert await served() == first

            leaf.private_key_pem.write_to_path(str(key))
            os.kill(bookie.pid, signal.SIGHUP)
            await eventually(lambda: log_has(bookie.log_path, "TLS material reloaded"))
            new = ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())
            assert await served() == new
            assert await served(bookie.http_port) == new  # HTTPS admin endpoint too
            # the connection made before carries on, with the old certificate
            assert before.writer.get_extra_info("ssl_object").getpeercert(True) == first
            before.writer.write(encode_request(ReadLacRequest(3, 1)))
            [answer] = await before.answers(1)
            assert answer.status != Status.UNAUTHORIZED
        finally:
            before.close()

        bk = await BookKeeper.connect(cluster.metadata_uri, ssl=ctx, token=OLD_TOKEN)
        try:
            await write_and_read(bk)
        finally:
            await bk.close()
