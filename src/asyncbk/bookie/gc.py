"""Garbage collection on a bookie: forget deleted ledgers, compact entry logs.

Every ``gc_interval_s``:

1. **Deleted ledgers.**  The bookie notes the ledgers it stores, *then* lists the
   ledgers in the metadata store.  A noted ledger missing from the list was
   deleted: its metadata existed before any of its entries reached this bookie,
   so it was there when the listing started.  (Listing first would race with
   ledgers created meanwhile.)
2. **Ledgers this bookie no longer belongs to.**  A closed ledger whose
   ensembles do not name this bookie (it was replaced by re-replication) is
   dropped too -- under the ledger's ``ledger-<id>`` lock, the one replication
   workers hold while they copy and update metadata, and after re-reading the
   metadata under it, so a copy to this bookie cannot slip in between.
3. **Compaction.**  A finished entry log whose live fraction fell below
   ``minor_compaction_threshold`` (checked every ``minor_compaction_interval_s``)
   or ``major_compaction_threshold`` (every ``major_compaction_interval_s``) has
   its live entries moved to the current log, at most
   ``compaction_rate_bytes_per_s``, and is then deleted.  Adds and reads go on.

The rounds and the compaction intervals follow the injected clock (by default
the storage's).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from ..clock import Clock
from ..config import BookieConfig
from ..errors import BKError, MetadataError, NoSuchLedgerError
from ..meta.api import LedgerMetadataStore, LockStore
from ..meta.keys import ledger_lock
from .storage import Storage

COMPACTION_BATCH_LOGS = 16
"""Entry logs compacted together (their moves made durable by one checkpoint)."""


class GcMetadata(LedgerMetadataStore, LockStore, Protocol):
    """What garbage collection uses of the metadata store: the ledgers, and the
    ``ledger-<id>`` locks it shares with replication workers."""


class GarbageCollector:
    def __init__(self, storage: Storage, meta: GcMetadata, bookie_id: str,
                 config: BookieConfig, lease_id: Any, log: Any, *,
                 clock: Clock | None = None) -> None:
        self.storage = storage
        self.clock = clock if clock is not None else storage.clock
        self.meta = meta
        self.bookie_id = bookie_id
        self.config = config
        self.lease_id = lease_id
        """A callable returning the bookie's registration lease (None while it has none)."""
        self.log = log
        self.runs = 0
        self.deleted = 0
        self.dropped_not_in_ensemble = 0
        self.bytes_freed = 0
        self.last_run_s = 0.0
        now = self.clock.monotonic_s()
        self._last_minor = now
        self._last_major = now

    async def run_forever(self) -> None:
        while True:
            await self.clock.sleep(self.config.gc_interval_s)
            try:
                await self.run_once()
            except BKError as exc:
                self.log.warning("garbage collection round failed", error=str(exc))
            except Exception as exc:  # a bug: say so loudly, but keep collecting
                self.log.error("garbage collection round failed unexpectedly",
                               error=repr(exc))

    async def run_once(self, force_compaction: bool = False) -> dict[str, int]:
        """One round; returns what it did."""
        t0 = time.perf_counter()  # performance timer: only reported (last_run_s)
        local = set(self.storage.ledger_ids())  # before the listing: see the module doc
        listed = {lid async for lid in self.meta.iter_ledger_ids()}
        deleted = 0
        for ledger_id in sorted(local - listed):
            await self.storage.delete_ledger(ledger_id)
            deleted += 1
        dropped = 0
        if self.config.gc_drop_ledgers_not_in_ensemble:
            for ledger_id in sorted(local & listed):
                if await self._drop_if_not_in_ensemble(ledger_id):
                    dropped += 1
        freed = await self._compact(force_compaction)
        self.runs += 1
        self.deleted += deleted
        self.dropped_not_in_ensemble += dropped
        self.bytes_freed += freed
        self.last_run_s = time.perf_counter() - t0
        if deleted or dropped or freed:
            self.log.info("garbage collected", ledgers_deleted=deleted,
                          ledgers_not_in_ensemble=dropped, bytes_freed=freed,
                          seconds=round(self.last_run_s, 3))
        return {"deleted": deleted, "dropped": dropped, "bytes_freed": freed}

    async def _drop_if_not_in_ensemble(self, ledger_id: int) -> bool:
        try:
            md = await self.meta.read_ledger(ledger_id)
        except NoSuchLedgerError:
            await self.storage.delete_ledger(ledger_id)
            return True
        if not md.is_closed or self.bookie_id in md.all_bookies():
            return False
        lease_id = self.lease_id()
        if lease_id is None:
            return False
        lock = ledger_lock(ledger_id)
        owner = f"gc-{self.bookie_id}"
        try:
            if await self.meta.acquire_lock(lock, owner, lease_id) != owner:
                return False  # a worker is copying it (maybe to us): next round
        except MetadataError:
            return False
        try:
            md = await self.meta.read_ledger(ledger_id)
            if self.bookie_id in md.all_bookies():
                return False
            await self.storage.delete_ledger(ledger_id)
            self.log.info("dropped a ledger this bookie no longer belongs to",
                          ledger_id=ledger_id)
            return True
        except NoSuchLedgerError:
            await self.storage.delete_ledger(ledger_id)
            return True
        finally:
            await self.meta.release_lock(lock, owner)

    async def _compact(self, force: bool) -> int:
        cfg = self.config
        now = self.clock.monotonic_s()
        threshold = 0.0
        if force or now - self._last_major >= cfg.major_compaction_interval_s:
            threshold, self._last_major, self._last_minor = cfg.major_compaction_threshold, now, now
        elif now - self._last_minor >= cfg.minor_compaction_interval_s:
            threshold, self._last_minor = cfg.minor_compaction_threshold, now
        if threshold <= 0:
            return 0
        chosen = [log_id for log_id, (live, total) in sorted((await self.storage.entry_log_usage()).items())
                  if total and live / total < threshold]
        freed = 0
        for i in range(0, len(chosen), COMPACTION_BATCH_LOGS):  # one checkpoint per batch
            freed += await self.storage.compact_entry_logs(chosen[i:i + COMPACTION_BATCH_LOGS],
                                                           cfg.compaction_rate_bytes_per_s)
        return freed

    def statistics(self) -> dict[str, Any]:
        return {"runs": self.runs, "ledgers_deleted": self.deleted,
                "ledgers_not_in_ensemble": self.dropped_not_in_ensemble,
                "bytes_freed": self.bytes_freed, "last_run_s": self.last_run_s}


__all__ = ["GarbageCollector"]
