"""Placement per ledger and per namespace: ``create_ledger(placement=PlacementSpec(...))``
and the namespace settings ``placement_policy``, ``min_racks_per_write_quorum``,
``min_regions_per_write_quorum``, ``enforce_placement`` (checked, stored in the
namespace record, older records without them read as the client's settings), used
for every segment of the namespace's streams and for their writers' ensemble
changes.  The ledger and stream clients run on the simulator, with the bookies'
racks given to the client (``bookie_racks``)."""

from __future__ import annotations

import argparse
import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest

from asyncbk.cli.stream import admin
from asyncbk.cli.stream.args import add_commands
from asyncbk.client.client import PlacementSpec
from asyncbk.client.placement import write_set_spread
from asyncbk.config import ClientConfig
from asyncbk.errors import ConfigError, PlacementError
from asyncbk.meta import keys
from asyncbk.meta.memory import MemoryMetadataStore
from asyncbk.stream.client import BookKeeper
from asyncbk.stream.meta import StreamConfig, StreamMetadata, config_from, placement_spec
from asyncbk.testing.sim import BlockableStore, SimCluster, run_sim

PW = b"pw"
RACKS = {"b0:3181": "/r1", "b1:3181": "/r1", "b2:3181": "/r2", "b3:3181": "/r2"}
LOCATIONS = {b: f"/default-region{r}" for b, r in RACKS.items()}
RACK_AWARE = {"placement_policy": "rack-aware", "min_racks_per_write_quorum": 2,
              "enforce_placement": True}

# --------------------------------------------------------------------------- PlacementSpec


@pytest.mark.parametrize(("kw", "error", "words"), [
    ({"placement_policy": "rack"}, ValueError, ["placement_policy", "rack-aware", "'rack'"]),
    ({"placement_policy": 1}, ValueError, ["placement_policy"]),
    ({"min_racks_per_write_quorum": 0}, ValueError, ["min_racks_per_write_quorum", ">= 1"]),
    ({"min_regions_per_write_quorum": -1}, ValueError, ["min_regions_per_write_quorum"]),
    ({"min_racks_per_write_quorum": True}, TypeError, ["int", "bool"]),
    ({"min_regions_per_write_quorum": "2"}, TypeError, ["int", "str"]),
    ({"enforce_placement": 1}, TypeError, ["enforce_placement", "bool", "int"]),
])
def test_placement_spec_refuses_bad_values(kw: dict[str, Any], error: type[Exception],
                                           words: list[str]) -> None:
    with pytest.raises(error) as info:
        PlacementSpec(**kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_placement_spec_resolves_against_the_client() -> None:
    cfg = ClientConfig()
    assert PlacementSpec().resolve(cfg) == ("random", 0, 0, False)
    assert PlacementSpec(min_racks_per_write_quorum=3, enforce_placement=True).resolve(cfg) \
        == ("random", 0, 0, False)  # random ignores them
    assert PlacementSpec("rack-aware").resolve(cfg) == ("rack-aware", 2, 0, False)
    assert PlacementSpec("region-aware", enforce_placement=True).resolve(cfg) == (
        "region-aware", 2, 2, True)
    mine = ClientConfig(placement_policy="region-aware", min_racks_per_write_quorum=3,
                        min_regions_per_write_quorum=3, enforce_placement=True).validate()
    assert PlacementSpec().resolve(mine) == ("region-aware", 3, 3, True)
    assert PlacementSpec(min_regions_per_write_quorum=2, enforce_placement=False).resolve(
        mine) == ("region-aware", 3, 2, False)
    assert PlacementSpec("rack-aware").resolve(mine) == ("rack-aware", 3, 0, True)


# --------------------------------------------------------------------------- settings


def test_placement_settings_default_to_the_clients() -> None:
    cfg = StreamConfig()
    assert (cfg.placement_policy, cfg.min_racks_per_write_quorum,
            cfg.min_regions_per_write_quorum, cfg.enforce_placement) == (None, None, None, None)
    assert cfg.placement == {}
    assert placement_spec(cfg) is None
    # None is accepted, explicitly: the client's setting
    assert config_from({k: None for k in RACK_AWARE}) == cfg
    ns = config_from(RACK_AWARE, source="namespace 'orders'")
    assert ns.placement == RACK_AWARE
    assert placement_spec(ns) == PlacementSpec("rack-aware", 2, None, True)
    # a stream may override the namespace's, or give it back to the client
    assert config_from({"placement_policy": "random"}, ns).placement == {
        **RACK_AWARE, "placement_policy": "random"}
    assert config_from({"placement_policy": None}, ns).placement_policy is None
    assert ns.with_overrides({"enforce_placement": False}).enforce_placement is False


@pytest.mark.parametrize(("values", "words"), [
    ({"placement_policy": "rack"}, ["unknown placement_policy 'rack'", "rack-aware",
                                    "region-aware"]),
    ({"placement_policy": ""}, ["unknown placement_policy ''"]),
    ({"placement_policy": 2}, ["'placement_policy'", "str", "int"]),
    ({"min_racks_per_write_quorum": 0}, ["min_racks_per_write_quorum", ">= 1", "0"]),
    ({"min_regions_per_write_quorum": 0}, ["min_regions_per_write_quorum", ">= 1"]),
    ({"min_racks_per_write_quorum": 2.0}, ["'min_racks_per_write_quorum'", "int", "float"]),
    ({"min_racks_per_write_quorum": True}, ["'min_racks_per_write_quorum'", "int", "bool"]),
    ({"min_regions_per_write_quorum": "3"}, ["'min_regions_per_write_quorum'", "str"]),
    ({"enforce_placement": 1}, ["'enforce_placement'", "bool", "int"]),
    ({"enforce_placement": "yes"}, ["'enforce_placement'", "bool", "str"]),
    ({"placement": "rack-aware"}, ["unknown setting 'placement'", "placement_policy"]),
])
def test_placement_settings_are_checked(values: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        config_from(values, source="namespace 'orders'")
    msg = str(info.value)
    assert msg.startswith("namespace 'orders': "), msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


# --------------------------------------------------------------------------- the record


@pytest.fixture
async def md() -> AsyncIterator[StreamMetadata]:
    store = MemoryMetadataStore("/t")
    yield StreamMetadata(store)
    await store.close()


async def _record(md: StreamMetadata, name: str) -> dict[str, Any]:
    kv = await md.meta.kv_get(keys.namespace(md.root, name))
    assert kv is not None
    d = msgpack.unpackb(kv.value, raw=False)
    assert isinstance(d, dict)
    return d


async def test_placement_round_trips_through_the_namespace_record(md: StreamMetadata) -> None:
    cfg = StreamConfig(ensemble_size=4, write_quorum=2, ack_quorum=2,
                       placement_policy="region-aware", min_racks_per_write_quorum=3,
                       min_regions_per_write_quorum=2, enforce_placement=False)
    await md.create_namespace("geo", cfg, 1)
    assert await md.namespace_config("geo") == cfg
    assert (await _record(md, "geo"))["defaults"]["placement_policy"] == "region-aware"
    some = StreamConfig(placement_policy="rack-aware")
    await md.create_namespace("some", some, 1)
    assert await md.namespace_config("some") == some
    assert set((await _record(md, "some"))["defaults"]) & {
        "min_racks_per_write_quorum", "min_regions_per_write_quorum", "enforce_placement"} \
        == set()


async def test_a_namespace_without_placement_stores_what_older_clients_read(
        md: StreamMetadata) -> None:
    """No placement setting given: the record has exactly the keys it had before
    placement existed (so older clients, which refuse unknown settings, read it)."""
    await md.create_namespace("plain", StreamConfig(rolling_entries=5), 1)
    before = {"ensemble_size", "write_quorum", "ack_quorum", "digest", "rolling_bytes",
              "rolling_s", "rolling_entries", "retention_s"}
    assert set((await _record(md, "plain"))["defaults"]) == before


async def test_an_older_namespace_record_reads_as_the_clients_placement(
        md: StreamMetadata) -> None:
    """A record written before placement existed (no such keys) is read, every placement
    setting the client's."""
    old = {"defaults": {"ensemble_size": 4, "write_quorum": 3, "ack_quorum": 2,
                        "digest": "xxh3", "rolling_bytes": 1 << 20,
                        "rolling_s": 60.0, "rolling_entries": 0, "retention_s": 3600.0},
           "ctime_ms": 1}
    key = keys.namespace(md.root, "old")
    await md.meta.kv_txn([(key, 0)], put=[(key, msgpack.packb(old, use_bin_type=True))])
    cfg = await md.namespace_config("old")
    assert cfg == StreamConfig(ensemble_size=4, write_quorum=3, ack_quorum=2,
                               rolling_bytes=1 << 20, rolling_s=60.0, retention_s=3600.0)
    assert cfg.placement == {} and placement_spec(cfg) is None


async def test_bad_placement_in_a_record_is_a_config_error(md: StreamMetadata) -> None:
    with pytest.raises(ConfigError, match="namespace 'x': unknown placement_policy 'rack'"):
        await md.create_namespace("x", StreamConfig(placement_policy="rack"), 1)
    assert await md.list_namespaces() == []
    key = keys.namespace(md.root, "hand")
    bad = {"defaults": {"placement_policy": "racks"}, "ctime_ms": 1}
    await md.meta.kv_txn([(key, 0)], put=[(key, msgpack.packb(bad, use_bin_type=True))])
    with pytest.raises(ConfigError, match="namespace 'hand': unknown placement_policy"):
        await md.namespace_config("hand")


# --------------------------------------------------------------------------- the CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncbk stream")
    sub = parser.add_subparsers(dest="stream_command")
    add_commands(sub, lambda p: None, argparse.HelpFormatter)
    return parser


def test_cli_settings_take_placement() -> None:
    p = _parser()
    uri = ["--metadata-uri", "etcd://h:1/r"]
    args = p.parse_args(["create-namespace", "ns", *uri, "--placement-policy", "rack-aware",
                         "--min-racks-per-write-quorum", "2", "--enforce-placement"])
    assert (args.placement_policy, args.min_racks_per_write_quorum,
            args.min_regions_per_write_quorum, args.enforce_placement) == (
        "rack-aware", 2, None, True)
    args = p.parse_args(["create-namespace", "ns", *uri])
    assert (args.placement_policy, args.enforce_placement) == (None, None)
    args = p.parse_args(["create", "ns", "s", *uri, "--no-enforce-placement"])
    assert args.enforce_placement is False and args.placement_policy is None
    for bad in (["--placement-policy", "rack"], ["--min-racks-per-write-quorum", "0"],
                ["--min-regions-per-write-quorum", "x"]):
        with pytest.raises(SystemExit):
            p.parse_args(["create-namespace", "ns", *uri, *bad])


def test_placement_in_words() -> None:
    assert admin.placement_text(StreamConfig()) == "placement: the writing client's settings"
    text = admin.placement_text(config_from(RACK_AWARE))
    assert text == ("placement: policy rack-aware, min racks per write quorum 2, min regions "
                    "per write quorum the client's, enforce yes")


# --------------------------------------------------------------------------- on the simulator


def _config(**kw: Any) -> ClientConfig:
    base: dict[str, Any] = dict(add_timeout_s=0.5, read_timeout_s=0.5, connect_timeout_s=0.3,
                                reconnect_backoff_s_max=0.2, explicit_lac_interval_s=0.0,
                                bookie_racks=RACKS)
    base.update(kw)
    return ClientConfig(**base).validate()


def _client(c: SimCluster, name: str, cfg: ClientConfig | None = None) -> BookKeeper:
    """The stream client on the simulated cluster (closed by ``c.stop()``)."""
    bk = BookKeeper(BlockableStore(c.history, state=c.state), cfg or _config(),
                    connector=c.net.connector(name), rng=random.Random(c.rng.getrandbits(64)))
    bk.bookies.start()
    c.clients.append(bk)
    return bk


def _spans_two_racks(ensemble: Any, write_quorum: int) -> bool:
    return write_set_spread(list(ensemble), write_quorum, LOCATIONS)[1] == 2


def test_one_policy_per_distinct_setting() -> None:
    async def body() -> None:
        c = SimCluster(1, 4)
        await c.start()
        bk = _client(c, "w")
        assert bk.placement_for(None) is bk.placement
        assert bk.placement_for(PlacementSpec()) is bk.placement
        assert bk.placement_for(PlacementSpec("random", enforce_placement=True)) is bk.placement
        rack = bk.placement_for(PlacementSpec("rack-aware", enforce_placement=True))
        assert rack is not bk.placement
        assert bk.placement_for(PlacementSpec("rack-aware", 2, 5, True)) is rack  # same one
        assert bk.placement_for(PlacementSpec("rack-aware")) is not rack  # not enforced
        with pytest.raises(TypeError, match="PlacementSpec"):
            bk.placement_for({"placement_policy": "rack-aware"})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="PlacementSpec"):
            await bk.create_ledger(2, 2, 2, placement="rack-aware")  # type: ignore[arg-type]
        await c.stop()

    run_sim(body)


def test_a_ledgers_own_policy_places_it_and_its_replacements() -> None:
    """The client places at random; a ledger created rack-aware (enforced) spans both
    racks, and when its r1 bookie dies its writer replaces it by the other r1 bookie,
    the only one that keeps both racks in the write set (six times over)."""
    async def body() -> None:
        c = SimCluster(2, 4)
        await c.start()
        bk = _client(c, "w")
        spec = PlacementSpec("rack-aware", enforce_placement=True)
        for _ in range(6):
            lh = await bk.create_ledger(2, 2, 2, password=PW, placement=spec)
            assert lh.placement is bk.placement_for(spec)
            assert _spans_two_racks(lh.metadata.ensembles[0][1], 2)
            await lh.close()
        plain = await bk.create_ledger(2, 2, 2, password=PW)
        assert plain.placement is bk.placement
        await plain.close()

        # (at random, each replacement would be the wrong one half the time)
        for _ in range(6):
            lh = await bk.create_ledger(2, 2, 2, password=PW, placement=spec)
            await asyncio.gather(*(lh.append(b"before %d" % i) for i in range(5)))
            first = list(lh.metadata.ensembles[0][1])
            victim = c.bookie(next(b for b in first if RACKS[b] == "/r1"))
            await victim.crash(torn=False)
            await asyncio.wait_for(asyncio.gather(
                *(lh.append(b"after %d" % i) for i in range(5))), 30)
            last = list(lh.metadata.ensembles[-1][1])
            assert len(lh.metadata.ensembles) == 2 and victim.id not in last
            assert {RACKS[b] for b in last} == {"/r1", "/r2"}
            await lh.close()
            await victim.restart()
            await asyncio.sleep(1)
        await c.stop()

    run_sim(body)


def test_fallbacks_of_a_ledgers_policy_count_in_the_clients() -> None:
    async def body() -> None:
        c = SimCluster(3, 4)
        await c.start()
        bk = _client(c, "w")
        three = PlacementSpec("rack-aware", min_racks_per_write_quorum=3)
        lh = await bk.create_ledger(3, 3, 2, password=PW, placement=three)  # 2 racks only
        assert lh.placement.fallbacks == 1 and bk.placement.fallbacks == 1
        await lh.close()
        with pytest.raises(PlacementError, match="3 racks"):
            await bk.create_ledger(3, 3, 2, placement=PlacementSpec(
                "rack-aware", min_racks_per_write_quorum=3, enforce_placement=True))
        assert bk.placement.fallbacks == 1
        await c.stop()

    run_sim(body)


def test_a_namespace_places_every_segment_of_its_streams() -> None:
    """A client that places at random; a namespace rack-aware (enforced) with E4 Qw2:
    every write set of every segment spans both racks, rolled 8 times by each of two
    writers in turn; a stream that overrides the policy back to random is not
    constrained (its ledgers use the client's policy)."""
    async def body() -> None:
        c = SimCluster(4, 4)
        await c.start()
        bk = _client(c, "a")
        ns = await bk.namespace("racked", create=True, ensemble_size=4, write_quorum=2,
                                ack_quorum=2, rolling_entries=1, **RACK_AWARE)
        assert ns.defaults.placement == RACK_AWARE
        await ns.create_stream("s")
        await ns.create_stream("free", placement_policy="random")
        for who in ("a", "b"):
            client = bk if who == "a" else _client(c, who)
            wns = await client.namespace("racked")
            async with await wns.open_writer("s") as w:
                for i in range(4):
                    await w.write(b"%s %d" % (who.encode(), i))
                assert w._lh.placement is client.placement_for(placement_spec(wns.defaults))
            async with await wns.open_writer("free") as w:
                await w.write(b"x")
                assert w._lh.placement is client.placement
        info = await ns.stream_info("s")
        assert len(info.segments) >= 8
        for seg in info.segments:
            md = await bk.ledger_metadata(seg.ledger_id)
            for _, ensemble in md.ensembles:
                assert _spans_two_racks(ensemble, 2), (seg.seq, ensemble)
        assert bk.placement.fallbacks == 0
        await c.stop()

    run_sim(body)


def test_an_enforced_namespace_that_cannot_place_a_segment_fails_with_placement_error() -> None:
    """Enforced, and the bookies left cannot meet it: ``open_writer`` raises
    PlacementError; so does a writer's roll once a rack is gone (what it had
    acknowledged stays)."""
    async def body() -> None:
        c = SimCluster(5, 4)
        await c.start()
        bk = _client(c, "w")
        three = await bk.namespace("three", create=True, ensemble_size=3, write_quorum=3,
                                   ack_quorum=2, placement_policy="rack-aware",
                                   min_racks_per_write_quorum=3, enforce_placement=True)
        await three.create_stream("s")
        with pytest.raises(PlacementError, match="3 racks"):
            await three.open_writer("s")

        ns = await bk.namespace("two", create=True, ensemble_size=2, write_quorum=2,
                                ack_quorum=1, rolling_entries=3, **RACK_AWARE)
        await ns.create_stream("s")
        w = await ns.open_writer("s")
        acked = [await w.write(b"%d" % i) for i in range(2)]
        for b in ("b2:3181", "b3:3181"):  # rack r2 goes, and its registrations expire
            await c.bookie(b).crash(torn=False)
        await asyncio.sleep(10)
        with pytest.raises(PlacementError, match="no new ensemble of 2 bookies"):  # the roll
            for i in range(2, 10):
                await asyncio.wait_for(w.write(b"%d" % i), 30)
        await w.abort()
        for b in ("b2:3181", "b3:3181"):
            await c.bookie(b).restart()
        await asyncio.sleep(1)
        reader = await ns.open_reader("s")
        got = [(await reader.read_next()).position for _ in acked]
        assert got == acked
        await reader.close()
        await c.stop()

    run_sim(body)
