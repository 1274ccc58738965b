"""Auto-recovery: an elected auditor and replication workers, coordinated in etcd.

* **Election.** Every auto-recovery process holds a lease and tries to take the
  ``auditor`` lock with it.  The holder is the auditor; when it dies its lease
  expires, the lock goes with it, and another process takes over within about
  ``lease_ttl_s`` + ``election_poll_s``.
* **Auditor.** Watches the bookie registry.  A bookie that disappears (its
  registration lease expired, or it was stopped) is *lost* after
  ``lost_bookie_delay_s``; a bookie that comes back within the delay costs
  nothing.  Once lost, every ledger with a fragment on it is marked
  under-replicated in etcd.  Every ``audit_interval_s`` the auditor also scans
  all ledgers for bookies that are not registered (losses that happened while
  no auditor ran), with the same delay.
* **Workers** (every process, the auditor's included) take marked ledgers one
  at a time under a ``ledger-<id>`` lock bound to their lease, and copy what the
  lost bookies held (:mod:`.replication`), at most ``rate_entries_per_s``
  entries a second.  An open ledger with a lost bookie in its last fragment is
  first recovered (fenced and closed), once the mark is
  ``open_ledger_grace_s`` old: a live writer would have replaced the bookie
  itself by then.  The mark is cleared when no fragment references a lost
  bookie any more (and kept, with a compare-and-swap, if a new loss was marked
  meanwhile).  Replacements follow the ledger's own placement when it was
  created with one (a namespace's segments), else the client's policy.  When an
  enforced placement cannot be met, nothing is copied and the ledger stays
  marked: it is retried when the registered bookies change, else after a delay
  doubling from ``worker_poll_s`` up to ``audit_interval_s`` (as BookKeeper's
  replication worker fails and retries such a ledger later).
* **Placement** (``fix_placement``, off by default).  The auditor also checks,
  every ``audit_interval_s``, every ledger against its own recorded placement,
  or else the client's rack- or region-aware policy, with the bookies' current
  locations, and moves the fragments that violate it to bookies the policy
  chooses (:mod:`.placement`), one ledger at a time under its ``ledger-<id>``
  lock, at the same rate limit.
  Ledgers marked under-replicated are left to the workers first; the open
  fragment of an open ledger is its writer's and is only reported.

Time (the lost-bookie delay, the age of a mark, every poll and sleep) comes
from the injected :class:`~asyncbk.clock.Clock`; a mark's time is the metadata
store's wall-clock time when it was first marked.  Randomness (the placement
repair's choices) comes from the injected ``rng``, so the simulator's worker
replays from its seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import BKError, MetadataError, NoSuchLedgerError, PlacementError
from ..log import get_logger
from ..meta.api import (
    BookieRegistry,
    LeaseStore,
    LedgerMetadataStore,
    LockStore,
    UnderReplicated,
    UnderReplicationStore,
)
from ..meta.keys import AUDITOR_LOCK, ledger_lock
from ..types import BookieId
from .placement import PlacementRule, check_ledger, fix_ledger_placement, rule_of
from .replication import RateLimiter, ReplicationStats, needs_recovery_first, replicate_ledger

AUDIT_POLL_S = 0.5
"""The auditor looks at the registry at least this often (and at once on a change)."""


@dataclass(frozen=True)
class AutoRecoveryConfig:
    lost_bookie_delay_s: float = 30.0
    """A bookie gone this long is lost and its ledgers re-replicated (0: at once)."""
    audit_interval_s: float = 60.0
    """How often the auditor scans every ledger for bookies that are not registered."""
    open_ledger_grace_s: float = 30.0
    """How long a marked open ledger's writer gets to replace a lost bookie of its last
    fragment itself, before the ledger is recovered (fenced and closed) and copied."""
    rate_entries_per_s: float = 5000.0
    """Entries copied per second by one worker (0: no limit)."""
    fix_placement: bool = False
    """The auditor also moves fragments that violate their ledger's own placement, or
    else the client's rack- or region-aware placement policy (given where the bookies
    are now), to bookies that comply."""
    lease_ttl_s: int = 10
    election_poll_s: float = 1.0
    worker_poll_s: float = 1.0
    metadata_timeout_s: float = 10.0

    def validate(self) -> AutoRecoveryConfig:
        for name in ("lost_bookie_delay_s", "audit_interval_s", "open_ledger_grace_s",
                     "rate_entries_per_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("lease_ttl_s", "election_poll_s", "worker_poll_s", "metadata_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        return self


@dataclass
class AutoRecoveryStatus:
    """What an auto-recovery process is doing (for the shell, HTTP and metrics)."""

    id: str
    is_auditor: bool = False
    auditor: str | None = None
    lost_pending: dict[BookieId, float] = field(default_factory=dict)
    """Bookies gone but still within the delay: bookie -> ``clock.monotonic_s()`` when
    it went."""
    lost: set[BookieId] = field(default_factory=set)
    ledgers_marked: int = 0
    audits: int = 0
    replication: ReplicationStats = field(default_factory=ReplicationStats)
    replicating: int | None = None
    replicated_ledgers: int = 0
    recovered_open_ledgers: int = 0
    underreplicated: int = 0
    """Marked ledgers seen at the worker's last round."""
    placement_checks: int = 0
    """Placement checks of every ledger done (``fix_placement``)."""
    placement_violating: int = 0
    """Ledgers that violated the placement policy at the last check."""
    placement_fixed_fragments: int = 0
    """Fragments moved to comply with the placement policy."""
    placement_left: int = 0
    """Violating fragments left at the last check (open, a bookie not registered, no
    bookies to comply with, or an error)."""
    placement_blocked: int = 0
    """Re-replications that failed because the ledger's enforced placement could not be
    met (the ledger stays marked under-replicated and is retried)."""
    last_error: str = ""
    clock: Clock = field(default=SYSTEM_CLOCK, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        now = self.clock.monotonic_s()
        r = self.replication
        return {
            "id": self.id, "is_auditor": self.is_auditor, "auditor": self.auditor,
            "lost_bookies": sorted(self.lost),
            "bookies_within_delay": {b: round(now - t, 1)
                                     for b, t in sorted(self.lost_pending.items())},
            "ledgers_marked": self.ledgers_marked, "audits": self.audits,
            "underreplicated_ledgers": self.underreplicated,
            "replicating_ledger": self.replicating,
            "replicated_ledgers": self.replicated_ledgers,
            "recovered_open_ledgers": self.recovered_open_ledgers,
            "copied_entries": r.entries, "copied_bytes": r.bytes,
            "copied_fragments": r.fragments, "errors": r.errors, "last_error": self.last_error,
            "placement_checks": self.placement_checks,
            "placement_violating_ledgers": self.placement_violating,
            "placement_fixed_fragments": self.placement_fixed_fragments,
            "placement_left_fragments": self.placement_left,
            "placement_blocked_replications": self.placement_blocked,
        }


class RecoveryMetadata(LedgerMetadataStore, BookieRegistry, LockStore, UnderReplicationStore,
                       Protocol):
    """What auto-recovery uses of the metadata store: the ledgers, the registry, the
    auditor and ``ledger-<id>`` locks, and the under-replication marks."""


class LeaseKeeper:
    """A lease granted and refreshed every ttl/3; re-granted if it is lost."""

    def __init__(self, meta: LeaseStore, ttl_s: int, log: Any, *,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.meta = meta
        self.ttl_s = ttl_s
        self.log = log
        self.clock = clock
        self.lease_id: int | None = None
        self.changed = asyncio.Event()

    async def run(self) -> None:
        while True:
            try:
                if self.lease_id is None:
                    self.lease_id = await self.meta.grant_lease(self.ttl_s)
                    self.changed.set()
                elif await self.meta.keepalive_lease(self.lease_id) <= 0:
                    self.log.warning("auto-recovery lease lost", lease_id=self.lease_id)
                    self.lease_id = None
                    self.changed.set()
                    continue
            except BKError as exc:
                self.log.warning("lease keep-alive failed", error=str(exc))
            await self.clock.sleep(self.ttl_s / 3)

    async def ready(self) -> int:
        while self.lease_id is None:
            self.changed.clear()
            await self.changed.wait()
        return self.lease_id


class AutoRecovery:
    """One auto-recovery process (or task, inside a bookie): candidate auditor + worker."""

    def __init__(self, bk: Any, config: AutoRecoveryConfig, process_id: str | None = None,
                 *, owns_client: bool = False, clock: Clock = SYSTEM_CLOCK,
                 rng: random.Random | None = None, log: Any = None) -> None:
        self.bk = bk
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        self._owns_client = owns_client
        self.meta: RecoveryMetadata = bk.meta
        self.config = config.validate()
        self.placement_rule: PlacementRule | None = None
        """What ``fix_placement`` checks ledgers without their own placement against:
        the client's placement settings (random: only ledgers created with their own
        rack- or region-aware placement are checked)."""
        if config.fix_placement:
            self.placement_rule = PlacementRule.of_client(bk.config)
        self.id = process_id or f"{socket.gethostname()}:{os.getpid()}"
        self.log = log if log is not None else get_logger(component="autorecovery",
                                                           autorecovery_id=self.id)
        self.status = AutoRecoveryStatus(self.id, clock=clock)
        self.lease = LeaseKeeper(self.meta, config.lease_ttl_s, self.log, clock=clock)
        self.limiter = RateLimiter(config.rate_entries_per_s, clock=clock)
        self._tasks: list[asyncio.Task[None]] = []
        self._registered: dict[BookieId, Any] | None = None
        self._view_changed = asyncio.Event()
        self._placement_retry: dict[int, tuple[float, float, frozenset[Any]]] = {}
        """Ledger -> (when to retry, delay, registered bookies) after its enforced
        placement could not be met."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for coro, name in ((self.lease.run(), "lease"), (self._watch(), "watch"),
                           (self._elect(), "election"), (self._work(), "worker")):
            self._tasks.append(loop.create_task(coro, name=f"asyncbk-autorecovery-{name}"))
        self.log.info("auto-recovery started", config=self.config.__dict__)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self.lease.lease_id is not None:
            with contextlib.suppress(BKError):
                await self.meta.revoke_lease(self.lease.lease_id)  # the auditor role moves now
            self.lease.lease_id = None
        if self._owns_client:
            await self.bk.close()

    # ------------------------------------------------------------------ registry

    async def _watch(self) -> None:
        while True:
            try:
                async for view in self.meta.watch_bookies():
                    self._registered = dict(view)
                    self._view_changed.set()
            except BKError as exc:
                self.log.warning("bookie watch failed, retrying", error=str(exc))
                await self.clock.sleep(1)

    async def _available(self) -> dict[BookieId, Any]:
        if self._registered is None:
            return dict(await self.meta.list_bookies())
        return self._registered

    # ------------------------------------------------------------------ election

    async def _elect(self) -> None:
        while True:
            try:
                lease_id = await self.lease.ready()
                holder = await self.meta.acquire_lock(AUDITOR_LOCK, self.id, lease_id)
                self.status.auditor = holder
                if holder == self.id:
                    self.status.is_auditor = True
                    self.log.info("elected auditor")
                    try:
                        await self._audit_while_holding(lease_id)
                    finally:
                        self.status.is_auditor = False
                    self.log.warning("no longer the auditor")
                    continue
            except BKError as exc:
                self.log.warning("auditor election failed, retrying", error=str(exc))
            await self.clock.sleep(self.config.election_poll_s)

    async def _audit_while_holding(self, lease_id: int) -> None:
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._audit())]
        if self.placement_rule is not None:
            tasks.append(loop.create_task(self._placement_loop()))
        try:
            while not any(t.done() for t in tasks):
                await self.clock.sleep(self.config.election_poll_s)
                if self.lease.lease_id != lease_id or \
                        await self.meta.lock_holder(AUDITOR_LOCK) != self.id:
                    return
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ auditor

    async def _audit(self) -> None:
        cfg = self.config
        st = self.status
        st.lost_pending.clear()
        st.lost.clear()
        seen: set[BookieId] = set(await self._available())
        next_scan = 0.0
        while True:
            now = self.clock.monotonic_s()
            registered = set(await self._available())
            for b in seen - registered:
                if b not in st.lost and b not in st.lost_pending:
                    self.log.warning("bookie gone; lost unless it is back in time", bookie=b,
                                     delay_s=cfg.lost_bookie_delay_s)
                    st.lost_pending[b] = now
            for b in registered:
                if st.lost_pending.pop(b, None) is not None:
                    self.log.info("bookie back within the delay: nothing to do", bookie=b)
                if b in st.lost:
                    st.lost.discard(b)
                    self.log.info("lost bookie registered again", bookie=b)
            seen |= registered
            if now >= next_scan:
                next_scan = now + cfg.audit_interval_s
                for b in await self._unregistered_in_ledgers(registered):
                    if b not in st.lost and b not in st.lost_pending:
                        self.log.warning("ledgers reference an unregistered bookie", bookie=b)
                        st.lost_pending[b] = now
                seen |= st.lost_pending.keys()
                st.audits += 1
            due = {b for b, t in st.lost_pending.items() if now - t >= cfg.lost_bookie_delay_s}
            if due:
                await self._mark_ledgers_of(due)
                for b in due:
                    del st.lost_pending[b]
                st.lost |= due
            self._view_changed.clear()
            await self._wait_view_change(AUDIT_POLL_S)

    async def _wait_view_change(self, timeout_s: float) -> None:
        """Until the registry view changes or ``timeout_s`` pass on the clock."""
        changed = asyncio.ensure_future(self._view_changed.wait())
        timer = asyncio.ensure_future(self.clock.sleep(timeout_s))
        try:
            await asyncio.wait((changed, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (changed, timer):
                t.cancel()
            await asyncio.gather(changed, timer, return_exceptions=True)

    async def _unregistered_in_ledgers(self, registered: set[BookieId]) -> set[BookieId]:
        out: set[BookieId] = set()
        async for ledger_id in self.meta.iter_ledger_ids():
            try:
                md = await self.meta.read_ledger(ledger_id)
            except NoSuchLedgerError:
                continue
            out |= md.all_bookies() - registered
        return out

    async def _mark_ledgers_of(self, lost: set[BookieId]) -> None:
        marked = 0
        async for ledger_id in self.meta.iter_ledger_ids():
            try:
                md = await self.meta.read_ledger(ledger_id)
            except NoSuchLedgerError:
                continue
            hit = md.all_bookies() & lost
            if hit:
                await self.meta.mark_underreplicated(ledger_id, hit)
                marked += 1
        self.status.ledgers_marked += marked
        self.log.warning("bookies lost: ledgers marked under-replicated", bookies=sorted(lost),
                         ledgers=marked)

    # ------------------------------------------------------------------ placement

    async def _placement_loop(self) -> None:
        """While auditor: check (and repair) every ledger's placement each audit interval."""
        while True:
            try:
                await self.check_placement()
            except BKError as exc:
                self.status.last_error = f"placement check: {exc}"
                self.log.warning("placement check failed; retrying at the next interval",
                                 error=str(exc))
            await self.clock.sleep(self.config.audit_interval_s)

    async def check_placement(self) -> None:
        """One pass of ``fix_placement``: every ledger checked (against its own recorded
        placement, or else the client's), violating ones repaired."""
        default = self.placement_rule
        if default is None:
            return
        view = await self._available()
        available = set(view)
        writable = sorted(b for b, reg in view.items() if not reg.readonly)
        locations = await self.bk.bookies.current_locations(self.config.metadata_timeout_s)
        marked = {m.ledger_id for m in await self.meta.list_underreplicated()}
        violating = left = 0
        async for ledger_id in self.meta.iter_ledger_ids():
            if ledger_id in marked:
                continue  # lost bookies first: the workers' job
            try:
                md = await self.meta.read_ledger(ledger_id)
            except NoSuchLedgerError:
                continue
            rule, own = rule_of(md, default, self.bk.config)
            checks = check_ledger(md, rule, locations, available, own_rule=own)
            if not checks:
                continue
            violating += 1
            if not any(c.fixable for c in checks):
                left += len(checks)
                continue
            left += await self._fix_placement(ledger_id, default, available, writable,
                                              len(checks))
        st = self.status
        st.placement_checks += 1
        st.placement_violating, st.placement_left = violating, left
        if violating:
            self.log.warning("placement check: ledgers violate their placement policy",
                             policy=default.policy, ledgers=violating, fragments_left=left)

    async def _fix_placement(self, ledger_id: int, rule: PlacementRule,
                             available: set[BookieId], writable: list[BookieId],
                             violating: int) -> int:
        """Repair one ledger (with ``violating`` fragments) under its lock, against its
        own placement or else ``rule``; returns the violating fragments left."""
        lease_id = await self.lease.ready()
        lock = ledger_lock(ledger_id)
        owner = f"{self.id} placement"  # not this process's worker (locks are re-entrant)
        try:
            if await self.meta.acquire_lock(lock, owner, lease_id) != owner:
                return violating  # a worker has it; the next check sees it again
        except MetadataError:
            return violating
        self.status.replicating = ledger_id
        try:
            done = await fix_ledger_placement(self.bk, ledger_id, rule, available, writable,
                                              self.limiter, self.status.replication,
                                              rng=self.rng)
        except NoSuchLedgerError:
            return 0
        except BKError as exc:  # a concurrent change or a failed copy: next interval
            self.status.replication.errors += 1
            self.status.last_error = f"ledger {ledger_id} placement: {exc}"
            self.log.warning("placement repair failed; retrying at the next check",
                             ledger_id=ledger_id, error=str(exc))
            return violating
        finally:
            self.status.replicating = None
            with contextlib.suppress(BKError):
                await self.meta.release_lock(lock, owner)
        self.status.placement_fixed_fragments += len(done.fixed)
        for line in done.left:
            self.log.warning("placement violation left", detail=line)
        return len(done.left)

    # ------------------------------------------------------------------ worker

    async def _work(self) -> None:
        while True:
            try:
                marks = await self.meta.list_underreplicated()
                self.status.underreplicated = len(marks)
                for ledger_id in self._placement_retry.keys() - {m.ledger_id for m in marks}:
                    del self._placement_retry[ledger_id]  # replicated elsewhere, or deleted
                for mark in marks:
                    if not await self._placement_retry_due(mark.ledger_id):
                        continue
                    await self._take(mark)
            except BKError as exc:
                self.status.last_error = str(exc)
                self.log.warning("replication round failed", error=str(exc))
            await self.clock.sleep(self.config.worker_poll_s)

    async def _take(self, mark: UnderReplicated) -> None:
        lease_id = await self.lease.ready()
        lock = ledger_lock(mark.ledger_id)
        try:
            if await self.meta.acquire_lock(lock, self.id, lease_id) != self.id:
                return  # another worker has it
        except MetadataError:
            return  # our lease just expired; the next round has a new one
        self.status.replicating = mark.ledger_id
        try:
            await self._replicate(mark)
            self._placement_retry.pop(mark.ledger_id, None)
        except PlacementError as exc:
            self.status.replication.errors += 1
            self.status.placement_blocked += 1
            self.status.last_error = f"ledger {mark.ledger_id}: {exc}"
            delay = await self._placement_backoff(mark.ledger_id)
            self.log.warning("re-replication blocked by an enforced placement; the ledger "
                             "stays under-replicated and is retried when the registered "
                             "bookies change or after the delay", ledger_id=mark.ledger_id,
                             retry_s=round(delay, 1), error=str(exc))
        except BKError as exc:
            self.status.replication.errors += 1
            self.status.last_error = f"ledger {mark.ledger_id}: {exc}"
            self.log.warning("re-replication failed; retrying later", ledger_id=mark.ledger_id,
                             error=str(exc))
        finally:
            self.status.replicating = None
            with contextlib.suppress(BKError):
                await self.meta.release_lock(lock, self.id)

    def _registered_key(self, view: dict[BookieId, Any]) -> frozenset[Any]:
        return frozenset((b, bool(reg.readonly)) for b, reg in view.items())

    async def _placement_backoff(self, ledger_id: int) -> float:
        """After ``ledger_id``'s enforced placement could not be met: its next delay
        (doubling from ``worker_poll_s`` up to ``audit_interval_s``)."""
        cap = max(self.config.audit_interval_s, self.config.worker_poll_s)
        previous = self._placement_retry.get(ledger_id)
        delay = min(cap, previous[1] * 2 if previous else self.config.worker_poll_s)
        self._placement_retry[ledger_id] = (self.clock.monotonic_s() + delay, delay,
                                            self._registered_key(await self._available()))
        return delay

    async def _placement_retry_due(self, ledger_id: int) -> bool:
        """Whether a ledger whose enforced placement could not be met may be tried again:
        its delay has passed, or the registered bookies changed since."""
        retry = self._placement_retry.get(ledger_id)
        if retry is None:
            return True
        return self.clock.monotonic_s() >= retry[0] or \
            self._registered_key(await self._available()) != retry[2]

    async def _replicate(self, mark: UnderReplicated) -> None:
        ledger_id = mark.ledger_id
        try:
            md = await self.meta.read_ledger(ledger_id)
        except NoSuchLedgerError:
            await self.meta.clear_underreplicated(ledger_id, mark.version)
            return
        view = await self._available()
        available = set(view)
        if needs_recovery_first(md, available):
            age_s = self.clock.wall_s() - mark.marked_ms / 1000
            if age_s < self.config.open_ledger_grace_s:
                return  # the writer may still replace the bookie itself
            self.log.warning("recovering an open ledger whose last fragment lost a bookie",
                             ledger_id=ledger_id)
            await self.bk.open_ledger(ledger_id, password=md.password, recovery=True)
            self.status.recovered_open_ledgers += 1
        writable = sorted(b for b, reg in view.items() if not reg.readonly)
        await replicate_ledger(self.bk, ledger_id, available, writable, self.limiter,
                               self.status.replication)
        md = await self.meta.read_ledger(ledger_id)
        if md.all_bookies() <= available and \
                await self.meta.clear_underreplicated(ledger_id, mark.version):
            self.status.replicated_ledgers += 1
            self.log.info("ledger fully replicated again", ledger_id=ledger_id)


__all__ = ["AUDITOR_LOCK", "AutoRecovery", "AutoRecoveryConfig", "AutoRecoveryStatus",
           "ledger_lock"]
