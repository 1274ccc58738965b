"""docker/grafana/: the committed dashboards are what generate.py writes, every panel
has a query on the templated Prometheus data source, every query parses (promtool,
through a rule file made of them), counters are only read through rate() or
increase() and histogram buckets only through histogram_quantile().

The helpers here (the expressions of the dashboards and alert rules, and the metric
names an expression uses) also serve tests/integration/test_metrics_exist.py, which
checks those names against a live cluster's endpoints."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ruamel.yaml import YAML  # a direct test dependency (pyproject's test extra)

from tests.modules import load_script

from .test_alerts import promtool

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "docker" / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
ALERTS = ROOT / "docker" / "prometheus" / "alerts.yml"

# ------------------------------------------------------------------ helpers

FUNCTIONS = frozenset({
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp",
    "clamp_max", "clamp_min", "count_over_time", "delta", "deriv", "exp", "floor",
    "histogram_quantile", "holt_winters", "idelta", "increase", "irate", "label_join",
    "label_replace", "last_over_time", "ln", "log2", "log10", "max_over_time",
    "min_over_time", "predict_linear", "quantile_over_time", "rate", "resets", "round",
    "scalar", "sort", "sort_desc", "sqrt", "stddev_over_time", "sum_over_time", "time",
    "timestamp", "vector",
})
AGGREGATIONS = frozenset({"sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk",
                          "bottomk", "quantile", "count_values", "group"})
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on",
                      "ignoring", "group_left", "group_right", "inf", "nan"})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_IDENT = re.compile(r"(?<![\w$.:])([a-zA-Z_:][\w:]*)")


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects (what must exist on some endpoint).

    Label matchers, grouping clauses, ranges and strings are set aside first; every
    identifier left is a function, an aggregation, a keyword or a metric name.  An
    identifier called like a function that PromQL does not know is an error, so a
    typo cannot pass as a metric."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    text = _GROUPING.sub(r"\1 ()", text)
    names: set[str] = set()
    for m in _IDENT.finditer(text):
        word = m.group(1)
        rest = text[m.end():].lstrip()
        if word in KEYWORDS:
            continue
        if rest.startswith("("):
            if word not in FUNCTIONS | AGGREGATIONS:
                raise ValueError(f"unknown function {word!r} in {expr!r}")
            continue
        if word in AGGREGATIONS and rest.startswith(("by", "without")):
            continue
        names.add(word)
    return names


def label_matchers(expr: str) -> list[tuple[str, set[str]]]:
    """``[(metric, {label names its matchers use}), ...]`` for each ``metric{...}``."""
    text = _STRING.sub('""', expr)
    out = []
    for m in re.finditer(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}", text):
        labels = {part.split("=")[0].split("!")[0].strip().rstrip("~")
                  for part in m.group(2).split(",") if part.strip()}
        out.append((m.group(1), labels))
    return out


def load_generator() -> ModuleType:
    # (registered: its dataclasses look their module up)
    return load_script(GRAFANA / "generate.py", "asyncbk_grafana_generate", register=True)


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def dashboard_exprs() -> list[tuple[str, str]]:
    """``[(where, PromQL), ...]`` of every panel query and variable query."""
    out = []
    for name, d in dashboards().items():
        for p in panels(d):
            out += [(f"{name}: {p['title']}", t["expr"]) for t in p["targets"]]
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                m = re.fullmatch(r"label_values\((\w+), *\w+\)", v["query"]["query"])
                assert m, f"{name}: variable {v['name']}: not label_values(metric, label)"
                out.append((f"{name}: variable {v['name']}", m.group(1)))
    return out


def alert_exprs() -> list[tuple[str, str]]:
    doc = YAML(typ="safe").load(ALERTS.read_text())
    return [(f"alert {r['alert']}", r["expr"]) for g in doc["groups"] for r in g["rules"]]


def as_promql(expr: str) -> str:
    """A Grafana query as plain PromQL: its variables replaced by what they stand for."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def check_exprs(tool: str, exprs: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``promtool check rules`` on a rule file with one recording rule per expression."""
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"check:expr_{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "exprs.yml"
    path.write_text(json.dumps(rules, indent=1))  # JSON is YAML
    return subprocess.run([tool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)


# ------------------------------------------------------------------ tests


def test_metric_names_finds_every_metric_and_nothing_else() -> None:
    expr = ('histogram_quantile(0.99, sum by (bookie, le) (rate(asyncbk_a_bucket'
            '{bookie=~"$bookie", le!="x"}[$__rate_interval]))) > on (bookie) group_left () '
            'asyncbk_b and max(asyncbk_c offset 30m) >= 1 - asyncbk_d / up')
    assert metric_names(expr) == {"asyncbk_a_bucket", "asyncbk_b", "asyncbk_c",
                                  "asyncbk_d", "up"}
    assert metric_names("sum without (id) (asyncbk_e) * 60") == {"asyncbk_e"}
    with pytest.raises(ValueError, match="rat"):
        metric_names("rat(asyncbk_x_total[5m])")
    assert label_matchers('rate(m_total{a="1", b=~"x,y"}[5m]) / n{c!="z"}') == [
        ("m_total", {"a", "b"}), ("n", {"c"})]


def test_committed_dashboards_are_what_generate_py_writes() -> None:
    expected = load_generator().rendered()
    committed = {p.name: p.read_text() for p in DASHBOARDS.glob("*.json")}
    assert set(committed) == set(expected), "run python docker/grafana/generate.py"
    for name, text in expected.items():
        assert committed[name] == text, f"{name} is stale: run docker/grafana/generate.py"


def test_the_dashboards_cover_what_operators_watch() -> None:
    titles = {name: {p["title"] for p in panels(d)} for name, d in dashboards().items()}
    assert set(titles) == {"bookies.json", "clients.json", "autorecovery.json",
                           "streams.json"}
    assert {"Adds per second", "Reads per second", "Add latency", "Journal fsync latency",
            "Group commit size (records per fsync)", "Read-only",
            "Read-only reasons in force", "Disk usage per directory"} <= titles["bookies.json"]
    assert {"Append latency", "Ensemble changes", "Quarantined bookies"} \
        <= titles["clients.json"]
    assert {"Under-replicated ledgers", "Ledgers replicated per minute", "Copy rate"} \
        <= titles["autorecovery.json"]
    assert {"Records written per second", "Lag (records)",
            "Lag (age of the oldest unacknowledged record)"} <= titles["streams.json"]


def test_every_panel_has_a_query_on_the_templated_datasource() -> None:
    for name, d in dashboards().items():
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        for p in panels(d):
            where = f"{name}: {p['title']}"
            assert p["targets"], f"{where}: no query"
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            assert p["gridPos"]["x"] >= 0 and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
            for t in p["targets"]:
                assert t["expr"].strip() and t["datasource"]["uid"] == "${datasource}", where
                for var in re.findall(r"\$(\w+)", t["expr"]):
                    assert var.startswith("__") or var in variables, \
                        f"{where}: ${var} is not a variable of the dashboard"


def test_counters_go_through_rate_and_buckets_through_histogram_quantile() -> None:
    for where, expr in dashboard_exprs() + alert_exprs():
        for name in metric_names(expr):
            if name.endswith("_bucket"):
                assert "histogram_quantile(" in expr, f"{where}: raw buckets of {name}"
            if name.endswith(("_total", "_bucket", "_sum", "_count")) \
                    and ": variable " not in where:
                assert re.search(rf"\b(rate|increase|irate)\(\s*{name}\b", expr), \
                    f"{where}: {name} is a counter read without rate() or increase()"


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    tool = promtool()
    exprs = [as_promql(e) for _, e in dashboard_exprs()]
    assert len(exprs) > 50
    done = check_exprs(tool, exprs, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout


def test_the_parse_check_catches_a_broken_query(tmp_path: Path) -> None:
    tool = promtool()
    done = check_exprs(tool, ["sum by (bookie (rate(asyncbk_bookie_add_requests_total[5m]))"],
                       tmp_path)
    assert done.returncode != 0
