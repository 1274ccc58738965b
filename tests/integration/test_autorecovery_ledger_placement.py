"""Auto-recovery follows a ledger's own placement, with real processes: six bookies
in three racks (two each), a client that places at random creates ledgers with
``placement=PlacementSpec("rack-aware", min_racks_per_write_quorum=3,
enforce_placement=True)`` (E3 Qw3 Qa2: one bookie per rack), a bookie is killed
(SIGKILL), and ``asyncbk autorecovery`` with the default random policy replaces it
in every ledger by the other bookie of its rack, the only one keeping three racks
(at random, one chance in three per ledger).  Then ``asyncbk shell placementcheck``
(random policy too) checks those ledgers against their own placement."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from asyncbk.client.client import PlacementSpec
from asyncbk.client.quorum import write_set
from asyncbk.proto import ReadRequest, ReadResponse, Status
from asyncbk.testing.cluster import LocalCluster

from .clitools import cli_env

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors"),
              pytest.mark.timeout(90)]

RACKS = ["/r1", "/r1", "/r2", "/r2", "/r3", "/r3"]
SPEC = PlacementSpec("rack-aware", min_racks_per_write_quorum=3, enforce_placement=True)
LEDGERS = 6
"""Each ensemble has one bookie of each rack, so some bookie is in at least 3 of them:
a random replacement would be right in all of those one time in 27 at most."""
PW = b"pw"


async def test_autorecovery_replaces_a_lost_bookie_within_the_ledgers_rack(
        tmp_path: Path) -> None:
    async with LocalCluster(bookies=6, data_dir=tmp_path / "cluster", racks=RACKS) as cluster:
        rack = {b.id: r for b, r in zip(cluster.bookies, RACKS, strict=True)}
        bk = await cluster.client()  # random placement
        data: dict[int, list[bytes]] = {}
        ensembles: dict[int, tuple[str, ...]] = {}
        for n in range(LEDGERS):
            lh = await bk.create_ledger(3, 3, 2, password=PW, placement=SPEC)
            data[lh.id] = [b"ledger %d entry %d" % (lh.id, i) for i in range(40 + n)]
            await asyncio.gather(*(lh.append(d) for d in data[lh.id]))
            await lh.close()
            ensembles[lh.id] = (await bk.ledger_metadata(lh.id)).ensembles[0][1]
            assert {rack[b] for b in ensembles[lh.id]} == set(RACKS)
        victim_id = max(rack, key=lambda b: sum(b in e for e in ensembles.values()))
        victim = next(b for b in cluster.bookies if b.id == victim_id)
        mate = next(b for b in rack if rack[b] == rack[victim_id] and b != victim_id)
        hit = [lid for lid, e in ensembles.items() if victim_id in e]
        assert len(hit) >= 3

        ar = await cluster.start_autorecovery(lost_bookie_delay=1, audit_interval=2, rate=0)
        victim.kill()
        async with asyncio.timeout(40):
            while True:
                mds = {lid: await bk.ledger_metadata(lid) for lid in hit}
                if not any(victim_id in md.all_bookies() for md in mds.values()):
                    break
                await asyncio.sleep(0.5)
        for lid, md in mds.items():
            assert md.ensembles == ((0, tuple(mate if b == victim_id else b
                                              for b in ensembles[lid])),), (lid, md.ensembles)
            for entry_id in range(md.last_entry_id + 1):  # every replica in place
                for p in write_set(entry_id, 3, 3):
                    ch = bk.bookie_client.channel(md.ensembles[0][1][p])
                    resp = await ch.request(ReadRequest(ch.next_request_id(), lid, entry_id,
                                                        0, b""), 5.0)
                    assert isinstance(resp, ReadResponse) and resp.status == Status.OK
        reader = await cluster.client()
        for lid, entries in data.items():
            rh = await reader.open_ledger(lid, password=PW)
            assert [e.data for e in await rh.read(0, len(entries) - 1)] == entries
        async with asyncio.timeout(10):
            while await bk.meta.list_underreplicated():  # noqa: ASYNC110 - polling etcd
                await asyncio.sleep(0.2)
        async with aiohttp.ClientSession() as s, \
                s.get(f"{ar.http_url}/api/v1/autorecovery/status") as resp:
            status = await resp.json()
        assert status["placement_blocked_replications"] == 0 and status["copied_entries"] > 0

        r = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "asyncbk", "shell", "placementcheck",
                             "--json", "--metadata-uri", cluster.metadata_uri],
            capture_output=True, text=True, timeout=60, env=cli_env(),
            stdin=subprocess.DEVNULL)
        assert r.returncode == 0, (r.stdout, r.stderr)
        report = json.loads(r.stdout)
        assert report["policy"] == "random" and report["ledgers_checked"] == LEDGERS
        assert report["ledgers_with_own_placement"] == LEDGERS
        assert report["violating_ledgers"] == 0 and report["fragments"] == []
