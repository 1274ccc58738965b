"""Ledger recovery: fence the ledger, find its last acknowledged entry, seal it.

Steps (BookKeeper's ledger recovery protocol):

1. Metadata to IN_RECOVERY by compare-and-swap (a ledger already IN_RECOVERY
   is recovered again: recovery is idempotent, so concurrent recoverers
   converge; a ledger already CLOSED needs nothing).
2. Fence: a READ of entry -1 with the FENCE flag to every bookie of the last
   fragment.  A fenced bookie refuses the old writer's adds; once enough
   bookies of *every* write set answered (``Qw - Qa + 1`` of each), no add of
   the old writer can reach its ack quorum any more.  The answers also give
   the highest LAC any of them knows (piggybacked on entries).
3. Read forward from that LAC: each entry is read from its whole write set;
   an entry found anywhere (with a good digest) is recovered and re-written
   to its write set with the RECOVERY_ADD flag; the first entry that is
   missing (NO_ENTRY) on at least ``Qw - Qa + 1`` bookies of its write set
   cannot have been acknowledged, and ends the ledger.  If neither can be
   decided (bookies unreachable), recovery fails and the ledger stays open:
   it never closes short.
4. Close by compare-and-swap with the recovered last entry id and length
   (taken from the last entry's envelope); on a lost race re-read: a ledger
   someone else closed meanwhile is taken as it is.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..errors import (
    BKError,
    BookieUnavailableError,
    DigestMismatchError,
    MetadataVersionError,
    NoSuchLedgerError,
    UnauthorizedAccessError,
)
from ..log import get_logger
from ..meta.model import LedgerMetadata, LedgerState
from ..proto import AddFlag, AddRequest, AddResponse, ReadFlag, ReadRequest, ReadResponse, Status
from .digest import DigestManager, master_key
from .ledger import status_error
from .quorum import write_set

if TYPE_CHECKING:
    from .client import BookKeeper


class LedgerRecoveryOp:
    def __init__(self, bk: BookKeeper, md: LedgerMetadata, password: bytes) -> None:
        self._bk = bk
        self._md = md
        self._digest = DigestManager(md.ledger_id, md.digest, password)
        self._master_key = master_key(password)
        self._log = get_logger(ledger_id=md.ledger_id)

    async def run(self) -> LedgerMetadata:
        md = await self._mark_in_recovery(self._md)
        if md.is_closed:
            return md
        first_of_fragment = md.ensembles[-1][0]
        lac, lac_length = await self._fence_and_read_lac(md)
        # Entries before the last fragment were acknowledged (an ensemble change
        # happens only past the LAC), so the recovery point is at least there.
        last, length = lac, lac_length
        if first_of_fragment - 1 > lac:
            last = first_of_fragment - 1
            found = await self._read_for_recovery(md, last)
            if found is None:
                raise BookieUnavailableError(
                    f"ledger {md.ledger_id}: entry {last}, before the last fragment, is missing")
            length = found[1]
        entry_id = last + 1
        while True:
            found = await self._read_for_recovery(md, entry_id)
            if found is None:
                break
            body, total_length = found
            await self._rewrite(md, entry_id, body)
            last, length = entry_id, total_length
            entry_id += 1
        self._log.info("recovered ledger", last_entry_id=last, length=length, lac_read=lac)
        return await self._close(md, last, length)

    async def _mark_in_recovery(self, md: LedgerMetadata) -> LedgerMetadata:
        while md.state is LedgerState.OPEN:
            try:
                md = await self._bk.meta.update_ledger(md.replace(state=LedgerState.IN_RECOVERY))
            except MetadataVersionError:
                md = await self._bk.meta.read_ledger(md.ledger_id)
        return md

    async def _fence_and_read_lac(self, md: LedgerMetadata) -> tuple[int, int]:
        ensemble = md.ensembles[-1][1]
        timeout_s = self._bk.config.read_timeout_s
        futs = []
        for bookie in ensemble:
            ch = self._bk.bookie_client.channel(bookie)
            futs.append(ch.request(ReadRequest(ch.next_request_id(), md.ledger_id, -1,
                                               ReadFlag.FENCE, self._master_key), timeout_s))
        results = await asyncio.gather(*futs, return_exceptions=True)
        answered: set[int] = set()
        lac, lac_length = -1, 0
        errors: list[str] = []
        for pos, r in enumerate(results):
            if isinstance(r, BaseException):
                if not isinstance(r, BKError):
                    raise r
                errors.append(f"{ensemble[pos]}: {r}")
                continue
            assert isinstance(r, ReadResponse)
            if r.status == Status.UNAUTHORIZED:
                raise UnauthorizedAccessError(f"ledger {md.ledger_id}: wrong password")
            if r.status not in (Status.OK, Status.NO_ENTRY, Status.NO_LEDGER):
                errors.append(f"{ensemble[pos]}: {Status(r.status).name}")
                continue
            answered.add(pos)
            lac = max(lac, r.lac)
            if r.status == Status.OK:
                try:
                    entry_lac, total_length, _ = self._digest.unseal(r.entry_id, r.body)
                except DigestMismatchError as exc:
                    errors.append(f"{ensemble[pos]}: {exc}")
                    continue
                if entry_lac > lac:
                    lac = entry_lac
        needed = md.write_quorum - md.ack_quorum + 1
        for start in range(md.ensemble_size):
            covered = sum(1 for p in write_set(start, md.ensemble_size, md.write_quorum)
                          if p in answered)
            if covered < needed:
                raise BookieUnavailableError(
                    f"ledger {md.ledger_id}: could not fence enough bookies to recover "
                    f"({'; '.join(errors) or 'no answers'}); the ledger stays open, retry later")
        if lac >= 0:
            lac_length = (await self._read_for_recovery(md, lac) or (b"", -1))[1]
            if lac_length < 0:
                raise BookieUnavailableError(
                    f"ledger {md.ledger_id}: entry {lac} (the LAC) could not be read back")
        return lac, lac_length

    async def _read_for_recovery(self, md: LedgerMetadata, entry_id: int) -> tuple[bytes, int] | None:
        """The body and total length of ``entry_id`` if any replica has it; None if enough
        replicas say it does not exist; raises if that cannot be decided."""
        ensemble = md.ensemble_at(entry_id)
        positions = write_set(entry_id, md.ensemble_size, md.write_quorum)
        timeout_s = self._bk.config.read_timeout_s
        futs = []
        for pos in positions:
            ch = self._bk.bookie_client.channel(ensemble[pos])
            # Recovery reads fence too: a bookie that missed the fence (it was down)
            # must not accept the old writer's adds once it answers us.
            futs.append(ch.request(ReadRequest(ch.next_request_id(), md.ledger_id, entry_id,
                                               ReadFlag.FENCE, self._master_key), timeout_s))
        results = await asyncio.gather(*futs, return_exceptions=True)
        missing = 0
        errors: list[str] = []
        for pos, r in zip(positions, results, strict=True):
            if isinstance(r, BaseException):
                if not isinstance(r, BKError):
                    raise r
                errors.append(f"{ensemble[pos]}: {r}")
                continue
            assert isinstance(r, ReadResponse)
            if r.status == Status.OK:
                try:
                    _, total_length, _ = self._digest.unseal(entry_id, r.body)
                except DigestMismatchError as exc:
                    errors.append(f"{ensemble[pos]}: {exc}")
                    continue
                return r.body, total_length
            if r.status in (Status.NO_ENTRY, Status.NO_LEDGER):
                missing += 1
            else:
                errors.append(f"{ensemble[pos]}: {Status(r.status).name}")
        if missing >= md.write_quorum - md.ack_quorum + 1:
            return None
        raise BookieUnavailableError(
            f"ledger {md.ledger_id}: cannot tell whether entry {entry_id} exists "
            f"({'; '.join(errors)}); the ledger stays open, retry recovery later")

    async def _rewrite(self, md: LedgerMetadata, entry_id: int, body: bytes) -> None:
        ensemble = md.ensemble_at(entry_id)
        timeout_s = self._bk.config.add_timeout_s
        futs = []
        for pos in write_set(entry_id, md.ensemble_size, md.write_quorum):
            ch = self._bk.bookie_client.channel(ensemble[pos])
            futs.append(ch.request(AddRequest(ch.next_request_id(), md.ledger_id, entry_id,
                                              self._master_key, AddFlag.RECOVERY_ADD, -1, body),
                                   timeout_s))
        results = await asyncio.gather(*futs, return_exceptions=True)
        acks = sum(1 for r in results if isinstance(r, AddResponse) and r.status == Status.OK)
        if acks < md.ack_quorum:
            detail = "; ".join(
                str(r) if isinstance(r, BaseException)
                else str(status_error(r.status, "recovery add")) for r in results
                if not (isinstance(r, AddResponse) and r.status == Status.OK))
            raise BookieUnavailableError(
                f"ledger {md.ledger_id}: could not re-replicate entry {entry_id} to an ack "
                f"quorum ({detail}); the ledger stays open, retry recovery later")

    async def _close(self, md: LedgerMetadata, last: int, length: int) -> LedgerMetadata:
        while True:
            if md.is_closed:
                return md
            try:
                return await self._bk.meta.update_ledger(md.replace(
                    state=LedgerState.CLOSED, last_entry_id=last, length=length))
            except MetadataVersionError:
                md = await self._bk.meta.read_ledger(md.ledger_id)
            except NoSuchLedgerError:
                raise

