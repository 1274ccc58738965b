"""Calls to an etcd cluster (>= 3.4), through etcd3-py's ``AioClient``: the
connection plumbing under :class:`~asyncbk.meta.etcd.EtcdMetadataStore`.

Failure handling: every call is bounded by ``timeout_s`` (asyncbk's
TimeoutError).  With several endpoints, a call that cannot connect moves on
to the next endpoint (each endpoint is tried once per call; a lone endpoint
twice).  A call whose
connection broke *after* the request was sent may or may not have been
applied: reads and idempotent writes are retried on the next endpoint, but a
compare-and-swap is not (a retry could report a conflict with its own first
attempt); it raises MetadataError saying the outcome is unknown, and the
caller re-reads.

With a user, each endpoint's client authenticates before its first call, and
a token etcd forgot is renewed and the refused call repeated.  A watch
(:meth:`EtcdClient.watch_prefix`) survives failures by re-listing and
watching again.

etcd3-py's constructor probes the server version with a *blocking*
``requests.get`` and, failing that, assumes etcd 3.3 and its ``/v3beta``
gateway prefix, which etcd 3.5 no longer serves.
:func:`~asyncbk.meta.etcd3_adapter.new_client` skips that probe (the adapter
holds every etcd3-py internal asyncbk uses); :meth:`EtcdClient.probe` asks
``/version`` asynchronously instead and requires etcd >= 3.4 (the ``/v3``
prefix).
"""

from __future__ import annotations

import asyncio
import builtins
import os
import random
import socket
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any, TypeVar

import aiohttp
from etcd3.errors import (
    ErrAuthFailed,
    ErrAuthNotEnabled,
    ErrInvalidAuthToken,
    ErrPermissionDenied,
    ErrUserEmpty,
    Etcd3Exception,
)

from ..backoff import Backoff
from ..errors import BKError, MetadataError
from ..errors import TimeoutError as BKTimeoutError
from ..log import get_logger
from . import keys
from .etcd3_adapter import new_client, rpc_url
from .etcd_stream import stream_json

T = TypeVar("T")

_log = get_logger(component="meta.etcd")

ENDPOINT_DEFAULT: tuple[str, int] = ("127.0.0.1", 2379)
TIMEOUT_S_DEFAULT = 10.0
ETCD_VERSION_MIN = (3, 4)
WATCH_BACKOFF_S_INITIAL = 0.1
WATCH_BACKOFF_S_MAX = 5.0
WATCH_BACKOFF_JITTER = 0.5
"""Each watch back-off is drawn from [1 - this, 1] of its delay, so that many watchers
losing etcd at once do not come back in lockstep."""

# Failures where the request certainly never reached etcd: always safe to retry.
_NOT_SENT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientConnectorError,) + (
    (aiohttp.ConnectionTimeoutError,) if hasattr(aiohttp, "ConnectionTimeoutError") else ()
)
_GRPC_UNAVAILABLE = 14


def _refusal_hint(exc: BaseException) -> str:
    if "CommonName" in str(exc):
        return (" (with authentication on, etcd's JSON gateway, which asyncbk uses, refuses "
                "client certificates that have a common name: issue the certificate asyncbk "
                "presents to etcd without a CN, its names in subjectAltName only)")
    return ""


def etcd_key(key: str) -> bytes:
    return key.encode()


def etcd_prefix_end(prefix: str) -> bytes:
    # keys.prefix_end hands back the incremented UTF-8 bytes as latin-1 text.
    return keys.prefix_end(prefix).encode("latin-1")


def _is_unavailable(exc: Etcd3Exception) -> bool:
    return getattr(exc, "code", None) == _GRPC_UNAVAILABLE or getattr(exc, "status", None) == 503


class EtcdClient:
    """Calls to the etcd cluster at ``endpoints``, under the key prefix ``root``,
    with the timeout, endpoint fail-over and authentication of the module
    docstring.

    The constructor does no I/O; its clients (one aiohttp session per endpoint)
    are opened on first use, inside the running loop.
    """

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        root: str,
        timeout_s: float,
        *,
        watch_backoff_s_max: float = WATCH_BACKOFF_S_MAX,
        ssl_context: ssl.SSLContext | None = None,
        user: str | None = None,
        password: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if (user is None) != (password is None):
            raise ValueError("etcd authentication needs both a user name and a password")
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.root = root
        """The key prefix of the calls (for messages: what a user needs permission on)."""
        self.endpoints: list[tuple[str, int]] = [(str(h), int(p)) for h, p in endpoints]
        self.timeout_s = float(timeout_s)
        self._watch_backoff_s_max = watch_backoff_s_max
        self._rng = rng
        """The watch back-off's jitter (None: a process-wide generator)."""
        self._ssl_context = ssl_context
        self.user = user
        """The etcd user this client authenticates as (None: etcd without auth)."""
        self._password = password
        self._auth_lock = asyncio.Lock()
        self._clients: list[Any] = [None] * len(self.endpoints)
        self._current = 0
        self._closed = False
        self._closed_event = asyncio.Event()

    def _endpoint_text(self, index: int) -> str:
        host, port = self.endpoints[index]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def _all_endpoints_text(self) -> str:
        return ", ".join(self._endpoint_text(i) for i in range(len(self.endpoints)))

    def _client(self, index: int) -> Any:
        if self._closed:
            raise MetadataError("etcd metadata store is closed")
        client = self._clients[index]
        if client is None:
            host, port = self.endpoints[index]
            # The whole call is bounded by asyncio.timeout(timeout_s); the connect
            # timeout only keeps one dead endpoint from eating all of that budget.
            client = new_client(host, port, self.timeout_s / len(self.endpoints),
                                self._ssl_context)
            self._clients[index] = client
        return client

    async def _authed_client(self, index: int) -> Any:
        """The client of endpoint ``index``, authenticated first when this store has
        a user (etcd hands out a token, sent with every later request)."""
        client = self._client(index)
        if self.user is None or client.token:
            return client
        async with self._auth_lock:  # one authentication at a time (etcd hashes with bcrypt)
            if client.token:
                return client
            try:
                # Not etcd3-py's auth(), which clears the token while it waits: calls
                # running meanwhile would go out without one.
                client.token = (await client.authenticate(self.user, self._password)).token
            except (ErrAuthFailed, ErrUserEmpty):
                raise MetadataError(
                    f"etcd at {self._endpoint_text(index)} refused user {self.user!r}: wrong "
                    "user name or password (check --etcd-user and --etcd-password-file)"
                ) from None
            except ErrAuthNotEnabled:
                raise MetadataError(
                    f"etcd at {self._endpoint_text(index)} has authentication disabled, but "
                    f"user {self.user!r} was given: drop --etcd-user, or enable auth in etcd"
                ) from None
        return client

    def _forget_token(self, index: int, exc: BaseException) -> bool:
        """Whether ``exc`` says the token of endpoint ``index`` is no longer valid (etcd
        drops a simple token unused for ``--auth-token-ttl``, and all of them when it
        restarts); if so the token is forgotten, so the next call authenticates anew."""
        if self.user is None or not (isinstance(exc, ErrInvalidAuthToken)
                                     or "invalid auth token" in str(exc)):
            return False
        client = self._clients[index]
        if client is not None:
            client.token = None
        return True

    def _failed(self, index: int) -> None:
        """Move off endpoint ``index`` (unless another call already did)."""
        if self._current == index:
            self._current = (index + 1) % len(self.endpoints)

    async def call(
        self,
        what: str,
        op: Callable[[Any], Awaitable[T]],
        *,
        retry_unknown: bool = False,
    ) -> T:
        """Run ``op(client)`` with the timeout and endpoint fail-over described
        in the module docstring.  ``retry_unknown``: ``op`` may be repeated even
        if a previous attempt possibly took effect (reads, idempotent writes)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._call_with_failover(what, op, retry_unknown)
        except BKTimeoutError:
            raise
        except builtins.TimeoutError:
            raise BKTimeoutError(
                f"etcd {what} got no answer within {self.timeout_s}s"
                f" (endpoint {self._endpoint_text(self._current)})"
            ) from None

    async def _call_with_failover(
        self, what: str, op: Callable[[Any], Awaitable[T]], retry_unknown: bool
    ) -> T:
        failures: list[str] = []
        start = self._current
        # Each endpoint once; a single endpoint twice, because the classic
        # failure there is a pooled connection that etcd closed (restart).
        for attempt in range(max(2, len(self.endpoints))):
            index = (start + attempt) % len(self.endpoints)
            endpoint = self._endpoint_text(index)
            try:
                client = await self._authed_client(index)
                try:
                    return await op(client)
                except (ErrInvalidAuthToken, MetadataError) as exc:
                    # Refused before it was applied: authenticate again and repeat.
                    # (A streamed answer, a lease keep-alive's, says it as MetadataError.)
                    if not self._forget_token(index, exc):
                        raise
                    return await op(await self._authed_client(index))
            except _NOT_SENT_ERRORS as exc:
                failures.append(f"{endpoint} ({_why_unreachable(exc, self.timeout_s)})")
                self._failed(index)
            except aiohttp.ClientError as exc:
                failures.append(f"{endpoint}: {exc!r}")
                self._failed(index)
                if not retry_unknown:
                    raise MetadataError(
                        f"etcd {what} at {endpoint} failed, outcome unknown: {exc!r}"
                    ) from exc
            except ErrPermissionDenied:
                raise MetadataError(
                    f"etcd {what} at {endpoint}: permission denied to user {self.user!r}; "
                    f"grant it read-write on the prefix {self.root or '/'} (etcdctl role "
                    "grant-permission --prefix)") from None
            except (ErrUserEmpty, ErrInvalidAuthToken):
                raise MetadataError(
                    f"etcd {what} at {endpoint}: etcd requires authentication; give "
                    "--etcd-user and --etcd-password-file (or etcd_user/etcd_password)"
                ) from None
            except Etcd3Exception as exc:
                if not _is_unavailable(exc):
                    raise MetadataError(f"etcd {what} at {endpoint} failed: {exc}"
                                        f"{_refusal_hint(exc)}") from exc
                failures.append(f"{endpoint}: {exc}")
                self._failed(index)
                if not retry_unknown:
                    raise MetadataError(
                        f"etcd {what} at {endpoint} failed, outcome unknown: {exc}"
                    ) from exc
            except RuntimeError as exc:
                if self._closed:  # aiohttp: "Session is closed"
                    raise MetadataError("etcd metadata store is closed") from exc
                raise
        raise MetadataError(f"cannot reach etcd for {what}: {', '.join(failures)}")

    async def probe(self) -> None:
        failures: list[str] = []
        per_endpoint_s = self.timeout_s / len(self.endpoints)
        for index in range(len(self.endpoints)):
            client = self._client(index)
            endpoint = self._endpoint_text(index)
            try:
                async with asyncio.timeout(per_endpoint_s):
                    async with client.session.get(rpc_url(client, "/version",
                                                          prefix=False)) as resp:
                        resp.raise_for_status()
                        info = await resp.json(content_type=None)
            except (aiohttp.ClientError, builtins.TimeoutError, ValueError) as exc:
                failures.append(f"{endpoint} ({_why_unreachable(exc, per_endpoint_s)})"
                                f"{self._tls_hint(exc)}")
                continue
            version = str(info.get("etcdserver", "")) if isinstance(info, dict) else ""
            try:
                major_minor = tuple(int(x) for x in version.split(".")[:2])
            except ValueError:
                major_minor = ()
            if len(major_minor) != 2 or major_minor < ETCD_VERSION_MIN:
                raise MetadataError(
                    f"etcd at {endpoint} reports version {version or '?'}; asyncbk needs etcd >= "
                    + ".".join(map(str, ETCD_VERSION_MIN))
                )
            self._current = index
            break
        else:
            raise MetadataError(f"cannot reach etcd at {', '.join(failures)} -- is etcd "
                                "running?")
        # The KV API answers too (and the root prefix is readable).
        key = keys.instance_id(self.root)
        await self.call("probe read", lambda c: c.range(etcd_key(key)), retry_unknown=True)

    def _tls_hint(self, exc: BaseException) -> str:
        if isinstance(exc, aiohttp.ClientSSLError):
            return (" (TLS failed: is the etcd certificate signed by the CA given with "
                    "--etcd-ca/--tls-ca, and does it name this host?)")
        if self._ssl_context is None and (
                isinstance(exc, aiohttp.ServerDisconnectedError)
                or isinstance(exc, aiohttp.ClientResponseError) and exc.status == 400):
            return " (does this etcd serve TLS? then write the URI as etcds://...)"
        refused = isinstance(exc, aiohttp.ClientConnectorError) and isinstance(
            exc.os_error, ConnectionRefusedError | socket.gaierror)  # nothing to do with TLS
        if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError) \
                and self._ssl_context is not None and not refused:
            return " (does this etcd serve TLS? a plain etcd is etcd://...)"
        return ""

    async def range_prefix(self, prefix: str) -> tuple[list[Any], int]:
        """All key-values under ``prefix`` and the revision they were read at."""
        resp = await self.call(
            f"range {prefix}",
            lambda c: c.range(etcd_key(prefix), range_end=etcd_prefix_end(prefix)),
            retry_unknown=True,
        )
        return list(resp.kvs or []), int(resp.header.revision)

    async def watch_prefix(
        self, prefix: str, what: str
    ) -> AsyncGenerator[dict[bytes, bytes], None]:
        """Every key under ``prefix`` with its value, as they change: range them,
        yield them, then follow an etcd watch from the next revision, yielding them
        all again after every batch of events.  ``what`` names the watch in
        messages ("bookie watch").

        Any failure (etcd unreachable, stream broken or ended, watch cancelled
        by compaction) leads to a capped, jittered back-off and a fresh
        range + watch, so no change is lost for good: the next state after a
        hiccup is complete again.  Ends only when cancelled or the client is
        closed.  A watch on a silently partitioned endpoint is not detected
        (etcd sends nothing on an idle watch); it recovers once the
        connection actually breaks.
        """
        backoff = Backoff(min(WATCH_BACKOFF_S_INITIAL, self._watch_backoff_s_max),
                          self._watch_backoff_s_max, jitter=WATCH_BACKOFF_JITTER, rng=self._rng)
        while not self._closed:
            stream_index: int | None = None
            try:
                kvs, revision = await self.range_prefix(prefix)  # fails over by itself
                state = {bytes(kv.key): bytes(kv.value or b"") for kv in kvs}
                yield dict(state)
                stream_index = self._current
                request = {
                    "create_request": {
                        "key": etcd_key(prefix),
                        "range_end": etcd_prefix_end(prefix),
                        "start_revision": revision + 1,
                    }
                }
                stream = stream_json(
                    await self._authed_client(stream_index), "/watch", request,
                    connect_timeout_s=self.timeout_s,
                )
                async with aclosing(stream):
                    while (result := await self._next_unless_closed(stream)) is not None:
                        if result.get("canceled"):
                            raise MetadataError(
                                f"etcd cancelled the {what}: "
                                f"{result.get('cancel_reason') or 'no reason given'}"
                                f" (compact revision {result.get('compact_revision', 0)})"
                            )
                        if result.get("created"):
                            backoff.reset()
                        events = result.get("events") or []
                        if not events:
                            continue
                        for event in events:
                            kv = event.get("kv") or {}
                            key = bytes(kv.get("key") or b"")
                            if getattr(event.get("type"), "value", event.get("type")) == "DELETE":
                                state.pop(key, None)
                            else:
                                state[key] = bytes(kv.get("value") or b"")
                        yield dict(state)
                if self._closed:
                    return
                _log.info(f"{what} stream ended; re-listing", root=self.root)
            except (BKError, aiohttp.ClientError, OSError) as exc:
                if self._closed:
                    return
                if stream_index is not None and isinstance(exc, aiohttp.ClientError | OSError):
                    self._failed(stream_index)
                if stream_index is not None:
                    self._forget_token(stream_index, exc)
                _log.warning(f"{what} failed; re-listing", root=self.root, error=repr(exc))
            await self._sleep_unless_closed(backoff.next_s())

    async def _next_unless_closed(
        self, stream: AsyncIterator[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """The stream's next result; None when it ends or the client is closed.

        Closing the aiohttp session does not reliably wake a reader blocked on
        a streaming response, so the read is raced against ``close()`` and
        cancelled (which closes the response) if the client closes first."""
        step = asyncio.ensure_future(anext(stream))
        closed = asyncio.ensure_future(self._closed_event.wait())
        try:
            await asyncio.wait({step, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            step.cancel()  # no-op if done
            await asyncio.wait({step, closed})
        if step.cancelled():
            return None
        try:
            return step.result()
        except StopAsyncIteration:
            return None

    async def _sleep_unless_closed(self, delay_s: float) -> None:
        try:
            async with asyncio.timeout(delay_s):
                await self._closed_event.wait()
        except builtins.TimeoutError:
            pass

    async def close(self) -> None:
        """Close every HTTP session; watchers end, later calls raise MetadataError."""
        self._closed = True
        self._closed_event.set()
        clients = [c for c in self._clients if c is not None]
        self._clients = [None] * len(self.endpoints)
        for client in clients:
            await client.close()


def _why_unreachable(exc: BaseException, timeout_s: float) -> str:
    """A few words on why an endpoint could not be reached: "connection refused", "no
    answer in 3.3 s", "no such host" (rather than aiohttp's text, which repeats the
    address and names an SSL context even for plain HTTP)."""
    if isinstance(exc, builtins.TimeoutError | aiohttp.ServerTimeoutError):
        return f"no answer in {timeout_s:.1f} s"
    if isinstance(exc, aiohttp.ClientConnectorError) and \
            not isinstance(exc, aiohttp.ClientSSLError):
        os_error = exc.os_error
        if isinstance(os_error, socket.gaierror):
            return f"cannot resolve the host: {(os_error.strerror or 'no address').lower()}"
        if isinstance(os_error, OSError) and os_error.errno is not None:
            return os.strerror(os_error.errno).lower()
        return "cannot connect"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "closed the connection"
    return str(exc) or type(exc).__name__
