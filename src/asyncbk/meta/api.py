"""The metadata store interface.  Two implementations share these semantics:
``meta.etcd.EtcdMetadataStore`` (production) and
``meta.memory.MemoryMetadataStore`` (unit tests and the simulator).

The interface comes in parts, one protocol each, so that code can say which it
uses: :class:`LedgerMetadataStore` (ids and ledger metadata),
:class:`LeaseStore` (leases), :class:`BookieRegistry` (registrations bound to
leases), :class:`LockStore` (locks bound to leases),
:class:`UnderReplicationStore` (auto-recovery's marks), :class:`CookieStore`
(cookies and the instance id) and :class:`KeyValueStore` (generic keys for
streams).  :class:`MetadataStore` is all of them; both stores implement it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..types import BookieId
from .model import LedgerMetadata

SESSION_KEY = "session"
"""Key of a registration's ``info`` that names the registration itself (the bookie's
lease id): it changes whenever the bookie registers anew, e.g. after a restart."""


@dataclass(frozen=True)
class BookieRegistration:
    bookie_id: BookieId
    readonly: bool
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def session(self) -> Any:
        """What tells this registration from the bookie's earlier ones (None if unknown)."""
        return self.info.get(SESSION_KEY)


@dataclass(frozen=True)
class KeyValue:
    """A key of the generic key-value section, with its value and version (the store
    revision of its last change; compare-and-swap compares it)."""

    key: str
    value: bytes
    version: int


@dataclass(frozen=True)
class UnderReplicated:
    """A ledger marked under-replicated: which bookies it lost, and the mark's version."""

    ledger_id: int
    bookies: frozenset[BookieId]
    marked_ms: int
    version: int


class LedgerMetadataStore(Protocol):
    """Ledger ids and ledger metadata, every change a compare-and-swap."""

    async def allocate_ledger_id(self) -> int:
        """A ledger id no other call (from any client) ever returns; ids are > 0."""
        ...

    async def create_ledger(self, md: LedgerMetadata) -> LedgerMetadata:
        """Store ``md`` if no ledger with its id exists (else MetadataVersionError).
        Returns ``md`` with ``version`` set."""
        ...

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        ...

    async def update_ledger(self, md: LedgerMetadata) -> LedgerMetadata:
        """Compare-and-swap: write ``md`` only if the stored version is ``md.version``.
        Returns the new value with its new version.  MetadataVersionError on a lost
        race, NoSuchLedgerError if the ledger was deleted."""
        ...

    async def delete_ledger(self, ledger_id: int, version: int | None = None) -> None:
        """Delete (only at ``version`` if given).  NoSuchLedgerError if absent."""
        ...

    def iter_ledger_ids(self, page_size: int = 1000) -> AsyncIterator[int]:
        """Every ledger id, ascending, read in pages."""
        ...


class LeaseStore(Protocol):
    """Leases: what bookie registrations and locks are bound to."""

    async def grant_lease(self, ttl_s: int) -> int:
        ...

    async def keepalive_lease(self, lease_id: int) -> int:
        """Refresh the lease; returns its remaining TTL in seconds, 0 if it is gone."""
        ...

    async def revoke_lease(self, lease_id: int) -> None:
        ...


class BookieRegistry(LeaseStore, Protocol):
    """The bookies that are up, each registered under its lease."""

    async def register_bookie(self, reg: BookieRegistration, lease_id: int) -> None:
        """Put the registration (writable or read-only key) bound to the lease and
        remove the other kind for the same bookie, atomically."""
        ...

    async def unregister_bookie(self, bookie_id: BookieId) -> None:
        ...

    async def list_bookies(self) -> dict[BookieId, BookieRegistration]:
        ...

    def watch_bookies(self) -> AsyncIterator[dict[BookieId, BookieRegistration]]:
        """The registry as it changes: first the current view, then a new full view
        after every change.  Survives store hiccups by re-listing and re-watching;
        ends only when cancelled or the store is closed."""
        ...


class LockStore(LeaseStore, Protocol):
    """Named locks, each bound to its holder's lease (the auditor election, the
    ``ledger-<id>`` locks of replication and garbage collection)."""

    async def acquire_lock(self, name: str, owner: str, lease_id: int) -> str:
        """Take lock ``name`` for ``owner``, bound to ``lease_id`` (it goes when the
        lease does), unless someone holds it.  Returns the holder afterwards:
        ``owner`` if it was taken (or already held by ``owner``), else the other."""
        ...

    async def lock_holder(self, name: str) -> str | None:
        ...

    async def release_lock(self, name: str, owner: str) -> None:
        """Release lock ``name`` if ``owner`` holds it (else nothing)."""
        ...


class UnderReplicationStore(Protocol):
    """The ledgers marked under-replicated, for auto-recovery."""

    async def mark_underreplicated(self, ledger_id: int, bookies: set[BookieId]) -> None:
        """Mark a ledger under-replicated for the loss of ``bookies`` (added to
        those already marked)."""
        ...

    async def list_underreplicated(self) -> list[UnderReplicated]:
        """Every marked ledger, by id."""
        ...

    async def clear_underreplicated(self, ledger_id: int, version: int) -> bool:
        """Remove the mark if it is still at ``version``; False if it changed (a new
        loss was marked meanwhile) or is gone."""
        ...


class CookieStore(Protocol):
    """Bookie cookies and the cluster's instance id (what a cookie names)."""

    async def read_cookie(self, bookie_id: BookieId) -> tuple[bytes, int] | None:
        """``(value, version)`` or None."""
        ...

    async def write_cookie(self, bookie_id: BookieId, data: bytes, version: int | None) -> int:
        """Create (``version`` None: only if absent) or CAS-update; returns the new version.
        MetadataVersionError on conflict."""
        ...

    async def delete_cookie(self, bookie_id: BookieId) -> None:
        ...

    async def get_or_create_instance_id(self) -> str:
        ...


class KeyValueStore(Protocol):
    """Generic keys, for the layers above (streams and namespaces).  Keys are
    full keys built by ``meta.keys`` under ``root``."""

    root: str

    async def kv_get(self, key: str) -> KeyValue | None:
        ...

    async def kv_range(self, prefix: str, *, after: str | None = None,
                       limit: int = 0) -> list[KeyValue]:
        """Keys starting with ``prefix`` (and greater than ``after``), in key order; at
        most ``limit`` of them (0: all)."""
        ...

    async def kv_txn(self, compare: Sequence[tuple[str, int]],
                     put: Sequence[tuple[str, bytes]] = (), delete: Sequence[str] = (),
                     delete_prefix: Sequence[str] = ()) -> int:
        """One atomic transaction: if every key of ``compare`` is at its version (0:
        the key is absent), write ``put``, remove ``delete`` and every key under each
        of ``delete_prefix``, all at one new revision, which is returned.  Otherwise
        nothing changes and MetadataVersionError names a key that differed.
        MetadataError (outcome unknown) is never retried blindly: re-read and check."""
        ...


class MetadataStore(LedgerMetadataStore, BookieRegistry, LockStore, UnderReplicationStore,
                    CookieStore, KeyValueStore, Protocol):
    """The whole store: every part above, under one ``root``, closed as one.

    Errors, for every part: ``NoSuchLedgerError`` for a missing ledger;
    ``MetadataVersionError`` when a compare-and-swap loses (the caller re-reads,
    never overwrites); ``TimeoutError`` (asyncbk's) when the store does not answer
    within the store's timeout; ``MetadataError`` for anything else the store does
    wrong.  Code that needs one part takes that part's protocol.
    """

    root: str

    async def close(self) -> None:
        ...
