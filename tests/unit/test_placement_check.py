"""The placement check and its repair plan, pure: which write sets of an ensemble
violate a rack- or region-aware policy (against a brute-force model built on the
writer's own striping, and examples), which positions a repair changes (fewest,
always a compliant result, found whenever an exhaustive search finds one), a
ledger's fragments as the shell lists them, and the command-line options."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncbk.autorecovery.placement import PlacementRule, check_ledger
from asyncbk.cli.main import build_parser, main
from asyncbk.client.placement import (
    placement_violations,
    plan_placement_fix,
    write_set_violations,
)
from asyncbk.client.quorum import write_set
from asyncbk.meta.model import LedgerState, new_metadata
from asyncbk.topology import DEFAULT_LOCATION, region_of

# ---------------------------------------------------------------- model

LOCATIONS = ["/eu/r1", "/eu/r2", "/eu/r3", "/us/r1", "/us/r2", "/ap/r1"]


def model(ensemble: Sequence[str], write_quorum: int, locations: dict[str, str],
          policy: str, min_racks: int, min_regions: int,
          available: Sequence[str]) -> set[frozenset[int]]:
    """Brute force: the position sets of the write sets (as the writer stripes entries,
    one entry per starting position) that span too few racks or regions."""
    if policy == "random":
        return set()
    avail = {locations.get(b, DEFAULT_LOCATION) for b in available}
    racks = min(min_racks, write_quorum, len(avail))
    regions = min(min_regions, write_quorum, len({region_of(x) for x in avail})) \
        if policy == "region-aware" else 0
    bad = set()
    for entry in range(len(ensemble)):
        positions = write_set(entry, len(ensemble), write_quorum)
        locs = [locations.get(ensemble[p], DEFAULT_LOCATION) for p in positions]
        if len(set(locs)) < max(racks, regions) or len({region_of(x) for x in locs}) < regions:
            bad.add(frozenset(positions))
    return bad


@st.composite
def topologies(draw: st.DrawFn) -> tuple[list[str], int, dict[str, str], list[str], str, int,
                                         int]:
    size = draw(st.integers(1, 7))
    write_quorum = draw(st.integers(1, size))
    spares = draw(st.integers(0, 4))
    bookies = [f"b{i}:3181" for i in range(size + spares)]
    places = draw(st.lists(st.sampled_from(LOCATIONS), min_size=len(bookies),
                           max_size=len(bookies)))
    locations = dict(zip(bookies, places, strict=True))
    unknown = draw(st.integers(0, size))  # some bookies without a location (the default)
    for b in bookies[:unknown]:
        del locations[b]
    policy = draw(st.sampled_from(["rack-aware", "region-aware", "random"]))
    return (bookies[:size], write_quorum, locations, bookies, policy,
            draw(st.integers(1, 4)), draw(st.integers(1, 4)))


@settings(max_examples=400, deadline=None)
@given(topologies())
def test_violations_match_the_brute_force_model(case: tuple) -> None:  # type: ignore[type-arg]
    ensemble, wq, locations, available, policy, racks, regions = case
    found = write_set_violations(ensemble, wq, locations, policy,
                                 min_racks_per_write_quorum=racks,
                                 min_regions_per_write_quorum=regions, available=available)
    assert {frozenset(v.positions) for v in found} == model(
        ensemble, wq, locations, policy, racks, regions, available)
    assert len(found) == len({frozenset(v.positions) for v in found})  # each write set once
    for v in found:
        assert list(v.positions) == write_set(v.positions[0], len(ensemble), wq)
        assert v.bookies == tuple(ensemble[p] for p in v.positions)
        assert v.racks < v.need_racks or v.regions < v.need_regions
        assert str(v).startswith("write set at positions ")


def test_examples() -> None:
    loc = {"a:1": "/dc/r1", "b:1": "/dc/r1", "c:1": "/dc/r2", "d:1": "/dc/r2"}
    # two racks alternating around a ring of four: every write set of 2 spans both
    assert placement_violations(["a:1", "c:1", "b:1", "d:1"], 2, loc) == []
    # a ring of three over two racks: one write set always has one rack
    assert len(placement_violations(["a:1", "b:1", "c:1"], 2, loc)) == 1
    assert len(placement_violations(["a:1", "c:1", "b:1"], 2, loc)) == 1
    # AABB: the write sets (0,1) and (2,3) are within one rack each
    found = write_set_violations(["a:1", "b:1", "c:1", "d:1"], 2, loc)
    assert [v.positions for v in found] == [(0, 1), (2, 3)]
    assert str(found[0]) == (
        "write set at positions 0,1 [a:1 /dc/r1, b:1 /dc/r1] spans 1 rack, needs 2 "
        "(min_racks_per_write_quorum, capped at the write quorum and the 2 racks available)")
    # Qw = E: one write set, reported once
    assert len(placement_violations(["a:1", "b:1"], 2, loc)) == 1
    # racks available cap the minimum: every bookie in one rack violates nothing
    assert placement_violations(["a:1", "b:1"], 2, loc, available=["a:1", "b:1"]) == []
    # a minimum above the write quorum is capped at it
    assert placement_violations(["a:1", "c:1"], 2, loc, min_racks_per_write_quorum=5) == []
    assert placement_violations(["a:1", "b:1"], 2, loc, policy="random") == []
    # bookies without a location are all in the default rack
    assert len(placement_violations(["x:1", "y:1"], 2, loc)) == 1


def test_region_aware_says_regions_then_racks() -> None:
    loc = {"a:1": "/eu/r1", "b:1": "/eu/r1", "c:1": "/us/r1", "d:1": "/us/r2"}
    (v,) = write_set_violations(["a:1", "b:1"], 2, loc, "region-aware")
    assert (v.regions, v.racks, v.need_regions, v.need_racks) == (1, 1, 2, 2)
    text = str(v)
    assert text.index("spans 1 region,") < text.index("spans 1 rack,")
    # two regions but three racks wanted: only the racks are short
    (v,) = write_set_violations(["a:1", "b:1", "c:1"], 3, loc, "region-aware",
                                min_racks_per_write_quorum=3)
    assert (v.regions, v.racks, v.need_regions, v.need_racks) == (2, 2, 2, 3)
    assert "region" not in str(v).split("]")[1].split("(")[0]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="write_quorum"):
        write_set_violations(["a:1"], 2, {})
    with pytest.raises(ValueError, match="unknown placement policy"):
        write_set_violations(["a:1"], 1, {}, "nearby")


# ---------------------------------------------------------------- repair plans


def fixes(ensemble: Sequence[str], wq: int, spare: Sequence[str], locations: dict[str, str],
          policy: str, racks: int, regions: int, available: Sequence[str]) -> int | None:
    """Brute force: the fewest positions whose bookies, changed for spare ones, leave
    no violation (None: no change does)."""
    for k in range(min(len(ensemble), len(spare)) + 1):
        for positions in itertools.combinations(range(len(ensemble)), k):
            for chosen in itertools.permutations(spare, k):
                trial = list(ensemble)
                for p, b in zip(positions, chosen, strict=True):
                    trial[p] = b
                if not write_set_violations(trial, wq, locations, policy,
                                            min_racks_per_write_quorum=racks,
                                            min_regions_per_write_quorum=regions,
                                            available=available):
                    return k
    return None


@settings(max_examples=250, deadline=None)
@given(topologies(), st.integers(0, 2**32))
def test_repair_plans_are_minimal_and_compliant(case: tuple, seed: int) -> None:  # type: ignore[type-arg]
    ensemble, wq, locations, available, policy, racks, regions = case
    if len(ensemble) > 5:
        ensemble = ensemble[:5]
        wq = min(wq, 5)
    spare = [b for b in available if b not in ensemble]
    plan = plan_placement_fix(ensemble, wq, spare, locations, policy,
                              min_racks_per_write_quorum=racks,
                              min_regions_per_write_quorum=regions, available=available,
                              rng=random.Random(seed))
    best = fixes(ensemble, wq, spare, locations, policy, racks, regions, available)
    if best is None:
        assert plan is None
        return
    assert plan is not None and len(plan) == best
    assert set(plan.values()) <= set(spare) and len(set(plan.values())) == len(plan)
    trial = list(ensemble)
    for p, b in plan.items():
        trial[p] = b
    assert not write_set_violations(trial, wq, locations, policy,
                                    min_racks_per_write_quorum=racks,
                                    min_regions_per_write_quorum=regions, available=available)


def test_repair_plan_examples() -> None:
    loc = {"a:1": "/dc/r1", "b:1": "/dc/r1", "c:1": "/dc/r2", "d:1": "/dc/r2", "e:1": "/dc/r1"}
    # AABB -> one position moved is not enough (two disjoint bad write sets): two
    plan = plan_placement_fix(["a:1", "b:1", "c:1", "d:1"], 2, ["e:1"], loc, "rack-aware")
    assert plan is None  # the only spare is in r1: nothing alternates
    plan = plan_placement_fix(["a:1", "b:1"], 2, ["c:1", "e:1"], loc, "rack-aware")
    assert plan is not None and list(plan.values()) == ["c:1"]
    assert plan_placement_fix(["a:1", "c:1"], 2, ["b:1"], loc, "rack-aware") == {}
    # a ring of three over two racks cannot comply
    assert plan_placement_fix(["a:1", "b:1", "c:1"], 2, ["d:1", "e:1"], loc,
                              "rack-aware") is None


# ---------------------------------------------------------------- ledgers


def test_check_ledger_fragments() -> None:
    loc = {"a:1": "/dc/r1", "b:1": "/dc/r1", "c:1": "/dc/r2", "x:1": "/dc/r1"}
    registered = ["a:1", "b:1", "c:1"]  # x:1 is not (the client's mapping locates it)
    md = new_metadata(7, ["a:1", "b:1"], 2, 2, "xxh3", b"", None, 0)
    md = md.replace(ensembles=((0, ("a:1", "b:1")), (10, ("a:1", "c:1")), (10, ("b:1", "x:1")),
                               (20, ("a:1", "b:1"))))
    rule = PlacementRule("rack-aware")
    open_checks = check_ledger(md, rule, loc, registered)
    # fragment 1 is empty (10..9), fragment 2 has an unregistered bookie, fragment 3 is
    # the open tail
    assert [(c.index, c.first, c.open_tail, c.fixable) for c in open_checks] == [
        (0, 0, False, True), (2, 10, False, False), (3, 20, True, False)]
    assert "writer's fragment" in open_checks[2].why_not_fixable()
    assert open_checks[0].where() == "ledger 7 fragment 0 (first entry 0, entries 0..9)"
    # closed; fragment 1 (10..14) complies
    closed = md.replace(state=LedgerState.CLOSED, last_entry_id=25,
                        ensembles=md.ensembles[:2] + ((15, ("b:1", "x:1")), (20, ("a:1", "b:1"))))
    checks = check_ledger(closed, rule, loc, registered)
    assert [(c.index, c.last, c.fixable, c.unregistered) for c in checks] == [
        (0, 9, True, []), (2, 19, False, ["x:1"]), (3, 25, True, [])]
    assert "x:1 not registered" in checks[1].why_not_fixable()
    js = checks[0].to_json()
    assert js["ledger_id"] == 7 and js["first_entry"] == 0 and js["reasons"]
    assert check_ledger(closed, PlacementRule("random"), loc, registered) == []


def test_placement_rule() -> None:
    assert "2 regions and 3 racks" in PlacementRule("region-aware", 3, 2).describe()
    with pytest.raises(ValueError, match="unknown placement policy"):
        PlacementRule("nearby")
    with pytest.raises(ValueError, match="min_racks_per_write_quorum must be >= 1"):
        PlacementRule("rack-aware", 0)


# ---------------------------------------------------------------- command line

URI = "etcd://127.0.0.1:1/x"


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.mark.parametrize(("args", "code", "expect"), [
    (["shell", "placementcheck", "--metadata-uri", URI, "--min-racks", "0"], 2,
     "must be >= 1"),
    (["shell", "placementcheck", "--metadata-uri", URI, "--policy", "nearby"], 2,
     "invalid choice"),
    (["shell", "placementcheck", "--metadata-uri", URI, "--dry-run"], 1, "give --fix too"),
    (["shell", "placementcheck", "--metadata-uri", URI, "--bookie-racks-file",
      "/nonexistent/racks"], 1, "bookie_racks_file /nonexistent/racks does not exist"),
    (["shell", "listbookies", "--metadata-uri", URI, "--bookie-racks-script", "'unclosed"], 1,
     "bookie_racks_script"),
    (["shell", "listbookies", "--metadata-uri", URI, "--placement-policy", "nearby"], 2,
     "invalid choice"),
    (["autorecovery", "--metadata-uri", URI, "--min-racks-per-write-quorum", "0"], 2,
     "must be >= 1"),
    (["bookie", "--metadata-uri", URI, "--port", "4000", "--journal-dir", "j", "--ledger-dir",
      "l", "--placement-policy", "rack-aware"], 1, "give --autorecovery too"),
])
def test_option_errors_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str],
                                    code: int, expect: str) -> None:
    got, out, err = run_main(capsys, *args)
    assert got == code
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0], err


def test_bad_rack_file_is_refused_before_connecting(capsys: pytest.CaptureFixture[str],
                                                    tmp_path) -> None:  # type: ignore[no-untyped-def]
    racks = tmp_path / "racks.txt"
    racks.write_text("# racks\n10.0.0.1:3181 /eu/r1\n10.0.0.2 eu/r2\n")
    got, _, err = run_main(capsys, "autorecovery", "--metadata-uri", URI,
                           "--bookie-racks-file", str(racks))
    assert got == 1
    assert f"{racks}:3: a network location is an absolute path" in err
    assert len(err.strip().splitlines()) == 1


def test_placementcheck_help_gives_every_default() -> None:
    parser = build_parser()
    shell = next(a for a in parser._subparsers._group_actions  # type: ignore[union-attr]
                 if a.dest == "command").choices["shell"]
    check = next(a for a in shell._subparsers._group_actions  # type: ignore[union-attr]
                 if a.dest == "shell_command").choices["placementcheck"]
    options = [a for a in check._actions if a.option_strings and a.dest != "help"]
    assert {"--policy", "--min-racks", "--min-regions", "--json", "--fix",
            "--placement-policy", "--bookie-racks-file"} <= {
        o for a in options for o in a.option_strings}
    for action in options:
        text = action.help or ""
        assert "default" in text or text.startswith("required"), action.option_strings


def test_a_repair_may_move_a_neighbour_of_the_violating_write_set() -> None:
    """[r3 r2 r3 r1 r1] with Qw 2 and spares in r1 and r3 only: the write set (3, 4)
    needs another rack, and whichever of its positions takes r3 crowds its other
    neighbour, which must move to r1: two positions, one of them in no violating write
    set (found by the property test above)."""
    locations = {"b0:1": "/eu/r3", "b1:1": "/eu/r2", "b2:1": "/eu/r3", "b3:1": "/eu/r1",
                 "b4:1": "/eu/r1", "b5:1": "/eu/r1", "b6:1": "/eu/r3"}
    ensemble = ["b0:1", "b1:1", "b2:1", "b3:1", "b4:1"]
    plan = plan_placement_fix(ensemble, 2, ["b5:1", "b6:1"], locations, "rack-aware",
                              min_racks_per_write_quorum=2, available=list(locations),
                              rng=random.Random(0))
    assert plan is not None and len(plan) == 2 and set(plan.values()) == {"b5:1", "b6:1"}
    fixed = list(ensemble)
    for position, bookie in plan.items():
        fixed[position] = bookie
    assert not write_set_violations(fixed, 2, locations, "rack-aware",
                                    available=list(locations))
