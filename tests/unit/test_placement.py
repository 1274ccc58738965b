"""Placement policies against a brute-force model: for random topologies, quorums and
failure/exclude sets, a chosen ensemble meets the racks/regions constraint whenever
some ensemble does (otherwise the best weaker one), enforced placement raises
exactly when none does, replacements keep the write sets they join within the
constraint when possible, and reads prefer the client's rack, then region."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest
import structlog
from hypothesis import event, given, settings
from hypothesis import strategies as st

from asyncbk.client.placement import (
    RackAwarePlacement,
    RandomPlacement,
    RegionAwarePlacement,
    make_policy,
    write_set_spread,
)
from asyncbk.config import BookieConfig, ClientConfig, from_mapping
from asyncbk.errors import ConfigError, NotEnoughBookiesError, PlacementError
from asyncbk.topology import (
    DEFAULT_LOCATION,
    location_of,
    normalize_location,
    read_order,
    region_of,
    resolve_locations,
)

# ---------------------------------------------------------------- model


def windows(size: int, write_quorum: int) -> list[list[int]]:
    return [[(s + i) % size for i in range(write_quorum)] for s in range(size)]


def meets(seq: Sequence[str], write_quorum: int, regions: int, racks: int,
          only: Sequence[int] | None = None) -> bool:
    """Whether every write set of the rack sequence ``seq`` (those containing a
    position of ``only``, if given) spans ``regions`` regions and ``racks`` racks."""
    for w in windows(len(seq), write_quorum):
        if only is not None and not set(w) & set(only):
            continue
        locs = [seq[p] for p in w]
        if len(set(locs)) < racks or len({region_of(x) for x in locs}) < regions:
            return False
    return True


def exists(seq: Sequence[str | None], write_quorum: int, counts: Mapping[str, int],
           regions: int, racks: int) -> bool:
    """Brute force: can the ``None`` positions of ``seq`` be filled from ``counts`` so
    that the write sets containing them meet the constraint?"""
    free = [p for p, x in enumerate(seq) if x is None]
    for fill in itertools.product(sorted(counts), repeat=len(free)):
        if any(n > counts[r] for r, n in Counter(fill).items()):
            continue
        full = list(seq)
        for p, r in zip(free, fill, strict=True):
            full[p] = r
        if meets([str(x) for x in full], write_quorum, regions, racks, free):
            return True
    return False


def targets(policy: RackAwarePlacement | RegionAwarePlacement,
            write_quorum: int) -> list[tuple[int, int]]:
    return policy._targets(write_quorum)


# ---------------------------------------------------------------- strategies


@dataclass
class Topology:
    locations: dict[str, str]
    """Normalized, bookies without one left out (the default location)."""
    writable: list[str]
    exclude: list[str]

    def counts(self, excluded: set[str]) -> dict[str, int]:
        return dict(Counter(location_of(b, self.locations) for b in self.writable
                            if b not in excluded))


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    regions = draw(st.sampled_from([1, 1, 2, 2, 3]))
    locations: dict[str, str] = {}
    bookies: list[str] = []
    n = 0
    for g in range(regions):
        for r in range(draw(st.sampled_from([1, 1, 2, 2, 3]))):
            for _ in range(draw(st.integers(0, 5))):
                b = f"10.0.0.{n}:3181"
                n += 1
                bookies.append(b)
                if draw(st.integers(0, 9)) > 0:  # now and then one without a location
                    locations[b] = f"/g{g}/r{r}"
    writable = [b for b in bookies if draw(st.integers(0, 7)) > 0]
    exclude = [b for b in writable if draw(st.integers(0, 6)) == 0]
    return Topology(resolve_locations(locations), writable, exclude)


@st.composite
def quorum(draw: st.DrawFn, available: int = 6) -> tuple[int, int]:
    """``(ensemble size, write quorum)``, the size mostly within ``available``."""
    top = min(6, available + 1) if draw(st.integers(0, 9)) == 0 else min(6, available)
    size = draw(st.integers(1, max(1, top)))
    return size, draw(st.integers(min(2, size), size))  # Qw = 1 is trivially met


@st.composite
def ensemble_cases(draw: st.DrawFn) -> tuple[Topology, int, int]:
    topo = draw(topologies())
    size, wq = draw(quorum(len(set(topo.writable) - set(topo.exclude))))
    return topo, size, wq


def policies(enforce: bool) -> st.SearchStrategy[RackAwarePlacement | RegionAwarePlacement]:
    rack = st.builds(lambda k, seed: RackAwarePlacement(k, enforce, rng=random.Random(seed),
                                                        log=structlog.get_logger()),
                     st.sampled_from([1, 2, 2, 3]), st.integers(0, 2**32))
    region = st.builds(lambda g, k, seed: RegionAwarePlacement(
        g, enforce, min_racks_per_write_quorum=k, rng=random.Random(seed),
        log=structlog.get_logger()), st.sampled_from([1, 2, 2, 3]), st.sampled_from([1, 2, 2, 3]),
        st.integers(0, 2**32))
    return st.one_of(rack, region)


# ---------------------------------------------------------------- new ensembles


@settings(max_examples=400)
@given(case=ensemble_cases(), policy=policies(enforce=False))
def test_new_ensemble_meets_the_constraint_whenever_possible(
        case: tuple[Topology, int, int],
        policy: RackAwarePlacement | RegionAwarePlacement) -> None:
    topo, size, wq = case
    counts = topo.counts(set(topo.exclude))
    if sum(counts.values()) < size:
        with pytest.raises(NotEnoughBookiesError) as info:
            policy.new_ensemble(size, wq, topo.writable, topo.locations, topo.exclude)
        assert not isinstance(info.value, PlacementError)
        return
    ensemble = policy.new_ensemble(size, wq, topo.writable, topo.locations, topo.exclude)
    assert len(ensemble) == size == len(set(ensemble))
    assert set(ensemble) <= set(topo.writable) - set(topo.exclude)
    seq = [location_of(b, topo.locations) for b in ensemble]
    # the first target of the policy's list that any ensemble meets: the chosen one
    # meets it (the required one when possible, else the best weaker one)
    wanted = targets(policy, wq)
    best = next(t for t in wanted if exists([None] * size, wq, counts, *t))
    assert meets(seq, wq, *best)
    assert policy.fallbacks == (0 if best == wanted[0] else 1)
    event("met" if best == wanted[0] else "fell back")
    assert write_set_spread(ensemble, wq, topo.locations)[1] >= best[1]


@settings(max_examples=300)
@given(case=ensemble_cases(), policy=policies(enforce=True))
def test_enforced_new_ensemble_raises_exactly_when_none_exists(
        case: tuple[Topology, int, int],
        policy: RackAwarePlacement | RegionAwarePlacement) -> None:
    topo, size, wq = case
    counts = topo.counts(set(topo.exclude))
    if sum(counts.values()) < size:
        return
    required = targets(policy, wq)[0]
    if exists([None] * size, wq, counts, *required):
        ensemble = policy.new_ensemble(size, wq, topo.writable, topo.locations, topo.exclude)
        assert meets([location_of(b, topo.locations) for b in ensemble], wq, *required)
        event("met")
    else:
        event("raised")
        with pytest.raises(PlacementError) as info:
            policy.new_ensemble(size, wq, topo.writable, topo.locations, topo.exclude)
        message = str(info.value)
        assert "per_write_quorum" in message and "available:" in message
        for loc, n in counts.items():
            assert f"{loc} ({n} bookie" in message
    assert policy.fallbacks == 0


# ---------------------------------------------------------------- replacements


@st.composite
def replacement_cases(draw: st.DrawFn) -> tuple[Topology, int, int, list[str], list[int]]:
    topo = draw(topologies())
    pool = sorted(set(topo.writable) | set(topo.locations))
    size, wq = draw(quorum(max(1, len(pool) - 1)))
    if len(pool) < size:
        size = max(1, len(pool))
        wq = min(wq, size)
    ensemble = draw(st.permutations(pool))[:size] if pool else []
    failed = sorted(draw(st.sets(st.integers(0, max(0, len(ensemble) - 1)), min_size=1,
                                 max_size=2))) if ensemble else []
    return topo, size, wq, ensemble, failed


@settings(max_examples=400)
@given(case=replacement_cases(), policy=policies(enforce=False))
def test_replacements_keep_the_constraint_when_possible(
        case: tuple[Topology, int, int, list[str], list[int]],
        policy: RackAwarePlacement | RegionAwarePlacement) -> None:
    topo, _, wq, ensemble, failed = case
    if not ensemble:
        return
    counts = topo.counts(set(topo.exclude) | set(ensemble))
    if sum(counts.values()) < len(failed):
        with pytest.raises(NotEnoughBookiesError):
            policy.replace(ensemble, failed, wq, topo.writable, topo.locations, topo.exclude)
        return
    new = policy.replace(ensemble, failed, wq, topo.writable, topo.locations, topo.exclude)
    assert len(new) == len(failed) == len(set(new))
    assert set(new) <= set(topo.writable) - set(topo.exclude) - set(ensemble)
    after = list(ensemble)
    for p, b in zip(failed, new, strict=True):
        after[p] = b
    seq: list[str | None] = [location_of(b, topo.locations) for b in ensemble]
    for p in failed:
        seq[p] = None
    wanted = targets(policy, wq)
    best = next(t for t in wanted if exists(seq, wq, counts, *t))
    assert meets([location_of(b, topo.locations) for b in after], wq, *best, only=failed)
    assert policy.fallbacks == (0 if best == wanted[0] else 1)
    event("met" if best == wanted[0] else "fell back")


@settings(max_examples=300)
@given(case=replacement_cases(), policy=policies(enforce=True))
def test_enforced_replacement_raises_exactly_when_none_exists(
        case: tuple[Topology, int, int, list[str], list[int]],
        policy: RackAwarePlacement | RegionAwarePlacement) -> None:
    topo, _, wq, ensemble, failed = case
    counts = topo.counts(set(topo.exclude) | set(ensemble))
    if not ensemble or sum(counts.values()) < len(failed):
        return
    seq: list[str | None] = [location_of(b, topo.locations) for b in ensemble]
    for p in failed:
        seq[p] = None
    if exists(seq, wq, counts, *targets(policy, wq)[0]):
        policy.replace(ensemble, failed, wq, topo.writable, topo.locations, topo.exclude)
        event("met")
    else:
        event("raised")
        with pytest.raises(PlacementError, match="replacements for"):
            policy.replace(ensemble, failed, wq, topo.writable, topo.locations, topo.exclude)


# ---------------------------------------------------------------- examples


def test_one_rack_down_still_gets_two_racks() -> None:
    """Three racks, one of them gone: two racks are enough for every write set."""
    locs = resolve_locations({f"b{i}": f"/r{i % 3}" for i in range(9)})
    writable = [b for b in locs if locs[b] != "/default-region/r2"]
    policy = RackAwarePlacement(2, enforce=True, rng=random.Random(7))
    for _ in range(50):
        ensemble = policy.new_ensemble(4, 3, writable, locs)
        assert write_set_spread(ensemble, 3, locs)[1] == 2


def test_enforced_error_names_the_constraint_and_what_was_available() -> None:
    locs = resolve_locations({"a:1": "/eu/r1", "b:1": "/eu/r1", "c:1": "/eu/r2"})
    policy = RegionAwarePlacement(2, enforce=True, rng=random.Random(1))
    with pytest.raises(PlacementError) as info:
        policy.new_ensemble(3, 2, list(locs), locs)
    message = str(info.value)
    assert "2 regions (min_regions_per_write_quorum)" in message
    assert "2 racks in 1 region: /eu/r1 (2 bookies), /eu/r2 (1 bookie)" in message
    rack = RackAwarePlacement(3, enforce=True, rng=random.Random(1))
    with pytest.raises(PlacementError, match=r"3 racks \(min_racks_per_write_quorum\)"):
        rack.new_ensemble(3, 3, list(locs), locs)


def test_fallback_warns_and_counts() -> None:
    locs = resolve_locations({"a:1": "/r1", "b:1": "/r1", "c:1": "/r1"})
    with structlog.testing.capture_logs() as logs:
        policy = RackAwarePlacement(2, rng=random.Random(1), log=structlog.get_logger())
        ensemble = policy.new_ensemble(3, 2, list(locs), locs)
    assert sorted(ensemble) == sorted(locs)
    assert policy.fallbacks == 1
    [event] = [e for e in logs if e["log_level"] == "warning"]
    assert event["policy"] == "rack-aware" and event["achieved_racks"] == 1
    assert "/default-region/r1 (3 bookies)" in event["available"]


def test_region_aware_spreads_racks_inside_a_region() -> None:
    """Qw = 3 over two regions: the two bookies a write set has in one region are on
    different racks when that region has two."""
    locs = resolve_locations({f"{g}{r}{i}:1": f"/{g}/{r}" for g in ("eu", "us")
                              for r in ("r1", "r2") for i in range(2)})
    policy = RegionAwarePlacement(2, rng=random.Random(3))
    for _ in range(30):
        ensemble = policy.new_ensemble(4, 3, list(locs), locs)
        assert write_set_spread(ensemble, 3, locs) == (2, 3)


@pytest.mark.parametrize(("policy", "locations", "size", "qw"), [
    ("rack-aware", ["/r1", "/r1", "/r2", "/r2", "/r3", "/r3"], 2, 2),
    ("rack-aware", ["/a/r1", "/a/r2", "/a/r3", "/b/r4", "/b/r5", "/b/r6"], 3, 3),
    ("region-aware", ["/a/r1", "/a/r2", "/a/r3", "/b/r4", "/b/r5", "/b/r6"], 3, 3),
])
def test_every_rack_and_bookie_gets_its_share(policy: str, locations: list[str], size: int,
                                              qw: int) -> None:
    """Racks that are interchangeable for the constraint are chosen at random: no rack
    (or bookie) is left out because its name sorts last."""
    locs = resolve_locations({f"b{i}:1": loc for i, loc in enumerate(locations)})
    placement = make_policy(policy, rng=random.Random(1))
    racks: Counter[str] = Counter()
    bookies: Counter[str] = Counter()
    draws = 3000
    for _ in range(draws):
        ensemble = placement.new_ensemble(size, qw, list(locs), locs)
        bookies.update(ensemble)
        racks.update({locs[b] for b in ensemble})
    assert set(racks) == set(locs.values())
    fair = draws * size / len(locs)
    assert all(n > fair * 0.5 for n in bookies.values()), bookies
    assert len(bookies) == len(locs)


def test_random_placement_is_unchanged() -> None:
    writable = [f"b{i}" for i in range(8)]
    a, b = random.Random(5), random.Random(5)
    got = RandomPlacement(a).new_ensemble(3, 2, writable, {}, exclude={"b1"})
    assert got == b.sample(sorted(set(writable) - {"b1"}), 3)
    ensemble = ["b0", "b2", "b3"]
    got = RandomPlacement(a).replace(ensemble, [1], 2, writable, {}, exclude={"b4"})
    assert got == b.sample(sorted(set(writable) - set(ensemble) - {"b4"}), 1)


def test_large_topology_is_placed_quickly() -> None:
    locs = resolve_locations({f"b{i}:1": f"/g{i % 3}/r{i % 7}" for i in range(120)})
    policy = make_policy("region-aware", min_racks_per_write_quorum=3, rng=random.Random(1))
    for _ in range(20):
        ensemble = policy.new_ensemble(12, 5, list(locs), locs)
        assert write_set_spread(ensemble, 5, locs) >= (2, 3)
    assert policy.fallbacks == 0


# ---------------------------------------------------------------- locations and reads


def test_location_syntax() -> None:
    assert normalize_location("") == DEFAULT_LOCATION == "/default-region/default-rack"
    assert normalize_location("/r1") == "/default-region/r1"
    assert normalize_location("/eu/r1") == "/eu/r1"
    for bad in ("r1", "/", "/a/b/c", "/eu/", "//r1", "/e u/r1", "/eu/r1/"):
        with pytest.raises(ValueError, match="network location"):
            normalize_location(bad)
    assert resolve_locations({"a": "/r1", "b": "bad", "c": ""}, {"a": "/eu/r9"}) == {
        "a": "/eu/r9", "b": DEFAULT_LOCATION, "c": DEFAULT_LOCATION}


def test_location_settings_are_checked() -> None:
    assert from_mapping(BookieConfig, {"rack": "/eu/r1"}).rack == "/eu/r1"
    with pytest.raises(ConfigError, match="rack"):
        from_mapping(BookieConfig, {"rack": "eu/r1"})
    with pytest.raises(ConfigError, match="placement_policy"):
        from_mapping(ClientConfig, {"placement_policy": "rack"})
    with pytest.raises(ConfigError, match="bookie_racks"):
        from_mapping(ClientConfig, {"bookie_racks": {"a:1": "/a/b/c"}})
    with pytest.raises(ConfigError, match="client_location"):
        from_mapping(ClientConfig, {"client_location": "r1"})
    with pytest.raises(ConfigError, match="min_racks_per_write_quorum"):
        from_mapping(ClientConfig, {"min_racks_per_write_quorum": 0})


@given(replicas=st.lists(st.sampled_from([f"b{i}" for i in range(8)]), unique=True,
                         max_size=8),
       where=st.dictionaries(st.sampled_from([f"b{i}" for i in range(8)]),
                             st.sampled_from(["/eu/r1", "/eu/r2", "/us/r1", "/r1"])),
       client=st.sampled_from(["", "/eu/r1", "/eu/r2", "/us/r1", "/r1", "/ap/r1"]))
def test_read_order_prefers_rack_then_region_and_keeps_ties(
        replicas: list[str], where: dict[str, str], client: str) -> None:
    locs = resolve_locations(where)
    me = normalize_location(client) if client else ""
    order = read_order(replicas, locs, me)
    assert sorted(order) == sorted(replicas)
    if not me:
        assert order == replicas
        return

    def distance(b: str) -> int:
        loc = location_of(b, locs)
        return 0 if loc == me else 1 if region_of(loc) == region_of(me) else 2

    assert [distance(b) for b in order] == sorted(distance(b) for b in replicas)
    for d in range(3):  # ties keep the write set's order
        assert [b for b in order if distance(b) == d] == [b for b in replicas
                                                          if distance(b) == d]


# ---------------------------------------------------------------- auto-recovery's use


class _Channel:
    def __init__(self, bookie: str, dead: set[str]) -> None:
        self.bookie, self.dead = bookie, dead

    def next_request_id(self) -> int:
        return 1

    async def request(self, req: object, timeout_s: float) -> object:
        from asyncbk.errors import BookieUnavailableError
        from asyncbk.proto import BookieInfoResponse, Status

        if self.bookie in self.dead:
            raise BookieUnavailableError(f"{self.bookie} does not answer")
        return BookieInfoResponse(1, Status.OK, self.bookie, "writable", 0, 0, "")


class _FakeClient:
    """What re-replication asks of a client to choose replacements."""

    def __init__(self, policy: RackAwarePlacement, locations: dict[str, str],
                 dead: set[str]) -> None:
        self.placement = policy
        self.bookies = self
        self._locations = locations
        self.bookie_client = self
        self._dead = dead

    def locations(self) -> dict[str, str]:
        return self._locations

    def channel(self, bookie: str) -> _Channel:
        return _Channel(bookie, self._dead)


async def test_re_replication_replaces_from_the_right_rack_skipping_dead_bookies() -> None:
    """Ensemble [r1, r2] with the r1 bookie lost: the replacement comes from r1; a
    registered r1 bookie that does not answer is skipped for the next r1 one."""
    from asyncbk.autorecovery.replication import _pick_replacements

    locs = resolve_locations({"a1:1": "/r1", "a2:1": "/r1", "a3:1": "/r1",
                              "b1:1": "/r2", "b2:1": "/r2", "b3:1": "/r2"})
    for seed in range(20):
        dead = {"a2:1"}
        bk = _FakeClient(RackAwarePlacement(2, True, rng=random.Random(seed)), locs, dead)
        unusable: set[str] = set()
        got = await _pick_replacements(bk, bk.placement,  # type: ignore[arg-type]
                                       ["a1:1", "b1:1"], [0], 2, sorted(locs), unusable)
        assert got == ["a3:1"]
        assert unusable <= dead
