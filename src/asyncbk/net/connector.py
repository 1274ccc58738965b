"""How a client channel reaches a bookie (:class:`TcpConnector`), and how it tells a
refusal of its credentials from a bookie that is unreachable.

A bookie refuses a client in three ways, and only the first is said in words:

* a wrong token: the bookie answers the AUTH request UNAUTHORIZED, then closes;
* a TLS handshake it refuses (a client certificate its CA did not sign, none where
  one is required, a client without TLS): the bookie's TLS layer closes the
  connection without an alert, during the handshake (TLS 1.2) or right after it
  (TLS 1.3, where the client's side of the handshake is over first);
* a TLS handshake *this client* refuses (the bookie's certificate does not verify):
  ``ssl.SSLCertVerificationError`` at connect.

A TLS terminator in front of a bookie may send an alert instead of closing
silently (:func:`credential_refusal` reads the alerts that mean "your
credentials").  For a silent close, :meth:`TcpConnector.explain_refusal` asks the
address again, with a TLS handshake that offers no certificate and checks none
(:func:`speaks_tls`): if a TLS server answers it, the bookie is up and speaks TLS.
Then a second handshake offers this client's own credentials
(:func:`tls_session_end`): if the bookie keeps that session open, it accepts them,
and the connection it closed was lost for some other reason (a reset, a restart, a
loaded machine); if it ends that session too, or refuses it with an alert, the
close was a refusal.  A bookie that is down, a network that drops or resets
connections, a proxy whose bookie is gone: none of them completes a TLS handshake,
so none is taken for a refusal.
The mirror case, a client with TLS and a bookie without, is shown the same way: a
bookie answers a plain BOOKIE_INFO (:func:`speaks_plain_protocol`).
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from ..errors import ProtocolError
from ..proto import BookieInfoRequest, FrameDecoder, decode_response, encode_request
from ..types import BookieId, parse_bookie_id

Connector = Callable[[BookieId, Callable[[], asyncio.Protocol]], Awaitable[Any]]
"""Opens a connection to a bookie and attaches the protocol made by the factory
(TCP by default; the simulator and fault proxies plug in their own)."""


@runtime_checkable
class ExplainsRefusals(Protocol):
    """A connector that can tell whether a bookie that closed a connection before
    answering anything refused this client's credentials."""

    async def explain_refusal(self, bookie_id: BookieId, timeout_s: float) -> str | None:
        """Why ``bookie_id`` refused this client (for an UnauthorizedAccessError),
        or None when its silence cannot be shown to be a refusal."""
        ...


CREDENTIAL_ALERTS = frozenset({
    "SSLV3_ALERT_BAD_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "SSLV3_ALERT_CERTIFICATE_REVOKED",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "SSLV3_ALERT_HANDSHAKE_FAILURE",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED",
    "TLSV1_ALERT_ACCESS_DENIED",
    "TLSV1_ALERT_INSUFFICIENT_SECURITY",
    "TLSV1_ALERT_PROTOCOL_VERSION",
    "TLSV1_ALERT_UNKNOWN_CA",
})
"""OpenSSL's names (``ssl.SSLError.reason``) of the TLS alerts by which a server
refuses a client's certificate or handshake."""

SILENT_CLOSE_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionResetError, ConnectionAbortedError, BrokenPipeError, ssl.SSLEOFError,
    ssl.SSLZeroReturnError)
"""How a TLS handshake that the bookie cut short without a word fails at connect
(a connection refused or timed out never got that far)."""


def credential_refusal(exc: BaseException | None) -> str | None:
    """What ``exc`` (from connecting to a bookie, or ending its connection) says about
    this client's credentials, if it is a refusal of them; None for anything else
    (a network failure, a bookie gone)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or exc
        return (f"its TLS certificate did not verify ({detail}): give the client the CA "
                "that signed the bookies' certificates (ssl=..., --tls-ca), and check that "
                "the certificate names the host of the bookie id")
    if isinstance(exc, ssl.SSLError) and exc.reason in CREDENTIAL_ALERTS:
        return (f"it refused the TLS handshake ({exc.reason}): check the client certificate "
                "(ssl=..., --tls-cert): it must be signed by the CA the bookies trust "
                "(--tls-ca) and be valid")
    return None


def may_be_silent_refusal(exc: BaseException | None) -> bool:
    """Whether a connect that failed with ``exc`` may be a TLS handshake the bookie
    refused without an alert (worth :meth:`ExplainsRefusals.explain_refusal`)."""
    return isinstance(exc, SILENT_CLOSE_ERRORS) or (
        isinstance(exc, ssl.SSLError) and exc.reason == "UNEXPECTED_EOF_WHILE_READING")


def _probe_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # (only asks whether TLS answers: nothing is sent)
    return ctx


async def speaks_tls(host: str, port: int, timeout_s: float) -> bool:
    """Whether a TLS server answers at ``host:port``: a handshake offering no client
    certificate and checking none gets through the server's side of it (or a TLS
    alert back).  False when nothing listens, the connection is reset or closed
    before the server's hello, or nothing answers within ``timeout_s``.  Sends no
    application data."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            transport, _ = await loop.create_connection(asyncio.Protocol, host, port,
                                                        ssl=_probe_context())
    except ssl.SSLError as exc:
        return bool(exc.reason) and "ALERT" in str(exc.reason)
    except (OSError, builtins.TimeoutError):
        return False
    transport.abort()
    return True


SESSION_HOLD_S = 1.0
"""How long a bookie must keep a session with this client's credentials open for
:meth:`TcpConnector.explain_refusal` to take them as accepted (a bookie refusing a
certificate ends the session as its handshake completes)."""


class _SessionWatch(asyncio.Protocol):
    def __init__(self, ended: asyncio.Future[BaseException]) -> None:
        self._ended = ended

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._ended.done():
            self._ended.set_result(exc if exc is not None else EOFError("session ended"))


async def tls_session_end(connect: Callable[[Callable[[], asyncio.Protocol]], Any],
                          timeout_s: float,
                          hold_s: float = SESSION_HOLD_S) -> BaseException | None:
    """How a session opened by ``connect`` (a protocol factory in, ``(transport,
    protocol)`` out: a :class:`TcpConnector` bound to a bookie, so with this client's
    own credentials) ends within ``hold_s`` of its handshake: the error that failed
    the handshake or ended the session (an ``EOFError`` for a plain close), or None
    if the server kept it open that long (it accepts the credentials).  Sends no
    application data."""
    ended: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
    try:
        async with asyncio.timeout(timeout_s):
            transport, _ = await connect(lambda: _SessionWatch(ended))
    except (OSError, builtins.TimeoutError) as exc:  # (ssl.SSLError is an OSError)
        return exc
    try:
        async with asyncio.timeout(hold_s):
            return await ended
    except builtins.TimeoutError:
        return None
    finally:
        transport.abort()


async def speaks_plain_protocol(host: str, port: int, timeout_s: float) -> bool:
    """Whether a bookie answers at ``host:port`` without TLS: a BOOKIE_INFO request
    (read-only) gets a well-formed answer, whatever its status (a bookie with tokens
    answers UNAUTHORIZED)."""
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[bool] = loop.create_future()

    class Probe(asyncio.Protocol):
        def __init__(self) -> None:
            self.decoder = FrameDecoder(PROBE_FRAME_BYTES_MAX)

        def data_received(self, data: bytes) -> None:
            if answered.done():
                return
            try:
                bodies = self.decoder.feed(data)
                if bodies:  # (else: wait for the rest of the frame)
                    answered.set_result(decode_response(bodies[0]).request_id == 1)
            except ProtocolError:
                answered.set_result(False)

        def connection_lost(self, exc: Exception | None) -> None:
            if not answered.done():
                answered.set_result(False)

    transport: asyncio.Transport | None = None
    try:
        async with asyncio.timeout(timeout_s):
            transport, _ = await loop.create_connection(Probe, host, port)
            transport.write(encode_request(BookieInfoRequest(1)))
            return await answered
    except (OSError, builtins.TimeoutError):
        return False
    finally:
        if transport is not None:
            transport.abort()


PROBE_FRAME_BYTES_MAX = 64 * 1024
"""The largest answer :func:`speaks_plain_protocol` reads (a BOOKIE_INFO is small)."""


class TcpConnector:
    """Connects over TCP to the bookie id's ``host:port`` (or its entry in
    ``address_map``, e.g. a fault-injecting proxy in front of it); over TLS with
    ``ssl_context``, the bookie's certificate checked against the host of its id
    (unless the context turns hostname checks off).  Explains refusals
    (:class:`ExplainsRefusals`)."""

    def __init__(self, address_map: dict[BookieId, str] | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._overrides = dict(address_map or {})
        self.ssl_context = ssl_context

    def address(self, bookie_id: BookieId) -> tuple[str, int]:
        """Where connections to ``bookie_id`` go."""
        return parse_bookie_id(self._overrides.get(bookie_id, bookie_id))

    async def __call__(self, bookie_id: BookieId,
                       factory: Callable[[], asyncio.Protocol]) -> Any:
        host, port = self.address(bookie_id)
        loop = asyncio.get_running_loop()
        if self.ssl_context is None:
            return await loop.create_connection(factory, host, port)
        return await loop.create_connection(factory, host, port, ssl=self.ssl_context,
                                            server_hostname=parse_bookie_id(bookie_id)[0])

    async def explain_refusal(self, bookie_id: BookieId, timeout_s: float) -> str | None:
        """Why ``bookie_id``, which closed a connection before answering anything (or
        cut its TLS handshake short), refused this client; None unless a TLS server
        answers at its address, or (for a client with TLS) a bookie without TLS (see
        the module docstring)."""
        host, port = self.address(bookie_id)
        if not await speaks_tls(host, port, timeout_s):
            if self.ssl_context is not None and await speaks_plain_protocol(host, port,
                                                                            timeout_s):
                return ("it does not serve TLS and this client connects with TLS: drop "
                        "ssl=... (--tls-ca) for this cluster, or give its bookies "
                        "--tls-cert and --tls-key")
            return None
        if self.ssl_context is None:
            return ("it serves TLS and this client connects without it: pass ssl=... (a "
                    "client context with the CA that signed the bookies' certificates; "
                    "--tls-ca for the tools)")
        ended = await tls_session_end(functools.partial(self, bookie_id), timeout_s,
                                      min(timeout_s, SESSION_HOLD_S))
        if ended is None:  # it keeps a session with these credentials: no refusal
            return None
        said = credential_refusal(ended)
        if said is not None:
            return said
        if not (isinstance(ended, EOFError) or may_be_silent_refusal(ended)):
            return None  # (refused or timed out: the bookie went away meanwhile)
        return ("it serves TLS but ended this client's TLS session before answering "
                "anything: it refused this client's certificate (none given where it "
                "requires one, not signed by the CA it trusts (--tls-ca), or expired); "
                "check the certificate given with ssl=... (--tls-cert, --tls-key)")


def tcp_connector(address_map: dict[BookieId, str] | None = None,
                  ssl_context: ssl.SSLContext | None = None) -> TcpConnector:
    """A :class:`TcpConnector` (the name kept from when it was a closure)."""
    return TcpConnector(address_map, ssl_context)


__all__ = ["CREDENTIAL_ALERTS", "PROBE_FRAME_BYTES_MAX", "Connector", "ExplainsRefusals",
           "TcpConnector", "credential_refusal", "may_be_silent_refusal",
           "speaks_plain_protocol", "speaks_tls", "tcp_connector", "tls_session_end"]
