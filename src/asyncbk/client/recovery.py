"""Ledger recovery: fence the ledger, find its last acknowledged entry, seal it.

Steps (BookKeeper's ledger recovery protocol):

1. Metadata to IN_RECOVERY by compare-and-swap (a ledger already IN_RECOVERY
   is recovered again: recovery is idempotent, so concurrent recoverers
   converge; a ledger already CLOSED needs nothing).
2. Fence: a READ of entry -1 with the FENCE flag to every bookie of the last
   fragment.  A fenced bookie refuses the old writer's adds; once enough
   bookies of *every* write set answered (``Qw - Qa + 1`` of each), no add of
   the old writer can reach its ack quorum any more.  The answers also give
   the highest LAC any of them knows (piggybacked on entries, or explicit).
3. Read forward from that LAC (or from the start of the last fragment, if
   later: entries before a fragment change were all acknowledged).  Each entry
   is read from its whole write set, with the FENCE flag too (a bookie that
   missed the first round must not accept the old writer's adds after
   answering us).  An entry found anywhere with a good digest is recovered and
   re-written to its write set with the RECOVERY_ADD flag (through a
   recovery-mode :class:`LedgerHandle`, so a failing bookie is replaced by an
   ensemble change).  The first entry missing (NO_ENTRY / NO_LEDGER) on at
   least ``Qw - Qa + 1`` bookies of its write set cannot have been
   acknowledged and ends the ledger.  If that cannot be decided (bookies
   unreachable), recovery fails and the ledger stays in recovery: it never
   closes short.
4. Close by compare-and-swap with the recovered last entry id and length
   (the length comes from the last entry's envelope); a ledger someone else
   closed meanwhile is taken as it is.
"""

from __future__ import annotations

import asyncio

from ..errors import (
    BKError,
    BookieUnavailableError,
    DigestMismatchError,
    MetadataVersionError,
    UnauthorizedAccessError,
)
from ..meta.model import LedgerMetadata, LedgerState
from ..net.pool import expect_answer, next_answers
from ..proto import ReadFlag, ReadRequest, ReadResponse, Response, Status
from .context import ClientContext
from .digest import DigestManager, master_key
from .ledger import LedgerHandle
from .quorum import write_set


class LedgerRecoveryOp:
    def __init__(self, ctx: ClientContext, md: LedgerMetadata, password: bytes) -> None:
        self._ctx = ctx
        self._md = md
        self._password = password
        self._digest = DigestManager(md.ledger_id, md.digest, password)
        self._master_key = master_key(password)
        self._log = ctx.logger(ledger_id=md.ledger_id)

    async def run(self) -> LedgerMetadata:
        tracing = self._ctx.tracing
        if tracing is None:
            return await self._run()
        # (the fencing reads, recovery reads and re-writes are children of this span)
        with tracing.current("asyncbk.recovery",
                             {"asyncbk.ledger_id": self._md.ledger_id}) as span:
            closed = await self._run()
            span.set_attribute("asyncbk.last_entry_id", closed.last_entry_id)
            return closed

    async def _run(self) -> LedgerMetadata:
        md = await self._mark_in_recovery(self._md)
        if md.is_closed:
            return md
        lac, length = await self._fence_and_read_lac(md)
        first_of_last_fragment = md.ensembles[-1][0]
        if first_of_last_fragment - 1 > lac:
            lac = first_of_last_fragment - 1
            found = await self._read_for_recovery(md, lac)
            if found is None:
                raise BookieUnavailableError(
                    f"ledger {md.ledger_id}: entry {lac}, before the last fragment, is missing")
            length = found[1]
        writer = LedgerHandle(self._ctx, md, self._password, recovery=True, lac=lac,
                              length=length)
        entry_id = lac + 1
        try:
            while True:
                # Reads use the metadata as it was: a fragment the writer adds while
                # re-writing holds only what it re-wrote.
                found = await self._read_for_recovery(md, entry_id)
                if found is None:
                    break
                body, total_length = found
                if writer.pending_adds >= self._ctx.config.pending_adds_max:
                    await writer.wait_for_capacity()
                writer.append_recovered(entry_id, body, total_length)
                entry_id += 1
        except BaseException:
            await writer.close_quietly()
            raise
        await writer.close()
        closed = writer.metadata
        self._log.info("recovered ledger", lac_read=lac, last_entry_id=closed.last_entry_id,
                       length=closed.length, ensemble_changes=writer.ensemble_changes)
        return closed

    async def _mark_in_recovery(self, md: LedgerMetadata) -> LedgerMetadata:
        while md.state is LedgerState.OPEN:
            try:
                md = await self._ctx.meta.update_ledger(md.replace(state=LedgerState.IN_RECOVERY))
            except MetadataVersionError:
                md = await self._ctx.meta.read_ledger(md.ledger_id)
        return md

    async def _fence_and_read_lac(self, md: LedgerMetadata) -> tuple[int, int]:
        """Fence the last fragment; the highest LAC known and the ledger length at it.

        Returns as soon as every write set has ``Qw - Qa + 1`` answers: a hung
        bookie does not hold recovery up (its request is dropped)."""
        ensemble = md.ensembles[-1][1]
        needed = md.write_quorum - md.ack_quorum + 1
        write_sets = [write_set(s, md.ensemble_size, md.write_quorum)
                      for s in range(md.ensemble_size)]
        timeout_s = self._ctx.config.read_timeout_s
        inflight: dict[asyncio.Future[Response], int] = {}
        for pos, bookie in enumerate(ensemble):
            ch = self._ctx.bookie_client.channel(bookie)
            inflight[ch.request(ReadRequest(ch.next_request_id(), md.ledger_id, -1,
                                            ReadFlag.FENCE, self._master_key, self._ctx.current_trace()),
                                timeout_s)] = pos
        answered: set[int] = set()
        lac = -1
        errors: list[str] = []
        refused = False
        """Whether a bookie refused this client's credentials."""

        def covered() -> bool:
            return all(sum(p in answered for p in ws) >= needed for ws in write_sets)

        try:
            while inflight and not covered():
                for pos, r in await next_answers(inflight):
                    if not isinstance(r, BKError):
                        try:
                            r = expect_answer(r, ReadResponse, ensemble[pos])
                        except BKError as exc:
                            r = exc
                    if isinstance(r, BKError):
                        errors.append(f"{ensemble[pos]}: {r}")
                        refused |= isinstance(r, UnauthorizedAccessError)
                        continue
                    if r.status == Status.UNAUTHORIZED:
                        raise UnauthorizedAccessError(f"ledger {md.ledger_id}: wrong password")
                    if r.status not in (Status.OK, Status.NO_ENTRY, Status.NO_LEDGER):
                        errors.append(f"{ensemble[pos]}: {Status(r.status).name}")
                        continue
                    if r.status == Status.OK:
                        try:
                            entry_lac, _, _ = self._digest.unseal(r.entry_id, r.body)
                        except DigestMismatchError as err:
                            errors.append(f"{ensemble[pos]}: {err}")
                            continue
                        lac = max(lac, entry_lac)
                    answered.add(pos)
                    lac = max(lac, r.lac)
        finally:
            for fut in inflight:
                fut.cancel()
        if not covered():
            if refused:
                raise UnauthorizedAccessError(
                    f"ledger {md.ledger_id}: could not fence enough bookies to recover, "
                    f"credentials refused ({'; '.join(errors)}); the ledger stays in recovery")
            raise BookieUnavailableError(
                f"ledger {md.ledger_id}: could not fence enough bookies to recover "
                f"({'; '.join(errors) or 'no answers'}); the ledger stays in recovery, "
                "retry later")
        if lac < 0:
            return -1, 0
        found = await self._read_for_recovery(md, lac)
        if found is None:
            raise BookieUnavailableError(
                f"ledger {md.ledger_id}: entry {lac} (the LAC) is missing on its bookies")
        return lac, found[1]

    async def _read_for_recovery(self, md: LedgerMetadata, entry_id: int) -> tuple[bytes, int] | None:
        """The body and total length of ``entry_id`` if any replica has it; None once
        enough replicas say it does not exist; raises if that cannot be decided.
        Returns as soon as the answer is known."""
        ensemble = md.ensemble_at(entry_id)
        positions = write_set(entry_id, md.ensemble_size, md.write_quorum)
        needed_missing = md.write_quorum - md.ack_quorum + 1
        timeout_s = self._ctx.config.read_timeout_s
        inflight: dict[asyncio.Future[Response], int] = {}
        for pos in positions:
            ch = self._ctx.bookie_client.channel(ensemble[pos])
            # Recovery reads fence too: a bookie that missed the fence (it was down)
            # must not accept the old writer's adds once it answers us.
            inflight[ch.request(ReadRequest(ch.next_request_id(), md.ledger_id, entry_id,
                                            ReadFlag.FENCE, self._master_key, self._ctx.current_trace()),
                                timeout_s)] = pos
        missing = 0
        errors: list[str] = []
        refused = False
        try:
            while inflight:
                for pos, r in await next_answers(inflight):
                    if not isinstance(r, BKError):
                        try:
                            r = expect_answer(r, ReadResponse, ensemble[pos])
                        except BKError as exc:
                            r = exc
                    if isinstance(r, BKError):
                        errors.append(f"{ensemble[pos]}: {r}")
                        refused |= isinstance(r, UnauthorizedAccessError)
                        continue
                    if r.status == Status.OK:
                        try:
                            _, total_length, _ = self._digest.unseal(entry_id, r.body)
                        except DigestMismatchError as err:
                            errors.append(f"{ensemble[pos]}: {err}")
                            continue
                        return r.body, total_length
                    if r.status in (Status.NO_ENTRY, Status.NO_LEDGER):
                        missing += 1
                        if missing >= needed_missing:
                            return None
                    else:
                        errors.append(f"{ensemble[pos]}: {Status(r.status).name}")
        finally:
            for fut in inflight:
                fut.cancel()
        if refused:
            raise UnauthorizedAccessError(
                f"ledger {md.ledger_id}: cannot tell whether entry {entry_id} exists, "
                f"credentials refused ({'; '.join(errors)}); the ledger stays in recovery")
        raise BookieUnavailableError(
            f"ledger {md.ledger_id}: cannot tell whether entry {entry_id} exists "
            f"({'; '.join(errors)}); the ledger stays in recovery, retry later")
