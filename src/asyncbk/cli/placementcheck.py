"""``asyncbk shell placementcheck``: ledger fragments whose write sets break a rack- or
region-aware placement policy, given where the bookies are now, and (``--fix``) their
repair by re-replication (see docs/placement.md)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ..errors import BKError, MetadataVersionError, NoSuchLedgerError
from .common import LedgerLocks, progress

__all__ = ["placementcheck"]


async def placementcheck(bk: Any, args: argparse.Namespace) -> int:
    """``asyncbk shell placementcheck``: see its description (shell.add_commands).
    Returns the exit code."""
    import sys

    from ..autorecovery.placement import (
        PlacementRule,
        available_racks,
        check_ledger,
        describe_available,
        fix_ledger_placement,
        rule_of,
    )
    from ..autorecovery.replication import RateLimiter, ReplicationStats

    cfg = bk.config
    given = args.policy is not None
    rule = PlacementRule(args.policy or cfg.placement_policy,
                         args.min_racks or cfg.min_racks_per_write_quorum,
                         args.min_regions or cfg.min_regions_per_write_quorum)
    report: dict[str, Any] = {
        "policy": rule.policy, "min_racks_per_write_quorum": rule.min_racks_per_write_quorum,
        "min_regions_per_write_quorum": rule.min_regions_per_write_quorum
        if rule.policy == "region-aware" else None}
    note = ""
    if rule.policy == "random":
        # ledgers created with their own placement are still checked against it
        note = ("random placement accepts every ensemble, so no ledger without its own "
                "placement can violate it"
                + ("" if given else " (the client's --placement-policy is random)")
                + "; check those against a policy with --policy rack-aware or --policy "
                "region-aware")
        report["note"] = note
    view = await bk.meta.list_bookies()
    available = set(view)
    writable = sorted(b for b, reg in view.items() if not reg.readonly)
    locations = await bk.bookies.current_locations(cfg.metadata_timeout_s)
    racks = available_racks(locations, available)
    ledgers = [lid async for lid in bk.list_ledgers()]
    checked = progress("placementcheck", "ledgers checked")
    checks = []
    own_rules = 0
    for n, lid in enumerate(ledgers, 1):
        checked(n, len(ledgers))
        try:
            md = await bk.ledger_metadata(lid)
        except NoSuchLedgerError:  # deleted meanwhile
            continue
        ledger_rule, own = rule_of(md, rule, cfg)  # a ledger's own placement first
        own_rules += own
        checks += check_ledger(md, ledger_rule, locations, available, own_rule=own)
    violating = sorted({c.ledger_id for c in checks})
    report.update(racks=racks, ledgers_checked=len(ledgers), violating_ledgers=len(violating),
                  ledgers_with_own_placement=own_rules,
                  fragments=[c.to_json() for c in checks])
    against = rule.describe()
    if own_rules:
        against = (f"its placement ({own_rules} ledger(s) with their own, the others "
                   f"{against})")
    over = f"{against}; bookies: {describe_available(racks)}"
    if not args.json:
        for c in checks:
            why = f" (not movable now: {c.why_not_fixable()})" if not c.fixable else ""
            against = f"the ledger's own, {c.rule.describe()}" \
                if c.own_rule and c.rule is not None else "the command's"
            print(f"{c.where()}, ensemble [{', '.join(c.ensemble)}], rule: {against}{why}:")
            for v in c.violations:
                print(f"  {v}")
    left = len(checks)
    if args.fix and checks:
        left = 0
        fixed: list[str] = []
        unfixed: list[str] = []
        stats = ReplicationStats()
        limiter = RateLimiter(args.rate)
        by_ledger: dict[int, int] = {}
        for c in checks:
            by_ledger[c.ledger_id] = by_ledger.get(c.ledger_id, 0) + 1
        async with LedgerLocks(bk, f"shell-placement-{os.getpid()}",
                                enabled=not args.dry_run) as locks:
            for lid in violating:
                async with locks.hold(lid) as holder:
                    if holder is not None:
                        unfixed.append(f"ledger {lid}: busy ({holder} holds it); run again "
                                       "later")
                        left += by_ledger[lid]
                        continue
                    try:
                        done = await fix_ledger_placement(
                            bk, lid, rule, available, writable, limiter, stats,
                            progress=None if args.dry_run or args.json
                            else progress(f"ledger {lid}"), dry_run=args.dry_run)
                    except NoSuchLedgerError:
                        continue  # deleted meanwhile: nothing left to fix
                    except MetadataVersionError as exc:
                        unfixed.append(f"ledger {lid}: changed while it was moved ({exc}); "
                                       "nothing was lost: run placementcheck again")
                        left += by_ledger[lid]
                        continue
                    except BKError as exc:
                        unfixed.append(f"ledger {lid}: FAILED: {exc}")
                        left += by_ledger[lid]
                        continue
                fixed += done.fixed
                unfixed += done.left
                left += len(done.left)
        if args.dry_run:
            left = len(checks)
        report.update(fixed=fixed, left=unfixed, dry_run=args.dry_run,
                      copied_entries=stats.entries, copied_bytes=stats.bytes)
        if not args.json:
            verb = "would move" if args.dry_run else "moved"
            for line in fixed:
                print(f"{verb} {line}")
            for line in unfixed:
                print(f"left {line}")
            if args.dry_run:
                print(f"dry run: {len(fixed)} of {len(checks)} violating fragment(s) would be "
                      f"moved, {len(unfixed)} not; {over}")
            else:
                print(f"moved {len(fixed)} of {len(checks)} violating fragment(s) "
                      f"({stats.entries} entries, {stats.bytes} bytes copied); {left} left; "
                      f"{over}")
    elif not args.json:
        if checks:
            print(f"{len(violating)} of {len(ledgers)} ledger(s) violate the placement policy "
                  f"({len(checks)} fragment(s)); {over}; move them with --fix")
        elif note and not own_rules:
            print(note)
        else:
            print(f"placement OK: none of {len(ledgers)} ledger(s) violates {over}")
        if note and checks:
            print(note)
    if args.json:
        report["left_fragments"] = left
        print(json.dumps(report, indent=2))
    sys.stdout.flush()
    return 1 if left else 0
