"""The production metadata store: etcd v3, through etcd3-py's ``AioClient``.

How the :class:`~asyncbk.meta.api.MetadataStore` contract maps onto etcd:

* a metadata *version* is the key's ``mod_revision``; compare-and-swap is a
  transaction comparing it (creation compares ``create_revision == 0``, i.e.
  "absent").  When the compare fails, the same transaction reads the key, so
  that "deleted meanwhile" (NoSuchLedgerError) and "changed meanwhile"
  (MetadataVersionError) are told apart without a second round trip;
* a ledger id is the revision of a put to ``<root>/idgen``: etcd revisions
  are cluster-wide, unique and increasing, so concurrent clients never get
  the same id and need no coordination;
* bookie registrations are keys bound to a lease; registering puts one kind
  (writable/read-only) and deletes the other in one transaction;
* watches and lease keep-alives use :mod:`asyncbk.meta.etcd_stream`, because
  etcd3-py's own streaming is broken on aiohttp >= 3.10.

Failure handling: every call is bounded by ``timeout_s`` (asyncbk's
TimeoutError).  With several endpoints, a call that cannot connect moves on
to the next endpoint (each endpoint is tried once per call; a lone endpoint
twice).  A call whose
connection broke *after* the request was sent may or may not have been
applied: reads and idempotent writes are retried on the next endpoint, but a
compare-and-swap is not (a retry could report a conflict with its own first
attempt); it raises MetadataError saying the outcome is unknown, and the
caller re-reads.

etcd3-py's constructor probes the server version with a *blocking*
``requests.get`` and, failing that, assumes etcd 3.3 and its ``/v3beta``
gateway prefix, which etcd 3.5 no longer serves.  :func:`new_client` skips
that probe; :meth:`EtcdMetadataStore.connect` asks ``/version`` asynchronously
instead and requires etcd >= 3.4 (the ``/v3`` prefix).
"""

from __future__ import annotations

import asyncio
import builtins
import random
import ssl
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any, TypeVar

import aiohttp
from etcd3 import AioClient
from etcd3.baseclient import BaseClient
from etcd3.baseclient import sem as _semver
from etcd3.errors import (
    ErrAuthFailed,
    ErrAuthNotEnabled,
    ErrInvalidAuthToken,
    ErrLeaseNotFound,
    ErrPermissionDenied,
    ErrUserEmpty,
    Etcd3Exception,
)
from etcd3.models import (
    CompareCompareResult,
    CompareCompareTarget,
    RangeRequestSortOrder,
    RangeRequestSortTarget,
)

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import BKError, MetadataError, MetadataVersionError, NoSuchLedgerError
from ..errors import TimeoutError as BKTimeoutError
from ..log import get_logger
from ..types import BookieId
from . import keys
from .api import BookieRegistration, KeyValue, UnderReplicated
from .codec import (
    pack_registration_info,
    pack_underreplicated,
    registrations_from_items,
    unpack_underreplicated,
)
from .etcd_stream import lease_keepalive_once, stream_json
from .model import LedgerMetadata

T = TypeVar("T")

_log = get_logger(component="meta.etcd")

ENDPOINT_DEFAULT: tuple[str, int] = ("127.0.0.1", 2379)
TIMEOUT_S_DEFAULT = 10.0
ETCD_VERSION_MIN = (3, 4)
_ASSUMED_SERVER_VERSION = "3.5.0"
"""What etcd3-py is told the server is: any >= 3.4 selects the ``/v3`` prefix
and the newest request schema it ships (3.3's, a subset of 3.4/3.5's)."""

WATCH_BACKOFF_S_INITIAL = 0.1
WATCH_BACKOFF_S_MAX = 5.0

# Failures where the request certainly never reached etcd: always safe to retry.
_NOT_SENT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientConnectorError,) + (
    (aiohttp.ConnectionTimeoutError,) if hasattr(aiohttp, "ConnectionTimeoutError") else ()
)
_GRPC_UNAVAILABLE = 14


class _AioClient(AioClient):
    """etcd3-py's AioClient without the blocking version probe in its constructor,
    and with TLS from a context of ours.

    etcd3-py builds its own context, and only when given a client certificate:
    without hostname checking, and with no way to trust a CA without presenting
    a certificate.  So its constructor is skipped (``BaseClient``'s runs) and the
    session is made here, on ``ssl_context`` (or plain HTTP without one)."""

    def __init__(self, host: str, port: int, timeout: aiohttp.ClientTimeout,
                 ssl_context: ssl.SSLContext | None) -> None:
        BaseClient.__init__(
            self, host=host, port=port, protocol="https" if ssl_context else "http",
            timeout=timeout, server_version=_ASSUMED_SERVER_VERSION,
            cluster_version=_ASSUMED_SERVER_VERSION)
        self.ssl_context = ssl_context
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=_POOL_SIZE,
                                           ssl=ssl_context if ssl_context else False))

    def _retrieve_version(self) -> None:
        self.server_version_sem = _semver.Version(self.server_version)
        self.cluster_version_sem = _semver.Version(self.cluster_version)

    def __repr__(self) -> str:  # etcd3-py keeps the password on the client
        return f"<etcd client {self.host}:{self.port}>"


_POOL_SIZE = 30


def new_client(host: str, port: int, connect_timeout_s: float = TIMEOUT_S_DEFAULT,
               ssl_context: ssl.SSLContext | None = None) -> Any:
    """An etcd3-py ``AioClient`` for etcd >= 3.4 at ``host:port`` (HTTPS with
    ``ssl_context``), made without the blocking version probe of etcd3-py's
    constructor.  Call it inside the running loop (it opens an aiohttp session);
    ``await client.close()`` it."""
    return _AioClient(host, port, aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
                      ssl_context)


def _key(key: str) -> bytes:
    return key.encode()


def _prefix_end(prefix: str) -> bytes:
    # keys.prefix_end hands back the incremented UTF-8 bytes as latin-1 text.
    return keys.prefix_end(prefix).encode("latin-1")


def _compare(key: str, target: CompareCompareTarget, field: str, value: int) -> dict[str, Any]:
    return {"key": _key(key), "result": CompareCompareResult.EQUAL, "target": target, field: value}


def _compare_mod(key: str, mod_revision: int) -> dict[str, Any]:
    return _compare(key, CompareCompareTarget.MOD, "mod_revision", mod_revision)


def _compare_absent(key: str) -> dict[str, Any]:
    return _compare(key, CompareCompareTarget.CREATE, "create_revision", 0)


def _failure_kvs(resp: Any) -> list[Any]:
    """The key-values read by the single range op of a failed transaction."""
    responses = resp.responses or []
    if not responses or responses[0].response_range is None:
        raise MetadataError("etcd transaction answered without the expected range result")
    return list(responses[0].response_range.kvs or [])


def _is_unavailable(exc: Etcd3Exception) -> bool:
    return getattr(exc, "code", None) == _GRPC_UNAVAILABLE or getattr(exc, "status", None) == 503


class _Backoff:
    """Capped exponential back-off with jitter (so that many watchers losing
    etcd at once do not come back in lockstep)."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self._initial_s = initial_s
        self._max_s = max_s
        self._failures = 0

    def reset(self) -> None:
        self._failures = 0

    def next_delay_s(self) -> float:
        base = min(self._max_s, self._initial_s * (2 ** min(self._failures, 30)))
        self._failures += 1
        return base * random.uniform(0.5, 1.0)


class EtcdMetadataStore:
    """:class:`~asyncbk.meta.api.MetadataStore` on etcd (>= 3.4).

    Prefer :meth:`connect`, which also checks that etcd answers.  The
    constructor does no I/O; its clients (one aiohttp session per endpoint)
    are opened on first use, inside the running loop.
    """

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]] = (ENDPOINT_DEFAULT,),
        root: str = "",
        timeout_s: float = TIMEOUT_S_DEFAULT,
        *,
        watch_backoff_s_max: float = WATCH_BACKOFF_S_MAX,
        clock: Clock = SYSTEM_CLOCK,
        ssl_context: ssl.SSLContext | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        if (user is None) != (password is None):
            raise ValueError("etcd authentication needs both a user name and a password")
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.root = keys.normalize_root(root)
        self.endpoints: list[tuple[str, int]] = [(str(h), int(p)) for h, p in endpoints]
        self.timeout_s = float(timeout_s)
        self._watch_backoff_s_max = watch_backoff_s_max
        self._clock = clock
        """Wall-clock source of the times this store writes (under-replication marks)."""
        self._ssl_context = ssl_context
        self.user = user
        """The etcd user this store authenticates as (None: etcd without auth)."""
        self._password = password
        self._auth_lock = asyncio.Lock()
        self._clients: list[Any] = [None] * len(self.endpoints)
        self._current = 0
        self._closed = False
        self._closed_event = asyncio.Event()

    @classmethod
    async def connect(
        cls,
        endpoints: Sequence[tuple[str, int]] = (ENDPOINT_DEFAULT,),
        root: str = "",
        timeout_s: float = TIMEOUT_S_DEFAULT,
        *,
        watch_backoff_s_max: float = WATCH_BACKOFF_S_MAX,
        clock: Clock = SYSTEM_CLOCK,
        ssl_context: ssl.SSLContext | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> EtcdMetadataStore:
        """A store whose etcd answered: ``/version`` (>= 3.4) on some endpoint,
        then (as ``user``, when given) a read of the instance id key.  Raises
        MetadataError ("cannot reach etcd at ...: is etcd running?") if no
        endpoint answers, or saying what etcd refused (TLS, user, permission)."""
        store = cls(endpoints, root, timeout_s, watch_backoff_s_max=watch_backoff_s_max,
                    clock=clock, ssl_context=ssl_context, user=user, password=password)
        try:
            await store._probe()
        except BaseException:
            await store.close()
            raise
        return store

    # --- plumbing --------------------------------------------------------

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

    async def _call(
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
                failures.append(f"{endpoint}: {exc}")
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
                    raise MetadataError(f"etcd {what} at {endpoint} failed: {exc}") from exc
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
        raise MetadataError(f"cannot reach etcd for {what}: {'; '.join(failures)}")

    async def _probe(self) -> None:
        failures: list[str] = []
        per_endpoint_s = self.timeout_s / len(self.endpoints)
        for index in range(len(self.endpoints)):
            client = self._client(index)
            endpoint = self._endpoint_text(index)
            try:
                async with asyncio.timeout(per_endpoint_s):
                    async with client.session.get(client._url("/version", prefix=False)) as resp:
                        resp.raise_for_status()
                        info = await resp.json(content_type=None)
            except (aiohttp.ClientError, builtins.TimeoutError, ValueError) as exc:
                failures.append(f"{endpoint}: {str(exc) or type(exc).__name__}"
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
            raise MetadataError(
                f"cannot reach etcd at {self._all_endpoints_text()}: {'; '.join(failures)}"
                " -- is etcd running?"
            )
        # The KV API answers too (and the root prefix is readable).
        key = keys.instance_id(self.root)
        await self._call("probe read", lambda c: c.range(_key(key)), retry_unknown=True)

    def _tls_hint(self, exc: BaseException) -> str:
        if isinstance(exc, aiohttp.ClientSSLError):
            return (" (TLS failed: is the etcd certificate signed by the CA given with "
                    "--etcd-ca/--tls-ca, and does it name this host?)")
        if self._ssl_context is None and (
                isinstance(exc, aiohttp.ServerDisconnectedError)
                or isinstance(exc, aiohttp.ClientResponseError) and exc.status == 400):
            return " (does this etcd serve TLS? then write the URI as etcds://...)"
        if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError) \
                and self._ssl_context is not None:
            return " (does this etcd serve TLS? a plain etcd is etcd://...)"
        return ""

    async def _range_prefix(self, prefix: str) -> tuple[list[Any], int]:
        """All key-values under ``prefix`` and the revision they were read at."""
        resp = await self._call(
            f"range {prefix}",
            lambda c: c.range(_key(prefix), range_end=_prefix_end(prefix)),
            retry_unknown=True,
        )
        return list(resp.kvs or []), int(resp.header.revision)

    # --- ledgers ---------------------------------------------------------

    async def allocate_ledger_id(self) -> int:
        key = keys.idgen(self.root)
        # Repeating this after an unknown outcome only skips an id: retry.
        resp = await self._call(
            "ledger id allocation", lambda c: c.put(_key(key), b""), retry_unknown=True
        )
        ledger_id = int(resp.header.revision)
        if ledger_id <= 0:
            raise MetadataError(f"etcd answered a put with revision {ledger_id}")
        return ledger_id

    async def create_ledger(self, md: LedgerMetadata) -> LedgerMetadata:
        key = keys.ledger(self.root, md.ledger_id)

        def op(c: Any) -> Awaitable[Any]:
            return c.txn(
                compare=[_compare_absent(key)],
                success=[c.put(_key(key), md.to_bytes(), txn_obj=True)],
                failure=[],
            )

        resp = await self._call(f"create ledger {md.ledger_id}", op)
        if not resp.succeeded:
            raise MetadataVersionError(f"ledger {md.ledger_id} already exists")
        return md.replace(version=int(resp.header.revision))

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        key = keys.ledger(self.root, ledger_id)
        resp = await self._call(
            f"read ledger {ledger_id}", lambda c: c.range(_key(key)), retry_unknown=True
        )
        if not resp.kvs:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        kv = resp.kvs[0]
        return LedgerMetadata.from_bytes(kv.value or b"", version=int(kv.mod_revision))

    async def update_ledger(self, md: LedgerMetadata) -> LedgerMetadata:
        key = keys.ledger(self.root, md.ledger_id)

        def op(c: Any) -> Awaitable[Any]:
            return c.txn(
                compare=[_compare_mod(key, md.version)],
                success=[c.put(_key(key), md.to_bytes(), txn_obj=True)],
                failure=[c.range(_key(key), keys_only=True, txn_obj=True)],
            )

        resp = await self._call(f"update ledger {md.ledger_id}", op)
        if resp.succeeded:
            return md.replace(version=int(resp.header.revision))
        kvs = _failure_kvs(resp)
        if not kvs:
            raise NoSuchLedgerError(f"ledger {md.ledger_id} does not exist")
        raise MetadataVersionError(
            f"ledger {md.ledger_id} is at version {int(kvs[0].mod_revision)}, not {md.version}"
        )

    async def delete_ledger(self, ledger_id: int, version: int | None = None) -> None:
        key = keys.ledger(self.root, ledger_id)
        if version is None:
            resp = await self._call(
                f"delete ledger {ledger_id}", lambda c: c.delete_range(_key(key))
            )
            if not resp.deleted:
                raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
            return

        def op(c: Any) -> Awaitable[Any]:
            return c.txn(
                compare=[_compare_mod(key, version)],
                success=[c.delete_range(_key(key), txn_obj=True)],
                failure=[c.range(_key(key), keys_only=True, txn_obj=True)],
            )

        resp = await self._call(f"delete ledger {ledger_id}", op)
        if resp.succeeded:
            return
        kvs = _failure_kvs(resp)
        if not kvs:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        raise MetadataVersionError(
            f"ledger {ledger_id} is at version {int(kvs[0].mod_revision)}, not {version}"
        )

    async def iter_ledger_ids(self, page_size: int = 1000) -> AsyncGenerator[int, None]:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        prefix = keys.ledgers_prefix(self.root)
        start = _key(prefix)
        while True:
            kvs, more = await self._ledger_key_page(start, _prefix_end(prefix), page_size)
            for kv in kvs:
                key = bytes(kv.key).decode(errors="replace")
                try:
                    ledger_id = keys.ledger_id_from_key(self.root, key)
                except ValueError:
                    _log.warning("ignoring malformed ledger key", key=key)
                    continue
                yield ledger_id
            if not more or not kvs:
                return
            start = bytes(kvs[-1].key) + b"\0"

    async def _ledger_key_page(
        self, start: bytes, end: bytes, limit: int
    ) -> tuple[list[Any], bool]:
        """Up to ``limit`` keys in ``[start, end)``, ascending; and whether more follow."""
        resp = await self._call(
            "list ledgers",
            lambda c: c.range(
                start,
                range_end=end,
                limit=limit,
                keys_only=True,
                sort_order=RangeRequestSortOrder.ASCEND,
                sort_target=RangeRequestSortTarget.KEY,
            ),
            retry_unknown=True,
        )
        return list(resp.kvs or []), bool(resp.more)

    # --- leases ----------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> int:
        if ttl_s < 1:
            raise ValueError(f"lease ttl must be >= 1 s, got {ttl_s}")
        # A lease granted by a lost attempt just expires: retry.
        resp = await self._call(
            "lease grant", lambda c: c.lease_grant(int(ttl_s)), retry_unknown=True
        )
        if not resp.ID:
            raise MetadataError(f"etcd granted no lease: {resp}")
        return int(resp.ID)

    async def keepalive_lease(self, lease_id: int) -> int:
        return await self._call(
            f"lease keep-alive {lease_id:#x}",
            lambda c: lease_keepalive_once(c, lease_id, self.timeout_s),
            retry_unknown=True,
        )

    async def revoke_lease(self, lease_id: int) -> None:
        async def op(c: Any) -> None:
            try:
                await c.lease_revoke(lease_id)
            except ErrLeaseNotFound:
                pass  # already expired or revoked: the goal is reached

        await self._call(f"lease revoke {lease_id:#x}", op, retry_unknown=True)

    # --- bookie registry -------------------------------------------------

    async def register_bookie(self, reg: BookieRegistration, lease_id: int) -> None:
        put_key = (keys.bookie_readonly if reg.readonly else keys.bookie_writable)(
            self.root, reg.bookie_id
        )
        other_key = (keys.bookie_writable if reg.readonly else keys.bookie_readonly)(
            self.root, reg.bookie_id
        )
        value = pack_registration_info(reg.info)

        async def op(c: Any) -> Any:
            try:
                return await c.txn(
                    compare=[],
                    success=[
                        c.put(_key(put_key), value, lease=lease_id, txn_obj=True),
                        c.delete_range(_key(other_key), txn_obj=True),
                    ],
                    failure=[],
                )
            except ErrLeaseNotFound:
                raise MetadataError(
                    f"cannot register {reg.bookie_id}: lease {lease_id:#x} does not exist"
                    " (expired or revoked)"
                ) from None

        # Same registration twice is the same state: retry.
        await self._call(f"register bookie {reg.bookie_id}", op, retry_unknown=True)

    async def unregister_bookie(self, bookie_id: BookieId) -> None:
        w = _key(keys.bookie_writable(self.root, bookie_id))
        r = _key(keys.bookie_readonly(self.root, bookie_id))
        await self._call(
            f"unregister bookie {bookie_id}",
            lambda c: c.txn(
                compare=[],
                success=[c.delete_range(w, txn_obj=True), c.delete_range(r, txn_obj=True)],
                failure=[],
            ),
            retry_unknown=True,
        )

    def _registry_view(self, state: dict[bytes, bytes]) -> dict[BookieId, BookieRegistration]:
        return registrations_from_items(
            self.root, ((k.decode(errors="replace"), v) for k, v in sorted(state.items()))
        )

    async def list_bookies(self) -> dict[BookieId, BookieRegistration]:
        kvs, _ = await self._range_prefix(keys.bookies_prefix(self.root))
        return self._registry_view({bytes(kv.key): bytes(kv.value or b"") for kv in kvs})

    async def watch_bookies(self) -> AsyncGenerator[dict[BookieId, BookieRegistration], None]:
        """Range the registry, yield it, then follow an etcd watch from the next
        revision, yielding the full view whenever it changes.

        Any failure (etcd unreachable, stream broken or ended, watch cancelled
        by compaction) leads to a capped, jittered back-off and a fresh
        range + watch, so no change is lost for good: the next view after a
        hiccup is complete again.  Ends only when cancelled or the store is
        closed.  A watch on a silently partitioned endpoint is not detected
        (etcd sends nothing on an idle watch); it recovers once the
        connection actually breaks.
        """
        prefix = keys.bookies_prefix(self.root)
        backoff = _Backoff(WATCH_BACKOFF_S_INITIAL, self._watch_backoff_s_max)
        last: dict[BookieId, BookieRegistration] | None = None
        while not self._closed:
            stream_index: int | None = None
            try:
                kvs, revision = await self._range_prefix(prefix)  # fails over by itself
                state = {bytes(kv.key): bytes(kv.value or b"") for kv in kvs}
                view = self._registry_view(state)
                if view != last:
                    last = view
                    yield dict(view)
                stream_index = self._current
                request = {
                    "create_request": {
                        "key": _key(prefix),
                        "range_end": _prefix_end(prefix),
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
                                "etcd cancelled the bookie watch: "
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
                        view = self._registry_view(state)
                        if view != last:
                            last = view
                            yield dict(view)
                if self._closed:
                    return
                _log.info("bookie watch stream ended; re-listing", root=self.root)
            except (BKError, aiohttp.ClientError, OSError) as exc:
                if self._closed:
                    return
                if stream_index is not None and isinstance(exc, aiohttp.ClientError | OSError):
                    self._failed(stream_index)
                if stream_index is not None:
                    self._forget_token(stream_index, exc)
                _log.warning("bookie watch failed; re-listing", root=self.root, error=repr(exc))
            await self._sleep_unless_closed(backoff.next_delay_s())

    async def _next_unless_closed(
        self, stream: AsyncIterator[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """The stream's next result; None when it ends or the store is closed.

        Closing the aiohttp session does not reliably wake a reader blocked on
        a streaming response, so the read is raced against ``close()`` and
        cancelled (which closes the response) if the store closes first."""
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

    # --- cookies and cluster identity -----------------------------------

    async def read_cookie(self, bookie_id: BookieId) -> tuple[bytes, int] | None:
        key = keys.cookie(self.root, bookie_id)
        resp = await self._call(
            f"read cookie {bookie_id}", lambda c: c.range(_key(key)), retry_unknown=True
        )
        if not resp.kvs:
            return None
        kv = resp.kvs[0]
        return bytes(kv.value or b""), int(kv.mod_revision)

    async def write_cookie(self, bookie_id: BookieId, data: bytes, version: int | None) -> int:
        key = keys.cookie(self.root, bookie_id)
        compare = _compare_absent(key) if version is None else _compare_mod(key, version)
        resp = await self._call(
            f"write cookie {bookie_id}",
            lambda c: c.txn(
                compare=[compare],
                success=[c.put(_key(key), bytes(data), txn_obj=True)],
                failure=[],
            ),
        )
        if not resp.succeeded:
            expected = "absent" if version is None else f"at version {version}"
            raise MetadataVersionError(f"cookie of {bookie_id} is not {expected}")
        return int(resp.header.revision)

    async def delete_cookie(self, bookie_id: BookieId) -> None:
        key = keys.cookie(self.root, bookie_id)
        await self._call(
            f"delete cookie {bookie_id}",
            lambda c: c.delete_range(_key(key)),
            retry_unknown=True,
        )

    # --- generic keys ----------------------------------------------------

    async def kv_get(self, key: str) -> KeyValue | None:
        resp = await self._call(f"read {key}", lambda c: c.range(_key(key)), retry_unknown=True)
        kvs = list(resp.kvs or [])
        if not kvs:
            return None
        return KeyValue(key, bytes(kvs[0].value or b""), int(kvs[0].mod_revision))

    async def kv_range(self, prefix: str, *, after: str | None = None,
                       limit: int = 0) -> list[KeyValue]:
        start = _key(after) + b"\0" if after is not None else _key(prefix)
        resp = await self._call(
            f"range {prefix}",
            lambda c: c.range(start, range_end=_prefix_end(prefix), limit=limit),
            retry_unknown=True,
        )
        return [KeyValue(bytes(kv.key).decode(), bytes(kv.value or b""), int(kv.mod_revision))
                for kv in resp.kvs or []]

    async def kv_txn(self, compare: Sequence[tuple[str, int]],
                     put: Sequence[tuple[str, bytes]] = (), delete: Sequence[str] = (),
                     delete_prefix: Sequence[str] = ()) -> int:
        compares = [_compare_absent(k) if v == 0 else _compare_mod(k, v) for k, v in compare]

        def op(c: Any) -> Awaitable[Any]:
            success = [c.delete_range(_key(k), txn_obj=True) for k in delete]
            success += [c.delete_range(_key(p), range_end=_prefix_end(p), txn_obj=True)
                        for p in delete_prefix]
            success += [c.put(_key(k), bytes(v), txn_obj=True) for k, v in put]
            return c.txn(compare=compares, success=success,
                         failure=[c.range(_key(k), keys_only=True, txn_obj=True)
                                  for k, _ in compare])

        what = f"transaction on {compare[0][0] if compare else 'keys'}"
        resp = await self._call(what, op)
        if resp.succeeded:
            return int(resp.header.revision)
        for (key, version), r in zip(compare, resp.responses or [], strict=False):
            kvs = list(r.response_range.kvs or []) if r.response_range is not None else []
            current = int(kvs[0].mod_revision) if kvs else 0
            if current != version:
                raise MetadataVersionError(
                    f"{key} is {'absent' if not kvs else f'at version {current}'}, "
                    f"not {'absent' if version == 0 else f'at version {version}'}")
        raise MetadataVersionError(f"{what} lost a race")

    async def get_or_create_instance_id(self) -> str:
        key = keys.instance_id(self.root)
        candidate = str(uuid.uuid4())
        resp = await self._call(
            "instance id",
            lambda c: c.txn(
                compare=[_compare_absent(key)],
                success=[c.put(_key(key), candidate.encode(), txn_obj=True)],
                failure=[c.range(_key(key), txn_obj=True)],
            ),
            # A lost first attempt that did create the key is read back by the retry.
            retry_unknown=True,
        )
        if resp.succeeded:
            return candidate
        kvs = _failure_kvs(resp)
        if not kvs:
            raise MetadataError("etcd instance id vanished while being read")
        return bytes(kvs[0].value or b"").decode()

    # --- auto-recovery: locks and under-replication marks ------------------

    async def acquire_lock(self, name: str, owner: str, lease_id: int) -> str:
        key = keys.lock(self.root, name)

        async def op(c: Any) -> Any:
            try:
                return await c.txn(
                    compare=[_compare_absent(key)],
                    success=[c.put(_key(key), owner.encode(), lease=lease_id, txn_obj=True)],
                    failure=[c.range(_key(key), txn_obj=True)],
                )
            except ErrLeaseNotFound:
                raise MetadataError(f"cannot take lock {name}: lease {lease_id:#x} does not "
                                    "exist (expired or revoked)") from None

        # After an unknown outcome the retry finds the lock held, by us or by another.
        resp = await self._call(f"take lock {name}", op, retry_unknown=True)
        if resp.succeeded:
            return owner
        kvs = _failure_kvs(resp)
        return bytes(kvs[0].value or b"").decode() if kvs else await self.acquire_lock(
            name, owner, lease_id)

    async def lock_holder(self, name: str) -> str | None:
        key = keys.lock(self.root, name)
        resp = await self._call(f"read lock {name}", lambda c: c.range(_key(key)),
                                retry_unknown=True)
        return bytes(resp.kvs[0].value or b"").decode() if resp.kvs else None

    async def release_lock(self, name: str, owner: str) -> None:
        key = keys.lock(self.root, name)
        await self._call(
            f"release lock {name}",
            lambda c: c.txn(
                compare=[{"key": _key(key), "result": CompareCompareResult.EQUAL,
                          "target": CompareCompareTarget.VALUE, "value": owner.encode()}],
                success=[c.delete_range(_key(key), txn_obj=True)],
                failure=[],
            ),
            retry_unknown=True,
        )

    async def mark_underreplicated(self, ledger_id: int, bookies: set[BookieId]) -> None:
        key = keys.underreplicated(self.root, ledger_id)
        while True:
            resp = await self._call(f"read mark of ledger {ledger_id}",
                                    lambda c: c.range(_key(key)), retry_unknown=True)
            known: set[BookieId] = set()
            marked_ms = int(self._clock.wall_s() * 1000)
            compare = _compare_absent(key)
            if resp.kvs:
                kv = resp.kvs[0]
                old = unpack_underreplicated(ledger_id, bytes(kv.value or b""),
                                             int(kv.mod_revision))
                if set(bookies) <= old.bookies:
                    return
                known, marked_ms = set(old.bookies), old.marked_ms
                compare = _compare_mod(key, int(kv.mod_revision))
            value = pack_underreplicated(known | set(bookies), marked_ms)
            put = await self._call(
                f"mark ledger {ledger_id} under-replicated",
                lambda c, cmp=compare, v=value: c.txn(  # type: ignore[misc]
                    compare=[cmp], success=[c.put(_key(key), v, txn_obj=True)], failure=[]),
                retry_unknown=True,  # a repeated merge is the same merge
            )
            if put.succeeded:
                return

    async def list_underreplicated(self) -> list[UnderReplicated]:
        prefix = keys.underreplicated_prefix(self.root)
        kvs, _ = await self._range_prefix(prefix)
        out = []
        for kv in kvs:
            key = bytes(kv.key).decode(errors="replace")
            try:
                ledger_id = int(key[len(prefix):])
            except ValueError:
                _log.warning("ignoring malformed under-replication key", key=key)
                continue
            out.append(unpack_underreplicated(ledger_id, bytes(kv.value or b""),
                                              int(kv.mod_revision)))
        return sorted(out, key=lambda u: u.ledger_id)

    async def clear_underreplicated(self, ledger_id: int, version: int) -> bool:
        key = keys.underreplicated(self.root, ledger_id)
        resp = await self._call(
            f"clear mark of ledger {ledger_id}",
            lambda c: c.txn(compare=[_compare_mod(key, version)],
                            success=[c.delete_range(_key(key), txn_obj=True)], failure=[]),
        )
        return bool(resp.succeeded)

    async def close(self) -> None:
        """Close every HTTP session; watchers end, later calls raise MetadataError."""
        self._closed = True
        self._closed_event.set()
        clients = [c for c in self._clients if c is not None]
        self._clients = [None] * len(self.endpoints)
        for client in clients:
            await client.close()
