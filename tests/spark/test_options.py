"""Options of ``format("asyncbk")`` given wrongly: each fails with one clear message.

Missing or conflicting options, unknown streams, unparsable positions and numbers,
options that do not apply (``endingPositions`` or ``ledgers`` on a streaming read), bad
writes, and an unreachable metadata store (within a bounded time).  After all of it
the cluster still serves a good read.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from .conftest import ClusterThread

pytestmark = pytest.mark.spark

URI = "<uri>"
NS = "<ns>"
UNREACHABLE = "etcd://127.0.0.1:1/x"
UNREACHABLE_BOUND_S = 30.0
STREAM_WAIT_S = 60.0


@dataclass
class Target:
    uri: str
    ns: str
    records: dict[str, int]


@pytest.fixture(scope="module")
def target(spark_cluster: ClusterThread) -> Target:
    """A namespace with two small streams, ``alpha`` and ``beta``."""
    cs = spark_cluster
    ns = f"o{uuid.uuid4().hex[:10]}"
    counts = {"alpha": 12, "beta": 5}

    async def build() -> None:
        assert cs.bk is not None
        nsobj = await cs.bk.namespace(ns, create=True, ensemble_size=3, write_quorum=2,
                                      ack_quorum=2)
        for name, n in counts.items():
            await nsobj.create_stream(name)
            async with await nsobj.open_writer(name) as w:
                for i in range(n):
                    w.write_nowait(b"%s-%d" % (name.encode(), i))
                await w.flush()

    cs.run(build())
    return Target(cs.metadata_uri, ns, counts)


def options(t: Target, opts: dict[str, Any]) -> dict[str, str]:
    return {k: t.uri if v == URI else t.ns if v == NS else str(v) for k, v in opts.items()}


def spark_error(action: Callable[[], Any]) -> str:
    """The text of the error ``action()`` raises (Spark wraps ours in its own)."""
    try:
        action()
    except (PySparkException, Py4JJavaError) as exc:
        return str(exc)
    pytest.fail("expected an error")


def assert_says(text: str, *fragments: str) -> None:
    low = text.lower()
    missing = [f for f in fragments if f.lower() not in low]
    assert not missing, f"{missing} not in the error:\n{text[:3000]}"


def batch_read(spark: SparkSession, opts: dict[str, str]) -> DataFrame:
    r = spark.read.format("asyncbk")
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def stream_error(spark: SparkSession, opts: dict[str, str], ckpt: Path) -> str:
    """The error a streaming query with ``opts`` fails with (start or first batch)."""
    def run() -> None:
        r = spark.readStream.format("asyncbk")
        for k, v in opts.items():
            r = r.option(k, v)
        q = (r.load().writeStream.format("noop").option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
        try:
            if q.awaitTermination(STREAM_WAIT_S) is False:
                pytest.fail(f"the streaming query neither failed nor ended in {STREAM_WAIT_S} s")
        finally:
            q.stop()
    return spark_error(run)


def good_read(spark: SparkSession, t: Target) -> None:
    rows = batch_read(spark, options(t, {"metadataUri": URI, "namespace": NS,
                                          "streams": "alpha,beta"})).collect()
    assert sorted(bytes(r.data) for r in rows) == sorted(
        b"%s-%d" % (name.encode(), i) for name, n in t.records.items() for i in range(n))


# ---------------------------------------------------------------------- batch reads

BAD_BATCH = [
    pytest.param({"namespace": NS, "streams": "alpha"}, ["metadataUri"], id="no-metadataUri"),
    pytest.param({"metadataUri": URI, "streams": "alpha"}, ["namespace"], id="no-namespace"),
    pytest.param({"metadataUri": URI, "namespace": NS},
                 ["streams", "streamsPattern", "ledgers"], id="no-selection"),
    pytest.param({"metadataUri": URI, "namespace": NS, "streams": "alpha",
                  "streamsPattern": "a.*"}, ["streams", "streamsPattern"], id="streams+pattern"),
    pytest.param({"metadataUri": URI, "namespace": NS, "streams": "alpha", "ledgers": "1"},
                 ["streams", "ledgers"], id="streams+ledgers"),
    pytest.param({"metadataUri": URI, "namespace": NS, "streams": "alpha,no-such-stream"},
                 ["no-such-stream"], id="unknown-stream"),
    pytest.param({"metadataUri": URI, "namespace": NS, "streams": "alpha",
                  "startingPositions": '{"alpha": '}, ["startingPositions", "JSON"],
                 id="bad-json"),
    pytest.param({"metadataUri": URI, "namespace": NS, "streams": "alpha",
                  "endingPositions": "[1, 2]"}, ["endingPositions"], id="json-not-object"),
    pytest.param({"metadataUri": URI, "namespace": NS, "streams": "alpha",
                  "startingPositions": '{"alpha": "1:x:0"}'}, ["startingPositions", "1:x:0"],
                 id="bad-position"),
    pytest.param({"metadataUri": URI, "namespace": NS, "streams": "alpha",
                  "startingPositions": '{"alpha": {"txid": "soon"}}'},
                 ["startingPositions", "txid"], id="bad-txid"),
    pytest.param({"metadataUri": URI, "namespace": NS, "streams": "alpha",
                  "startingPositions": '{"beta": "earliest"}'}, ["beta", "startingPositions"],
                 id="position-of-unselected-stream"),
    pytest.param({"metadataUri": URI, "namespace": NS, "streams": "alpha",
                  "maxRecordsPerPartition": "lots"}, ["maxRecordsPerPartition", "lots"],
                 id="maxRecordsPerPartition-word"),
    pytest.param({"metadataUri": URI, "namespace": NS, "streams": "alpha",
                  "maxRecordsPerPartition": "1.5"}, ["maxRecordsPerPartition", "1.5"],
                 id="maxRecordsPerPartition-fraction"),
    pytest.param({"metadataUri": URI, "namespace": NS, "streams": "alpha",
                  "maxRecordsPerPartition": "-1"}, ["maxRecordsPerPartition", "-1"],
                 id="maxRecordsPerPartition-negative"),
    pytest.param({"metadataUri": URI, "namespace": NS, "streams": "alpha",
                  "failOnDataLoss": "maybe"}, ["failOnDataLoss", "maybe"], id="failOnDataLoss"),
    pytest.param({"metadataUri": URI, "ledgers": "12,abc"}, ["ledgers", "abc"],
                 id="ledger-id-not-int"),
]


@pytest.mark.parametrize(("opts", "says"), BAD_BATCH)
def test_bad_batch_read_options(spark: SparkSession, target: Target, opts: dict[str, Any],
                                says: list[str]) -> None:
    """A batch read with a wrong option fails with a SparkOptionError naming it."""
    text = spark_error(lambda: batch_read(spark, options(target, opts)).collect())
    assert_says(text, "SparkOptionError", *says)


# ---------------------------------------------------------------------- streaming reads

BAD_STREAM = [
    pytest.param({"endingPositions": "latest"}, ["endingPositions"], id="endingPositions"),
    pytest.param({"ledgers": "1,2"}, ["ledgers"], id="ledgers"),
    pytest.param({"maxRecordsPerTrigger": "many"}, ["maxRecordsPerTrigger", "many"],
                 id="maxRecordsPerTrigger-word"),
    pytest.param({"maxRecordsPerTrigger": "-5"}, ["maxRecordsPerTrigger", "-5"],
                 id="maxRecordsPerTrigger-negative"),
]


@pytest.mark.parametrize(("extra", "says"), BAD_STREAM)
def test_bad_streaming_read_options(spark: SparkSession, target: Target, tmp_path: Path,
                                    extra: dict[str, str], says: list[str]) -> None:
    """A streaming read with an option that does not apply or does not parse fails
    (at start or in its first batch, never silently) with a message naming it."""
    opts = {"metadataUri": URI, "namespace": NS, "streams": "alpha", **extra}
    if "ledgers" in extra:
        del opts["streams"]
    text = stream_error(spark, options(target, opts), tmp_path / "ckpt")
    assert_says(text, "SparkOptionError", *says)


# ---------------------------------------------------------------------- writes


def test_write_without_stream_option(spark: SparkSession, target: Target) -> None:
    """A write needs the ``stream`` option; the message says so."""
    df = spark.createDataFrame([(b"x",)], "data binary")

    def write() -> None:
        (df.write.format("asyncbk").option("metadataUri", target.uri)
         .option("namespace", target.ns).mode("append").save())

    text = spark_error(write)
    assert_says(text, "SparkOptionError")
    assert re.search(r"['\"`]?stream['\"`]? option|option ['\"`]?stream\b", text, re.I), text


def test_write_without_data_column(spark: SparkSession, spark_cluster: ClusterThread,
                                   target: Target) -> None:
    """A DataFrame written without a ``data`` column fails, naming the column, and
    writes nothing."""
    df = spark.createDataFrame([(1, "x")], "id long, payload string")

    def write() -> None:
        (df.write.format("asyncbk").option("metadataUri", target.uri)
         .option("namespace", target.ns).option("stream", "nodata").mode("append").save())

    text = spark_error(write)
    assert re.search(r"column (named )?['\"`]?data\b|['\"`]data['\"`] column", text, re.I), text

    async def nodata_records() -> int:
        assert spark_cluster.bk is not None
        nsobj = await spark_cluster.bk.namespace(target.ns)
        if not await nsobj.stream_exists("nodata"):
            return 0
        return sum(s.records for s in (await nsobj.stream_info("nodata")).segments)

    assert spark_cluster.run(nodata_records()) == 0
    good_read(spark, target)


# ---------------------------------------------------------------------- unreachable


def test_unreachable_metadata_store_fails_in_bounded_time(spark: SparkSession,
                                                          target: Target) -> None:
    """A metadataUri nobody answers at fails within a bounded time, saying it cannot
    reach the metadata store (and naming it); then a good read works."""
    started = time.monotonic()
    text = spark_error(lambda: batch_read(spark, {
        "metadataUri": UNREACHABLE, "namespace": target.ns, "streams": "alpha"}).collect())
    elapsed = time.monotonic() - started
    assert elapsed < UNREACHABLE_BOUND_S, f"took {elapsed:.1f} s"
    assert "127.0.0.1:1" in text
    assert re.search(r"(cannot|can't|could not|couldn't|unable to) (reach|connect)|unreachable",
                     text, re.I), text
    assert_says(text, "metadata")
    good_read(spark, target)


def test_cluster_serves_after_the_failures(spark: SparkSession, target: Target) -> None:
    """After wrong options of every kind, a correct read gets every record."""
    for opts in ({"metadataUri": URI, "namespace": NS},
                 {"metadataUri": URI, "namespace": NS, "streams": "nope"}):
        spark_error(lambda o=opts: batch_read(spark, options(target, o)).collect())
    good_read(spark, target)
