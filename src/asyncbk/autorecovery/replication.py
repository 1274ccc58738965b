"""Re-replication: copy the entries a lost bookie held to a new bookie.

A *fragment* (entries ``first..last`` written to one ensemble) loses a replica
when a bookie of its ensemble is gone for good.  :func:`replicate_ledger`
copies, for every such fragment, each entry whose write set includes the lost
position: it reads the entry's stored body from a surviving replica (checking
its digest), writes it byte for byte to a replacement bookie chosen by the
placement policy (an ADD with the RECOVERY_ADD flag, so a fenced or closed
ledger accepts it, acknowledged after the new bookie's fsync), and then swaps
the bookie in that fragment's ensemble by compare-and-swap on the metadata.

The placement policy is the ledger's own when it was created with one
(``create_ledger(placement=...)``, a namespace's segments: recorded in its
metadata, see :func:`~asyncbk.client.client.ledger_placement`), else the
client's (:func:`ledger_policy`).  When the ledger's placement is enforced and no
replacement meets it, nothing is copied: :class:`~asyncbk.errors.PlacementError`
(as BookKeeper's replication worker fails with enforced placement), and
auto-recovery keeps the ledger marked under-replicated and retries later.

Only fragments that can no longer grow are copied: those of a closed ledger,
and the earlier fragments of an open one.  The last fragment of an open ledger
belongs to its writer (which replaces failed bookies itself); if the writer is
gone, the caller recovers (fences and closes) the ledger first.

A writer changing its own ensemble at the same time only costs a retry: both
sides compare-and-swap, and each re-reads and re-applies its change on top
of the other's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..clock import RateLimiter
from ..errors import (
    BKError,
    BookieIOError,
    BookieUnavailableError,
    DigestMismatchError,
    MetadataVersionError,
    NotEnoughBookiesError,
    PlacementError,
)
from ..log import get_logger
from ..meta.model import LedgerMetadata
from ..proto import AddFlag, AddRequest, AddResponse, ReadRequest, ReadResponse, Status
from ..types import BookieId

if TYPE_CHECKING:
    from ..client.client import BookKeeper, PlacementSpec
    from ..client.digest import DigestManager
    from ..client.placement import PlacementPolicy

COPY_WINDOW = 64
"""Entries being copied at once, per fragment."""

_log = get_logger(component="replication")


@dataclass
class ReplicationStats:
    ledgers: int = 0
    fragments: int = 0
    entries: int = 0
    bytes: int = 0
    errors: int = 0


def lost_positions(md: LedgerMetadata, available: set[BookieId]) -> list[tuple[int, int]]:
    """``(fragment index, position)`` of every bookie of the ledger that is not available."""
    return [(i, p) for i, (_, ens) in enumerate(md.ensembles) for p, b in enumerate(ens)
            if b not in available]


def needs_recovery_first(md: LedgerMetadata, available: set[BookieId]) -> bool:
    """Whether the ledger is still open with a lost bookie in its last fragment."""
    if md.is_closed:
        return False
    return any(b not in available for b in md.ensembles[-1][1])


def ledger_spec(md: LedgerMetadata) -> PlacementSpec | None:
    """The ledger's own recorded placement
    (:func:`~asyncbk.client.client.ledger_placement`), None without one; a malformed
    record (hand-edited) is logged as a warning and read as none."""
    from ..client.client import ledger_placement

    try:
        return ledger_placement(md)
    except ValueError as exc:
        _log.warning("malformed placement record in the ledger's metadata; using this "
                     "process's placement policy", ledger_id=md.ledger_id, error=str(exc))
        return None


def ledger_policy(bk: BookKeeper, md: LedgerMetadata) -> PlacementPolicy:
    """The policy that chooses replacements for ``md``'s bookies: the ledger's own
    (:func:`ledger_spec`, through ``bk.placement_for``: resolved as its creator
    resolved it), else the client's (``bk.placement``)."""
    spec = ledger_spec(md)
    return bk.placement if spec is None else bk.placement_for(spec)


def describe_placement(resolved: tuple[str, int, int, bool]) -> str:
    """``rack-aware, at least 3 racks per write set, enforced``, of a resolved
    :class:`~asyncbk.client.client.PlacementSpec` (``spec.resolve(config)``)."""
    policy, racks, regions, enforce = resolved
    if policy == "random":
        return "random"
    need = f"at least {racks} racks"
    if policy == "region-aware":
        need = f"at least {regions} regions and {racks} racks"
    return f"{policy}, {need} per write set" + (", enforced" if enforce else "")


async def replicate_ledger(bk: BookKeeper, ledger_id: int, available: set[BookieId],
                           writable: list[BookieId], limiter: RateLimiter,
                           stats: ReplicationStats,
                           progress: Callable[[int, int], None] | None = None,
                           dry_run: bool = False) -> list[str]:
    """Copy every copyable fragment of ``ledger_id`` that has a bookie outside
    ``available`` to a replacement from ``writable``; returns what was (or, with
    ``dry_run``, would be) done, one line per fragment.  Replacements are chosen by
    :func:`ledger_policy`; PlacementError when the ledger's enforced placement
    cannot be met (nothing of that fragment is copied)."""
    from ..client.client import PlacementSpec
    from ..client.digest import DigestManager, master_key

    md = await bk.meta.read_ledger(ledger_id)
    spec = ledger_spec(md)  # the ledger's own placement (None: the client's)
    policy = bk.placement if spec is None else bk.placement_for(spec)
    unusable: set[BookieId] = set()  # registered but not answering (dead, lease not expired)
    digest = DigestManager(md.ledger_id, md.digest, md.password)
    key = master_key(md.password)
    done: list[str] = []
    index = 0
    while index < len(md.ensembles):
        first, ensemble = md.ensembles[index]
        last = md.fragment_bounds(index)[1]
        is_open_tail = index == len(md.ensembles) - 1 and not md.is_closed
        lost = [p for p, b in enumerate(ensemble) if b not in available]
        if not lost or is_open_tail:
            index += 1
            continue
        try:
            new_bookies = await _pick_replacements(bk, policy, ensemble, lost, md.write_quorum,
                                                   writable, unusable)
        except PlacementError as exc:
            own = "the ledger's own placement" if spec is not None \
                else "this process's placement policy"
            rule = describe_placement((spec or PlacementSpec()).resolve(bk.config))
            raise PlacementError(
                f"ledger {ledger_id} fragment {index} (entries {first}..{last}): no "
                f"replacement for {', '.join(ensemble[p] for p in lost)} meets {own} "
                f"({rule}): {exc}") from exc
        if len(new_bookies) < len(lost):
            raise NotEnoughBookiesError(
                f"ledger {ledger_id} fragment at {first}: {len(lost)} replacement(s) needed, "
                f"{len(new_bookies)} writable bookie(s) outside the ensemble answer; start "
                "more bookies")
        replaced = dict(zip(lost, new_bookies, strict=True))
        count = sum(1 for e in range(first, last + 1)
                    if any((p - e) % md.ensemble_size < md.write_quorum for p in lost))
        line = (f"ledger {ledger_id} fragment {index} (entries {first}..{last}, {count} to copy): "
                + ", ".join(f"{ensemble[p]} -> {b}" for p, b in replaced.items()))
        done.append(line)
        if dry_run:
            index += 1
            continue
        await copy_fragment(bk, md, digest, key, first, last, ensemble, replaced, limiter,
                             stats, progress)
        md = await swap_bookies(bk, md, index, first, ensemble, replaced)
        stats.fragments += 1
        _log.info("fragment re-replicated", ledger_id=ledger_id, fragment=index, first=first,
                  last=last, entries=count, replaced={ensemble[p]: b for p, b in replaced.items()})
        index += 1
    if done and not dry_run:
        stats.ledgers += 1
    return done


PROBE_TIMEOUT_S = 3.0


async def _pick_replacements(bk: BookKeeper, policy: PlacementPolicy,
                             ensemble: Sequence[BookieId], lost: list[int],
                             write_quorum: int, writable: list[BookieId],
                             unusable: set[BookieId]) -> list[BookieId]:
    """Replacements for the ``lost`` positions of ``ensemble`` (in that order), chosen by
    ``policy`` (:func:`ledger_policy`) among ``writable`` bookies outside the ensemble
    that answer as writable; fewer if too few answer (PlacementError if an enforced
    policy cannot be met by those that remain).  A bookie can stay registered for a
    lease TTL after it died: each proposed one is asked first, and one that does not
    answer is left out of the next proposal."""
    current = list(ensemble)
    todo = list(lost)
    picked: dict[int, BookieId] = {}
    while todo:
        candidates = [b for b in writable if b not in unusable and b not in ensemble]
        if len(candidates) < len(todo):
            break
        proposal = policy.replace(current, todo, write_quorum, candidates,
                                  bk.bookies.locations())
        for pos, bookie in zip(todo, proposal, strict=True):
            if await answers_writable(bk, bookie):
                picked[pos] = bookie
                current[pos] = bookie
            else:
                unusable.add(bookie)
        todo = [p for p in todo if p not in picked]
    return [picked[p] for p in lost if p in picked]


async def answers_writable(bk: BookKeeper, bookie: BookieId) -> bool:
    """Whether ``bookie`` answers a health probe (BOOKIE_INFO) as writable."""
    from ..proto import BookieInfoRequest, BookieInfoResponse

    ch = bk.bookie_client.channel(bookie)
    try:
        resp = await ch.request(BookieInfoRequest(ch.next_request_id()), PROBE_TIMEOUT_S)
    except BKError:
        return False
    return isinstance(resp, BookieInfoResponse) and resp.state == "writable"


def _unexpected(bookie: BookieId, resp: object, request: str, expected: type) -> str:
    """What to say when a bookie answered with a message of another type than the
    request's (``request``: "a READ", "an ADD")."""
    return (f"bookie {bookie} answered {request} request with {type(resp).__name__} "
            f"instead of {expected.__name__}")


async def copy_fragment(bk: BookKeeper, md: LedgerMetadata, digest: DigestManager, key: bytes,
                        first: int, last: int, ensemble: tuple[BookieId, ...],
                        replaced: dict[int, BookieId], limiter: RateLimiter,
                        stats: ReplicationStats,
                        progress: Callable[[int, int], None] | None,
                        skip: set[int] | None = None) -> None:
    """Copy the entries of fragment ``first..last`` that the ``replaced`` positions
    hold to their new bookies, reading each from a replica at a position not in
    ``skip`` (default: the replaced ones, lost)."""
    todo = [(e, p) for e in range(first, last + 1) for p in replaced
            if (p - e) % md.ensemble_size < md.write_quorum]
    total = len(todo)
    copied = 0
    sem = asyncio.Semaphore(COPY_WINDOW)
    unread = set(replaced) if skip is None else skip

    async def copy(entry_id: int, position: int) -> None:
        nonlocal copied
        async with sem:
            await limiter.acquire()
            body = await _read_body(bk, md, digest, entry_id, ensemble, unread)
            await _write_body(bk, md, key, entry_id, body, replaced[position])
            copied += 1
            stats.entries += 1
            stats.bytes += len(body)
            if progress is not None:
                progress(copied, total)

    tasks = [asyncio.create_task(copy(e, p)) for e, p in todo]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        stats.errors += 1
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _read_body(bk: BookKeeper, md: LedgerMetadata, digest: DigestManager, entry_id: int,
                     ensemble: tuple[BookieId, ...], lost: set[int]) -> bytes:
    """The stored body of ``entry_id`` from a surviving replica, digest checked.  A
    replica that fails, answers something else than a READ response or a body that
    does not verify is skipped; BookieUnavailableError (saying why, per replica) when
    none is left."""
    errors: list[str] = []
    for p in range(md.ensemble_size):
        if (p - entry_id) % md.ensemble_size >= md.write_quorum or p in lost:
            continue
        bookie = ensemble[p]
        ch = bk.bookie_client.channel(bookie)
        try:
            resp = await ch.request(ReadRequest(ch.next_request_id(), md.ledger_id, entry_id,
                                                0, b""), bk.config.read_timeout_s)
        except BKError as exc:
            errors.append(f"{bookie}: {exc}")
            continue
        if not isinstance(resp, ReadResponse):
            errors.append(_unexpected(bookie, resp, "a READ", ReadResponse))
            continue
        if resp.status != Status.OK:
            errors.append(f"{bookie}: {Status(resp.status).name}")
            continue
        try:
            digest.unseal(entry_id, resp.body)
        except DigestMismatchError as exc:
            errors.append(f"{bookie}: {exc}")
            continue
        return resp.body
    raise BookieUnavailableError(f"ledger {md.ledger_id} entry {entry_id}: no surviving "
                                 f"replica could be read ({'; '.join(errors)})")


async def _write_body(bk: BookKeeper, md: LedgerMetadata, key: bytes, entry_id: int,
                      body: bytes, bookie: BookieId) -> None:
    ch = bk.bookie_client.channel(bookie)
    resp = await ch.request(AddRequest(ch.next_request_id(), md.ledger_id, entry_id, key,
                                       int(AddFlag.RECOVERY_ADD), -1, body),
                            bk.config.add_timeout_s)
    if not isinstance(resp, AddResponse):
        raise BookieIOError(f"copy of ledger {md.ledger_id} entry {entry_id}: "
                            + _unexpected(bookie, resp, "an ADD", AddResponse))
    if resp.status != Status.OK:
        raise BookieUnavailableError(f"copy of ledger {md.ledger_id} entry {entry_id} to "
                                     f"{bookie}: bookie answered {Status(resp.status).name}")


async def swap_bookies(bk: BookKeeper, md: LedgerMetadata, index: int, first: int,
                       ensemble: tuple[BookieId, ...],
                       replaced: dict[int, BookieId]) -> LedgerMetadata:
    """Put the replacements into fragment ``index`` by compare-and-swap, re-reading on a
    lost race; fails if the fragment itself changed meanwhile (copy again)."""
    while True:
        fragments = list(md.ensembles)
        if index >= len(fragments) or fragments[index] != (first, ensemble):
            raise MetadataVersionError(
                f"ledger {md.ledger_id} fragment {index} changed while it was copied")
        new = list(ensemble)
        for p, b in replaced.items():
            new[p] = b
        fragments[index] = (first, tuple(new))
        try:
            return await bk.meta.update_ledger(md.replace(ensembles=tuple(fragments)))
        except MetadataVersionError:
            md = await bk.meta.read_ledger(md.ledger_id)


__all__ = ["RateLimiter", "ReplicationStats", "answers_writable", "copy_fragment",
           "describe_placement", "ledger_policy", "ledger_spec", "lost_positions",
           "needs_recovery_first", "replicate_ledger", "swap_bookies"]
