"""The bookie's HTTP admin endpoint against live bookie processes."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from asyncbk.errors import NotEnoughBookiesError
from asyncbk.testing.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]

TIMEOUT = aiohttp.ClientTimeout(total=10)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus text ``text``."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            head, value = line.rsplit(" ", 1)
            if all(part in head for part in want.split(",")):
                return float(value)
    raise AssertionError(f"no sample {name}{{{want}}} in metrics")


async def test_health_info_and_metrics(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 3, 2)
    await asyncio.gather(*(lh.append(b"x" * 100) for _ in range(50)))
    await lh.close()
    assert [e.data for e in await (await bk.open_ledger(lh.id)).read(0, 49)] == [b"x" * 100] * 50
    b = cluster.bookies[0]
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.get(f"{b.http_url}/healthz") as r:
            assert (r.status, await r.text()) == (200, "ok\n")
        async with s.get(f"{b.http_url}/api/v1/bookie/info") as r:
            info = await r.json()
        assert info["bookie_id"] == b.id and info["state"] == "writable"
        assert info["ledgers"] >= 1 and info["entries"] >= 50
        assert 0 < info["disk"]["free_bytes"] <= info["disk"]["total_bytes"]
        async with s.get(f"{b.http_url}/metrics") as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
            text = await r.text()
    assert metric(text, "asyncbk_bookie_add_requests_total", bookie=b.id) == 50
    assert metric(text, "asyncbk_bookie_written_bytes_total", bookie=b.id) > 50 * 100
    assert metric(text, "asyncbk_bookie_add_latency_seconds_count", bookie=b.id) == 50
    assert metric(text, "asyncbk_bookie_add_latency_seconds_bucket", bookie=b.id,
                  le="+Inf") == 50
    assert metric(text, "asyncbk_bookie_journal_fsync_seconds_count", bookie=b.id) >= 1
    assert metric(text, "asyncbk_bookie_journal_batch_records_sum", bookie=b.id) >= 50
    assert metric(text, "asyncbk_bookie_state", bookie=b.id, state="writable") == 1
    assert metric(text, "asyncbk_bookie_read_only", bookie=b.id) == 0
    assert metric(text, "asyncbk_bookie_connections", bookie=b.id) >= 1
    # the reads went to some bookie: together they returned the 50 entries
    total_read = 0.0
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        for each in cluster.bookies:
            async with s.get(f"{each.http_url}/metrics") as r:
                total_read += metric(await r.text(), "asyncbk_bookie_read_entries_total",
                                     bookie=each.id)
    assert total_read == 50


async def test_maintenance_read_only_switch(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    b = cluster.bookies[1]
    url = f"{b.http_url}/api/v1/bookie/state"
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        for body in ("not json", json.dumps({"read_only": "yes"}), json.dumps([True]),
                     json.dumps({"read_only": True, "extra": 1})):
            async with s.put(url, data=body) as r:
                assert r.status == 400
                assert "read_only" in (await r.json())["error"]
        async with s.get(url) as r:
            assert await r.json() == {"state": "writable", "read_only": False, "reasons": []}
        async with s.put(url, json={"read_only": True}) as r:
            assert r.status == 200
            assert await r.json() == {"state": "readonly", "read_only": True,
                                      "reasons": ["maintenance"]}
        async with s.get(f"{b.http_url}/healthz") as r:
            assert r.status == 200  # read-only still serves reads
        async with s.get(f"{b.http_url}/nope") as r:
            assert r.status == 404
        # only 2 writable bookies now: an ensemble of 3 cannot be formed
        async with asyncio.timeout(10):
            while True:
                try:
                    await (await bk.create_ledger(3, 3, 2)).close()
                except NotEnoughBookiesError:
                    break
                await asyncio.sleep(0.1)
        async with s.put(url, json={"read_only": False}) as r:
            assert (await r.json())["state"] == "writable"
    async with asyncio.timeout(10):
        while True:
            try:
                lh = await bk.create_ledger(3, 3, 2)
                break
            except NotEnoughBookiesError:
                await asyncio.sleep(0.1)
    assert await lh.append(b"back") == 0


async def test_client_metrics(cluster: LocalCluster) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from asyncbk.client.metrics import ClientCollector

    bk = await cluster.client()
    lh = await bk.create_ledger(3, 2, 2)
    await asyncio.gather(*(lh.append(b"m") for _ in range(30)))
    await lh.close()
    rh = await bk.open_ledger(lh.id)
    await rh.read(0, 29)
    await rh.read(0, 9)
    assert bk.stats.add_latency.count == 30
    assert bk.stats.read_latency.count == 2 and bk.stats.read_entries == 40
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClientCollector(bk, name="test"))
    text = generate_latest(registry).decode()
    assert metric(text, "asyncbk_client_add_latency_seconds_count", client="test") == 30
    assert metric(text, "asyncbk_client_read_entries_total", client="test") == 40
    assert metric(text, "asyncbk_client_ensemble_changes_total", client="test") == 0
