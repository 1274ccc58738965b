#!/usr/bin/env python3
"""Write asyncbk's Grafana dashboards (``dashboards/*.json``) from the panels below.

    python docker/grafana/generate.py          # rewrite the JSON files
    python docker/grafana/generate.py --check  # exit 1 if a file differs

The JSON files are committed; tests/unit/test_dashboards.py checks that they are
what this script writes, that every panel has a query, and that every query
parses (promtool), and tests/integration/test_metrics_exist.py that every metric
a query uses is exported by a live cluster.

Each dashboard takes its Prometheus data source from a ``datasource`` variable
(pick it when importing), so nothing here names a data source.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"


@dataclass
class Panel:
    title: str
    exprs: list[tuple[str, str]]
    """(PromQL, legend) pairs."""
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"
    width: int = 12
    thresholds: list[tuple[float, str]] = field(default_factory=list)


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    variables: list[tuple[str, str, str]]
    """(name, label, metric whose label values fill it)."""
    rows: list[tuple[str, list[Panel]]]


def quantiles(metric: str, selector: str, by: str, qs: tuple[float, ...] = (0.5, 0.99, 0.999)
              ) -> list[tuple[str, str]]:
    out = []
    for q in qs:
        expr = (f"histogram_quantile({q}, sum by ({by}, le) "
                f"(rate({metric}_bucket{{{selector}}}[{RATE}])))")
        out.append((expr, f"p{q * 100:g} {{{{{by}}}}}"))
    return out


B = 'bookie=~"$bookie"'
C = 'client=~"$client"'
NS = 'namespace=~"$namespace"'

BOOKIES = Dashboard(
    "asyncbk-bookies", "asyncbk / bookies",
    "Adds and reads, journal group commit and fsync, read-only state and its reasons, "
    "disk usage per directory.",
    [("bookie", "bookie", "asyncbk_bookie_state")],
    [
        ("Requests", [
            Panel("Adds per second", [
                (f"sum by (bookie) (rate(asyncbk_bookie_add_requests_total{{{B}}}[{RATE}]))",
                 "{{bookie}}")], "reqps", "adds accepted for journaling"),
            Panel("Reads per second", [
                (f"sum by (bookie) (rate(asyncbk_bookie_read_requests_total{{{B}}}[{RATE}]))",
                 "{{bookie}} requests"),
                (f"sum by (bookie) (rate(asyncbk_bookie_read_entries_total{{{B}}}[{RATE}]))",
                 "{{bookie}} entries")], "reqps"),
            Panel("Add latency", quantiles("asyncbk_bookie_add_latency_seconds", B, "bookie"),
                  "s", "arrival to answer, journal fsync included"),
            Panel("Read latency", quantiles("asyncbk_bookie_read_latency_seconds", B, "bookie"),
                  "s"),
            Panel("Bytes written per second", [
                (f"sum by (bookie) (rate(asyncbk_bookie_written_bytes_total{{{B}}}[{RATE}]))",
                 "{{bookie}}")], "Bps"),
            Panel("Refused and failed adds per second", [
                (f"sum by (bookie) (rate(asyncbk_bookie_add_rejected_total{{{B}}}[{RATE}]))",
                 "{{bookie}} refused"),
                (f"sum by (bookie) (rate(asyncbk_bookie_add_errors_total{{{B}}}[{RATE}]))",
                 "{{bookie}} failed"),
                (f"sum by (bookie) (rate(asyncbk_bookie_read_errors_total{{{B}}}[{RATE}]))",
                 "{{bookie}} read errors")], "reqps",
                  "refused: read-only, fenced, unauthorized, bad request; failed: journal"),
        ]),
        ("Journal", [
            Panel("Journal fsync latency",
                  quantiles("asyncbk_bookie_journal_fsync_seconds", B, "bookie"), "s",
                  "fdatasync of one group commit"),
            Panel("Group commit size (records per fsync)", [
                (f"sum by (bookie) (rate(asyncbk_bookie_journal_batch_records_sum{{{B}}}"
                 f"[{RATE}])) / sum by (bookie) "
                 f"(rate(asyncbk_bookie_journal_batch_records_count{{{B}}}[{RATE}]))",
                 "{{bookie}} mean"),
                *quantiles("asyncbk_bookie_journal_batch_records", B, "bookie", (0.99,))],
                  "short"),
            Panel("Group commits by reason", [
                (f"sum by (bookie, reason) "
                 f"(rate(asyncbk_bookie_journal_flushes_total{{{B}}}[{RATE}]))",
                 "{{bookie}} {{reason}}")], "ops"),
            Panel("Journal queue", [
                (f"asyncbk_bookie_journal_queue_entries{{{B}}}", "{{bookie}}")], "short",
                  "records waiting for or in a journal write"),
        ]),
        ("State", [
            Panel("Read-only", [(f"max by (bookie) (asyncbk_bookie_read_only{{{B}}})",
                                 "{{bookie}}")], "bool", kind="stat", width=8,
                  thresholds=[(0, "green"), (1, "red")]),
            Panel("Read-only reasons in force", [
                (f"max by (bookie, reason) (asyncbk_bookie_read_only_reason{{{B}}}) == 1",
                 "{{bookie}} {{reason}}")], "short",
                  "config, disk_full, journal_failed, maintenance", width=8),
            Panel("State", [
                (f"max by (bookie, state) (asyncbk_bookie_state{{{B}}}) == 1",
                 "{{bookie}} {{state}}")], "short",
                  "starting, writable, readonly, unregistered, draining, closed", width=8),
            Panel("Client connections", [
                (f"asyncbk_bookie_connections{{{B}}}", "{{bookie}}")], "short", width=8),
            Panel("Ledgers stored", [(f"asyncbk_bookie_ledgers{{{B}}}", "{{bookie}}")],
                  "short", width=8),
            Panel("Journal failed", [(f"max by (bookie) (asyncbk_bookie_journal_failed{{{B}}})",
                                      "{{bookie}}")], "bool", kind="stat", width=8,
                  thresholds=[(0, "green"), (1, "red")]),
        ]),
        ("Disks", [
            Panel("Disk usage per directory", [
                (f"1 - asyncbk_bookie_directory_free_bytes{{{B}}} "
                 f"/ asyncbk_bookie_directory_total_bytes{{{B}}}",
                 "{{bookie}} {{kind}} {{dir}}"),
                (f"max by (bookie) (asyncbk_bookie_disk_usage_threshold{{{B}}})",
                 "{{bookie}} high mark"),
                (f"max by (bookie) (asyncbk_bookie_disk_usage_lwm_threshold{{{B}}})",
                 "{{bookie}} low mark")], "percentunit",
                  "used fraction of each ledger and journal directory's file system; a "
                  "ledger directory turns full at the high mark"),
            Panel("Full ledger directories", [
                (f"asyncbk_bookie_directory_full{{{B}}} == 1", "{{bookie}} {{dir}}")],
                  "short", "take no plain adds until below the low mark"),
            Panel("Free bytes per directory", [
                (f"asyncbk_bookie_directory_free_bytes{{{B}}}",
                 "{{bookie}} {{kind}} {{dir}}")], "bytes"),
            Panel("Space reclaimed per second", [
                (f"sum by (bookie) "
                 f"(rate(asyncbk_bookie_compaction_freed_bytes_total{{{B}}}[{RATE}]))",
                 "{{bookie}} compaction"),
                (f"sum by (bookie) (rate(asyncbk_bookie_ledgers_deleted_total{{{B}}}[{RATE}]))",
                 "{{bookie}} ledgers deleted/s")], "short"),
        ]),
    ])

CLIENTS = Dashboard(
    "asyncbk-clients", "asyncbk / clients",
    "Append latency and rate, reads, ensemble changes and quarantined bookies, from the "
    "ClientCollector an application registers.",
    [("client", "client", "asyncbk_client_add_latency_seconds_count")],
    [
        ("Appends", [
            Panel("Append latency", quantiles("asyncbk_client_add_latency_seconds", C,
                                              "client"), "s",
                  "call to acknowledgement by an ack quorum"),
            Panel("Appends per second", [
                (f"sum by (client) (rate(asyncbk_client_add_latency_seconds_count{{{C}}}"
                 f"[{RATE}]))", "{{client}}")], "reqps"),
            Panel("Read latency", quantiles("asyncbk_client_read_latency_seconds", C,
                                            "client", (0.5, 0.99)), "s"),
            Panel("Entries read per second", [
                (f"sum by (client) (rate(asyncbk_client_read_entries_total{{{C}}}[{RATE}]))",
                 "{{client}}")], "short"),
        ]),
        ("Ensembles", [
            Panel("Ensemble changes", [
                (f"sum by (client) (increase(asyncbk_client_ensemble_changes_total{{{C}}}"
                 f"[5m]))", "{{client}}")], "short",
                  "bookies replaced by this client's writers, per 5 minutes"),
            Panel("Quarantined bookies", [
                (f"max by (client) (asyncbk_client_quarantined_bookies{{{C}}})",
                 "{{client}}")], "short",
                  "bookies kept out of new ensembles after a failed add"),
            Panel("Quarantined, per bookie", [
                (f"max by (client, bookie) (asyncbk_client_bookie_quarantined{{{C}}})",
                 "{{client}} {{bookie}}")], "short"),
            Panel("Placement fallbacks", [
                (f"sum by (client) (increase(asyncbk_client_placement_fallbacks_total{{{C}}}"
                 f"[5m]))", "{{client}}")], "short",
                  "ensembles that could not meet the placement policy, per 5 minutes"),
        ]),
    ])

AUTORECOVERY = Dashboard(
    "asyncbk-autorecovery", "asyncbk / auto-recovery",
    "Lost bookies, under-replicated ledgers and the replication that heals them.",
    [],
    [
        ("Health", [
            Panel("Under-replicated ledgers", [
                ("max(asyncbk_autorecovery_underreplicated_ledgers)", "marked")], "short",
                  "ledgers marked under-replicated, at the workers' last round", width=8),
            Panel("Lost bookies", [
                ("max(asyncbk_autorecovery_lost_bookies)", "lost"),
                ("max(asyncbk_autorecovery_bookies_within_delay)", "gone, within the delay")],
                  "short", width=8),
            Panel("Auditor", [("sum(asyncbk_autorecovery_is_auditor)", "auditors elected"),
                              ("max by (id) (asyncbk_autorecovery_is_auditor) == 1",
                               "{{id}}")],
                  "short", "exactly one process should be the auditor", width=8),
        ]),
        ("Replication", [
            Panel("Ledgers replicated per minute", [
                ("sum by (id) (rate(asyncbk_autorecovery_replicated_ledgers_total"
                 f"[{RATE}])) * 60", "{{id}}"),
                ("sum by (id) (rate(asyncbk_autorecovery_recovered_open_ledgers_total"
                 f"[{RATE}])) * 60", "{{id}} open ledgers recovered")], "short"),
            Panel("Copy rate", [
                (f"sum by (id) (rate(asyncbk_autorecovery_copied_bytes_total[{RATE}]))",
                 "{{id}}")], "Bps"),
            Panel("Entries copied per second", [
                (f"sum by (id) (rate(asyncbk_autorecovery_copied_entries_total[{RATE}]))",
                 "{{id}}")], "short"),
            Panel("Replication errors per minute", [
                (f"sum by (id) (rate(asyncbk_autorecovery_errors_total[{RATE}])) * 60",
                 "{{id}}")], "short"),
            Panel("Ledgers marked per minute", [
                (f"sum(rate(asyncbk_autorecovery_ledgers_marked_total[{RATE}])) * 60",
                 "marked")], "short"),
            Panel("Replicating", [("max by (id) (asyncbk_autorecovery_replicating)", "{{id}}")],
                  "short", "1 while a worker copies a ledger"),
        ]),
    ])

STREAMS = Dashboard(
    "asyncbk-streams", "asyncbk / streams and subscriptions",
    "Stream write and read rates per namespace, and each subscription's lag, from the "
    "StreamCollector of the processes that write, read or run retention.",
    [("namespace", "namespace", "asyncbk_stream_records_written_total")],
    [
        ("Streams", [
            Panel("Records written per second", [
                (f"sum by (namespace) (rate(asyncbk_stream_records_written_total{{{NS}}}"
                 f"[{RATE}]))", "{{namespace}}")], "short"),
            Panel("Bytes written per second", [
                (f"sum by (namespace) (rate(asyncbk_stream_bytes_written_total{{{NS}}}"
                 f"[{RATE}]))", "{{namespace}}")], "Bps"),
            Panel("Records read per second", [
                (f"sum by (namespace) (rate(asyncbk_stream_records_read_total{{{NS}}}"
                 f"[{RATE}]))", "{{namespace}}")], "short"),
            Panel("Segment rolls and writer takeovers", [
                (f"sum by (namespace) (increase(asyncbk_stream_segment_rolls_total{{{NS}}}"
                 f"[5m]))", "{{namespace}} rolls"),
                (f"sum by (namespace) (increase(asyncbk_stream_writer_takeovers_total"
                 f"{{{NS}}}[5m]))", "{{namespace}} takeovers")], "short", "per 5 minutes"),
        ]),
        ("Subscriptions", [
            Panel("Lag (records)", [
                (f"max by (namespace, stream, subscription) "
                 f"(asyncbk_subscription_lag_records{{{NS}}})",
                 "{{namespace}}/{{stream}} {{subscription}}")], "short",
                  "durable records after the subscription's position"),
            Panel("Lag (age of the oldest unacknowledged record)", [
                (f"max by (namespace, stream, subscription) "
                 f"(asyncbk_subscription_lag_seconds{{{NS}}})",
                 "{{namespace}}/{{stream}} {{subscription}}")], "s"),
            Panel("Lag (bytes)", [
                (f"max by (namespace, stream, subscription) "
                 f"(asyncbk_subscription_lag_bytes{{{NS}}})",
                 "{{namespace}}/{{stream}} {{subscription}}")], "bytes"),
            Panel("Segments evicted before acknowledged", [
                (f"sum by (namespace, stream, subscription) "
                 f"(increase(asyncbk_subscription_evicted_segments_total{{{NS}}}[1h]))",
                 "{{namespace}}/{{stream}} {{subscription}}"),
                (f"sum by (namespace) (increase(asyncbk_stream_backlog_evictions_total"
                 f"{{{NS}}}[1h]))", "{{namespace}} all")], "short",
                  "per hour; the consumer gets TruncatedError until sought"),
        ]),
    ])

DASHBOARDS = {"bookies": BOOKIES, "clients": CLIENTS, "autorecovery": AUTORECOVERY,
              "streams": STREAMS}


def _panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    height = 6 if p.kind == "stat" else 8
    out: dict[str, Any] = {
        "id": pid, "type": p.kind, "title": p.title, "datasource": DS,
        "gridPos": {"h": height, "w": p.width, "x": x, "y": y},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": expr,
                     "legendFormat": legend, "range": True}
                    for i, (expr, legend) in enumerate(p.exprs)],
        "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
        "options": {},
    }
    if p.description:
        out["description"] = p.description
    if p.thresholds:
        out["fieldConfig"]["defaults"]["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": color, "value": None if i == 0 else value}
                      for i, (value, color) in enumerate(p.thresholds)]}
    if p.kind == "timeseries":
        out["options"] = {"legend": {"displayMode": "list", "placement": "bottom"},
                          "tooltip": {"mode": "multi"}}
    else:
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}}
    return out


def render(d: Dashboard) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for title, row in d.rows:
        panels.append({"id": pid, "type": "row", "title": title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y, x, line_h = pid + 1, y + 1, 0, 0
        for p in row:
            if x + p.width > 24:
                x, y = 0, y + line_h
                line_h = 0
            panel = _panel(p, pid, x, y)
            panels.append(panel)
            pid, x = pid + 1, x + p.width
            line_h = max(line_h, panel["gridPos"]["h"])
        y += line_h
    variables: list[dict[str, Any]] = [{
        "name": "datasource", "label": "Prometheus", "type": "datasource",
        "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "options": []}]
    for name, label, metric in d.variables:
        variables.append({
            "name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": f"label_values({metric}, {label})", "refId": "var"},
            "definition": f"label_values({metric}, {label})",
            "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
            "current": {}, "options": [], "sort": 1, "hide": 0})
    return {
        "uid": d.uid, "title": d.title, "description": d.description,
        "tags": ["asyncbk"], "editable": True, "schemaVersion": 39, "version": 1,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "30s",
        "timezone": "browser", "graphTooltip": 1,
        "templating": {"list": variables},
        "annotations": {"list": []},
        "panels": panels,
    }


def rendered() -> dict[str, str]:
    """File name -> the JSON text this script writes."""
    return {f"{name}.json": json.dumps(render(d), indent=2, sort_keys=True) + "\n"
            for name, d in DASHBOARDS.items()}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    OUT.mkdir(exist_ok=True)
    for name, text in rendered().items():
        path = OUT / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        sys.stderr.write("not what generate.py writes: " + ", ".join(stale) + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
