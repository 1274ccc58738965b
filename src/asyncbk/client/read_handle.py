"""Reading a ledger: :class:`ReadHandle` (the writer's :class:`LedgerHandle` reads
through it too).

Each entry is asked of the bookies of its write set in order; the next one is
tried at once on an error or digest mismatch, and speculatively after
``speculative_read_timeout_s`` if the current one is slow.  The first good
answer wins and the other requests are cancelled.  Where a fragment's write
set is its whole ensemble (``Qw = E``) every bookie holds every entry, and
ranges are read in batches (READ_BATCH), spread over the ensemble; what a
batch cannot deliver (an error, a short run, a bad digest, a slow bookie) is
read entry by entry as above, so errors are those of single reads.

A reader of an open ledger follows it: ``read_last_add_confirmed``,
``wait_for_lac`` (long-poll) and ``tail``; when a read finds no replica it
re-reads the metadata, since the writer may have replaced a bookie since.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator

from ..errors import (
    BadRequestError,
    BKError,
    BookieIOError,
    BookieReadOnlyError,
    BookieUnavailableError,
    DigestMismatchError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadBeyondLastAddConfirmedError,
    TooManyRequestsError,
    UnauthorizedAccessError,
)
from ..meta.model import Ensemble, LedgerMetadata
from ..net.pool import expect_answer, next_answers
from ..proto import (
    LongPollLacRequest,
    LongPollLacResponse,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Response,
    Status,
)
from ..topology import normalize_location, read_order
from ..types import BookieId, LedgerEntry
from .context import ClientContext
from .digest import DigestManager, master_key
from .quorum import write_set

READ_WINDOW_ENTRIES_MAX = 1024
"""Entry reads in flight for one ``read`` call."""

READ_BATCH_ENTRIES_MAX = 256
"""Entries asked for in one READ_BATCH request."""

READ_BATCHES_INFLIGHT = 4
"""READ_BATCH requests in flight for one ``read`` call (spread over the ensemble)."""

FRAME_OVERHEAD_BYTES_MAX = 512
"""Room kept in a frame for the add request's other fields and the envelope header."""

_STATUS_ERRORS: dict[int, type[BKError]] = {
    Status.NO_LEDGER: NoSuchLedgerError,
    Status.NO_ENTRY: NoSuchEntryError,
    Status.FENCED: LedgerFencedError,
    Status.UNAUTHORIZED: UnauthorizedAccessError,
    Status.READ_ONLY: BookieReadOnlyError,
    Status.BAD_REQUEST: BadRequestError,
    Status.TOO_MANY_REQUESTS: TooManyRequestsError,
    Status.IO_ERROR: BookieIOError,
    Status.NOT_READY: BookieUnavailableError,
}


def status_error(status: int, what: str) -> BKError:
    """The client error for a bookie's non-OK status."""
    try:
        name = Status(status).name
    except ValueError:
        name = f"unknown status {status}"
    return _STATUS_ERRORS.get(status, BookieIOError)(f"{what}: bookie answered {name}")



class ReadHandle:
    """A handle to read a ledger (and to follow it while it is written)."""

    _follows_metadata = True
    """Whether reads may re-read the ledger's metadata when it may be stale (a reader;
    a writer's own metadata is always current)."""

    def __init__(self, ctx: ClientContext, metadata: LedgerMetadata, password: bytes) -> None:
        self._ctx = ctx
        self._metadata = metadata
        self._digest = DigestManager(metadata.ledger_id, metadata.digest, password)
        self._master_key = master_key(password)
        self._lac = metadata.last_entry_id if metadata.is_closed else -1
        self._log = ctx.logger(ledger_id=metadata.ledger_id)
        location = ctx.config.client_location
        self._location = normalize_location(location) if location else ""
        """The client's location (reads prefer replicas near it), ``""``: none."""

    def _read_order(self, replicas: list[BookieId]) -> list[BookieId]:
        """``replicas`` in the order to read them: near the client first, if it has a
        location (``client_location``)."""
        if not self._location:
            return replicas
        return read_order(replicas, self._ctx.bookies.locations(), self._location)

    @property
    def id(self) -> int:
        return self._metadata.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._metadata

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    def _advance_lac(self, lac: int) -> None:
        if lac > self._lac:
            self._lac = lac

    # ------------------------------------------------------------------ reads

    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` (inclusive); all must be at or below the LAC."""
        if last > self._lac:
            raise ReadBeyondLastAddConfirmedError(
                f"ledger {self.id}: asked for entries up to {last}, last add confirmed is "
                f"{self._lac}; call read_last_add_confirmed() or read_unconfirmed()")
        return await self.read_unconfirmed(first, last)

    async def read_unconfirmed(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` without the LAC bound (no repeatable-read guarantee)."""
        if first < 0 or last < first:
            raise ValueError(f"bad entry range {first}..{last}")
        tracing = self._ctx.tracing
        if tracing is None:
            return await self._read_unconfirmed(first, last)
        with tracing.current("asyncbk.read", {"asyncbk.ledger_id": self.id,
                                              "asyncbk.first": first, "asyncbk.last": last}):
            return await self._read_unconfirmed(first, last)

    async def _read_unconfirmed(self, first: int, last: int) -> list[LedgerEntry]:
        clock = self._ctx.clock
        started_s = clock.monotonic_s()
        try:
            out = await self._read_range(first, last)
        except (BookieUnavailableError, NoSuchEntryError):
            # A reader of an open ledger may hold fragments from before the writer
            # replaced a bookie: the entries are on the replacement.  Re-read the
            # metadata and, if the fragments changed, read again.
            if not self._follows_metadata or self._metadata.is_closed:
                raise
            before = self._metadata.ensembles
            await self._refresh_metadata()
            if self._metadata.ensembles == before:
                raise
            out = await self._read_range(first, last)
        stats = self._ctx.stats
        stats.read_latency.observe(clock.monotonic_s() - started_s)
        stats.read_entries += len(out)
        return out

    async def _read_range(self, first: int, last: int) -> list[LedgerEntry]:
        out: list[LedgerEntry] = []
        md = self._metadata
        batched = md.write_quorum == md.ensemble_size and self._ctx.config.read_batch
        pos = first
        while pos <= last:
            index = _fragment_index(md, pos)
            frag_last = md.fragment_bounds(index)[1]
            hi = last if frag_last < 0 or index + 1 == len(md.ensembles) else min(last, frag_last)
            if batched and hi > pos:
                out.extend(await self._read_batched(pos, hi, md.ensembles[index][1]))
            else:
                for lo in range(pos, hi + 1, READ_WINDOW_ENTRIES_MAX):
                    top = min(hi, lo + READ_WINDOW_ENTRIES_MAX - 1)
                    out.extend(await asyncio.gather(*(self._read_entry(e)
                                                      for e in range(lo, top + 1))))
            pos = hi + 1
        return out

    async def _read_batched(self, first: int, last: int, ensemble: Ensemble) -> list[LedgerEntry]:
        """Entries ``first..last`` of one fragment whose every bookie holds every entry."""
        chunks = [(lo, min(last, lo + READ_BATCH_ENTRIES_MAX - 1))
                  for lo in range(first, last + 1, READ_BATCH_ENTRIES_MAX)]
        out: list[LedgerEntry] = []
        for w in range(0, len(chunks), READ_BATCHES_INFLIGHT):
            window = chunks[w:w + READ_BATCHES_INFLIGHT]
            parts = await asyncio.gather(*(self._read_chunk(lo, hi, ensemble, w + i)
                                           for i, (lo, hi) in enumerate(window)))
            for part in parts:
                out.extend(part)
        return out

    async def _read_chunk(self, first: int, last: int, ensemble: Ensemble,
                          start: int) -> list[LedgerEntry]:
        cfg = self._ctx.config
        wait_s = cfg.speculative_read_timeout_s or cfg.read_timeout_s
        entries: list[LedgerEntry] = []
        pos = first
        size = len(ensemble)
        for bookie in self._read_order([ensemble[(start + k) % size] for k in range(size)]):
            while pos <= last:
                got = await self._read_batch_from(bookie, pos, last - pos + 1, wait_s)
                if not got:
                    break
                entries.extend(got)
                pos += len(got)
            if pos > last:
                return entries
        # what no batch delivered: entry by entry, with failover and speculation
        entries.extend(await asyncio.gather(*(self._read_entry(e) for e in range(pos, last + 1))))
        return entries

    async def _read_batch_from(self, bookie: BookieId, first: int, count: int,
                               wait_s: float) -> list[LedgerEntry]:
        """The good prefix of one READ_BATCH answer (empty on any failure)."""
        cfg = self._ctx.config
        ch = self._ctx.bookie_client.channel(bookie)
        bytes_max = max(1, cfg.frame_bytes_max - FRAME_OVERHEAD_BYTES_MAX - 8 * count)
        fut = ch.request(ReadBatchRequest(ch.next_request_id(), self.id, first, count, bytes_max,
                                          self._ctx.current_trace()), cfg.read_timeout_s)
        try:
            async with asyncio.timeout(wait_s):
                resp = await fut
        except (BKError, builtins.TimeoutError):  # an error, or slow: read entry by entry
            fut.cancel()
            return []
        try:
            resp = expect_answer(resp, ReadBatchResponse, bookie)
        except BKError:
            return []
        if resp.status != Status.OK:
            return []
        out: list[LedgerEntry] = []
        lac = resp.lac
        for i, body in enumerate(resp.bodies[:count]):
            try:
                entry_lac, _, payload = self._digest.unseal(first + i, body)
            except DigestMismatchError as exc:
                self._log.warning("digest mismatch in a batch read", bookie=bookie,
                                  entry_id=first + i, error=str(exc))
                break
            lac = max(lac, entry_lac)
            out.append(LedgerEntry(self.id, first + i, payload))
        self._advance_lac(lac)
        return out

    async def _read_entry(self, entry_id: int) -> LedgerEntry:
        md = self._metadata
        ensemble = md.ensemble_at(entry_id)
        replicas = self._read_order(
            [ensemble[p] for p in write_set(entry_id, md.ensemble_size, md.write_quorum)])
        cfg = self._ctx.config
        speculate_s = cfg.speculative_read_timeout_s or None
        errors: list[BKError] = []
        inflight: dict[asyncio.Future[Response], BookieId] = {}
        tried = 0

        def launch() -> None:
            nonlocal tried
            bookie = replicas[tried]
            tried += 1
            ch = self._ctx.bookie_client.channel(bookie)
            req = ReadRequest(ch.next_request_id(), md.ledger_id, entry_id, 0, b"", self._ctx.current_trace())
            inflight[ch.request(req, cfg.read_timeout_s)] = bookie

        launch()
        try:
            while inflight:
                answers = await next_answers(
                    inflight, speculate_s if tried < len(replicas) else None)
                if not answers:  # the current replicas are slow: ask one more
                    launch()
                    continue
                for bookie, r in answers:
                    if isinstance(r, BKError):
                        errors.append(r)
                    else:
                        entry = self._accept_read(r, bookie, entry_id, errors)
                        if entry is not None:
                            return entry
                    if tried < len(replicas):
                        launch()
        finally:
            for fut in inflight:
                fut.cancel()
        if errors and all(isinstance(e, DigestMismatchError) for e in errors):
            raise DigestMismatchError(
                f"ledger {md.ledger_id} entry {entry_id}: no replica has a good copy")
        if errors and all(isinstance(e, (NoSuchEntryError, NoSuchLedgerError)) for e in errors):
            raise NoSuchEntryError(f"ledger {md.ledger_id} entry {entry_id} is on no bookie")
        if any(isinstance(e, UnauthorizedAccessError) for e in errors):
            raise UnauthorizedAccessError(
                f"ledger {md.ledger_id} entry {entry_id}: no replica could be read, and "
                f"credentials were refused ({'; '.join(str(e) for e in errors)})")
        raise BookieUnavailableError(
            f"ledger {md.ledger_id} entry {entry_id}: no replica could be read "
            f"({'; '.join(str(e) for e in errors)})")

    def _accept_read(self, resp: Response, bookie: BookieId, entry_id: int,
                     errors: list[BKError]) -> LedgerEntry | None:
        try:
            resp = expect_answer(resp, ReadResponse, bookie)
        except BKError as exc:
            errors.append(exc)
            return None
        if resp.status != Status.OK:
            errors.append(status_error(resp.status, f"read {self.id}:{entry_id} from {bookie}"))
            return None
        try:
            lac, _, payload = self._digest.unseal(entry_id, resp.body)
        except DigestMismatchError as exc:
            self._log.warning("digest mismatch, reading another replica", bookie=bookie,
                              entry_id=entry_id, error=str(exc))
            errors.append(exc)
            return None
        self._advance_lac(max(lac, resp.lac))
        return LedgerEntry(self.id, entry_id, payload)

    async def read_last_add_confirmed(self) -> int:
        """Ask the bookies for the LAC (the highest any of them knows); updates and returns it."""
        md = self._metadata
        if md.is_closed:
            self._advance_lac(md.last_entry_id)
            return self._lac
        ensemble = md.ensembles[-1][1]
        timeout_s = self._ctx.config.read_timeout_s
        futs = []
        for bookie in ensemble:
            ch = self._ctx.bookie_client.channel(bookie)
            futs.append(ch.request(ReadLacRequest(ch.next_request_id(), md.ledger_id), timeout_s))
        results = await asyncio.gather(*futs, return_exceptions=True)
        answered = 0
        refused: list[str] = []
        for bookie, r in zip(ensemble, results, strict=True):
            if isinstance(r, ReadLacResponse):
                if r.status == Status.OK:
                    answered += 1
                    self._advance_lac(r.lac)
                elif r.status == Status.NO_LEDGER:
                    answered += 1
                elif r.status == Status.UNAUTHORIZED:
                    refused.append(f"bookie {bookie} answered UNAUTHORIZED")
            elif isinstance(r, UnauthorizedAccessError):
                refused.append(str(r))
            elif isinstance(r, BaseException) and not isinstance(r, BKError):
                raise r
        if answered == 0:
            if refused:
                raise UnauthorizedAccessError(
                    f"ledger {md.ledger_id}: no bookie of {', '.join(ensemble)} answered a "
                    f"LAC read, and credentials were refused ({'; '.join(refused)})")
            raise BookieUnavailableError(
                f"ledger {md.ledger_id}: no bookie of {', '.join(ensemble)} answered a LAC read")
        return self._lac

    async def wait_for_lac(self, after: int, timeout: float) -> int:  # noqa: ASYNC109 (public API name)
        """Long-poll the bookies until the LAC passes ``after`` or ``timeout`` seconds pass."""
        if self._lac > after or self._metadata.is_closed:
            return self._lac
        md = self._metadata
        ensemble = md.ensembles[-1][1]
        timeout_ms = max(0, int(timeout * 1000))
        grace_s = self._ctx.config.read_timeout_s
        futs: list[asyncio.Future[Response]] = []
        for bookie in ensemble:
            ch = self._ctx.bookie_client.channel(bookie)
            futs.append(ch.request(
                LongPollLacRequest(ch.next_request_id(), md.ledger_id, after, timeout_ms),
                timeout + grace_s))
        pending = list(futs)
        answered = False
        refused: list[str] = []
        try:
            async with asyncio.timeout(timeout + grace_s):
                while pending and self._lac <= after:
                    done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    pending = [f for f in pending if f not in done]
                    for f in [f for f in futs if f in done]:  # send order: replayable
                        exc = f.exception()
                        if exc is not None:
                            if isinstance(exc, UnauthorizedAccessError):
                                refused.append(str(exc))
                            continue
                        r = f.result()
                        if r.status == Status.UNAUTHORIZED:
                            refused.append(f"bookie {ensemble[futs.index(f)]} answered "
                                           "UNAUTHORIZED")
                            continue
                        answered = True
                        if isinstance(r, LongPollLacResponse) and r.status == Status.OK:
                            self._advance_lac(r.lac)
        except builtins.TimeoutError:
            pass
        finally:
            for f in pending:
                f.cancel()
        if refused and not answered and not pending:
            raise UnauthorizedAccessError(
                f"ledger {md.ledger_id}: no bookie of {', '.join(ensemble)} answered a LAC "
                f"long-poll, and credentials were refused ({'; '.join(refused)})")
        return self._lac

    async def tail(self, start: int = 0, poll_s: float = 1.0) -> AsyncIterator[LedgerEntry]:
        """Entries from ``start`` on, waiting for new ones; ends after the last entry of a
        closed ledger.  The first read asks for one entry, and each next one for twice
        as many, up to READ_WINDOW_ENTRIES_MAX: the first entry comes after one entry's
        read, not a thousand's."""
        next_id = start
        window = 1
        while True:
            if next_id <= self._lac:
                last = min(self._lac, next_id + window - 1)
                window = min(2 * window, READ_WINDOW_ENTRIES_MAX)
                for entry in await self.read(next_id, last):
                    yield entry
                next_id = last + 1
                continue
            if self._metadata.is_closed:
                return
            before = self._lac
            clock = self._ctx.clock
            started_s = clock.monotonic_s()
            await self.wait_for_lac(self._lac, poll_s)
            if self._lac == before:
                await self._refresh_metadata()
                # The long-poll ended early without news (bookies down or refusing):
                # wait out the interval rather than spin on the metadata store.
                idle_s = poll_s - (clock.monotonic_s() - started_s)
                if idle_s > 0 and not self._metadata.is_closed:
                    await clock.sleep(idle_s)

    async def _refresh_metadata(self) -> None:
        md = await self._ctx.meta.read_ledger(self.id)
        self._metadata = md
        if md.is_closed:
            self._advance_lac(md.last_entry_id)

    async def close(self) -> None:
        """A read handle holds no resources; provided for symmetry."""


def _fragment_index(md: LedgerMetadata, entry_id: int) -> int:
    index = 0
    for i, (first, _) in enumerate(md.ensembles):
        if first <= entry_id:
            index = i
        else:
            break
    return index
