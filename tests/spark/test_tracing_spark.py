"""A Spark read with the option ``tracing``: each read task's ``asyncbk.spark.read`` span,
with the client's read spans under it, exported by the Python workers as their
``ASYNCBK_OTEL_EXPORTER`` says.  The job runs in a subprocess (its own SparkContext and
Python workers, which take the variable from their parent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed: "
                    "pip install -e '.[test]'")

from .conftest import ClusterThread

pytestmark = pytest.mark.spark

TIMEOUT_S = 180
RECORDS = 300

JOB = """
import sys, time
from asyncbk.spark import local_session

spark = local_session("tracing", "local[2]")
df = (spark.read.format("asyncbk").option("metadataUri", sys.argv[1])
      .option("namespace", sys.argv[2]).option("streams", "s")
      .option("maxRecordsPerPartition", "100").option("tracing", "true").load())
print("rows", df.count())
time.sleep(1.0)  # the workers' batch exporters (every 100 ms here) write their spans
spark.stop()
"""


def test_a_traced_read_has_a_span_per_task_with_its_reads_under_it(
        spark_cluster: ClusterThread, ns: str, tmp_path: Path) -> None:
    async def write() -> None:
        assert spark_cluster.bk is not None
        nsobj = await spark_cluster.bk.namespace(ns)
        await nsobj.create_stream("s")
        async with await nsobj.open_writer("s") as w:
            for f in [w.write_nowait(b"r%d" % i) for i in range(RECORDS)]:
                await f

    spark_cluster.run(write())
    spans_file = tmp_path / "spans.jsonl"
    env = dict(os.environ, PYTHONUNBUFFERED="1", SPARK_LOCAL_IP="127.0.0.1",
               ASYNCBK_OTEL_EXPORTER=f"jsonl:{spans_file}", OTEL_BSP_SCHEDULE_DELAY="100")
    try:
        r = subprocess.run([sys.executable, "-c", JOB, spark_cluster.metadata_uri, ns],
                           capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
                           cwd=tmp_path)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the traced Spark job did not finish in {TIMEOUT_S} s: {exc}")
    assert r.returncode == 0, r.stderr[-4000:]
    assert f"rows {RECORDS}" in r.stdout, r.stdout
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    assert {s["service"] for s in spans} == {"asyncbk-spark"}
    tasks = [s for s in spans if s["name"] == "asyncbk.spark.read"]
    assert len(tasks) >= 3, [s["name"] for s in spans]  # 300 records, 100 a partition
    assert sum(s["attributes"]["asyncbk.records"] for s in tasks) == RECORDS
    assert all(s["attributes"]["asyncbk.namespace"] == ns for s in tasks)
    for task in tasks:
        reads = [s for s in spans if s["parent_id"] == task["span_id"]]
        assert reads and {s["name"] for s in reads} == {"asyncbk.read"}, task
        assert all(s["trace_id"] == task["trace_id"] for s in reads)
        assert all(task["start_ns"] <= s["start_ns"] <= s["end_ns"] <= task["end_ns"]
                   for s in reads)
