"""A ledger's own placement, recorded in its metadata by ``create_ledger(placement=...)``
(custom key ``asyncbk.placement``) and used by whoever replaces its bookies after its
writer is gone: re-replication (auto-recovery, ``asyncbk shell recover``) and the
placement check and repair (``placementcheck``, ``--fix-placement``).

The record itself is pure (round trip, malformed values, the reserved key); the
replacement choice runs on the simulator, with a writer and an "auto-recovery"
client that both place at random and six bookies in three racks given to the
clients (``bookie_racks``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from typing import Any

import pytest
from structlog.testing import capture_logs

from asyncbk.autorecovery import service
from asyncbk.autorecovery.placement import PlacementRule, check_ledger, rule_of
from asyncbk.autorecovery.replication import (
    RateLimiter,
    ReplicationStats,
    describe_placement,
    ledger_policy,
    replicate_ledger,
)
from asyncbk.autorecovery.service import AutoRecovery, AutoRecoveryConfig
from asyncbk.cli.placementcheck import placementcheck as _placementcheck
from asyncbk.client.client import (
    PLACEMENT_KEY,
    BookKeeper,
    PlacementSpec,
    ledger_placement,
    placement_record,
)
from asyncbk.client.placement import write_set_spread
from asyncbk.clock import ManualClock
from asyncbk.config import ClientConfig
from asyncbk.errors import PlacementError
from asyncbk.meta.api import BookieRegistration
from asyncbk.meta.memory import MemoryMetadataStore
from asyncbk.meta.model import LedgerMetadata, LedgerState, new_metadata
from asyncbk.testing.sim import BlockableStore, SimCluster, run_sim

PW = b"pw"
RACKS = {f"b{i}:3181": f"/r{i // 2 + 1}" for i in range(6)}
"""Six bookies, two per rack: b0 b1 in /r1, b2 b3 in /r2, b4 b5 in /r3."""
LOCATIONS = {b: f"/default-region{r}" for b, r in RACKS.items()}
THREE_RACKS = PlacementSpec("rack-aware", min_racks_per_write_quorum=3, enforce_placement=True)


def _md(custom: dict[str, bytes] | None) -> LedgerMetadata:
    return new_metadata(7, ["b0:3181", "b2:3181", "b4:3181"], 3, 2, "xxh3", PW, custom, 0)


# --------------------------------------------------------------------------- the record


@pytest.mark.parametrize("spec", [
    PlacementSpec(),
    PlacementSpec("random", min_racks_per_write_quorum=3, enforce_placement=True),
    PlacementSpec("rack-aware"),
    THREE_RACKS,
    PlacementSpec("region-aware", min_regions_per_write_quorum=3, enforce_placement=True),
    PlacementSpec(min_racks_per_write_quorum=4),
])
def test_the_record_reads_back_as_its_creator_resolved_it(spec: PlacementSpec) -> None:
    """Whatever the reading client's settings: the record holds the resolved spec."""
    creator = ClientConfig(placement_policy="region-aware", min_racks_per_write_quorum=2,
                           min_regions_per_write_quorum=2).validate()
    reader = ClientConfig(placement_policy="rack-aware", min_racks_per_write_quorum=5,
                          min_regions_per_write_quorum=4, enforce_placement=True).validate()
    record = placement_record(spec, creator)
    back = ledger_placement(_md({PLACEMENT_KEY: record}))
    assert back is not None
    assert back.resolve(reader) == back.resolve(creator) == spec.resolve(creator)
    assert b" " not in record and json.loads(record)["policy"] == spec.resolve(creator)[0]


def test_the_record_is_compact_json_with_null_for_what_the_policy_ignores() -> None:
    cfg = ClientConfig()
    assert placement_record(THREE_RACKS, cfg) == (
        b'{"policy":"rack-aware","min_racks_per_write_quorum":3,'
        b'"min_regions_per_write_quorum":null,"enforce":true}')
    assert placement_record(PlacementSpec(), cfg) == (
        b'{"policy":"random","min_racks_per_write_quorum":null,'
        b'"min_regions_per_write_quorum":null,"enforce":false}')
    assert ledger_placement(_md(None)) is None
    assert ledger_placement(_md({"app": b"x"})) is None
    # hand-written, minimums left out: the reading client's settings
    assert ledger_placement(_md({PLACEMENT_KEY: b'{"policy":"rack-aware"}'})) == \
        PlacementSpec("rack-aware")


@pytest.mark.parametrize(("value", "words"), [
    (b"{not json", ["Expecting"]),
    (b"\xff\xfe", ["utf-8"]),
    (b"[1, 2]", ["JSON object", "list"]),
    (b'"rack-aware"', ["JSON object", "str"]),
    (b"{}", ["'policy' is missing"]),
    (b'{"policy":null}', ["'policy' is missing"]),
    (b'{"policy":"rack"}', ["placement_policy", "'rack'"]),
    (b'{"policy":"rack-aware","min_racks":3}', ["unknown key", "'min_racks'"]),
    (b'{"policy":"rack-aware","min_racks_per_write_quorum":0}', [">= 1"]),
    (b'{"policy":"rack-aware","min_racks_per_write_quorum":true}', ["int", "bool"]),
    (b'{"policy":"rack-aware","min_racks_per_write_quorum":2.5}', ["int", "float"]),
    (b'{"policy":"rack-aware","enforce":"yes"}', ["enforce_placement", "bool"]),
])
def test_a_malformed_record_is_a_value_error_naming_ledger_key_and_value(
        value: bytes, words: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        ledger_placement(_md({PLACEMENT_KEY: value}))
    text = str(info.value)
    for w in ["ledger 7", PLACEMENT_KEY, "not a placement record", *words]:
        assert w in text, (w, text)


def test_a_malformed_record_falls_back_with_a_warning() -> None:
    md = _md({PLACEMENT_KEY: b"{not json"})
    fallback = PlacementRule("rack-aware", 2)
    with capture_logs() as logs:
        assert rule_of(md, fallback, ClientConfig()) == (fallback, False)
    [warning] = [e for e in logs if e["log_level"] == "warning"]
    assert "malformed placement record" in warning["event"] and warning["ledger_id"] == 7
    assert PLACEMENT_KEY in warning["error"]


def test_rule_of_a_ledger_with_its_own_placement_and_the_check_says_which() -> None:
    cfg = ClientConfig()
    own = _md({PLACEMENT_KEY: placement_record(THREE_RACKS, cfg)})
    command = PlacementRule("rack-aware", 2)
    rule, is_own = rule_of(own, command, cfg)
    assert (rule, is_own) == (PlacementRule("rack-aware", 3), True)
    assert rule_of(_md(None), command, cfg) == (command, False)
    assert rule_of(_md({PLACEMENT_KEY: placement_record(PlacementSpec(), cfg)}), command,
                   cfg) == (PlacementRule("random", 2, 2), True)
    # b0 b1 in one rack: 2 racks satisfy the command's rule, not the ledger's 3
    closed = own.replace(ensembles=((0, ("b0:3181", "b1:3181", "b2:3181")),),
                         state=LedgerState.CLOSED, last_entry_id=9)
    assert check_ledger(closed, command, LOCATIONS, RACKS) == []
    [frag] = check_ledger(closed, rule, LOCATIONS, RACKS, own_rule=True)
    assert frag.to_json()["rule"] == "ledger"
    assert frag.to_json()["placement"] == {"policy": "rack-aware",
                                           "min_racks_per_write_quorum": 3,
                                           "min_regions_per_write_quorum": None}
    [frag] = check_ledger(closed, PlacementRule("rack-aware", 3), LOCATIONS, RACKS)
    assert frag.to_json()["rule"] == "command"


def test_describe_placement() -> None:
    assert describe_placement(("random", 0, 0, False)) == "random"
    assert describe_placement(THREE_RACKS.resolve(ClientConfig())) == \
        "rack-aware, at least 3 racks per write set, enforced"
    assert describe_placement(("region-aware", 3, 2, False)) == \
        "region-aware, at least 2 regions and 3 racks per write set"


# --------------------------------------------------------------------------- the simulator


def _client(c: SimCluster, name: str, **kw: Any) -> BookKeeper:
    cfg = ClientConfig(add_timeout_s=0.5, read_timeout_s=0.5, connect_timeout_s=0.3,
                       reconnect_backoff_s_max=0.2, bookie_racks=RACKS, **kw).validate()
    bk = BookKeeper(BlockableStore(c.history, state=c.state), cfg,
                    connector=c.net.connector(name), rng=random.Random(c.rng.getrandbits(64)))
    bk.bookies.start()
    c.clients.append(bk)
    return bk


async def _ledger(bk: BookKeeper, placement: PlacementSpec | None,
                  entries: int = 20) -> tuple[int, list[bytes]]:
    lh = await bk.create_ledger(3, 3, 2, password=PW, placement=placement)
    data = [b"ledger %d entry %d" % (lh.id, i) for i in range(entries)]
    await asyncio.gather(*(lh.append(d) for d in data))
    await lh.close()
    return lh.id, data


async def _replicate(bk: BookKeeper, lid: int, lost: set[str],
                     unwritable: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    available = set(RACKS) - lost
    writable = sorted(available - unwritable)
    return await replicate_ledger(bk, lid, available, writable, RateLimiter(0),
                                  ReplicationStats())


def test_create_ledger_records_only_what_it_is_given_and_refuses_the_key() -> None:
    async def body() -> None:
        c = SimCluster(21, 6)
        await c.start()
        bk = _client(c, "w")
        plain = await bk.create_ledger(3, 3, 2, password=PW, metadata={"app": b"x"})
        md = await bk.ledger_metadata(plain.id)
        assert md.custom == {"app": b"x"}  # unchanged, byte for byte:
        assert md.to_bytes() == new_metadata(
            md.ledger_id, md.ensembles[0][1], 3, 2, "xxh3", PW, {"app": b"x"},
            md.ctime).to_bytes()
        placed = await bk.create_ledger(3, 3, 2, password=PW, metadata={"app": b"x"},
                                        placement=THREE_RACKS)
        md = await bk.ledger_metadata(placed.id)
        assert md.custom == {"app": b"x",
                             PLACEMENT_KEY: placement_record(THREE_RACKS, bk.config)}
        assert placed.metadata.custom == md.custom
        assert ledger_placement(md) == PlacementSpec("rack-aware", 3, None, True)
        ids = [lid async for lid in bk.list_ledgers()]
        for placement in (None, THREE_RACKS):
            with pytest.raises(ValueError, match="'asyncbk.placement' is reserved.*"
                               "placement=PlacementSpec"):
                await bk.create_ledger(3, 3, 2, metadata={PLACEMENT_KEY: b"{}"},
                                       placement=placement)
        assert [lid async for lid in bk.list_ledgers()] == ids  # nothing created
        await plain.close()
        await placed.close()
        await c.stop()

    run_sim(body)


def test_recovery_replaces_a_lost_bookie_as_the_ledgers_own_placement_says() -> None:
    """The writer and the recovering client place at random; ledgers created rack-aware
    with 3 racks (enforced), E3 Qw3, one bookie per rack: the replacement for a lost
    bookie is the other bookie of its rack, the only one keeping 3 racks (at random,
    one chance in three per ledger)."""
    async def body() -> None:
        c = SimCluster(22, 6)
        await c.start()
        writer = _client(c, "w")
        recovery = _client(c, "ar")
        placed = dict([await _ledger(writer, THREE_RACKS) for _ in range(6)])
        control, control_data = await _ledger(writer, None)
        ensembles = {lid: (await recovery.ledger_metadata(lid)).ensembles[0][1]
                     for lid in placed}
        victim = max(RACKS, key=lambda b: sum(b in e for e in ensembles.values()))
        mate = next(b for b in RACKS if RACKS[b] == RACKS[victim] and b != victim)
        hit = [lid for lid, e in ensembles.items() if victim in e]
        assert len(hit) >= 3
        await c.bookie(victim).crash(torn=False)
        for lid in hit:
            assert ledger_policy(recovery, await recovery.ledger_metadata(lid)) \
                is recovery.placement_for(THREE_RACKS)
            [line] = await _replicate(recovery, lid, {victim})
            assert f"{victim} -> {mate}" in line
            md = await recovery.ledger_metadata(lid)
            assert md.ensembles[0][1] == tuple(mate if b == victim else b
                                               for b in ensembles[lid])
            assert write_set_spread(md.ensembles[0][1], 3, LOCATIONS)[1] == 3
            rh = await recovery.open_ledger(lid, password=PW)
            assert [e.data for e in await rh.read(0, len(placed[lid]) - 1)] == placed[lid]
        if victim in (await recovery.ledger_metadata(control)).all_bookies():
            await _replicate(recovery, control, {victim})  # its client's policy: random
        rh = await recovery.open_ledger(control, password=PW)
        assert [e.data for e in await rh.read(0, len(control_data) - 1)] == control_data
        assert recovery.placement.fallbacks == 0
        await c.bookie(victim).restart()
        await c.stop()

    run_sim(body)


def test_enforced_placement_without_a_valid_replacement_copies_nothing() -> None:
    """The lost bookie's rack-mate is not writable: no replacement keeps 3 racks.
    Enforced: PlacementError naming the ledger and its rule, the metadata untouched
    (auto-recovery keeps the ledger marked and retries).  Not enforced: the best
    replacement there is, with a warning, counted in the client's fallbacks."""
    async def body() -> None:
        c = SimCluster(23, 6)
        await c.start()
        writer = _client(c, "w")
        recovery = _client(c, "ar")
        lid, data = await _ledger(writer, THREE_RACKS)
        before = await recovery.ledger_metadata(lid)
        victim = before.ensembles[0][1][0]
        mate = next(b for b in RACKS if RACKS[b] == RACKS[victim] and b != victim)
        with pytest.raises(PlacementError) as info:
            await _replicate(recovery, lid, {victim}, unwritable={mate})
        text = str(info.value)
        for w in [f"ledger {lid} fragment 0", victim, "the ledger's own placement",
                  "rack-aware, at least 3 racks per write set, enforced", "(enforced)"]:
            assert w in text, (w, text)
        after = await recovery.ledger_metadata(lid)
        assert (after.ensembles, after.version) == (before.ensembles, before.version)

        loose = PlacementSpec("rack-aware", min_racks_per_write_quorum=3)
        lid, data = await _ledger(writer, loose)
        md = await recovery.ledger_metadata(lid)
        victim = md.ensembles[0][1][0]
        mate = next(b for b in RACKS if RACKS[b] == RACKS[victim] and b != victim)
        with capture_logs() as logs:
            await _replicate(recovery, lid, {victim}, unwritable={mate})
        assert any("placement constraint not met" in e["event"] for e in logs)
        assert recovery.placement_for(loose).fallbacks == 1 == recovery.placement.fallbacks
        md = await recovery.ledger_metadata(lid)
        assert victim not in md.all_bookies() and mate not in md.all_bookies()
        rh = await recovery.open_ledger(lid, password=PW)
        assert [e.data for e in await rh.read(0, len(data) - 1)] == data
        await c.stop()

    run_sim(body)


def test_a_malformed_record_is_recovered_with_the_processs_policy() -> None:
    async def body() -> None:
        c = SimCluster(24, 6)
        await c.start()
        writer = _client(c, "w")
        recovery = _client(c, "ar", placement_policy="rack-aware",
                           min_racks_per_write_quorum=3, enforce_placement=True)
        lid, data = await _ledger(writer, THREE_RACKS)
        md = await recovery.ledger_metadata(lid)
        await recovery.meta.update_ledger(md.replace(custom={PLACEMENT_KEY: b"rack-aware"}))
        victim = md.ensembles[0][1][0]
        mate = next(b for b in RACKS if RACKS[b] == RACKS[victim] and b != victim)
        with capture_logs() as logs, pytest.raises(PlacementError,
                                                   match="this process's placement policy"):
            await _replicate(recovery, lid, {victim}, unwritable={mate})
        assert any("malformed placement record" in e["event"] for e in logs)
        [line] = await _replicate(recovery, lid, {victim})  # no crash: its own policy
        assert f"{victim} -> {mate}" in line
        rh = await recovery.open_ledger(lid, password=PW)
        assert [e.data for e in await rh.read(0, len(data) - 1)] == data
        await c.stop()

    run_sim(body)


def test_placementcheck_checks_a_ledger_against_its_own_placement(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Two closed ledgers whose fragments put two bookies in one rack (metadata edited:
    the check looks at metadata only): one created rack-aware with 3 racks, checked
    against that; one without, checked against the command's rule (2 racks, which it
    meets).  With the command's policy random, the first is still checked."""
    def args(**kw: Any) -> argparse.Namespace:
        base = {"policy": None, "min_racks": None, "min_regions": None, "fix": False,
                "dry_run": False, "rate": 0.0, "json": False}
        return argparse.Namespace(**{**base, **kw})

    async def body() -> None:
        c = SimCluster(25, 6)
        await c.start()
        bk = _client(c, "w")
        own, _ = await _ledger(bk, THREE_RACKS, entries=5)
        plain, _ = await _ledger(bk, None, entries=5)
        for lid in (own, plain):
            md = await bk.ledger_metadata(lid)
            await bk.meta.update_ledger(md.replace(
                ensembles=((0, ("b0:3181", "b1:3181", "b2:3181")),)))
        capsys.readouterr()
        assert await _placementcheck(bk, args(json=True, policy="rack-aware")) == 1
        report = json.loads(capsys.readouterr().out)
        assert report["ledgers_with_own_placement"] == 1
        assert [(f["ledger_id"], f["rule"]) for f in report["fragments"]] == [(own, "ledger")]
        assert report["fragments"][0]["placement"]["min_racks_per_write_quorum"] == 3
        assert await _placementcheck(bk, args(policy="rack-aware", min_racks=3)) == 1
        out = capsys.readouterr().out
        assert f"ledger {own} fragment 0" in out and f"ledger {plain} fragment 0" in out
        assert "rule: the ledger's own, rack-aware placement (every write set spans at " \
            "least 3 racks" in out and "rule: the command's" in out
        assert "its placement (1 ledger(s) with their own, the others rack-aware" in out
        assert await _placementcheck(bk, args()) == 1  # the client's policy: random
        out = capsys.readouterr().out
        assert f"ledger {own} fragment 0" in out and f"ledger {plain} " not in out
        assert "random placement accepts every ensemble, so no ledger without its own" in out
        await c.stop()

    run_sim(body)


# --------------------------------------------------------------------------- the worker


async def test_the_worker_keeps_a_blocked_ledger_marked_and_backs_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    meta = MemoryMetadataStore(clock=clock)
    lease = await meta.grant_lease(3600)
    for b in ("b0:3181", "b2:3181", "b4:3181"):
        await meta.register_bookie(BookieRegistration(b, False), lease)
    md = new_metadata(7, ["b0:3181", "b2:3181", "b5:3181"], 3, 2, "xxh3", PW, None, 0)
    await meta.create_ledger(md.replace(state=LedgerState.CLOSED, last_entry_id=9))
    await meta.mark_underreplicated(7, {"b5:3181"})
    calls: list[int] = []

    async def blocked(bk: Any, ledger_id: int, *args: Any, **kw: Any) -> list[str]:
        calls.append(ledger_id)
        raise PlacementError(f"ledger {ledger_id} fragment 0: no replacement meets the "
                             "ledger's own placement")

    monkeypatch.setattr(service, "replicate_ledger", blocked)

    class Bk:
        def __init__(self) -> None:
            self.meta = meta
            self.config = ClientConfig()

    ar = AutoRecovery(Bk(), AutoRecoveryConfig(worker_poll_s=1.0, audit_interval_s=3.0),
                      "ar-test", clock=clock)
    ar.lease.lease_id = await meta.grant_lease(3600)

    async def round_() -> None:
        [mark] = await meta.list_underreplicated()
        if await ar._placement_retry_due(mark.ledger_id):
            await ar._take(mark)

    await round_()
    assert calls == [7] and ar.status.placement_blocked == 1
    assert ar.status.to_json()["placement_blocked_replications"] == 1
    assert "ledger's own placement" in ar.status.last_error
    assert [m.ledger_id for m in await meta.list_underreplicated()] == [7]  # still marked
    await round_()
    assert calls == [7]  # within its delay (1 s)
    clock.advance(1.0)
    await round_()
    assert calls == [7, 7]  # the delay doubles: 2 s, then 3 s (audit_interval_s) at most
    clock.advance(1.5)
    await round_()
    assert calls == [7, 7]
    clock.advance(0.5)
    await round_()
    assert calls == [7, 7, 7]
    assert ar._placement_retry[7][1] == 3.0
    # a bookie registers: retried at once
    await meta.register_bookie(BookieRegistration("b1:3181", False), lease)
    await round_()
    assert calls == [7, 7, 7, 7] and ar.status.placement_blocked == 4
    assert ar.status.replication.errors == 4
