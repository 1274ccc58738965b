"""The writer's handle: :class:`LedgerHandle` (reads come from :class:`ReadHandle`).

The path of one append (see docs/architecture.md): ``append`` assigns the next
entry id, seals the payload in its digest envelope (with the current LAC
piggybacked) and submits it to the :class:`~asyncbk.client.write_path.WritePath`,
whose answer says which ensemble positions to send it to; the channels send it
and each bookie's answer goes back to the write path, which says which entries
are now complete (in id order, each advancing the LAC), and the handle resolves
their futures.  All of that without suspending.  The quorum, completion and
survival rules live in the write path; this module does the I/O: channels,
futures, timers, metadata.

Ensemble change: when a bookie errors, times out or answers READ_ONLY /
NOT_READY on an add, the handle picks a replacement (not in the ensemble; by
the placement policy the ledger was created with, see
``BookKeeper.create_ledger(placement=...)``), starts a new fragment at
``LAC + 1`` by compare-and-swap on the metadata, and tells the write path,
which re-sends every pending entry whose write set includes a replaced
position (no add completes while the change is being committed).  A lost
compare-and-swap re-reads the metadata; a ledger no longer OPEN (a recovery
started) fails the pending adds with LedgerFencedError.  With no replacement
available, the handle writes on without the failed bookies as long as every
write set keeps an ack quorum of healthy ones (retrying the replacement every
``DEGRADED_RETRY_S``); otherwise appends wait, and fail with
NotEnoughBookiesError once none has completed for ``ensemble_change_timeout_s``.

A handle that fails (fenced, no replacement, add quorum timeout) fails every
pending add with the cause and refuses later appends with it.
"""

from __future__ import annotations

import asyncio

from ..backoff import Backoff
from ..clock import loop_timer
from ..errors import (
    BadRequestError,
    BKError,
    BookieUnavailableError,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    NotEnoughBookiesError,
    PlacementError,
    TimeoutError,
    TooManyRequestsError,
    UnauthorizedAccessError,
    invariant,
)
from ..meta.model import Ensemble, Fragment, LedgerMetadata, LedgerState
from ..proto import AddFlag, AddResponse, Response, Status, WriteLacRequest
from ..tracing import Tracing
from ..types import BookieId
from .context import ClientContext
from .outbox import Outbox
from .pending import PendingAppends
from .placement import PlacementPolicy
from .read_handle import (
    FRAME_OVERHEAD_BYTES_MAX,
    READ_BATCH_ENTRIES_MAX,
    READ_BATCHES_INFLIGHT,
    READ_WINDOW_ENTRIES_MAX,
    ReadHandle,
    status_error,
)
from .write_path import NOTHING, Effects, WritePath

__all__ = ["DEGRADED_RETRY_S", "FRAME_OVERHEAD_BYTES_MAX", "READ_BATCHES_INFLIGHT",
           "READ_BATCH_ENTRIES_MAX", "READ_WINDOW_ENTRIES_MAX", "LedgerHandle", "ReadHandle",
           "status_error"]

DEGRADED_RETRY_S = 2.0
"""How often a handle writing without failed bookies (no spare) tries to replace them."""

ENSEMBLE_CHANGE_BACKOFF_S_INITIAL = 0.05
"""The first wait of an ensemble change with no replacement (doubling up to
``ensemble_change_backoff_s_max``; a registry change ends a wait early)."""



class LedgerHandle(ReadHandle):
    """The single writer's handle of an open ledger (it can read too).

    With ``recovery=True`` it is the recovery's writer: it re-writes recovered
    entries with the RECOVERY_ADD flag into an IN_RECOVERY ledger and closes it.
    """

    _follows_metadata = False

    def __init__(self, ctx: ClientContext, metadata: LedgerMetadata, password: bytes, *,
                 recovery: bool = False, lac: int = -1, length: int = 0,
                 placement: PlacementPolicy | None = None) -> None:
        super().__init__(ctx, metadata, password)
        self._placement = placement if placement is not None else ctx.placement
        """Chooses this ledger's replacements: the policy its ensemble was made with
        (``create_ledger(placement=...)``), else the client's."""
        self._loop = asyncio.get_running_loop()
        self._clock = ctx.clock
        self._now_s = loop_timer(ctx.clock, self._loop)
        self._tracing = ctx.tracing
        self._recovery = recovery
        self._add_flags = AddFlag.RECOVERY_ADD if recovery else AddFlag.NONE
        self._writable_state = LedgerState.IN_RECOVERY if recovery else LedgerState.OPEN
        self._persisted_ensembles = metadata.ensembles
        self._lac = lac
        # A recovery does not publish its progress as a LAC: a concurrent recoverer may
        # close the ledger shorter, and readers must never be told of entries past the
        # end that wins (they trust the bookies' LAC while the ledger looks open).
        self._writes = WritePath(metadata.ensembles[-1][1], metadata.write_quorum,
                                 metadata.ack_quorum, lac=lac, publish_lac=not recovery)
        self._pending = PendingAppends(lac + 1, traced=self._tracing is not None)
        """Pending entries, in id order (the same as the write path's), as data."""
        self._length = length
        self._submitted_length = length
        self._error: BKError | None = None
        self._closing: asyncio.Future[None] | None = None
        self._outbox = Outbox(ctx.bookie_client, metadata.ledger_id, self._master_key,
                              self._add_flags, metadata.ensemble_size,
                              ctx.config.add_timeout_s, on_acks=self._on_acks,
                              on_answer=self._on_add_response,
                              traced=self._tracing is not None)
        """Sends queued this loop turn, taken by each bookie's channel at its flush (not
        the handle itself: its public surface stays the application's)."""
        self._drained: asyncio.Future[None] | None = None
        """Resolved once no entry is pending (what close waits for)."""
        self._capacity = asyncio.Event()
        self._capacity.set()
        self._pending_max = ctx.config.pending_adds_max
        self._entry_bytes_max = ctx.config.frame_bytes_max - FRAME_OVERHEAD_BYTES_MAX
        self._quorum_timeout_s = ctx.config.add_quorum_timeout_s
        self._degraded_retry: asyncio.TimerHandle | None = None
        self._stalled_since_s: float | None = None
        """Since when appends wait for want of bookies (None: they don't)."""
        self._stalled_bookies: set[BookieId] = set()
        self._placement_error: PlacementError | None = None
        """Why the enforced placement policy found no replacement, the last time."""
        """The bookies that failed since then (named in the error if it lasts)."""
        self._change_task: asyncio.Task[None] | None = None
        self._judged: set[BookieId] = set()
        """Failed bookies whose channel is finding out whether they refused this
        client's credentials (not quarantined until it knows they did not)."""
        self.ensemble_changes = 0
        self._explicit_lac_handle: asyncio.TimerHandle | None = None
        self._quorum_timer: asyncio.TimerHandle | None = None

    @property
    def pending_adds(self) -> int:
        return len(self._pending)

    @property
    def placement(self) -> PlacementPolicy:
        """The placement policy this handle's ensemble changes use."""
        return self._placement

    # ------------------------------------------------------------------ append

    def append(self, data: bytes) -> asyncio.Future[int]:
        """Submit ``data`` now; the returned future resolves to its entry id once
        ``ack_quorum`` bookies have made it durable."""
        if self._recovery:
            raise LedgerClosedError(f"ledger {self.id} is being recovered")
        if type(data) is bytes:
            payload = data
        elif isinstance(data, (bytes, bytearray, memoryview)):
            payload = bytes(data)
        else:
            raise TypeError(f"append takes bytes, not {type(data).__name__}")
        if len(payload) > self._entry_bytes_max:
            # Checked here: an oversized frame would make each bookie drop the whole
            # connection, failing other ledgers' requests too.
            raise EntryTooLargeError(
                f"entry of {len(payload)} bytes exceeds the {self._entry_bytes_max}-byte "
                "maximum (frame_bytes_max less overhead); split it into smaller entries")
        entry_id = self._writes.next_entry_id
        total_length = self._submitted_length + len(payload)
        if self._closing is not None or self._error is not None or not self._capacity.is_set():
            self._check_appendable()  # (the capacity event is clear: the window is full)
        body = self._digest.seal(entry_id, self._lac, total_length, payload)
        self._submitted_length = total_length
        return self._enqueue(entry_id, total_length, body)

    def append_recovered(self, entry_id: int, body: bytes, total_length: int) -> asyncio.Future[int]:
        """Recovery: re-write an entry read back from the bookies, byte for byte."""
        invariant(self._recovery, "append_recovered on a writer handle")
        invariant(entry_id == self._writes.next_entry_id,
                  f"recovered entry {entry_id}, expected {self._writes.next_entry_id}")
        self._check_appendable()
        self._submitted_length = total_length
        return self._enqueue(entry_id, total_length, body)

    def _check_appendable(self) -> None:
        if self._closing is not None:
            raise LedgerClosedError(f"ledger {self.id} is closed")
        if self._error is not None:
            raise self._error
        if len(self._pending) >= self._pending_max:
            raise TooManyRequestsError(
                f"ledger {self.id}: {len(self._pending)} appends in flight (pending_adds_max); "
                "await earlier appends or wait_for_capacity()")

    def _enqueue(self, entry_id: int, total_length: int, body: bytes) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = self._loop.create_future()
        trace = b""
        if self._tracing is not None:
            span = self._tracing.start("asyncbk.append", {
                "asyncbk.ledger_id": self.id, "asyncbk.entry_id": entry_id,
                "asyncbk.bytes": len(body), "asyncbk.recovery": self._recovery})
            trace = Tracing.wire(span)
            count = self._pending.push(fut, body, total_length, self._now_s(), span, trace)
        else:
            count = self._pending.push(fut, body, total_length, self._now_s())
        if count >= self._pending_max:
            self._capacity.clear()
        writes = self._writes
        positions, lac = writes.submit_to(entry_id)
        if positions:
            self._outbox.queue_entry(entry_id, positions, lac, writes.ensemble, body, trace)
        if self._quorum_timer is None and self._quorum_timeout_s:
            self._arm_quorum_timer()
        return fut

    async def wait_for_capacity(self) -> None:
        """Wait until ``append`` would not raise TooManyRequestsError."""
        await self._capacity.wait()

    # ------------------------------------------------------------------ effects

    def _apply(self, effects: Effects) -> None:
        """Do what the write path decided."""
        if effects.sends:
            self._send(effects.sends, effects.lac)
        if effects.completed:
            self._complete(effects.completed)
        if effects.start_change:
            self._change_task = self._loop.create_task(self._change_ensemble())

    def _send(self, sends: tuple[tuple[int, int], ...], lac: int) -> None:
        """Queue ``sends`` for the bookies now at their positions (:class:`Outbox`)."""
        self._outbox.queue(sends, lac, self._writes.ensemble, self._pending)

    def _complete(self, entry_ids: tuple[int, ...]) -> None:
        pending = self._pending
        first = entry_ids[0]
        if first != pending.first:
            invariant(False, f"ledger {self.id}: completing entry {first}, "
                      f"the oldest pending is {pending.first}")
        done = pending.complete(len(entry_ids))
        self._ctx.stats.add_latency.observe_since(self._now_s(), done.submitted_s)
        if done.spans is not None:
            for span in done.spans:
                if span is not None:
                    span.end()
        self._lac = entry_ids[-1]
        self._length = done.length
        for entry_id, future in enumerate(done.futures, first):
            if not future.done():  # (the application may have cancelled it)
                future.set_result(entry_id)
        if len(pending) < self._pending_max:
            self._capacity.set()
        self._stalled_since_s = None
        self._stalled_bookies.clear()
        self._schedule_explicit_lac()
        if not len(pending):
            self._wake_drained()

    def _fail(self, error: BKError) -> None:
        if self._error is None:
            self._error = error
        self._writes.fail_all()
        self._outbox.discard()
        done = self._pending.clear()
        if done is not None:
            if done.spans is not None and self._tracing is not None:
                for span in done.spans:
                    if span is not None:
                        self._tracing.failed(span, error)
            for future in done.futures:
                if not future.done():
                    future.set_exception(error)
                    # The application may never await a failed append; don't warn.
                    future.exception()
        self._capacity.set()
        self._cancel_timers()
        self._wake_drained()

    def _wake_drained(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # ------------------------------------------------------------------ responses

    def _on_add_response(self, entry_id: int, position: int, bookie: BookieId,
                         result: Response | BKError) -> None:
        if self._error is not None or self._closing_done():
            return
        writes = self._writes
        if isinstance(result, AddResponse) and result.status == Status.OK:
            effects = writes.ack(entry_id, position, bookie)
            if effects is not NOTHING:
                self._apply(effects)
            return
        if not writes.is_current(position, bookie):
            return  # that position was given to another bookie since: stale answer
        # A failure of an entry that completed without this bookie still means the
        # bookie must be replaced, or later entries would run short of replicas.
        pending = writes.is_pending(entry_id)
        if not pending and position in writes.failed_positions:
            return
        error = (result if isinstance(result, BKError)
                 else status_error(result.status, f"add {self.id}:{entry_id} to {bookie}"))
        if isinstance(error, (LedgerFencedError, UnauthorizedAccessError)) or (
                pending and isinstance(error, BadRequestError)):
            self._log.warning("add refused, ledger handle unusable", entry_id=entry_id,
                              bookie=bookie, error=str(error))
            self._fail(error)
            return
        effects = writes.failed(position, bookie)
        if effects.newly_failed:
            self._log.info("bookie failed an add, changing ensemble", bookie=bookie,
                           entry_id=entry_id, error=str(error))
            if self._ctx.bookie_client.judging(bookie):
                self._judged.add(bookie)  # quarantined once it did not refuse this client
            else:
                self._ctx.quarantine_bookie(bookie)
        self._apply(effects)

    def _on_acks(self, entry_ids: list[int], position: int, bookie: BookieId) -> None:
        """``bookie`` acknowledged every entry of ``entry_ids`` (an ADD_BATCH answered
        OK throughout): :meth:`_on_add_response` for each, in one step."""
        if self._error is not None or self._closing_done():
            return
        effects = self._writes.ack_many(entry_ids, position, bookie)
        if effects is not NOTHING:
            self._apply(effects)

    def _closing_done(self) -> bool:
        return self._closing is not None and self._closing.done()

    # ------------------------------------------------------------------ ensemble change

    async def _change_ensemble(self) -> None:
        cfg = self._ctx.config
        writes = self._writes
        backoff = Backoff(min(ENSEMBLE_CHANGE_BACKOFF_S_INITIAL, cfg.ensemble_change_backoff_s_max),
                          cfg.ensemble_change_backoff_s_max)
        back: set[BookieId] = set()
        """Failed bookies of the ensemble found healthy again while appends waited:
        each may take its own position back (no spare to be had)."""
        effects = NOTHING
        try:
            while writes.failed_positions and self._error is None:
                if self.ensemble_changes >= cfg.ensemble_changes_max:
                    raise NotEnoughBookiesError(
                        f"ledger {self.id}: {self.ensemble_changes} ensemble changes already "
                        "(ensemble_changes_max); giving up")
                failed = sorted(writes.failed_positions)
                md = self._metadata
                ensemble = list(md.ensembles[-1][1])
                await self._judge([ensemble[p] for p in failed])
                writable = await self._ctx.bookies.writable(cfg.metadata_timeout_s)
                quarantined = self._ctx.quarantine.active()
                keep = [p for p in failed if ensemble[p] in back
                        and ensemble[p] in writable and ensemble[p] not in quarantined]
                try:
                    replacements = self._placement.replace(
                        ensemble, [p for p in failed if p not in keep], md.write_quorum,
                        writable, self._ctx.bookies.locations(), exclude=quarantined)
                except NotEnoughBookiesError as exc:
                    self._placement_error = exc if isinstance(exc, PlacementError) else None
                    if not await self._no_replacement(failed, ensemble, writable, quarantined,
                                                      back):
                        break  # writing on without them (degraded)
                    await self._ctx.bookies.wait_for_change(backoff.next_s())
                    continue
                for pos, bookie in zip([p for p in failed if p not in keep], replacements,
                                       strict=True):
                    ensemble[pos] = bookie
                old = md.ensembles[-1][1]
                if tuple(ensemble) != old:
                    first = self._lac + 1
                    self._metadata = await self._commit_ensemble(first, tuple(ensemble))
                    self.ensemble_changes += 1
                    self._ctx.stats.ensemble_changes += 1
                    self._log.info("ensemble changed", first_entry_id=first, old=list(old),
                                   new=list(ensemble), replaced=[old[p] for p in failed
                                                                 if p not in keep])
                if keep:
                    self._log.info("failed bookies healthy again, writing to them",
                                   bookies=[old[p] for p in keep])
                back.clear()
                self._apply(writes.ensemble_changed(ensemble, failed))
        except UnauthorizedAccessError as exc:
            self._log.warning("bookie refused this client, ledger handle unusable",
                              error=str(exc))
            self._fail(exc)
        except BKError as exc:
            self._log.warning("ensemble change failed", error=str(exc))
            self._fail(exc)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self._fail(BookieUnavailableError(f"ensemble change failed: {exc!r}"))
            raise
        finally:
            self._change_task = None
            effects = writes.change_ended()
        if self._error is None:
            self._apply(effects)

    async def _judge(self, bookies: list[BookieId]) -> None:
        """Raise UnauthorizedAccessError if one of the failed ``bookies`` refused this
        client's credentials (a bookie's TLS layer refuses by closing the connection
        without a word: its channel finds out within ``connect_timeout_s``), for a
        refusal is no reason to replace a bookie; quarantine the others that waited
        for that answer."""
        client = self._ctx.bookie_client
        for bookie in bookies:
            refusal = await client.verdict(bookie)
            if refusal is not None:
                raise refusal
            if bookie in self._judged:
                self._judged.discard(bookie)
                self._ctx.quarantine_bookie(bookie)

    async def _no_replacement(self, failed: list[int], ensemble: list[BookieId],
                              writable: list[BookieId], quarantined: set[BookieId],
                              back: set[BookieId]) -> bool:
        """No spare for the failed positions.  Returns False to write on without them
        (every write set keeps an ack quorum: degraded mode), True to try again (a
        quarantined bookie answered as healthy, or appends wait for one), and raises
        NotEnoughBookiesError once no append has completed for
        ``ensemble_change_timeout_s``."""
        cfg = self._ctx.config
        spares = set(writable) - set(ensemble)
        # Bookies that failed recently may be healthy again (a pause that ended, a
        # network blip): ask them before doing without them.
        if await self._ctx.release_healthy(spares & quarantined):
            return True
        if self._writes.ack_quorum_survives(failed):
            if set(failed) != self._writes.degraded:
                self._log.warning("no spare bookie: writing on without the failed ones",
                                  failed=[ensemble[p] for p in sorted(failed)])
            self._writes.degrade(failed)
            self._schedule_degraded_retry()
            return False
        # Too few healthy bookies for an ack quorum: appends wait (they cannot
        # complete).  With no spare at all, a failed bookie of the ensemble that is
        # healthy again (restarted, resumed) may take its own position back.
        own = {ensemble[p] for p in failed} & set(writable)
        healthy = await self._ctx.release_healthy(own)
        if healthy:
            back.update(healthy)
            return True
        now_s = self._now_s()
        self._stalled_bookies.update(ensemble[p] for p in failed)
        if self._stalled_since_s is None:
            self._stalled_since_s = now_s
            self._log.warning("no bookie can replace the failed ones yet; appends wait",
                              failed=[ensemble[p] for p in sorted(failed)],
                              quarantined=sorted(quarantined),
                              timeout_s=cfg.ensemble_change_timeout_s)
        elif now_s - self._stalled_since_s >= cfg.ensemble_change_timeout_s:
            if self._placement_error is not None:
                # spares exist, but none the enforced policy accepts: say which rule
                raise PlacementError(
                    f"ledger {self.id}: no append completed for "
                    f"{cfg.ensemble_change_timeout_s}s (ensemble_change_timeout_s): no "
                    f"replacement for {', '.join(sorted(self._stalled_bookies))} meets the "
                    f"placement policy: {self._placement_error}")
            raise NotEnoughBookiesError(
                f"ledger {self.id}: no append completed for {cfg.ensemble_change_timeout_s}s "
                f"(ensemble_change_timeout_s) for want of bookies; failed: "
                f"{', '.join(sorted(self._stalled_bookies))}; other writable bookies: "
                f"{', '.join(sorted(spares)) or 'none'}"
                + (f" (failed recently: {', '.join(sorted(quarantined & spares))})"
                   if quarantined & spares else "")
                + "; start more bookies or lower the ensemble size")
        return True

    def _schedule_degraded_retry(self) -> None:
        if self._degraded_retry is None:
            self._degraded_retry = self._loop.call_later(DEGRADED_RETRY_S, self._retry_degraded)

    def _retry_degraded(self) -> None:
        """Try again to replace the bookies left out (a spare may have appeared)."""
        self._degraded_retry = None
        if self._writes.degraded and self._error is None and not self._closing_done() \
                and self._writes.begin_change():
            self._change_task = self._loop.create_task(self._change_ensemble())

    async def _commit_ensemble(self, first: int, ensemble: Ensemble) -> LedgerMetadata:
        md = self._metadata
        if self._recovery:
            # A recovery keeps its fragments to itself until the close commits them
            # with the CLOSED state in one CAS.  Persisting one now would let a later
            # recovery attempt (after this one fails) read entries past our progress
            # from a replacement that never got them, and take its "no such entry"
            # for evidence that an acknowledged entry does not exist.
            return md.replace(ensembles=_with_fragment(md.ensembles, first, ensemble, self.id))
        while True:
            if md.state is not self._writable_state:
                if md.state is LedgerState.CLOSED:
                    raise LedgerClosedError(f"ledger {self.id} was closed by someone else")
                raise LedgerFencedError(
                    f"ledger {self.id} is {md.state.value}: another client is recovering it")
            if md.ensembles[-1][1] == ensemble:
                return md  # our own earlier write landed
            fragments = _with_fragment(md.ensembles, first, ensemble, self.id)
            try:
                return await self._ctx.meta.update_ledger(md.replace(ensembles=fragments))
            except MetadataVersionError:
                md = await self._ctx.meta.read_ledger(self.id)

    # ------------------------------------------------------------------ timers

    def _arm_quorum_timer(self) -> None:
        self._quorum_timer = self._loop.call_later(
            max(0.05, self._ctx.config.add_quorum_timeout_s / 4), self._check_quorum_timeout)

    def _check_quorum_timeout(self) -> None:
        self._quorum_timer = None
        pending = self._pending
        if not len(pending) or self._error is not None:
            return
        head = pending.first
        limit_s = self._ctx.config.add_quorum_timeout_s
        if self._now_s() - pending.oldest_submitted_s() >= limit_s:
            self._log.warning("add not acknowledged by an ack quorum in time",
                              entry_id=head, limit_s=limit_s)
            self._fail(TimeoutError(
                f"ledger {self.id}: entry {head} not acknowledged by "
                f"{self._metadata.ack_quorum} bookies within {limit_s}s"))
            return
        self._arm_quorum_timer()

    def _schedule_explicit_lac(self) -> None:
        interval_s = self._ctx.config.explicit_lac_interval_s
        if interval_s and self._explicit_lac_handle is None and self._closing is None \
                and not self._recovery:  # (a recovery publishes no LAC)
            self._explicit_lac_handle = self._loop.call_later(interval_s, self._send_explicit_lac)

    def _send_explicit_lac(self) -> None:
        """Idle writer: tell the bookies the LAC that no later add has piggybacked."""
        self._explicit_lac_handle = None
        lac = None if self._error is not None else self._writes.explicit_lac()
        if lac is None:
            return
        md = self._metadata
        try:
            for bookie in md.ensembles[-1][1]:
                ch = self._ctx.bookie_client.channel(bookie)
                ch.send(WriteLacRequest(ch.next_request_id(), md.ledger_id, self._master_key,
                                        lac), _ignore, self._ctx.config.add_timeout_s)
        except BKError:
            pass  # the client was closed under an idle handle: nothing to tell anyone

    def _cancel_timers(self) -> None:
        for handle in (self._explicit_lac_handle, self._quorum_timer, self._degraded_retry):
            if handle is not None:
                handle.cancel()
        self._explicit_lac_handle = None
        self._quorum_timer = None
        self._degraded_retry = None

    # ------------------------------------------------------------------ close

    async def close(self) -> None:
        """Wait for appends in flight, then seal the ledger in metadata (CLOSED, last entry
        id, length).  Idempotent."""
        if self._closing is None:
            self._closing = self._loop.create_task(self._close())
            # If every caller awaiting it is cancelled, its error is still consumed.
            self._closing.add_done_callback(_consume_error)
        await asyncio.shield(self._closing)

    async def close_quietly(self) -> None:
        """Abandon the handle without touching metadata: pending appends fail, timers
        and any ensemble change in progress stop."""
        if self._error is None:
            self._fail(LedgerClosedError(f"ledger {self.id}: handle abandoned"))
        if self._closing is None:  # refuse appends; a later close() returns at once
            self._closing = self._loop.create_future()
            self._closing.set_result(None)
        task = self._change_task
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        self._cancel_timers()

    async def _close(self) -> None:
        try:
            if len(self._pending):  # (not the futures: the application may have cancelled some)
                self._drained = self._loop.create_future()
                await self._drained
            if self._change_task is not None:
                await asyncio.wait([self._change_task])
            if isinstance(self._error, (LedgerFencedError, LedgerClosedError)) or (
                    self._recovery and self._error is not None):
                raise self._error
            md = self._metadata
            while True:
                if md.state is LedgerState.CLOSED:
                    if self._recovery:
                        break  # another recoverer finished first: take its result
                    if md.last_entry_id != self._lac:
                        raise LedgerFencedError(
                            f"ledger {self.id} was closed by someone else at entry "
                            f"{md.last_entry_id}, this writer had {self._lac}")
                    break
                if md.state is not self._writable_state:
                    raise LedgerFencedError(
                        f"ledger {self.id} is being recovered by another client")
                try:
                    md = await self._ctx.meta.update_ledger(md.replace(
                        state=LedgerState.CLOSED, last_entry_id=self._lac, length=self._length))
                except MetadataVersionError:
                    fresh = await self._ctx.meta.read_ledger(self.id)
                    if self._recovery and not fresh.is_closed:
                        if fresh.ensembles != self._persisted_ensembles:
                            raise  # someone else changed the fragments: start over
                        fresh = fresh.replace(ensembles=self._metadata.ensembles)
                    md = fresh
                    continue
                break
            self._metadata = md
            self._log.info("ledger closed", last_entry_id=md.last_entry_id, length=md.length,
                           recovery=self._recovery)
        finally:
            self._cancel_timers()


def _with_fragment(fragments: tuple[Fragment, ...], first: int, ensemble: Ensemble,
                   ledger_id: int) -> tuple[Fragment, ...]:
    """``fragments`` with a new last fragment at ``first`` (replacing the last one if it
    starts there too: several changes before any entry completes)."""
    out = list(fragments)
    last_first = out[-1][0]
    invariant(last_first <= first,
              f"ledger {ledger_id}: new fragment at {first} before the last at {last_first}")
    if last_first == first:
        out[-1] = (first, ensemble)
    else:
        out.append((first, ensemble))
    return tuple(out)


def _consume_error(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


def _ignore(result: Response | BKError) -> None:
    """Explicit LAC writes are best effort: the next one, or the next add, carries it."""
