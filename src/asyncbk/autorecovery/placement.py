"""Placement check and repair: ledger fragments whose write sets violate a rack- or
region-aware policy given where the bookies are *now* (a bookie moved racks, a rack
file changed, the policy was turned on after the ledgers were written), and their
repair by re-replication (``asyncbk shell placementcheck [--fix]``, ``asyncbk
autorecovery --fix-placement``; see docs/placement.md).

:func:`check_ledger` is pure.  :func:`fix_ledger_placement` works like
re-replication (:mod:`.replication`), fragment by fragment: it chooses the fewest
positions whose new bookies (chosen by the policy, each answering a health probe)
make every write set of the fragment comply, copies the entries those positions
hold to the new bookies (read from any replica, digest checked, written with
RECOVERY_ADD and acknowledged after the new bookie's fsync), then swaps them into
that fragment by compare-and-swap on the metadata.  The old bookies keep their
copies until garbage collection finds them out of the ledger.

Only fragments that can no longer grow are changed: those of a closed ledger and
the earlier fragments of an open one (BookKeeper's placement check looks at closed
ledgers only).  The last fragment of an open ledger is its writer's: it is reported,
and repaired once the ledger is closed.  A fragment with a bookie that is not
registered is re-replication's business (its entries may have one replica fewer);
it is reported and left alone.  A fragment without entries holds nothing and is not
checked.

A ledger created with its own placement (``create_ledger(placement=...)``, a
namespace's segments; recorded in its metadata, see
:func:`~asyncbk.client.client.ledger_placement`) is checked and repaired against
that placement (:func:`rule_of`); the rule given (the command's, the auditor's)
applies to the ledgers without one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..clock import RateLimiter
from ..config import ClientConfig
from ..log import get_logger
from ..meta.model import LedgerMetadata
from ..topology import POLICIES, location_of, region_of
from ..types import BookieId
from .replication import (
    ReplicationStats,
    answers_writable,
    copy_fragment,
    ledger_spec,
    swap_bookies,
)

if TYPE_CHECKING:
    import random

    from ..client.client import BookKeeper, PlacementSpec
    from ..client.placement import PlacementViolation

_log = get_logger(component="placement-fix")


@dataclass(frozen=True)
class PlacementRule:
    """The policy fragments are checked against: ``rack-aware`` or ``region-aware``
    with its minimums (``random`` accepts every ensemble)."""

    policy: str
    min_racks_per_write_quorum: int = 2
    min_regions_per_write_quorum: int = 2

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown placement policy {self.policy!r}; choose one of "
                             f"{', '.join(POLICIES)}")
        for name in ("min_racks_per_write_quorum", "min_regions_per_write_quorum"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def of_client(cls, config: ClientConfig) -> PlacementRule:
        """The rule of a client's placement settings."""
        return cls(config.placement_policy, config.min_racks_per_write_quorum,
                   config.min_regions_per_write_quorum)

    @classmethod
    def of_spec(cls, spec: PlacementSpec, config: ClientConfig) -> PlacementRule:
        """The rule of a ledger's own placement ``spec`` (its fields left None are
        ``config``'s)."""
        policy, racks, regions, _ = spec.resolve(config)
        return cls(policy, racks or config.min_racks_per_write_quorum,
                   regions or config.min_regions_per_write_quorum)

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy,
                "min_racks_per_write_quorum": None if self.policy == "random"
                else self.min_racks_per_write_quorum,
                "min_regions_per_write_quorum": self.min_regions_per_write_quorum
                if self.policy == "region-aware" else None}

    def describe(self) -> str:
        """``rack-aware placement (every write set spans at least 2 racks)``."""
        if self.policy == "random":
            return "random placement (no constraint)"
        need = f"{self.min_racks_per_write_quorum} racks"
        if self.policy == "region-aware":
            need = f"{self.min_regions_per_write_quorum} regions and {need}"
        return (f"{self.policy} placement (every write set spans at least {need}, capped "
                "at its write quorum and at what is available)")

    def violations(self, ensemble: Collection[BookieId], write_quorum: int,
                   locations: Mapping[BookieId, str],
                   available: Collection[BookieId]) -> list[PlacementViolation]:
        from ..client.placement import write_set_violations

        return write_set_violations(
            list(ensemble), write_quorum, locations, self.policy,
            min_racks_per_write_quorum=self.min_racks_per_write_quorum,
            min_regions_per_write_quorum=self.min_regions_per_write_quorum,
            available=available)


def rule_of(md: LedgerMetadata, default: PlacementRule,
            config: ClientConfig) -> tuple[PlacementRule, bool]:
    """``(rule, own)``: the rule ``md``'s fragments are checked against, its own
    recorded placement (``own``) or else ``default``; a malformed record is logged as
    a warning and ``default`` applies."""
    spec = ledger_spec(md)
    if spec is None:
        return default, False
    return PlacementRule.of_spec(spec, config), True


@dataclass
class FragmentCheck:
    """A fragment of a ledger whose write sets violate the rule."""

    ledger_id: int
    index: int
    first: int
    last: int
    """Its last entry (-1 for the open tail of an open ledger: not known yet)."""
    ensemble: tuple[BookieId, ...]
    write_quorum: int
    violations: list[PlacementViolation]
    open_tail: bool = False
    """The last fragment of an open ledger: its writer's, not repaired."""
    unregistered: list[BookieId] = field(default_factory=list)
    """Bookies of the fragment that are not registered: re-replicate them first."""
    rule: PlacementRule | None = None
    """The rule it violates."""
    own_rule: bool = False
    """Whether that rule is the ledger's own placement (else the one given to the check)."""

    @property
    def fixable(self) -> bool:
        return not self.open_tail and not self.unregistered

    def where(self) -> str:
        last = "open" if self.open_tail else str(self.last)
        return (f"ledger {self.ledger_id} fragment {self.index} (first entry {self.first}, "
                f"entries {self.first}..{last})")

    def rule_source(self) -> str:
        """``ledger`` (its own placement) or ``command`` (the rule given)."""
        return "ledger" if self.own_rule else "command"

    def why_not_fixable(self) -> str:
        if self.open_tail:
            return ("the ledger is open and this is its writer's fragment: repaired once "
                    "the ledger is closed")
        if self.unregistered:
            return (f"{', '.join(self.unregistered)} not registered: re-replicate it first "
                    "(auto-recovery, or asyncbk shell recover)")
        return ""

    def to_json(self) -> dict[str, Any]:
        return {"ledger_id": self.ledger_id, "fragment": self.index,
                "first_entry": self.first, "last_entry": None if self.open_tail else self.last,
                "ensemble": list(self.ensemble), "write_quorum": self.write_quorum,
                "open": self.open_tail, "unregistered": list(self.unregistered),
                "fixable": self.fixable, "reasons": [str(v) for v in self.violations],
                "rule": self.rule_source(),
                "placement": self.rule.to_json() if self.rule is not None else None}


def check_ledger(md: LedgerMetadata, rule: PlacementRule, locations: Mapping[BookieId, str],
                 available: Collection[BookieId], *,
                 own_rule: bool = False) -> list[FragmentCheck]:
    """The fragments of ``md`` that violate ``rule`` given ``locations`` (normalized,
    absent bookies in the default location) and the racks of the ``available``
    (registered) bookies; empty fragments are skipped.  ``rule`` is used as given
    (:func:`rule_of` picks a ledger's own); ``own_rule`` says it is the ledger's own."""
    if rule.policy == "random":
        return []
    registered = set(available)
    out = []
    for index, (first, ensemble) in enumerate(md.ensembles):
        open_tail = index == len(md.ensembles) - 1 and not md.is_closed
        last = md.fragment_bounds(index)[1]
        if not open_tail and last < first:
            continue
        found = rule.violations(ensemble, md.write_quorum, locations, registered)
        if found:
            out.append(FragmentCheck(md.ledger_id, index, first, last if not open_tail else -1,
                                     tuple(ensemble), md.write_quorum, found, open_tail,
                                     [b for b in ensemble if b not in registered], rule,
                                     own_rule))
    return out


def available_racks(locations: Mapping[BookieId, str],
                    available: Collection[BookieId]) -> dict[str, int]:
    """Location -> bookies there, of the ``available`` bookies."""
    out: dict[str, int] = {}
    for b in available:
        loc = location_of(b, locations)
        out[loc] = out.get(loc, 0) + 1
    return dict(sorted(out.items()))


def describe_available(racks: Mapping[str, int]) -> str:
    """``2 racks in 1 region: /default-region/r1 (3 bookies), ...``."""
    regions = {region_of(loc) for loc in racks}
    listed = ", ".join(f"{loc} ({n} bookie{'s' if n != 1 else ''})" for loc, n in racks.items())
    return (f"{len(racks)} rack{'s' if len(racks) != 1 else ''} in {len(regions)} "
            f"region{'s' if len(regions) != 1 else ''}" + (f": {listed}" if listed else ""))


@dataclass
class LedgerFix:
    """What :func:`fix_ledger_placement` did to one ledger."""

    fixed: list[str] = field(default_factory=list)
    """One line per fragment repaired (or, dry, that would be)."""
    left: list[str] = field(default_factory=list)
    """One line per violating fragment left as it is, saying why."""


async def fix_ledger_placement(bk: BookKeeper, ledger_id: int, rule: PlacementRule,
                               available: Collection[BookieId], writable: Collection[BookieId],
                               limiter: RateLimiter, stats: ReplicationStats, *,
                               progress: Callable[[int, int], None] | None = None,
                               dry_run: bool = False,
                               rng: random.Random | None = None) -> LedgerFix:
    """Repair the fragments of ``ledger_id`` that violate its rule: its own recorded
    placement, else ``rule`` (:func:`rule_of`; see the module docstring).  Locations
    are the client's (``bk.bookies``) now; ``available``: the
    registered bookies; ``writable``: those replacements may come from.  Raises
    BKError when copying fails, MetadataVersionError when the fragment changed while
    it was copied (nothing is lost: run it again), NoSuchLedgerError if the ledger
    was deleted."""
    from ..client.digest import DigestManager, master_key
    from ..client.placement import plan_placement_fix

    md = await bk.meta.read_ledger(ledger_id)
    rule, own = rule_of(md, rule, bk.config)
    locations = await bk.bookies.current_locations(bk.config.metadata_timeout_s)
    registered = set(available)
    digest = DigestManager(md.ledger_id, md.digest, md.password)
    key = master_key(md.password)
    result = LedgerFix()
    unusable: set[BookieId] = set()
    for check in check_ledger(md, rule, locations, registered, own_rule=own):
        if not check.fixable:
            result.left.append(f"{check.where()}: not fixed: {check.why_not_fixable()}")
            continue
        index, first, last, ensemble = check.index, check.first, check.last, check.ensemble
        plan: dict[int, BookieId] | None = None
        while True:
            spare = [b for b in writable if b not in unusable and b not in ensemble]
            plan = plan_placement_fix(
                ensemble, md.write_quorum, spare, locations, rule.policy,
                min_racks_per_write_quorum=rule.min_racks_per_write_quorum,
                min_regions_per_write_quorum=rule.min_regions_per_write_quorum,
                available=registered, rng=rng)
            if not plan or dry_run:
                break
            dead = [b for b in plan.values() if not await answers_writable(bk, b)]
            if not dead:
                break
            unusable.update(dead)
        if plan is None:
            result.left.append(
                f"{check.where()}: not fixed: no change of bookies makes every write set "
                f"comply ({len(spare)} writable bookie(s) outside the ensemble answer; "
                f"available: {describe_available(available_racks(locations, registered))}); "
                "add bookies in the racks that are short, or change the policy"
                + (f" (the ledger's own: {rule.describe()})" if own else ""))
            continue
        if not plan:  # complies already (it changed since the check)
            continue
        count = sum(1 for e in range(first, last + 1)
                    if any((p - e) % md.ensemble_size < md.write_quorum for p in plan))
        line = (f"{check.where()}, {count} entries to copy: "
                + ", ".join(f"{ensemble[p]} {location_of(ensemble[p], locations)} -> {b} "
                            f"{location_of(b, locations)}" for p, b in sorted(plan.items())))
        if dry_run:
            result.fixed.append(line)
            continue
        await copy_fragment(bk, md, digest, key, first, last, ensemble, plan, limiter, stats,
                            progress, skip=set())
        md = await swap_bookies(bk, md, index, first, ensemble, plan)
        stats.fragments += 1
        result.fixed.append(line)
        _log.info("fragment moved to comply with placement", ledger_id=ledger_id,
                  fragment=index, first=first, last=last, entries=count, policy=rule.policy,
                  ledger_placement=own,
                  replaced={ensemble[p]: b for p, b in plan.items()})
    if result.fixed and not dry_run:
        stats.ledgers += 1
    return result


__all__ = ["FragmentCheck", "LedgerFix", "PlacementRule", "available_racks", "check_ledger",
           "describe_available", "fix_ledger_placement", "rule_of"]
