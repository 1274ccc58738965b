"""A bookie refusing this client's credentials is told apart from a bookie that is
unreachable: the channel's logic on fakes, then the connector's verdicts against
real TLS and plain servers on loopback (made in-process: no bookie)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from asyncbk.errors import BookieUnavailableError, UnauthorizedAccessError
from asyncbk.net.adds import AddGroup
from asyncbk.net.channel import BookieChannel
from asyncbk.net.connector import (
    CREDENTIAL_ALERTS,
    TcpConnector,
    credential_refusal,
    may_be_silent_refusal,
    speaks_plain_protocol,
    speaks_tls,
    tls_session_end,
)
from asyncbk.net.server import BookieListener, ServerConnection
from asyncbk.proto import (
    AuthRequest,
    AuthResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    FrameDecoder,
    ReadRequest,
    Request,
    Status,
    decode_request,
    encode_response,
    refusal,
)

from .test_client_channel import Answers, FakeTransport

OPTIONS: dict[str, Any] = dict(frame_bytes_max=1 << 20, requests_max=1000,
                               connect_timeout_s=2.0, reconnect_backoff_s_max=0.5)


class FakeConnector:
    """Connects to a FakeTransport at once; ``verdict`` is what ``explain_refusal``
    says (counted in ``asked``); ``error`` makes connects fail with it instead."""

    def __init__(self, verdict: str | None = None, error: BaseException | None = None) -> None:
        self.verdict = verdict
        self.error = error
        self.asked = 0
        self.connects = 0
        self.transports: list[FakeTransport] = []
        self.protocols: list[Any] = []

    async def __call__(self, bookie_id: str, factory: Any) -> Any:
        self.connects += 1
        if self.error is not None:
            raise self.error
        transport = FakeTransport()
        protocol = factory()
        protocol.connection_made(transport)
        self.transports.append(transport)
        self.protocols.append(protocol)
        return transport, protocol

    async def explain_refusal(self, bookie_id: str, timeout_s: float) -> str | None:
        self.asked += 1
        await asyncio.sleep(0.01)  # a probe takes a moment: sends meanwhile must wait
        return self.verdict


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def first_request(transport: FakeTransport) -> Any:
    return decode_request(FrameDecoder(1 << 20).feed(b"".join(transport.written))[0])


def info(ch: BookieChannel) -> asyncio.Future[Any]:
    return ch.request(BookieInfoRequest(ch.next_request_id()), 5.0)


# ---------------------------------------------------------------- the channel's logic


async def test_a_refused_token_fails_every_request_at_once_and_sends_until_the_backoff_ends(
) -> None:
    connector = FakeConnector()
    ch = BookieChannel("b:1", connector=connector, token=b"wrong", **OPTIONS)
    first, second = info(ch), info(ch)
    got: list[Any] = []
    ch.send_adds(AddGroup(7, b"k", 0, -1, [0, 1], [b"a", b"b"], Answers(got), 5.0))
    await turns()
    assert ch.connected and connector.connects == 1
    auth = first_request(connector.transports[0])
    assert isinstance(auth, AuthRequest)  # first on the wire; the bookie refuses it
    ch.data_received(encode_response(AuthResponse(auth.request_id, Status.UNAUTHORIZED)))
    for fut in (first, second):
        with pytest.raises(UnauthorizedAccessError, match=r"bookie b:1: it refused this "
                           r"client's token.*--auth-tokens-file"):
            await fut
    assert [type(r) for r in got] == [UnauthorizedAccessError] * 2
    assert connector.transports[0].closed and not ch.connected
    assert "wrong" not in str(got[0])  # never the token itself
    # during the back-off: refused at once with the same cause, no new connection
    with pytest.raises(UnauthorizedAccessError, match="token"):
        await info(ch)
    assert connector.connects == 1 and connector.asked == 0
    # the back-off ends: the next send connects again, and a token accepted resets it
    ch.reset_backoff()
    third = info(ch)
    await turns()
    assert connector.connects == 2
    auth = first_request(connector.transports[1])
    assert isinstance(auth, AuthRequest)
    ch.data_received(encode_response(AuthResponse(auth.request_id, Status.OK)))
    ch.data_received(encode_response(BookieInfoResponse(auth.request_id - 1, Status.OK,
                                                        "b:1", "writable", 1, 2, "v")))
    assert (await third).status == Status.OK
    await ch.close()


async def test_a_silent_close_the_connector_explains_is_a_refusal() -> None:
    connector = FakeConnector(verdict="it refused this client's certificate")
    ch = BookieChannel("b:1", connector=connector, **OPTIONS)
    sent = info(ch)
    got: list[Any] = []
    ch.send_adds(AddGroup(7, b"k", 0, -1, [0], [b"a"], Answers(got), 5.0))
    await turns()
    assert not ch.judging
    ch.connection_lost(None)  # closed before any answer
    assert ch.judging and not sent.done(), "a read waits for the verdict"
    # an add fails at once, as on any lost connection (a writer must stop completing
    # entries without this bookie), and its writer asks the verdict before replacing it
    assert len(got) == 1 and isinstance(got[0], BookieUnavailableError)
    during = info(ch)  # queued while the connector is asked
    started = time.monotonic()
    refusal = await ch.verdict()
    assert isinstance(refusal, UnauthorizedAccessError) and not ch.judging
    assert str(refusal) == "bookie b:1: it refused this client's certificate"
    with pytest.raises(UnauthorizedAccessError, match="bookie b:1: it refused this client's "
                       "certificate"):
        await sent
    with pytest.raises(UnauthorizedAccessError, match="certificate"):
        await during
    assert time.monotonic() - started < 1.0
    assert connector.asked == 1 and connector.connects == 1
    with pytest.raises(UnauthorizedAccessError):  # the back-off: no new connection
        await info(ch)
    assert connector.connects == 1
    assert await ch.verdict() is refusal
    await ch.close()


async def test_a_silent_close_without_a_verdict_is_a_lost_connection() -> None:
    connector = FakeConnector(verdict=None)
    ch = BookieChannel("b:1", connector=connector, **OPTIONS)
    sent = info(ch)
    await turns()
    ch.connection_lost(ConnectionResetError("reset by peer"))
    assert ch.judging
    assert await ch.verdict() is None and not ch.judging
    with pytest.raises(BookieUnavailableError, match="lost: reset by peer"):
        await sent
    assert connector.asked == 1
    again = info(ch)  # no back-off after a lost connection: it reconnects at once
    await turns()
    assert connector.connects == 2 and not again.done()
    await ch.close()


async def test_a_connection_that_answered_is_never_taken_for_a_refusal() -> None:
    connector = FakeConnector(verdict="refused")
    ch = BookieChannel("b:1", connector=connector, **OPTIONS)
    first = info(ch)
    await turns()
    ch.data_received(encode_response(BookieInfoResponse(1, Status.OK, "b:1", "writable",
                                                        1, 2, "v")))
    await first
    second = info(ch)
    await turns()
    ch.connection_lost(None)
    with pytest.raises(BookieUnavailableError, match="closed by peer"):
        await second
    assert connector.asked == 0
    await ch.close()


async def test_closing_the_channel_while_the_verdict_is_awaited_fails_what_was_sent() -> None:
    connector = FakeConnector(verdict="refused")
    ch = BookieChannel("b:1", connector=connector, **OPTIONS)
    sent = info(ch)
    await turns()
    ch.connection_lost(None)
    await ch.close()
    with pytest.raises(BookieUnavailableError, match="closed"):
        await sent


@pytest.mark.parametrize(("error", "explained", "expected"), [
    (ssl.SSLCertVerificationError(1, "certificate verify failed"), False,
     UnauthorizedAccessError),
    (ConnectionResetError(104, "reset"), True, UnauthorizedAccessError),
    (ConnectionRefusedError(111, "refused"), False, BookieUnavailableError),
    (TimeoutError(), False, BookieUnavailableError),
])
async def test_a_failed_connect_is_a_refusal_only_when_shown(
        error: BaseException, explained: bool, expected: type[Exception]) -> None:
    """A certificate this client rejects is a refusal as it is; a handshake cut short
    is one if the connector shows it; a connection refused or timed out never is (the
    connector is not even asked)."""
    connector = FakeConnector(verdict="it refused this client's certificate", error=error)
    ch = BookieChannel("b:1", connector=connector, **OPTIONS)
    with pytest.raises(expected, match="b:1"):
        await info(ch)
    assert connector.asked == (1 if explained else 0)
    await ch.close()


def test_credential_refusal_reads_only_alerts_about_credentials() -> None:
    for reason in sorted(CREDENTIAL_ALERTS):
        alert = ssl.SSLError(1, f"[SSL: {reason}] alert")
        alert.reason = reason
        assert credential_refusal(alert) is not None and reason in str(credential_refusal(alert))
    for reason in ("SSLV3_ALERT_BAD_RECORD_MAC", "UNEXPECTED_EOF_WHILE_READING",
                   "WRONG_VERSION_NUMBER", None):
        other = ssl.SSLError(1, "other")
        other.reason = reason
        assert credential_refusal(other) is None
    assert credential_refusal(ConnectionResetError()) is None
    assert credential_refusal(None) is None
    assert "did not verify" in str(credential_refusal(ssl.SSLCertVerificationError(1, "x")))
    assert may_be_silent_refusal(ConnectionResetError()) and may_be_silent_refusal(
        ssl.SSLEOFError())
    assert not may_be_silent_refusal(ConnectionRefusedError())
    assert not may_be_silent_refusal(TimeoutError())


# ---------------------------------------------------------------- real servers


class Pki:
    """A bookies' CA, a server certificate for 127.0.0.1, a client certificate of
    that CA and one of another CA, as files and contexts."""

    def __init__(self, tmp: Path) -> None:
        self.ca = trustme.CA()
        self.server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.ca_file = tmp / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.client_files = self._write(tmp, "good", self.ca.issue_cert("asyncbk-client"))
        self.stranger_files = self._write(tmp, "stranger",
                                          trustme.CA().issue_cert("asyncbk-client"))

    @staticmethod
    def _write(tmp: Path, name: str, cert: trustme.LeafCert) -> tuple[str, str]:
        cert_file, key_file = tmp / f"{name}.pem", tmp / f"{name}.key"
        cert.cert_chain_pems[0].write_to_path(str(cert_file))
        cert.private_key_pem.write_to_path(str(key_file))
        return str(cert_file), str(key_file)

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.server.configure_cert(ctx)
        self.ca.configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def client_context(self, files: tuple[str, str] | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if files is not None:
            ctx.load_cert_chain(*files)
        return ctx


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


class Echo(asyncio.Protocol):
    """Answers nothing (it only has to accept, or refuse, the handshake)."""


@contextlib.asynccontextmanager
async def server(ctx: ssl.SSLContext | None, *,
                 close_at_once: bool = False) -> AsyncIterator[str]:
    """A loopback server (TLS with ``ctx``, requiring client certificates as the
    cluster's bookies do); its bookie id."""

    class Closer(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            transport.close()

    srv = await asyncio.get_running_loop().create_server(
        Closer if close_at_once else Echo, "127.0.0.1", 0, ssl=ctx)
    try:
        yield f"127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    finally:
        srv.close()
        await srv.wait_closed()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def first_answer(bookie: str, connector: TcpConnector,
                       token: bytes | None = b"t") -> BaseException | None:
    ch = BookieChannel(bookie, connector=connector, token=token, **OPTIONS)
    try:
        async with asyncio.timeout(10):
            await ch.request(ReadRequest(ch.next_request_id(), 1, 0, 0, b""), 5.0)
    except (UnauthorizedAccessError, BookieUnavailableError) as exc:
        return exc
    finally:
        await ch.close()
    return None


async def test_speaks_tls_tells_a_tls_server_from_anything_else(pki: Pki) -> None:
    async with server(pki.server_context()) as tls, server(None, close_at_once=True) as plain:
        assert await speaks_tls("127.0.0.1", int(tls.split(":")[1]), 2.0)
        assert not await speaks_tls("127.0.0.1", int(plain.split(":")[1]), 2.0)
    assert not await speaks_tls("127.0.0.1", free_port(), 2.0)


async def test_a_certificate_of_another_ca_is_refused_fast_with_the_cause(pki: Pki) -> None:
    async with server(pki.server_context()) as bookie:
        started = time.monotonic()
        err = await first_answer(bookie, TcpConnector(
            ssl_context=pki.client_context(pki.stranger_files)))
        assert isinstance(err, UnauthorizedAccessError), err
        assert f"bookie {bookie}" in str(err) and "certificate" in str(err)
        err = await first_answer(bookie, TcpConnector(ssl_context=pki.client_context(None)))
        assert isinstance(err, UnauthorizedAccessError) and "certificate" in str(err)
        assert time.monotonic() - started < 5.0
        # with the right certificate, nothing is refused (the server answers nothing)
        ch = BookieChannel(bookie, connector=TcpConnector(
            ssl_context=pki.client_context(pki.client_files)), **OPTIONS)
        fut = ch.request(ReadRequest(ch.next_request_id(), 1, 0, 0, b""), 0.5)
        with pytest.raises(asyncio.TimeoutError):  # asyncbk's TimeoutError: no answer
            await fut
        await ch.close()


async def test_a_close_the_bookie_does_not_repeat_is_no_refusal(pki: Pki) -> None:
    """A TLS bookie that ends one connection of a client it accepts (a reset, a restart,
    a loaded machine) before answering: the connector's second look, a session with
    the client's own credentials, stays open, so that close is a lost connection, not
    a refusal that would make the client's ledgers unusable (this once failed a
    good writer in CI)."""
    closed_once: list[bool] = []

    class ClosesTheFirst(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            if not closed_once:
                closed_once.append(True)
                transport.close()

    srv = await asyncio.get_running_loop().create_server(
        ClosesTheFirst, "127.0.0.1", 0, ssl=pki.server_context())
    bookie = f"127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    good = TcpConnector(ssl_context=pki.client_context(pki.client_files))
    try:
        err = await first_answer(bookie, good, token=None)
        assert closed_once and not isinstance(err, UnauthorizedAccessError), err
        assert await good.explain_refusal(bookie, 2.0) is None
        # the same server refuses a certificate of another CA, and is said to
        stranger = TcpConnector(ssl_context=pki.client_context(pki.stranger_files))
        said = await stranger.explain_refusal(bookie, 2.0)
        assert said is not None and "certificate" in said
    finally:
        srv.close()
        await srv.wait_closed()
    # a bookie gone: its silence is not shown to be a refusal
    assert await good.explain_refusal(f"127.0.0.1:{free_port()}", 2.0) is None


async def test_tls_session_end_tells_an_accepted_session_from_a_refused_one(
        pki: Pki) -> None:
    def connect(bookie: str, files: Any) -> Any:
        return functools.partial(TcpConnector(ssl_context=pki.client_context(files)), bookie)

    async with server(pki.server_context()) as bookie:
        assert await tls_session_end(connect(bookie, pki.client_files), 2.0,
                                     hold_s=0.3) is None
        ended = await tls_session_end(connect(bookie, pki.stranger_files), 2.0, hold_s=2.0)
        assert ended is not None
    assert isinstance(await tls_session_end(connect(f"127.0.0.1:{free_port()}",
                                                    pki.client_files), 2.0), OSError)


async def test_a_plain_client_of_a_tls_bookie_is_told_to_use_tls(pki: Pki) -> None:
    async with server(pki.server_context()) as bookie:
        err = await first_answer(bookie, TcpConnector())
    assert isinstance(err, UnauthorizedAccessError), err
    assert f"bookie {bookie}: it serves TLS" in str(err) and "ssl=" in str(err)


async def test_an_untrusted_bookie_certificate_is_this_clients_refusal(
        pki: Pki, tmp_path: Path) -> None:
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    async with server(pki.server_context()) as bookie:
        err = await first_answer(bookie, TcpConnector(
            ssl_context=ssl.create_default_context(cafile=str(other_ca))))
    assert isinstance(err, UnauthorizedAccessError) and "did not verify" in str(err)


async def test_network_failures_stay_unavailability(pki: Pki) -> None:
    """A server that closes every connection at once (a dying bookie, a proxy whose
    bookie is gone) and a port nothing listens on: BookieUnavailableError, with or
    without TLS on the client's side."""
    async with server(None, close_at_once=True) as closing:
        for connector in (TcpConnector(), TcpConnector(
                ssl_context=pki.client_context(pki.client_files))):
            err = await first_answer(closing, connector)
            assert isinstance(err, BookieUnavailableError), err
    err = await first_answer(f"127.0.0.1:{free_port()}", TcpConnector())
    assert isinstance(err, BookieUnavailableError), err


@contextlib.contextmanager
def alerting_server(ctx: ssl.SSLContext) -> Iterator[str]:
    """A blocking TLS server in a thread: unlike asyncio's, OpenSSL's own socket layer
    sends the alert that refuses a handshake (as a TLS terminator would)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)  # (so that the thread sees ``stop`` soon)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            tls = ctx.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
            with tls, contextlib.suppress(OSError):
                try:
                    tls.do_handshake()  # fails: OpenSSL sends the alert
                except ssl.SSLError:
                    tls.shutdown(socket.SHUT_WR)  # then EOF, after the alert
                    tls.settimeout(5)
                    while tls.recv(65536):  # (read what the client sent: close, not reset)
                        pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(10)
        listener.close()


async def test_a_tls_alert_refusing_the_certificate_is_named(pki: Pki) -> None:
    with alerting_server(pki.server_context()) as bookie:
        err = await first_answer(bookie, TcpConnector(
            ssl_context=pki.client_context(pki.stranger_files)))
    assert isinstance(err, UnauthorizedAccessError), err
    assert "ALERT" in str(err) and f"bookie {bookie}" in str(err)


class InfoHandler:
    """A bookie's request handler: BOOKIE_INFO answered, anything else NO_ENTRY."""

    def handle(self, request: Request, conn: ServerConnection) -> None:
        if isinstance(request, BookieInfoRequest):
            conn.respond(BookieInfoResponse(request.request_id, Status.OK, "b", "writable",
                                            1, 2, "v"))
        else:
            conn.respond(refusal(request, Status.NO_ENTRY))


@contextlib.asynccontextmanager
async def plain_bookie(tokens: list[bytes] | None = None) -> AsyncIterator[str]:
    listener = BookieListener(InfoHandler(), frame_bytes_max=1 << 20,
                              write_buffer_bytes_high=1 << 20, connections_max=16,
                              tokens=tokens)
    port = await listener.start("127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await listener.close()


async def test_speaks_plain_protocol_finds_a_bookie_without_tls(pki: Pki) -> None:
    async with plain_bookie() as open_bookie, plain_bookie([b"t"]) as guarded, \
            server(pki.server_context()) as tls, server(None, close_at_once=True) as closing:
        for bookie, expected in ((open_bookie, True), (guarded, True), (tls, False),
                                 (closing, False)):
            assert await speaks_plain_protocol("127.0.0.1", int(bookie.split(":")[1]),
                                               2.0) is expected, bookie
    assert not await speaks_plain_protocol("127.0.0.1", free_port(), 2.0)


async def test_a_tls_client_of_a_plain_bookie_is_told_so(pki: Pki) -> None:
    async with plain_bookie([b"t"]) as bookie:
        err = await first_answer(bookie, TcpConnector(
            ssl_context=pki.client_context(pki.client_files)))
        assert isinstance(err, UnauthorizedAccessError), err
        assert f"bookie {bookie}: it does not serve TLS" in str(err)
        # and without TLS, the same bookie answers
        assert await first_answer(bookie, TcpConnector()) is None
