"""An in-process metadata store with etcd's semantics, for unit tests and the
simulator.

It keeps the same key layout (:mod:`asyncbk.meta.keys`) and value encodings
as :class:`~asyncbk.meta.etcd.EtcdMetadataStore`, and mimics the parts of
etcd that asyncbk relies on:

* one store-wide *revision* that increases on every change; a key's version
  is the revision of its last modification (etcd's ``mod_revision``), and a
  ledger id is the revision of a write to the id generator key;
* compare-and-swap by version, with "deleted" told apart from "changed";
* leases that expire unless kept alive, taking their keys with them.  Time
  comes from an injected :class:`~asyncbk.clock.Clock`, so tests can expire
  leases with a :class:`~asyncbk.clock.ManualClock`.  Expiry is applied lazily
  at the start of every call (and by :meth:`MemoryMetadataState.expire_leases`);
  bookie watchers also wake up by themselves when the next lease is due.

Several :class:`MemoryMetadataStore` objects can share one
:class:`MemoryMetadataState`, the way several clients share one etcd cluster:
each store object is a "client" (it can be closed on its own), the state is
the "cluster".  ``memory://<name>`` URIs map to process-wide named states
(:func:`named_state`).

Every call yields to the event loop once before it acts, so concurrent
callers interleave as they would against a real server (two CAS writers on
one version really race), while each operation stays atomic.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

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
from .model import LedgerMetadata

_log = get_logger(component="meta")

LEASE_ID_FIRST = 0x5EED_0000_0001
"""First lease id a memory state hands out (etcd's are large opaque ints too)."""


# --- shared state ------------------------------------------------------------


@dataclass
class _Entry:
    value: bytes
    create_revision: int
    mod_revision: int
    lease_id: int = 0


@dataclass
class _Lease:
    ttl_s: int
    expires_at_s: float
    keys: set[str] = field(default_factory=set)


class MemoryMetadataState:
    """The "cluster" side of the memory store: keys, revisions and leases.

    All methods are synchronous and therefore atomic with respect to other
    coroutines; :class:`MemoryMetadataStore` composes them into operations.
    Watchers register an :class:`asyncio.Event` each (created on their own
    event loop), so a state is not tied to one loop and can outlive it (the
    process-wide named states are reused across test loops).
    """

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.revision = 1
        """Like etcd, an empty store is at revision 1; every change adds 1."""
        self._kv: dict[str, _Entry] = {}
        self._leases: dict[int, _Lease] = {}
        self._next_lease_id = LEASE_ID_FIRST
        self._waiters: dict[asyncio.Event, None] = {}
        """Watchers' events, in the order they came (a set's order would follow their
        addresses: the simulator replays a seed only if watchers wake in one order)."""

    # --- revisions and change notification -------------------------------

    def next_revision(self) -> int:
        """Start a change: the revision every key it writes gets."""
        self.revision += 1
        return self.revision

    def notify(self) -> None:
        """Wake every watcher (after a change that may touch the registry)."""
        for event in list(self._waiters):
            event.set()

    def add_waiter(self, event: asyncio.Event) -> None:
        self._waiters[event] = None

    def remove_waiter(self, event: asyncio.Event) -> None:
        self._waiters.pop(event, None)

    # --- keys ---------------------------------------------------------------

    def get(self, key: str) -> _Entry | None:
        return self._kv.get(key)

    def put(self, key: str, value: bytes, revision: int, lease_id: int = 0) -> None:
        old = self._kv.get(key)
        if old is not None and old.lease_id:
            lease = self._leases.get(old.lease_id)
            if lease is not None:
                lease.keys.discard(key)
        self._kv[key] = _Entry(
            value=bytes(value),
            create_revision=old.create_revision if old is not None else revision,
            mod_revision=revision,
            lease_id=lease_id,
        )
        if lease_id:
            self._leases[lease_id].keys.add(key)

    def delete(self, key: str) -> bool:
        old = self._kv.pop(key, None)
        if old is None:
            return False
        if old.lease_id:
            lease = self._leases.get(old.lease_id)
            if lease is not None:
                lease.keys.discard(key)
        return True

    def range(self, prefix: str) -> list[tuple[str, _Entry]]:
        """Every key starting with ``prefix``, in key (byte) order like etcd."""
        found = [(k, e) for k, e in self._kv.items() if k.startswith(prefix)]
        found.sort(key=lambda item: item[0].encode())
        return found

    # --- leases -------------------------------------------------------------

    def grant_lease(self, ttl_s: int) -> int:
        lease_id = self._next_lease_id
        self._next_lease_id += 1
        self._leases[lease_id] = _Lease(ttl_s=ttl_s, expires_at_s=self.clock.monotonic_s() + ttl_s)
        return lease_id

    def lease_alive(self, lease_id: int) -> bool:
        self.expire_leases()
        return lease_id in self._leases

    def keepalive_lease(self, lease_id: int) -> int:
        self.expire_leases()
        lease = self._leases.get(lease_id)
        if lease is None:
            return 0
        lease.expires_at_s = self.clock.monotonic_s() + lease.ttl_s
        return lease.ttl_s

    def revoke_lease(self, lease_id: int) -> None:
        self.expire_leases()
        if lease_id in self._leases:
            self._drop_leases([lease_id])

    def expire_leases(self) -> int:
        """Drop every lease whose time is up, with its keys; returns how many."""
        now = self.clock.monotonic_s()
        expired = [lid for lid, lease in self._leases.items() if lease.expires_at_s <= now]
        if expired:
            self._drop_leases(expired)
        return len(expired)

    def next_expiry_s(self) -> float | None:
        """Clock time (``monotonic_s``) at which the next lease expires, if any."""
        return min((lease.expires_at_s for lease in self._leases.values()), default=None)

    def _drop_leases(self, lease_ids: list[int]) -> None:
        changed = False
        for lease_id in lease_ids:
            lease = self._leases.pop(lease_id)
            doomed = [
                key
                for key in sorted(lease.keys)
                if (entry := self._kv.get(key)) is not None and entry.lease_id == lease_id
            ]
            if doomed:
                # Like etcd: revoking (or expiring) a lease is one change that
                # deletes all of its keys.
                self.next_revision()
                for key in doomed:
                    del self._kv[key]
                changed = True
        if changed:
            self.notify()


_NAMED_STATES: dict[str, MemoryMetadataState] = {}


def named_state(name: str) -> MemoryMetadataState:
    """The process-wide state called ``name`` (created on first use): what
    every ``memory://<name>`` URI in this process shares."""
    state = _NAMED_STATES.get(name)
    if state is None:
        state = _NAMED_STATES[name] = MemoryMetadataState()
    return state


def forget_named_states() -> None:
    """Drop every named state (tests call this to start from scratch)."""
    _NAMED_STATES.clear()


# --- the store ---------------------------------------------------------------


class MemoryMetadataStore:
    """:class:`~asyncbk.meta.api.MetadataStore` on a :class:`MemoryMetadataState`.

    ``MemoryMetadataStore()`` owns a fresh state on the system clock;
    ``MemoryMetadataStore(clock=manual)`` one on a manual clock; pass
    ``state=`` to make several stores ("clients") share one state, whose
    clock then applies (passing a different ``clock`` too is an error).
    """

    def __init__(
        self,
        root: str = "",
        *,
        clock: Clock | None = None,
        state: MemoryMetadataState | None = None,
    ) -> None:
        if state is None:
            state = MemoryMetadataState(clock if clock is not None else SYSTEM_CLOCK)
        elif clock is not None and clock is not state.clock:
            raise ValueError("a shared MemoryMetadataState brings its own clock")
        self.root = keys.normalize_root(root)
        self.state = state
        self._closed = False
        self._waiters: dict[asyncio.Event, None] = {}  # in order (see the state's)

    async def _enter(self) -> None:
        """Start of every call: refuse if closed, let others run, expire leases."""
        if self._closed:
            raise MetadataError("metadata store is closed")
        await asyncio.sleep(0)
        if self._closed:
            raise MetadataError("metadata store is closed")
        self.state.expire_leases()

    def expire_leases(self) -> int:
        """Apply lease expiry now (see :meth:`MemoryMetadataState.expire_leases`)."""
        return self.state.expire_leases()

    # --- ledgers ---------------------------------------------------------

    async def allocate_ledger_id(self) -> int:
        await self._enter()
        revision = self.state.next_revision()
        self.state.put(keys.idgen(self.root), b"", revision)
        return revision

    async def create_ledger(self, md: LedgerMetadata) -> LedgerMetadata:
        await self._enter()
        key = keys.ledger(self.root, md.ledger_id)
        if self.state.get(key) is not None:
            raise MetadataVersionError(f"ledger {md.ledger_id} already exists")
        revision = self.state.next_revision()
        self.state.put(key, md.to_bytes(), revision)
        return md.replace(version=revision)

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        await self._enter()
        entry = self.state.get(keys.ledger(self.root, ledger_id))
        if entry is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return LedgerMetadata.from_bytes(entry.value, version=entry.mod_revision)

    async def update_ledger(self, md: LedgerMetadata) -> LedgerMetadata:
        await self._enter()
        key = keys.ledger(self.root, md.ledger_id)
        entry = self.state.get(key)
        if entry is None:
            raise NoSuchLedgerError(f"ledger {md.ledger_id} does not exist")
        if entry.mod_revision != md.version:
            raise MetadataVersionError(
                f"ledger {md.ledger_id} is at version {entry.mod_revision}, not {md.version}"
            )
        revision = self.state.next_revision()
        self.state.put(key, md.to_bytes(), revision)
        return md.replace(version=revision)

    async def delete_ledger(self, ledger_id: int, version: int | None = None) -> None:
        await self._enter()
        key = keys.ledger(self.root, ledger_id)
        entry = self.state.get(key)
        if entry is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        if version is not None and entry.mod_revision != version:
            raise MetadataVersionError(
                f"ledger {ledger_id} is at version {entry.mod_revision}, not {version}"
            )
        self.state.next_revision()
        self.state.delete(key)

    async def iter_ledger_ids(self, page_size: int = 1000) -> AsyncGenerator[int, None]:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        prefix = keys.ledgers_prefix(self.root)
        after: str | None = None
        while True:
            await self._enter()
            page = [k for k, _ in self.state.range(prefix) if after is None or k.encode() > after.encode()]
            page = page[:page_size]
            for key in page:
                try:
                    ledger_id = keys.ledger_id_from_key(self.root, key)
                except ValueError:
                    _log.warning("ignoring malformed ledger key", key=key)
                    continue
                yield ledger_id
            if len(page) < page_size:
                return
            after = page[-1]

    # --- leases ----------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> int:
        if ttl_s < 1:
            raise ValueError(f"lease ttl must be >= 1 s, got {ttl_s}")
        await self._enter()
        return self.state.grant_lease(ttl_s)

    async def keepalive_lease(self, lease_id: int) -> int:
        await self._enter()
        return self.state.keepalive_lease(lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        await self._enter()
        self.state.revoke_lease(lease_id)

    # --- bookie registry -------------------------------------------------

    async def register_bookie(self, reg: BookieRegistration, lease_id: int) -> None:
        await self._enter()
        if lease_id and not self.state.lease_alive(lease_id):
            raise MetadataError(f"lease {lease_id:#x} does not exist (expired or revoked)")
        put_key = (keys.bookie_readonly if reg.readonly else keys.bookie_writable)(
            self.root, reg.bookie_id
        )
        other_key = (keys.bookie_writable if reg.readonly else keys.bookie_readonly)(
            self.root, reg.bookie_id
        )
        revision = self.state.next_revision()
        self.state.put(put_key, pack_registration_info(reg.info), revision, lease_id)
        self.state.delete(other_key)
        self.state.notify()

    async def unregister_bookie(self, bookie_id: BookieId) -> None:
        await self._enter()
        w = self.state.get(keys.bookie_writable(self.root, bookie_id))
        r = self.state.get(keys.bookie_readonly(self.root, bookie_id))
        if w is None and r is None:
            return
        self.state.next_revision()
        self.state.delete(keys.bookie_writable(self.root, bookie_id))
        self.state.delete(keys.bookie_readonly(self.root, bookie_id))
        self.state.notify()

    def _registry_view(self) -> dict[BookieId, BookieRegistration]:
        items = self.state.range(keys.bookies_prefix(self.root))
        return registrations_from_items(self.root, ((k, e.value) for k, e in items))

    async def list_bookies(self) -> dict[BookieId, BookieRegistration]:
        await self._enter()
        return self._registry_view()

    async def watch_bookies(self) -> AsyncGenerator[dict[BookieId, BookieRegistration], None]:
        """First the current view, then a new view whenever it changes (lease
        expiry included); ends when the store is closed."""
        await self._enter()
        changed = asyncio.Event()
        self.state.add_waiter(changed)
        self._waiters[changed] = None
        last: dict[BookieId, BookieRegistration] | None = None
        try:
            while not self._closed:
                changed.clear()
                self.state.expire_leases()
                view = self._registry_view()
                if view != last:
                    last = view
                    yield dict(view)
                    continue  # re-check: the consumer may have been slow
                await self._wait_for_change(changed)
        finally:
            self.state.remove_waiter(changed)
            self._waiters.pop(changed, None)

    async def _wait_for_change(self, changed: asyncio.Event) -> None:
        """Until ``changed`` is set or the next lease is due, whichever is first."""
        due_s = self.state.next_expiry_s()
        if due_s is None:
            await changed.wait()
            return
        delay_s = max(0.0, due_s - self.state.clock.monotonic_s())
        waiter = asyncio.ensure_future(changed.wait())
        sleeper = asyncio.ensure_future(self.state.clock.sleep(delay_s))
        try:
            await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            sleeper.cancel()
            await asyncio.gather(waiter, sleeper, return_exceptions=True)

    # --- cookies and cluster identity -----------------------------------

    async def read_cookie(self, bookie_id: BookieId) -> tuple[bytes, int] | None:
        await self._enter()
        entry = self.state.get(keys.cookie(self.root, bookie_id))
        return None if entry is None else (entry.value, entry.mod_revision)

    async def write_cookie(self, bookie_id: BookieId, data: bytes, version: int | None) -> int:
        await self._enter()
        key = keys.cookie(self.root, bookie_id)
        entry = self.state.get(key)
        if version is None and entry is not None:
            raise MetadataVersionError(f"cookie of {bookie_id} already exists")
        if version is not None and (entry is None or entry.mod_revision != version):
            current = "absent" if entry is None else f"at version {entry.mod_revision}"
            raise MetadataVersionError(f"cookie of {bookie_id} is {current}, not at {version}")
        revision = self.state.next_revision()
        self.state.put(key, data, revision)
        return revision

    async def delete_cookie(self, bookie_id: BookieId) -> None:
        await self._enter()
        key = keys.cookie(self.root, bookie_id)
        if self.state.get(key) is not None:
            self.state.next_revision()
            self.state.delete(key)

    # --- generic keys ----------------------------------------------------

    async def kv_get(self, key: str) -> KeyValue | None:
        await self._enter()
        entry = self.state.get(key)
        return None if entry is None else KeyValue(key, entry.value, entry.mod_revision)

    async def kv_range(self, prefix: str, *, after: str | None = None,
                       limit: int = 0) -> list[KeyValue]:
        await self._enter()
        out = [KeyValue(k, e.value, e.mod_revision) for k, e in self.state.range(prefix)
               if after is None or k.encode() > after.encode()]
        return out[:limit] if limit > 0 else out

    async def kv_txn(self, compare: Sequence[tuple[str, int]],
                     put: Sequence[tuple[str, bytes]] = (), delete: Sequence[str] = (),
                     delete_prefix: Sequence[str] = ()) -> int:
        await self._enter()
        for key, version in compare:
            entry = self.state.get(key)
            current = 0 if entry is None else entry.mod_revision
            if current != version:
                raise MetadataVersionError(
                    f"{key} is {'absent' if entry is None else f'at version {current}'}, "
                    f"not {'absent' if version == 0 else f'at version {version}'}")
        revision = self.state.next_revision()
        for key in delete:
            self.state.delete(key)
        for prefix in delete_prefix:
            for key, _ in self.state.range(prefix):
                self.state.delete(key)
        for key, value in put:
            self.state.put(key, value, revision)
        return revision

    async def get_or_create_instance_id(self) -> str:
        await self._enter()
        key = keys.instance_id(self.root)
        entry = self.state.get(key)
        if entry is not None:
            return entry.value.decode()
        instance_id = str(uuid.uuid4())
        self.state.put(key, instance_id.encode(), self.state.next_revision())
        return instance_id

    # --- auto-recovery -------------------------------------------------------

    async def acquire_lock(self, name: str, owner: str, lease_id: int) -> str:
        await self._enter()
        key = keys.lock(self.root, name)
        entry = self.state.get(key)
        if entry is not None:
            return entry.value.decode()
        if not self.state.lease_alive(lease_id):
            raise MetadataError(f"cannot take lock {name}: lease {lease_id:#x} does not exist")
        self.state.put(key, owner.encode(), self.state.next_revision(), lease_id)
        return owner

    async def lock_holder(self, name: str) -> str | None:
        await self._enter()
        entry = self.state.get(keys.lock(self.root, name))
        return None if entry is None else entry.value.decode()

    async def release_lock(self, name: str, owner: str) -> None:
        await self._enter()
        key = keys.lock(self.root, name)
        entry = self.state.get(key)
        if entry is not None and entry.value.decode() == owner:
            self.state.next_revision()
            self.state.delete(key)

    async def mark_underreplicated(self, ledger_id: int, bookies: set[BookieId]) -> None:
        await self._enter()
        key = keys.underreplicated(self.root, ledger_id)
        entry = self.state.get(key)
        known: set[BookieId] = set()
        marked_ms = int(self.state.clock.wall_s() * 1000)
        if entry is not None:
            old = unpack_underreplicated(ledger_id, entry.value, entry.mod_revision)
            known, marked_ms = set(old.bookies), old.marked_ms
            if set(bookies) <= known:
                return
        self.state.put(key, pack_underreplicated(known | set(bookies), marked_ms),
                       self.state.next_revision())

    async def list_underreplicated(self) -> list[UnderReplicated]:
        await self._enter()
        prefix = keys.underreplicated_prefix(self.root)
        out = []
        for key, entry in self.state.range(prefix):
            ledger_id = int(key[len(prefix):])
            out.append(unpack_underreplicated(ledger_id, entry.value, entry.mod_revision))
        return sorted(out, key=lambda u: u.ledger_id)

    async def clear_underreplicated(self, ledger_id: int, version: int) -> bool:
        await self._enter()
        key = keys.underreplicated(self.root, ledger_id)
        entry = self.state.get(key)
        if entry is None or entry.mod_revision != version:
            return False
        self.state.next_revision()
        self.state.delete(key)
        return True

    async def close(self) -> None:
        """Close this client: later calls fail, its watchers end.  The shared
        state (other clients) is unaffected."""
        self._closed = True
        for event in list(self._waiters):
            event.set()
