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

The calls themselves (timeouts, endpoint fail-over, authentication, watches
that survive failures) are :class:`~asyncbk.meta.etcd_client.EtcdClient`'s.
"""

from __future__ import annotations

import random
import ssl
import uuid
from collections.abc import AsyncGenerator, Awaitable, Sequence
from contextlib import aclosing
from typing import Any

from etcd3.errors import ErrLeaseNotFound
from etcd3.models import (
    CompareCompareResult,
    CompareCompareTarget,
    RangeRequestSortOrder,
    RangeRequestSortTarget,
)

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import MetadataError, MetadataVersionError, NoSuchLedgerError
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
from .etcd_client import (
    ENDPOINT_DEFAULT,
    TIMEOUT_S_DEFAULT,
    WATCH_BACKOFF_S_MAX,
    EtcdClient,
    etcd_key,
    etcd_prefix_end,
)
from .etcd_stream import lease_keepalive_once
from .model import LedgerMetadata

_log = get_logger(component="meta.etcd")


def _compare(key: str, target: CompareCompareTarget, field: str, value: int) -> dict[str, Any]:
    return {"key": etcd_key(key), "result": CompareCompareResult.EQUAL, "target": target,
            field: value}


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


class EtcdMetadataStore:
    """:class:`~asyncbk.meta.api.MetadataStore` on etcd (>= 3.4).

    Prefer :meth:`connect`, which also checks that etcd answers.  The
    constructor does no I/O; its clients (one aiohttp session per endpoint)
    are opened on first use, inside the running loop.  ``rng`` jitters the
    watch's back-off (a seeded one replays it; None: a process-wide one).
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
        rng: random.Random | None = None,
    ) -> None:
        self.root = keys.normalize_root(root)
        self._etcd = EtcdClient(endpoints, self.root, timeout_s,
                                watch_backoff_s_max=watch_backoff_s_max,
                                ssl_context=ssl_context, user=user, password=password, rng=rng)
        self._clock = clock
        """Wall-clock source of the times this store writes (under-replication marks)."""

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
        rng: random.Random | None = None,
    ) -> EtcdMetadataStore:
        """A store whose etcd answered: ``/version`` (>= 3.4) on some endpoint,
        then (as ``user``, when given) a read of the instance id key.  Raises
        MetadataError ("cannot reach etcd at ...: is etcd running?") if no
        endpoint answers, or saying what etcd refused (TLS, user, permission)."""
        store = cls(endpoints, root, timeout_s, watch_backoff_s_max=watch_backoff_s_max,
                    clock=clock, ssl_context=ssl_context, user=user, password=password,
                    rng=rng)
        try:
            await store._etcd.probe()
        except BaseException:
            await store.close()
            raise
        return store

    # --- ledgers ---------------------------------------------------------

    async def allocate_ledger_id(self) -> int:
        key = keys.idgen(self.root)
        # Repeating this after an unknown outcome only skips an id: retry.
        resp = await self._etcd.call(
            "ledger id allocation", lambda c: c.put(etcd_key(key), b""), retry_unknown=True
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
                success=[c.put(etcd_key(key), md.to_bytes(), txn_obj=True)],
                failure=[],
            )

        resp = await self._etcd.call(f"create ledger {md.ledger_id}", op)
        if not resp.succeeded:
            raise MetadataVersionError(f"ledger {md.ledger_id} already exists")
        return md.replace(version=int(resp.header.revision))

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        key = keys.ledger(self.root, ledger_id)
        resp = await self._etcd.call(
            f"read ledger {ledger_id}", lambda c: c.range(etcd_key(key)), retry_unknown=True
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
                success=[c.put(etcd_key(key), md.to_bytes(), txn_obj=True)],
                failure=[c.range(etcd_key(key), keys_only=True, txn_obj=True)],
            )

        resp = await self._etcd.call(f"update ledger {md.ledger_id}", op)
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
            resp = await self._etcd.call(
                f"delete ledger {ledger_id}", lambda c: c.delete_range(etcd_key(key))
            )
            if not resp.deleted:
                raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
            return

        def op(c: Any) -> Awaitable[Any]:
            return c.txn(
                compare=[_compare_mod(key, version)],
                success=[c.delete_range(etcd_key(key), txn_obj=True)],
                failure=[c.range(etcd_key(key), keys_only=True, txn_obj=True)],
            )

        resp = await self._etcd.call(f"delete ledger {ledger_id}", op)
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
        start = etcd_key(prefix)
        while True:
            kvs, more = await self._ledger_key_page(start, etcd_prefix_end(prefix), page_size)
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
        resp = await self._etcd.call(
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
        resp = await self._etcd.call(
            "lease grant", lambda c: c.lease_grant(int(ttl_s)), retry_unknown=True
        )
        if not resp.ID:
            raise MetadataError(f"etcd granted no lease: {resp}")
        return int(resp.ID)

    async def keepalive_lease(self, lease_id: int) -> int:
        return await self._etcd.call(
            f"lease keep-alive {lease_id:#x}",
            lambda c: lease_keepalive_once(c, lease_id, self._etcd.timeout_s),
            retry_unknown=True,
        )

    async def revoke_lease(self, lease_id: int) -> None:
        async def op(c: Any) -> None:
            try:
                await c.lease_revoke(lease_id)
            except ErrLeaseNotFound:
                pass  # already expired or revoked: the goal is reached

        await self._etcd.call(f"lease revoke {lease_id:#x}", op, retry_unknown=True)

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
                        c.put(etcd_key(put_key), value, lease=lease_id, txn_obj=True),
                        c.delete_range(etcd_key(other_key), txn_obj=True),
                    ],
                    failure=[],
                )
            except ErrLeaseNotFound:
                raise MetadataError(
                    f"cannot register {reg.bookie_id}: lease {lease_id:#x} does not exist"
                    " (expired or revoked)"
                ) from None

        # Same registration twice is the same state: retry.
        await self._etcd.call(f"register bookie {reg.bookie_id}", op, retry_unknown=True)

    async def unregister_bookie(self, bookie_id: BookieId) -> None:
        w = etcd_key(keys.bookie_writable(self.root, bookie_id))
        r = etcd_key(keys.bookie_readonly(self.root, bookie_id))
        await self._etcd.call(
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
        kvs, _ = await self._etcd.range_prefix(keys.bookies_prefix(self.root))
        return self._registry_view({bytes(kv.key): bytes(kv.value or b"") for kv in kvs})

    async def watch_bookies(self) -> AsyncGenerator[dict[BookieId, BookieRegistration], None]:
        """Range the registry, yield it, then follow an etcd watch from the next
        revision, yielding the full view whenever it changes.  Failures lead to a
        fresh range + watch (see :meth:`EtcdClient.watch_prefix`); ends only when
        cancelled or the store is closed."""
        last: dict[BookieId, BookieRegistration] | None = None
        states = self._etcd.watch_prefix(keys.bookies_prefix(self.root), "bookie watch")
        async with aclosing(states):
            async for state in states:
                view = self._registry_view(state)
                if view != last:
                    last = view
                    yield dict(view)

    # --- cookies and cluster identity -----------------------------------

    async def read_cookie(self, bookie_id: BookieId) -> tuple[bytes, int] | None:
        key = keys.cookie(self.root, bookie_id)
        resp = await self._etcd.call(
            f"read cookie {bookie_id}", lambda c: c.range(etcd_key(key)), retry_unknown=True
        )
        if not resp.kvs:
            return None
        kv = resp.kvs[0]
        return bytes(kv.value or b""), int(kv.mod_revision)

    async def write_cookie(self, bookie_id: BookieId, data: bytes, version: int | None) -> int:
        key = keys.cookie(self.root, bookie_id)
        compare = _compare_absent(key) if version is None else _compare_mod(key, version)
        resp = await self._etcd.call(
            f"write cookie {bookie_id}",
            lambda c: c.txn(
                compare=[compare],
                success=[c.put(etcd_key(key), bytes(data), txn_obj=True)],
                failure=[],
            ),
        )
        if not resp.succeeded:
            expected = "absent" if version is None else f"at version {version}"
            raise MetadataVersionError(f"cookie of {bookie_id} is not {expected}")
        return int(resp.header.revision)

    async def delete_cookie(self, bookie_id: BookieId) -> None:
        key = keys.cookie(self.root, bookie_id)
        await self._etcd.call(
            f"delete cookie {bookie_id}",
            lambda c: c.delete_range(etcd_key(key)),
            retry_unknown=True,
        )

    # --- generic keys ----------------------------------------------------

    async def kv_get(self, key: str) -> KeyValue | None:
        resp = await self._etcd.call(f"read {key}", lambda c: c.range(etcd_key(key)),
                                     retry_unknown=True)
        kvs = list(resp.kvs or [])
        if not kvs:
            return None
        return KeyValue(key, bytes(kvs[0].value or b""), int(kvs[0].mod_revision))

    async def kv_range(self, prefix: str, *, after: str | None = None,
                       limit: int = 0) -> list[KeyValue]:
        start = etcd_key(after) + b"\0" if after is not None else etcd_key(prefix)
        resp = await self._etcd.call(
            f"range {prefix}",
            lambda c: c.range(start, range_end=etcd_prefix_end(prefix), limit=limit),
            retry_unknown=True,
        )
        return [KeyValue(bytes(kv.key).decode(), bytes(kv.value or b""), int(kv.mod_revision))
                for kv in resp.kvs or []]

    async def kv_txn(self, compare: Sequence[tuple[str, int]],
                     put: Sequence[tuple[str, bytes]] = (), delete: Sequence[str] = (),
                     delete_prefix: Sequence[str] = ()) -> int:
        compares = [_compare_absent(k) if v == 0 else _compare_mod(k, v) for k, v in compare]

        def op(c: Any) -> Awaitable[Any]:
            success = [c.delete_range(etcd_key(k), txn_obj=True) for k in delete]
            success += [c.delete_range(etcd_key(p), range_end=etcd_prefix_end(p), txn_obj=True)
                        for p in delete_prefix]
            success += [c.put(etcd_key(k), bytes(v), txn_obj=True) for k, v in put]
            return c.txn(compare=compares, success=success,
                         failure=[c.range(etcd_key(k), keys_only=True, txn_obj=True)
                                  for k, _ in compare])

        what = f"transaction on {compare[0][0] if compare else 'keys'}"
        resp = await self._etcd.call(what, op)
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
        resp = await self._etcd.call(
            "instance id",
            lambda c: c.txn(
                compare=[_compare_absent(key)],
                success=[c.put(etcd_key(key), candidate.encode(), txn_obj=True)],
                failure=[c.range(etcd_key(key), txn_obj=True)],
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
                    success=[c.put(etcd_key(key), owner.encode(), lease=lease_id, txn_obj=True)],
                    failure=[c.range(etcd_key(key), txn_obj=True)],
                )
            except ErrLeaseNotFound:
                raise MetadataError(f"cannot take lock {name}: lease {lease_id:#x} does not "
                                    "exist (expired or revoked)") from None

        # After an unknown outcome the retry finds the lock held, by us or by another.
        resp = await self._etcd.call(f"take lock {name}", op, retry_unknown=True)
        if resp.succeeded:
            return owner
        kvs = _failure_kvs(resp)
        return bytes(kvs[0].value or b"").decode() if kvs else await self.acquire_lock(
            name, owner, lease_id)

    async def lock_holder(self, name: str) -> str | None:
        key = keys.lock(self.root, name)
        resp = await self._etcd.call(f"read lock {name}", lambda c: c.range(etcd_key(key)),
                                retry_unknown=True)
        return bytes(resp.kvs[0].value or b"").decode() if resp.kvs else None

    async def release_lock(self, name: str, owner: str) -> None:
        key = keys.lock(self.root, name)
        await self._etcd.call(
            f"release lock {name}",
            lambda c: c.txn(
                compare=[{"key": etcd_key(key), "result": CompareCompareResult.EQUAL,
                          "target": CompareCompareTarget.VALUE, "value": owner.encode()}],
                success=[c.delete_range(etcd_key(key), txn_obj=True)],
                failure=[],
            ),
            retry_unknown=True,
        )

    async def mark_underreplicated(self, ledger_id: int, bookies: set[BookieId]) -> None:
        key = keys.underreplicated(self.root, ledger_id)
        while True:
            resp = await self._etcd.call(f"read mark of ledger {ledger_id}",
                                    lambda c: c.range(etcd_key(key)), retry_unknown=True)
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
            put = await self._etcd.call(
                f"mark ledger {ledger_id} under-replicated",
                lambda c, cmp=compare, v=value: c.txn(  # type: ignore[misc]
                    compare=[cmp], success=[c.put(etcd_key(key), v, txn_obj=True)], failure=[]),
                retry_unknown=True,  # a repeated merge is the same merge
            )
            if put.succeeded:
                return

    async def list_underreplicated(self) -> list[UnderReplicated]:
        prefix = keys.underreplicated_prefix(self.root)
        kvs, _ = await self._etcd.range_prefix(prefix)
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
        resp = await self._etcd.call(
            f"clear mark of ledger {ledger_id}",
            lambda c: c.txn(compare=[_compare_mod(key, version)],
                            success=[c.delete_range(etcd_key(key), txn_obj=True)], failure=[]),
        )
        return bool(resp.succeeded)

    async def close(self) -> None:
        """Close every HTTP session; watchers end, later calls raise MetadataError."""
        await self._etcd.close()
