"""Rack-aware placement with real bookie processes that declare racks."""

from __future__ import annotations

import asyncio

import pytest

from asyncbk.client.placement import write_set_spread
from asyncbk.testing.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]

RACKS = ["/r1", "/r1", "/r2", "/r2"]


async def test_rack_aware_write_sets_span_two_racks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with LocalCluster(bookies=4, data_dir=tmp_path / "cluster", racks=RACKS) as cluster:
        # what listbookies reads: every bookie's registration carries its rack
        bk = await cluster.client(placement_policy="rack-aware", enforce_placement=True,
                                  client_location="/r2")
        registered = await bk.meta.list_bookies()
        assert {b: reg.info.get("rack") for b, reg in registered.items()} == {
            b.id: f"/default-region{rack}" for b, rack in zip(cluster.bookies, RACKS,
                                                               strict=True)}
        await bk.create_ledger(1, 1, 1)  # the registry view is loaded
        locations = bk.bookie_locations()
        assert locations == {b.id: f"/default-region{rack}"
                             for b, rack in zip(cluster.bookies, RACKS, strict=True)}

        # (E = 3, Qw = 2 cannot: three write sets of 2 around a ring of 3 over 2 racks)
        for e, w, a in [(2, 2, 2), (4, 2, 1), (4, 3, 2), (3, 3, 2)]:
            for _ in range(3):
                lh = await bk.create_ledger(e, w, a)
                md = lh.metadata
                assert write_set_spread(md.ensembles[0][1], w, locations)[1] == 2, md
                await lh.close()
        assert bk.placement.fallbacks == 0

        # an ensemble change keeps both racks in the write set: with the ensemble
        # [one of r1, one of r2] and the r1 bookie gone, only the other r1 bookie fits
        lh = await bk.create_ledger(2, 2, 2, password=b"pw")
        await asyncio.gather(*(lh.append(b"before %d" % i) for i in range(20)))
        first = lh.metadata.ensembles[0][1]
        victim = next(b for b in cluster.bookies if b.id in first
                      and locations[b.id] == "/default-region/r1")
        victim.kill()
        await asyncio.gather(*(lh.append(b"after %d" % i) for i in range(20)))
        md = lh.metadata
        assert len(md.ensembles) == 2
        last = md.ensembles[-1][1]
        assert victim.id not in last
        assert write_set_spread(last, 2, locations)[1] == 2
        assert {locations[b] for b in last} == {"/default-region/r1", "/default-region/r2"}
        await lh.close()

        # reads prefer the client's rack and still read everything
        rh = await bk.open_ledger(lh.id, password=b"pw")
        got = await rh.read(0, 39)
        assert [e.data for e in got] == [b"before %d" % i for i in range(20)] + [
            b"after %d" % i for i in range(20)]
        await bk.close()
