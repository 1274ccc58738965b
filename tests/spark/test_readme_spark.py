"""The README's Spark example runs as written (its own SparkSession, in a subprocess: one
SparkContext per process), against the session's LocalCluster, with only the URI and
the namespace replaced."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from asyncbk.stream.position import Position

from .conftest import ClusterThread

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TIMEOUT_S = 180  # Spark's start and one batch read; ~20-40 s seen here
URI_LITERAL = '"etcd://127.0.0.1:2379/asyncbk"'


def spark_block() -> str:
    """The first ```python block of the README's ``## Spark`` section."""
    text = README.read_text()
    start = text.index("\n## Spark\n")
    end = text.index("\n## ", start + 1)
    m = re.search(r"```python\n(.*?)```", text[start:end], re.DOTALL)
    assert m is not None, "the README's Spark section has no python example"
    return m.group(1)


def test_the_readme_spark_example_is_self_contained() -> None:
    code = spark_block()
    assert "SparkSession" in code and "PYSPARK_PYTHON" in code, code
    assert code.count(URI_LITERAL) == 1 and code.count('"orders"') == 1, code


def test_the_readme_spark_example_runs(spark_cluster: ClusterThread, ns: str,
                                       tmp_path: Path) -> None:
    async def write() -> list[Position]:
        assert spark_cluster.bk is not None
        nsobj = await spark_cluster.bk.namespace(ns)
        await nsobj.create_stream("eu")
        async with await nsobj.open_writer("eu") as w:
            futures = [w.write_nowait(b"order %d" % i) for i in range(5)]
            return [await f for f in futures]

    positions = spark_cluster.run(write())
    code = spark_block().replace(URI_LITERAL, f'"{spark_cluster.metadata_uri}"')
    code = code.replace('"orders"', f'"{ns}"')
    env = dict(os.environ, PYTHONUNBUFFERED="1", SPARK_LOCAL_IP="127.0.0.1")
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=TIMEOUT_S, env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the README's Spark example did not finish in {TIMEOUT_S} s: {exc}")
    assert r.returncode == 0, r.stderr[-4000:]
    header = [line for line in r.stdout.splitlines() if line.startswith("|stream")]
    assert header and "position" in header[0] and "data" in header[0], r.stdout
    rows = [line for line in r.stdout.splitlines()
            if line.replace(" ", "").startswith("|eu|")]
    assert len(rows) == len(positions) == 5, r.stdout
    for pos, row in zip(positions, rows, strict=True):
        assert str(pos) in row, (pos, row)
