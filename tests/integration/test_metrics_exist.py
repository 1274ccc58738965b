"""Every metric a Grafana dashboard (docker/grafana/dashboards/) or an alert rule
(docker/prometheus/alerts.yml) uses is exported by a live cluster, so the dashboards
and alerts cannot rot: a real etcd, three bookie processes with two ledger
directories each, an auto-recovery process, some ledger appends and reads, a stream
with subscriptions (one behind, one whose backlog a quota evicted), a quarantined
bookie, and the client's ClientCollector and StreamCollector served over HTTP by the
same endpoint code the bookies use.  Each endpoint's ``/metrics`` is fetched over HTTP
and parsed with prometheus_client's parser."""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncbk import Position
from asyncbk.client.metrics import ClientCollector
from asyncbk.net.http import AdminHttp
from asyncbk.stream.metrics import StreamCollector
from asyncbk.testing.cluster import LocalCluster
from tests.unit.test_dashboards import alert_exprs, dashboard_exprs, label_matchers, metric_names

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors"),
              pytest.mark.timeout(180)]

TIMEOUT = aiohttp.ClientTimeout(total=10)
MADE_BY_PROMETHEUS = {"up": {"job", "instance"}}
"""Series Prometheus makes itself for every target, with their labels."""


def samples(text: str) -> tuple[dict[str, set[str]], set[str]]:
    """The sample names of ``text`` with the label names each carries, and the names of
    the families declared without any sample (their sample names, by type)."""
    present: dict[str, set[str]] = defaultdict(set)
    empty: set[str] = set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            present[s.name] |= set(s.labels)
        if not family.samples:
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
            empty.update(family.name + x for x in suffixes.get(family.type, [""]))
    return present, empty


async def scrape(urls: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        for url in urls:
            async with s.get(f"{url}/metrics") as r:
                assert r.status == 200, url
                out[url] = await r.text()
    return out


def value(text: str, name: str, **labels: str) -> list[float]:
    return [s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


async def test_every_metric_a_dashboard_or_an_alert_uses_is_exported(tmp_path: Path) -> None:
    used: dict[str, list[str]] = defaultdict(list)
    exprs = dashboard_exprs() + alert_exprs()
    for where, expr in exprs:
        for name in metric_names(expr):
            used[name].append(where)
    assert len(used) > 40

    async with LocalCluster(bookies=3, data_dir=tmp_path / "cluster", ledger_dirs=2) as c:
        ar = await c.start_autorecovery(lost_bookie_delay=60, audit_interval=1)
        bk = await c.client()
        lh = await bk.create_ledger(3, 2, 2)
        await asyncio.gather(*(lh.append(b"x" * 100) for _ in range(100)))
        await lh.close()
        got = await (await bk.open_ledger(lh.id)).read(0, 99)
        assert [e.data for e in got] == [b"x" * 100] * 100

        ns = await bk.namespace("mon", create=True, ensemble_size=3, write_quorum=2,
                                ack_quorum=2, rolling_entries=20, retention_s=0.001,
                                backlog_quota_bytes=4_000)
        await ns.create_stream("s")
        await (await ns.subscribe("s", "stalled", Position.EARLIEST)).close()
        async with await ns.open_writer("s") as w:
            for _ in range(5):  # 20 records of 100 bytes a round: a segment each
                await asyncio.gather(*(w.write_nowait(b"y" * 100) for _ in range(20)))
            await ns.apply_retention("s")  # the quota evicts the stalled backlog's head
        await (await ns.subscribe("s", "behind", Position.LATEST)).close()
        async with await ns.open_writer("s") as w:
            await asyncio.gather(*(w.write_nowait(b"z" * 100) for _ in range(10)))
        async with await ns.open_reader("s", start=Position.EARLIEST) as r:
            assert await r.read_batch(5, wait_s=5.0)
        lags = {i.name: i for i in await ns.subscriptions("s")}  # measured: the gauges
        assert lags["behind"].lag_records == 10 and lags["stalled"].truncated
        bk.quarantine_bookie(c.bookies[0].id)
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session, session.put(
                f"{c.bookies[2].http_url}/api/v1/bookie/state",
                json={"read_only": True}) as r:  # read-only for maintenance: a reason
            assert r.status == 200

        client_http = AdminHttp("127.0.0.1", 0, [], [ClientCollector(bk, "monitoring"),
                                                     StreamCollector(bk, "monitoring")])
        client_url = f"http://127.0.0.1:{await client_http.start()}"
        try:
            texts = await scrape([*(b.http_url for b in c.bookies), ar.http_url,
                                  client_url])
        finally:
            await client_http.close()

    present: dict[str, set[str]] = defaultdict(set)
    declared_empty: set[str] = set()
    for text in texts.values():
        names, empty = samples(text)
        for name, labels in names.items():
            present[name] |= labels
        declared_empty |= empty
    for name, labels in MADE_BY_PROMETHEUS.items():
        present[name] |= labels

    missing = {name: where for name, where in used.items() if name not in present}
    assert not missing, "metrics used but exported by no endpoint (declared without " \
        f"samples: {sorted(set(missing) & declared_empty)}): {missing}"

    # The labels the queries select on, group by and show exist on those metrics.
    for where, expr in exprs:
        for name, labels in label_matchers(expr):
            assert labels <= present[name] | {"__name__"}, \
                f"{where}: {name} has no label {sorted(labels - present[name])}"
        available = set().union(*(present[n] for n in metric_names(expr)))
        for clause in re.findall(r"\b(?:by|on|without)\s*\(([^)]*)\)", expr):
            grouped = {x.strip() for x in clause.split(",") if x.strip()}
            assert grouped <= available, f"{where}: no label {sorted(grouped - available)}"

    # Real values, not only names: the load shows in the figures.
    bookie_text = "".join(texts[b.http_url] for b in c.bookies)
    assert sum(value(bookie_text, "asyncbk_bookie_add_requests_total")) >= 200
    for b, reasons in ((c.bookies[0], set()), (c.bookies[2], {"maintenance"})):
        on = {reason for reason in ("config", "disk_full", "journal_failed", "maintenance")
              if value(bookie_text, "asyncbk_bookie_read_only_reason", bookie=b.id,
                       reason=reason) == [1.0]}
        assert on == reasons, b.id
    assert value(bookie_text, "asyncbk_bookie_read_only", bookie=c.bookies[2].id) == [1.0]
    dirs = [x for f in text_string_to_metric_families(bookie_text) for x in f.samples
            if x.name == "asyncbk_bookie_directory_free_bytes"]
    kinds: dict[tuple[str, str], set[str]] = defaultdict(set)
    for x in dirs:
        kinds[(x.labels["bookie"], x.labels["kind"])].add(x.labels["dir"])
    for b in c.bookies:
        assert len(kinds[(b.id, "ledger")]) == 2, kinds  # two ledger directories each
        assert len(kinds[(b.id, "journal")]) >= 1, kinds
    assert value(bookie_text, "asyncbk_bookie_disk_usage_threshold")
    client_text = texts[client_url]
    assert value(client_text, "asyncbk_client_quarantined_bookies") == [1.0]
    assert value(client_text, "asyncbk_client_bookie_quarantined", bookie=c.bookies[0].id) \
        == [1.0]
    assert value(client_text, "asyncbk_subscription_lag_records", subscription="behind") \
        == [10.0]
    assert value(client_text, "asyncbk_subscription_evicted_segments_total",
                 subscription="stalled")[0] >= 1
    assert value(texts[ar.http_url], "asyncbk_autorecovery_underreplicated_ledgers") == [0.0]
