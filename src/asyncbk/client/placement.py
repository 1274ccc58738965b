"""Ensemble placement: which bookies a new ledger (or a replacement) uses, and the
quarantine of bookies that failed recently.

Policies (see docs/placement.md):

* :class:`RandomPlacement`: uniformly random among writable bookies.
* :class:`RackAwarePlacement`: every write set spans at least
  ``min_racks_per_write_quorum`` racks (capped at the write quorum) when the
  bookies available allow it.
* :class:`RegionAwarePlacement`: every write set spans at least
  ``min_regions_per_write_quorum`` regions, and inside a region the write set's
  bookies go to different racks where possible.

A write set is the ``write_quorum`` consecutive ensemble positions of an entry,
striped round-robin (:func:`~asyncbk.client.quorum.write_set`): the write sets of
an ensemble are its ``E`` cyclic windows of ``Qw`` positions.  When a policy's
constraint cannot be met, ``enforce=True`` raises :class:`~asyncbk.errors.PlacementError`
(saying which constraint and what was available); ``enforce=False`` uses the
best ensemble there is (the one whose worst write set spans most), logs a
warning and counts it in ``fallbacks``.

Policies are pure: bookie locations come in as a mapping (see
:mod:`asyncbk.topology`), randomness from an injected ``random.Random``.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..clock import LOOP_CLOCK, Clock
from ..errors import NotEnoughBookiesError, PlacementError
from ..log import get_logger
from ..topology import POLICIES, location_of, region_of
from ..types import BookieId

SEARCH_NODES_MAX = 20_000
"""Bound of the search for one constraint (positions tried); past it the
constraint counts as not met for this call."""


class Quarantine:
    """Bookies that failed an add recently, kept out of new ensembles and replacements
    for ``duration_s`` (one client-wide view: a bookie that failed one ledger's adds
    is likely to fail the others').

    A quarantine is bounded: it ends after ``duration_s``, or at once when the bookie
    registers anew (``release_if_new_session``: a restarted bookie is healthy again),
    so a run of faults can never exclude every spare for good."""

    def __init__(self, duration_s: float, clock: Clock = LOOP_CLOCK) -> None:
        self.duration_s = duration_s
        self._clock = clock
        self._until_s: dict[BookieId, float] = {}
        self._session: dict[BookieId, Any] = {}

    def add(self, bookie: BookieId, session: Any = None) -> None:
        """Quarantine ``bookie`` (whose registration was ``session`` when it failed)."""
        if self.duration_s <= 0:
            return
        self._until_s[bookie] = self._clock.monotonic_s() + self.duration_s
        self._session[bookie] = session

    def release_if_new_session(self, bookie: BookieId, session: Any) -> bool:
        """End ``bookie``'s quarantine if it has registered anew since it failed."""
        if bookie in self._until_s and session is not None \
                and session != self._session.get(bookie):
            self._release(bookie)
            return True
        return False

    def release(self, bookie: BookieId) -> None:
        """End ``bookie``'s quarantine (it was found healthy)."""
        self._release(bookie)

    def _release(self, bookie: BookieId) -> None:
        self._until_s.pop(bookie, None)
        self._session.pop(bookie, None)

    def active(self) -> set[BookieId]:
        """The bookies quarantined now."""
        now = self._clock.monotonic_s()
        for bookie in [b for b, until in self._until_s.items() if until <= now]:
            self._release(bookie)
        return set(self._until_s)


class PlacementPolicy(Protocol):
    """What the client, its ledger handles and auto-recovery ask of a policy."""

    fallbacks: int
    """Placements that could not meet the policy's constraint and used the best
    ensemble available instead (``enforce=False``)."""

    def new_ensemble(self, size: int, write_quorum: int, writable: Collection[BookieId],
                     locations: Mapping[BookieId, str],
                     exclude: Collection[BookieId] = ()) -> list[BookieId]:
        """``size`` distinct bookies of ``writable`` not in ``exclude``, in ensemble order."""
        ...

    def replace(self, ensemble: Sequence[BookieId], positions: Sequence[int],
                write_quorum: int, writable: Collection[BookieId],
                locations: Mapping[BookieId, str],
                exclude: Collection[BookieId] = ()) -> list[BookieId]:
        """New bookies for ``ensemble[p]`` for each ``p`` of ``positions`` (in that order),
        from ``writable``, outside ``ensemble`` and ``exclude``."""
        ...


def _candidates(writable: Collection[BookieId], exclude: Collection[BookieId],
                needed: int, what: str) -> list[BookieId]:
    candidates = sorted(set(writable) - set(exclude))
    if len(candidates) < needed:
        raise NotEnoughBookiesError(
            f"need {needed} writable bookies{what}, {len(candidates)} available"
            + (f" ({', '.join(candidates)})" if candidates else "")
            + "; start more bookies or lower ensemble_size")
    return candidates


class RandomPlacement:
    """Uniformly random choice among writable bookies (BookKeeper's default policy)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self.fallbacks = 0

    def new_ensemble(self, size: int, write_quorum: int, writable: Collection[BookieId],
                     locations: Mapping[BookieId, str],
                     exclude: Collection[BookieId] = ()) -> list[BookieId]:
        candidates = _candidates(writable, exclude, size, "")
        return self._rng.sample(candidates, size)

    def replace(self, ensemble: Sequence[BookieId], positions: Sequence[int],
                write_quorum: int, writable: Collection[BookieId],
                locations: Mapping[BookieId, str],
                exclude: Collection[BookieId] = ()) -> list[BookieId]:
        candidates = _candidates(writable, set(ensemble) | set(exclude), len(positions),
                                 " outside the ensemble")
        return self._rng.sample(candidates, len(positions))


def write_set_spread(ensemble: Sequence[BookieId], write_quorum: int,
                     locations: Mapping[BookieId, str]) -> tuple[int, int]:
    """``(regions, racks)``: the fewest distinct regions and racks any write set of
    ``ensemble`` spans."""
    size = len(ensemble)
    locs = [location_of(b, locations) for b in ensemble]
    regions = racks = write_quorum
    for start in range(size):
        window = [locs[(start + i) % size] for i in range(write_quorum)]
        racks = min(racks, len(set(window)))
        regions = min(regions, len({region_of(loc) for loc in window}))
    return regions, racks


@dataclass(frozen=True)
class PlacementViolation:
    """A write set of an ensemble that spans fewer racks or regions than its policy
    requires (:func:`write_set_violations`)."""

    positions: tuple[int, ...]
    """The ensemble positions of the write set, in write order."""
    bookies: tuple[BookieId, ...]
    locations: tuple[str, ...]
    """Each bookie's location."""
    regions: int
    """Regions the write set spans."""
    racks: int
    """Racks the write set spans."""
    need_regions: int
    """Regions required (0: no regions required)."""
    need_racks: int
    racks_available: int
    regions_available: int

    def __str__(self) -> str:
        where = ", ".join(f"{b} {loc}" for b, loc in zip(self.bookies, self.locations,
                                                         strict=True))
        short = []
        if self.regions < self.need_regions:
            short.append(f"spans {_n(self.regions, 'region')}, needs {self.need_regions} "
                         f"(min_regions_per_write_quorum, capped at the write quorum and "
                         f"the {_n(self.regions_available, 'region')} available)")
        if self.racks < self.need_racks:
            short.append(f"spans {_n(self.racks, 'rack')}, needs {self.need_racks} "
                         f"(min_racks_per_write_quorum, capped at the write quorum and "
                         f"the {_n(self.racks_available, 'rack')} available)")
        return (f"write set at positions {','.join(map(str, self.positions))} [{where}] "
                + " and ".join(short))


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'s' if count != 1 else ''}"


def required_spread(policy: str, write_quorum: int, min_racks_per_write_quorum: int,
                    min_regions_per_write_quorum: int, available_locations: Collection[str],
                    ) -> tuple[int, int]:
    """``(regions, racks)`` every write set of ``write_quorum`` bookies must span under
    ``policy``: each minimum capped at the write quorum and at the regions and racks of
    ``available_locations`` (``(0, 0)`` for ``random``)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}; choose one of "
                         f"{', '.join(POLICIES)}")
    if policy == "random":
        return 0, 0
    racks_available = len(set(available_locations))
    regions_available = len({region_of(loc) for loc in available_locations})
    racks = min(min_racks_per_write_quorum, write_quorum, racks_available)
    regions = 0
    if policy == "region-aware":
        regions = min(min_regions_per_write_quorum, write_quorum, regions_available)
    return regions, max(racks, regions)


def write_set_violations(ensemble: Sequence[BookieId], write_quorum: int,
                         locations: Mapping[BookieId, str], policy: str = "rack-aware", *,
                         min_racks_per_write_quorum: int = 2,
                         min_regions_per_write_quorum: int = 2,
                         available: Collection[BookieId] | None = None,
                         ) -> list[PlacementViolation]:
    """The write sets of ``ensemble`` that violate ``policy``, in position order.

    The write sets are the ensemble's cyclic windows of ``write_quorum`` positions
    (entry ``e`` goes to the one starting at ``e mod E``; equal windows, as when
    ``Qw = E``, count once).  Rack-aware: each must span ``min(min_racks, Qw, racks
    available)`` racks; region-aware: ``min(min_regions, Qw, regions available)``
    regions, and as many racks as rack-aware (at least as many as regions).
    Locations come from ``locations`` (normalized; a bookie absent is in the default
    location); the racks and regions available are those of ``available`` (default:
    every bookie of ``locations`` and of the ensemble).  ``random``: none."""
    if not 1 <= write_quorum <= len(ensemble):
        raise ValueError(f"need 1 <= write_quorum <= ensemble size, got {write_quorum} for "
                         f"{len(ensemble)} bookies")
    pool = set(locations) | set(ensemble) if available is None else set(available)
    avail = {location_of(b, locations) for b in pool}
    need_regions, need_racks = required_spread(
        policy, write_quorum, min_racks_per_write_quorum, min_regions_per_write_quorum, avail)
    if not need_racks:
        return []
    size = len(ensemble)
    locs = [location_of(b, locations) for b in ensemble]
    seen: set[frozenset[int]] = set()
    out = []
    for start in range(size):
        positions = tuple((start + i) % size for i in range(write_quorum))
        key = frozenset(positions)
        if key in seen:
            continue
        seen.add(key)
        window = [locs[p] for p in positions]
        racks = len(set(window))
        regions = len({region_of(loc) for loc in window})
        if racks < need_racks or regions < need_regions:
            out.append(PlacementViolation(
                positions, tuple(ensemble[p] for p in positions), tuple(window), regions,
                racks, need_regions, need_racks, len(avail),
                len({region_of(loc) for loc in avail})))
    return out


def placement_violations(ensemble: Sequence[BookieId], write_quorum: int,
                         locations: Mapping[BookieId, str], policy: str = "rack-aware", *,
                         min_racks_per_write_quorum: int = 2,
                         min_regions_per_write_quorum: int = 2,
                         available: Collection[BookieId] | None = None) -> list[str]:
    """:func:`write_set_violations` in words, one line per violating write set."""
    return [str(v) for v in write_set_violations(
        ensemble, write_quorum, locations, policy,
        min_racks_per_write_quorum=min_racks_per_write_quorum,
        min_regions_per_write_quorum=min_regions_per_write_quorum, available=available)]


FIX_SUBSETS_MAX = 200
"""Sets of positions :func:`plan_placement_fix` tries at most."""


def plan_placement_fix(ensemble: Sequence[BookieId], write_quorum: int,
                       candidates: Collection[BookieId], locations: Mapping[BookieId, str],
                       policy: str, *, min_racks_per_write_quorum: int = 2,
                       min_regions_per_write_quorum: int = 2,
                       available: Collection[BookieId] | None = None,
                       rng: random.Random | None = None,
                       subsets_max: int = FIX_SUBSETS_MAX) -> dict[int, BookieId] | None:
    """New bookies for some positions of ``ensemble`` (position -> bookie, from
    ``candidates`` outside the ensemble) after which no write set violates ``policy``
    (as :func:`write_set_violations` judges it, with the same arguments): ``{}`` if none
    does now, None if no such change is found.

    Fewest positions first (each one means copying its entries): sets of positions
    that touch every violating write set (and may hold others: a neighbour's rack can
    be what stands in the way), those in most violating write sets first,
    each tried with the policy's own exact search (enforced, its minimums capped as
    the check caps them); at most ``subsets_max`` sets are tried."""
    def violations(bookies: Sequence[BookieId]) -> list[PlacementViolation]:
        return write_set_violations(bookies, write_quorum, locations, policy,
                                    min_racks_per_write_quorum=min_racks_per_write_quorum,
                                    min_regions_per_write_quorum=min_regions_per_write_quorum,
                                    available=available)

    bad = violations(ensemble)
    if not bad:
        return {}
    pool = set(locations) | set(ensemble) if available is None else set(available)
    need_regions, need_racks = required_spread(
        policy, write_quorum, min_racks_per_write_quorum, min_regions_per_write_quorum,
        {location_of(b, locations) for b in pool})
    silent = _SilentLog()
    strict: PlacementPolicy = (
        RegionAwarePlacement(need_regions, True, min_racks_per_write_quorum=need_racks,
                             rng=rng, log=silent)
        if need_regions else RackAwarePlacement(need_racks, True, rng=rng, log=silent))
    spare = sorted(set(candidates) - set(ensemble))
    windows = [set(v.positions) for v in bad]
    crowded: Counter[int] = Counter()
    for v in bad:
        repeats = Counter(v.locations)
        for p, loc in zip(v.positions, v.locations, strict=True):
            crowded[p] += 2 if repeats[loc] > 1 else 1
    # Every position may take part: a fix may need to move a neighbour of a violating
    # write set too (its new bookie's rack would crowd the next write set otherwise).
    order = sorted(range(len(ensemble)), key=lambda p: (-crowded[p], p))
    tried = 0
    for k in range(1, min(len(order), len(spare)) + 1):
        for positions in itertools.combinations(order, k):
            chosen = set(positions)
            if not all(w & chosen for w in windows):
                continue
            tried += 1
            if tried > subsets_max:
                return None
            try:
                new = strict.replace(ensemble, positions, write_quorum, spare, locations)
            except NotEnoughBookiesError:  # PlacementError too
                continue
            trial = list(ensemble)
            for p, b in zip(positions, new, strict=True):
                trial[p] = b
            if not violations(trial):
                return dict(zip(positions, new, strict=True))
    return None


class _SilentLog:
    """A logger that drops everything (a trial placement's warnings are no news)."""

    def warning(self, *args: Any, **kwargs: Any) -> None:
        pass


class _OutOfBudget(Exception):
    pass


def _arrange(seq: list[str | None], write_quorum: int, counts: dict[str, int],
             need_regions: int, need_racks: int, prefer_regions: bool,
             rng: random.Random, nodes_max: int = SEARCH_NODES_MAX) -> list[str] | None:
    """Fill the ``None`` positions of the cyclic sequence ``seq`` with racks (a rack
    used at most ``counts[rack]`` times) so that every window of ``write_quorum``
    positions that contains a filled position spans at least ``need_regions``
    regions and ``need_racks`` racks; None if there is no such filling (or the
    search ran out of ``nodes_max``).  A depth-first search: racks absent from the
    position's windows first, randomly weighted by what they have left; racks
    nowhere in the sequence with the same count and region are tried once, through
    one of them chosen at random (so every rack gets its share of ensembles)."""
    size = len(seq)
    free = [p for p, loc in enumerate(seq) if loc is None]
    windows = {tuple(sorted({(s + i) % size for i in range(write_quorum)})) for s in range(size)}
    relevant = [w for w in windows if any(seq[p] is None for p in w)]
    containing = {p: [w for w in relevant if p in w] for p in free}
    seq = list(seq)
    counts = dict(counts)
    used = Counter(loc for loc in seq if loc is not None)
    nodes = 0

    def fits(p: int) -> bool:
        for w in containing[p]:
            placed = [seq[q] for q in w if seq[q] is not None]
            open_ = len(w) - len(placed)
            if len(set(placed)) + open_ < need_racks:
                return False
            if need_regions and len({region_of(x) for x in placed if x is not None}) \
                    + open_ < need_regions:
                return False
        return True

    def order(p: int) -> list[str]:
        near = {seq[q] for w in containing[p] for q in w if seq[q] is not None}
        near_regions = {region_of(x) for x in near if x is not None}
        keyed = []
        tried: set[tuple[int, str]] = set()
        racks = list(counts.items())
        rng.shuffle(racks)  # which of interchangeable unused racks stands for them
        for rack, left in racks:
            if left <= 0:
                continue
            if not used[rack]:
                sym = (left, region_of(rack))
                if sym in tried:
                    continue
                tried.add(sym)
            keyed.append(((prefer_regions and region_of(rack) in near_regions),
                          rack in near, -(rng.random() ** (1.0 / left)), rack))
        keyed.sort()
        return [k[3] for k in keyed]

    def dfs(d: int) -> bool:
        nonlocal nodes
        if d == len(free):
            return True
        p = free[d]
        for rack in order(p):
            nodes += 1
            if nodes > nodes_max:
                raise _OutOfBudget
            seq[p] = rack
            counts[rack] -= 1
            used[rack] += 1
            if fits(p) and dfs(d + 1):
                return True
            seq[p] = None
            counts[rack] += 1
            used[rack] -= 1
        return False

    try:
        found = dfs(0)
    except _OutOfBudget:
        return None
    return [str(seq[p]) for p in free] if found else None


class _SpreadPlacement:
    """Rack- and region-aware placement (the search in :func:`_arrange`)."""

    _name = "spread"

    def __init__(self, *, min_regions: int, min_racks: int, enforce: bool,
                 rng: random.Random | None, log: Any, prefer_regions: bool,
                 nodes_max: int) -> None:
        if min_regions < 0 or min_racks < 1:
            raise ValueError("need min_racks_per_write_quorum >= 1 and "
                             "min_regions_per_write_quorum >= 0")
        self.min_regions = min_regions
        self.min_racks = min_racks
        self.enforce = enforce
        self._rng = rng or random.Random()
        self._log = log if log is not None else get_logger(component="placement")
        self._prefer_regions = prefer_regions
        self._nodes_max = nodes_max
        self.fallbacks = 0

    def _targets(self, write_quorum: int) -> list[tuple[int, int]]:
        """``(regions, racks)`` per write set, the required one first, then weaker ones."""
        regions = min(self.min_regions, write_quorum)
        racks = min(self.min_racks, write_quorum)
        out: list[tuple[int, int]] = []
        for g in range(regions, -1, -1):
            for r in range(racks, 0, -1):
                t = (g, max(r, g))
                if t not in out:
                    out.append(t)
            if g <= 1:
                break
        return out

    def new_ensemble(self, size: int, write_quorum: int, writable: Collection[BookieId],
                     locations: Mapping[BookieId, str],
                     exclude: Collection[BookieId] = ()) -> list[BookieId]:
        candidates = _candidates(writable, exclude, size, "")
        return self._place([None] * size, write_quorum, candidates, locations,
                           f"new ensemble of {size} bookies")

    def replace(self, ensemble: Sequence[BookieId], positions: Sequence[int],
                write_quorum: int, writable: Collection[BookieId],
                locations: Mapping[BookieId, str],
                exclude: Collection[BookieId] = ()) -> list[BookieId]:
        candidates = _candidates(writable, set(ensemble) | set(exclude), len(positions),
                                 " outside the ensemble")
        if not positions:
            return []
        seq: list[str | None] = [location_of(b, locations) for b in ensemble]
        for p in positions:
            seq[p] = None
        placed = self._place(seq, write_quorum, candidates, locations,
                             f"choice of replacements for "
                             f"{', '.join(ensemble[p] for p in positions)} in ensemble "
                             f"{list(ensemble)}")
        return [placed[p] for p in positions]

    def _place(self, seq: list[str | None], write_quorum: int, candidates: list[BookieId],
               locations: Mapping[BookieId, str], what: str) -> list[BookieId]:
        groups: dict[str, list[BookieId]] = {}
        for b in candidates:
            groups.setdefault(location_of(b, locations), []).append(b)
        counts = {loc: len(bs) for loc, bs in groups.items()}
        targets = self._targets(write_quorum)
        racks = None
        for i, (g, r) in enumerate(targets):
            racks = _arrange(seq, write_quorum, counts, g, r, self._prefer_regions, self._rng,
                             self._nodes_max)
            if racks is not None:
                if i:
                    self._fell_back(what, write_quorum, counts, (g, r))
                break
            if i == 0 and self.enforce:
                raise PlacementError(self._unmet(seq, write_quorum, counts, what))
        if racks is None:  # unreachable: the weakest target is one rack per write set
            raise PlacementError(self._unmet(seq, write_quorum, counts, what))
        for bookies in groups.values():
            self._rng.shuffle(bookies)
        chosen = iter(racks)
        return [groups[next(chosen)].pop() if loc is None else "" for loc in seq]

    def _required(self, write_quorum: int) -> str:
        regions = min(self.min_regions, write_quorum)
        racks = min(self.min_racks, write_quorum)
        parts = []
        if regions:
            parts.append(f"{regions} regions (min_regions_per_write_quorum)")
        if racks > max(regions, 1) or not regions:
            parts.append(f"{racks} racks (min_racks_per_write_quorum)")
        return " and ".join(parts)

    def _unmet(self, seq: list[str | None], write_quorum: int, counts: dict[str, int],
               what: str) -> str:
        failed = self._required(write_quorum)
        regions = min(self.min_regions, write_quorum)
        racks = min(self.min_racks, write_quorum)
        if regions and racks > regions:  # say which of the two fails on its own
            alone = []
            if _arrange(seq, write_quorum, counts, regions, 1, True, self._rng,
                        self._nodes_max) is None:
                alone.append(f"{regions} regions (min_regions_per_write_quorum)")
            if _arrange(seq, write_quorum, counts, 0, racks, False, self._rng,
                        self._nodes_max) is None:
                alone.append(f"{racks} racks (min_racks_per_write_quorum)")
            if alone:
                failed = " and ".join(alone)
        return (f"{self._name} placement: no {what} (write quorum {write_quorum}) has every "
                f"write set spanning at least {failed}"
                + (" (enforced)" if self.enforce else "")
                + f"; {_describe(counts)}")

    def _fell_back(self, what: str, write_quorum: int, counts: dict[str, int],
                   got: tuple[int, int]) -> None:
        self.fallbacks += 1
        self._log.warning("placement constraint not met, using the best ensemble available",
                          policy=self._name, placing=what, write_quorum=write_quorum,
                          required=self._required(write_quorum),
                          achieved_regions=got[0] or None, achieved_racks=got[1],
                          available=_describe(counts))


def _describe(counts: Mapping[str, int]) -> str:
    """``available: 2 racks in 1 region: /eu/r1 (3 bookies), /eu/r2 (1 bookie)``."""
    racks = sorted(loc for loc, n in counts.items() if n > 0)
    regions = {region_of(loc) for loc in racks}
    listed = ", ".join(f"{loc} ({counts[loc]} bookie{'s' if counts[loc] != 1 else ''})"
                       for loc in racks)
    return (f"available: {len(racks)} rack{'s' if len(racks) != 1 else ''} in "
            f"{len(regions)} region{'s' if len(regions) != 1 else ''}"
            + (f": {listed}" if listed else ""))


class RackAwarePlacement(_SpreadPlacement):
    """Every write set spans at least ``min_racks_per_write_quorum`` racks (or the
    write quorum, if smaller) when the bookies available allow it, preferring racks
    not yet in the write set."""

    _name = "rack-aware"

    def __init__(self, min_racks_per_write_quorum: int = 2, enforce: bool = False, *,
                 rng: random.Random | None = None, log: Any = None,
                 nodes_max: int = SEARCH_NODES_MAX) -> None:
        super().__init__(min_regions=0, min_racks=min_racks_per_write_quorum, enforce=enforce,
                         rng=rng, log=log, prefer_regions=False, nodes_max=nodes_max)


class RegionAwarePlacement(_SpreadPlacement):
    """Every write set spans at least ``min_regions_per_write_quorum`` regions and
    ``min_racks_per_write_quorum`` racks (each capped at the write quorum) when the
    bookies available allow it, preferring regions, then racks, not yet in the write
    set (so inside a region a write set's bookies go to different racks)."""

    _name = "region-aware"

    def __init__(self, min_regions_per_write_quorum: int = 2, enforce: bool = False, *,
                 min_racks_per_write_quorum: int = 2, rng: random.Random | None = None,
                 log: Any = None, nodes_max: int = SEARCH_NODES_MAX) -> None:
        if min_regions_per_write_quorum < 1:
            raise ValueError("min_regions_per_write_quorum must be >= 1")
        super().__init__(min_regions=min_regions_per_write_quorum,
                         min_racks=min_racks_per_write_quorum, enforce=enforce, rng=rng,
                         log=log, prefer_regions=True, nodes_max=nodes_max)


def make_policy(name: str, *, min_racks_per_write_quorum: int = 2,
                min_regions_per_write_quorum: int = 2, enforce: bool = False,
                rng: random.Random | None = None, log: Any = None) -> PlacementPolicy:
    """The policy ``name`` (one of :data:`POLICIES`)."""
    if name == "random":
        return RandomPlacement(rng)
    if name == "rack-aware":
        return RackAwarePlacement(min_racks_per_write_quorum, enforce, rng=rng, log=log)
    if name == "region-aware":
        return RegionAwarePlacement(min_regions_per_write_quorum, enforce,
                                    min_racks_per_write_quorum=min_racks_per_write_quorum,
                                    rng=rng, log=log)
    raise ValueError(f"unknown placement policy {name!r}; choose one of {', '.join(POLICIES)}")


__all__ = [
    "POLICIES", "PlacementPolicy", "PlacementViolation", "Quarantine", "RackAwarePlacement",
    "RandomPlacement", "RegionAwarePlacement", "make_policy", "placement_violations",
    "plan_placement_fix", "required_spread", "write_set_spread", "write_set_violations",
]
