"""examples/spark_pipeline.py runs end to end against the session's LocalCluster.

The example starts a SparkSession of its own: it runs as a subprocess (its own JVM),
so it never meets the ``spark`` fixture's session (one SparkContext per process).
A few hundred events, a time bound on everything; the example's summary line must
say that every event produced was counted (windows in append mode: the producer's
closing heartbeat event makes the watermark close every window of real clicks)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ClusterThread

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "spark_pipeline.py"
TIMEOUT_S = 180  # Spark's start (~5 s) and first batches (15-60 s: they start Python
# workers for two queries, slow when the machine is busy); ~60-110 s seen here
SUMMARY = re.compile(r"^summary: produced=(\d+) counted=(\d+) window_page_counts=(\d+) (\w+)$",
                     re.MULTILINE)


def run_example(*args: str, timeout_s: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True,
                              text=True, timeout=timeout_s, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:  # show what it got to
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout
        pytest.fail(f"the example did not finish in {timeout_s} s; its output:\n{out}")


def test_help() -> None:
    r = run_example("--help", timeout_s=60)
    assert r.returncode == 0, r.stderr
    assert "--metadata-uri" in r.stdout and "--records" in r.stdout
    assert "--seconds" in r.stdout


def test_pipeline_counts_every_event(spark_cluster: ClusterThread, ns: str) -> None:
    r = run_example("--metadata-uri", spark_cluster.metadata_uri, "--namespace", ns,
                    "--records", "400", "--rate", "200", "--seconds", "30",
                    "--drain-s", "120")
    output = f"--- stdout\n{r.stdout}\n--- stderr (tail)\n{r.stderr[-4000:]}"
    m = SUMMARY.search(r.stdout)
    assert m is not None, output
    produced, counted, windows, verdict = int(m[1]), int(m[2]), int(m[3]), m[4]
    assert produced == 400, output
    assert counted == produced, output
    assert verdict == "OK" and r.returncode == 0, output
    # 400 events over ~2 s: at least one 5 s window, each of a few pages
    assert windows >= 3, output
    assert "[printer] batch" in r.stdout, output

    # and the counts went through the asyncbk sink into stream page-counts
    bk = spark_cluster.bk
    assert bk is not None

    async def counts_written() -> int:
        namespace = await bk.namespace(ns)
        info = await namespace.stream_info("page-counts")
        return sum(s.records for s in info.segments)

    assert spark_cluster.run(counts_written()) == windows, output
