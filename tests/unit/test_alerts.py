"""docker/prometheus/: the alert rules pass ``promtool check rules`` and their unit
tests (``promtool test rules alerts_test.yml``), every alert is shown firing there,
every rule has a ``for:``, a severity and a summary and description, and the example
scrape configuration passes ``promtool check config``.  Without promtool (Debian and
Ubuntu ship it in the ``prometheus`` package; .ci/run installs it) the promtool
tests are skipped, saying so."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML  # a direct test dependency (pyproject's test extra)

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "docker" / "prometheus"


def promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool is not installed (Debian/Ubuntu: apt-get install prometheus; "
                    ".ci/run installs it)")
    return tool


def run(*argv: str, cwd: Path = PROMETHEUS) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=120,
                          check=False)


def rules() -> list[dict[str, Any]]:
    doc = YAML(typ="safe").load((PROMETHEUS / "alerts.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_the_rules_pass_promtool_check() -> None:
    done = run(promtool(), "check", "rules", "alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_the_rules_pass_their_unit_tests() -> None:
    done = run(promtool(), "test", "rules", "alerts_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_unit_tests_catch_a_changed_rule(tmp_path: Path) -> None:
    """A rule that waits longer than its test expects makes ``promtool test rules``
    fail: the tests pin the rules down."""
    tool = promtool()
    text = (PROMETHEUS / "alerts.yml").read_text()
    changed = text.replace("expr: up{job=\"asyncbk-bookies\"} == 0\n        for: 2m",
                           "expr: up{job=\"asyncbk-bookies\"} == 0\n        for: 10m")
    assert changed != text
    (tmp_path / "alerts.yml").write_text(changed)
    shutil.copy(PROMETHEUS / "alerts_test.yml", tmp_path / "alerts_test.yml")
    done = run(tool, "test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert done.returncode != 0
    assert "AsyncbkBookieDown" in done.stdout + done.stderr


def test_the_example_scrape_config_is_valid() -> None:
    done = run(promtool(), "check", "config", "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_wait_a_severity_and_what_to_do() -> None:
    names = [r["alert"] for r in rules()]
    assert len(names) == len(set(names)), "an alert name is used twice"
    for r in rules():
        where = r["alert"]
        assert re.fullmatch(r"Asyncbk[A-Z]\w+", where)
        assert re.fullmatch(r"\d+[smh]", r["for"]), f"{where}: for: {r.get('for')!r}"
        assert r["labels"]["severity"] in {"warning", "critical"}, where
        assert r["annotations"]["summary"].strip(), where
        assert len(r["annotations"]["description"]) > 80, f"{where}: say what to do"


def test_every_alert_is_tested_firing_and_quiet() -> None:
    tests = YAML(typ="safe").load((PROMETHEUS / "alerts_test.yml").read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for t in tests:
        for case in t["alert_rule_test"]:
            (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {r["alert"] for r in rules()}
    assert names - firing == set(), "alerts never shown firing"
    assert names - quiet == set(), "alerts never shown quiet"


def test_the_alert_list_in_the_docs_is_complete() -> None:
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    for name in (r["alert"] for r in rules()):
        assert f"`{name}`" in doc, f"{name} is not explained in docs/monitoring.md"
