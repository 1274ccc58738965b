"""The exactly-once asyncbk sink (``writeStream.format("asyncbk")`` and ``df.write``).

The protocol tests call the writer objects the way Spark does, in this process (tasks'
``write``, the driver's ``commit``/``abort`` with a batch id, a ``sinkId`` in place of
the query id), against real etcd and bookies, and stop at each crash point of the
protocol: tasks wrote but nothing was committed, the commit landed but Spark did not
record it, an abort, a task attempt that died mid-write.  After each, the target stream
(read with the asyncbk stream API) holds every row exactly once, in batch order, and
the ledgers staged by replays, aborts and dead attempts are gone.

Then real queries: a streaming query killed by a failing UDF and restarted (and a
batch replayed after its commit), txids (one per batch by default; a given ``txid``
column must not decrease), and a plain StreamWriter fenced by a Spark commit.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from asyncbk.errors import InvalidTxidError, NoSuchLedgerError, WriterFencedError
from asyncbk.spark import AsyncbkDataSource
from asyncbk.stream import Position, StreamRecord

if TYPE_CHECKING:
    from .conftest import ClusterThread

pytestmark = pytest.mark.spark

QUERY_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 30.0


# ---------------------------------------------------------------------- helpers


def sink_options(sc: ClusterThread, ns: str, stream: str, sink_id: str = "sink-1"
                 ) -> dict[str, str]:
    return {"metadataUri": sc.metadata_uri, "namespace": ns, "stream": stream,
            "sinkId": sink_id}


def stream_writer(sc: ClusterThread, ns: str, stream: str, sink_id: str = "sink-1") -> Any:
    """A fresh driver's stream writer (as after a restart): a new data source object."""
    return AsyncbkDataSource(sink_options(sc, ns, stream, sink_id)).streamWriter(None, False)


def rows(prefix: str, n: int) -> list[Row]:
    return [Row(data=f"{prefix}-{i}".encode()) for i in range(n)]


def payloads(part: list[Row]) -> list[bytes]:
    return [r.data for r in part]


def read_stream(sc: ClusterThread, ns: str, stream: str) -> list[StreamRecord]:
    """Every record of ``stream`` from its start: up to the last position of its
    completed segments, then whatever else comes within a short wait."""

    async def go() -> list[StreamRecord]:
        assert sc.bk is not None
        nsobj = await sc.bk.namespace(ns)
        if not await nsobj.stream_exists(stream):
            return []
        last = (await nsobj.stream_info(stream)).last_position
        out: list[StreamRecord] = []
        async with await nsobj.open_reader(stream, start=Position.EARLIEST) as r:
            async with asyncio.timeout(READ_TIMEOUT_S):
                while last is not None and (not out or out[-1].position < last):
                    out += await r.read_batch(1000, wait_s=1.0)
            while got := await r.read_batch(1000, wait_s=0.3):
                out += got
        return out

    return sc.run(go())


def ledger_ids(sc: ClusterThread) -> set[int]:
    async def go() -> set[int]:
        assert sc.bk is not None
        return {lid async for lid in sc.bk.list_ledgers()}

    return sc.run(go())


def ledger_exists(sc: ClusterThread, ledger_id: int) -> bool:
    async def go() -> bool:
        assert sc.bk is not None
        try:
            await sc.bk.ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            return False
        return True

    return sc.run(go())


def staged(msgs: list[Any]) -> list[int]:
    """The ledger ids staged by the tasks (AsyncbkCommitMessage.staged: a StagedLedger
    as a dict per stream written; empty for a task without rows)."""
    return [s["ledger_id"] for m in msgs for s in m.staged.values()]


def segment_ledgers(sc: ClusterThread, ns: str, stream: str) -> list[int]:
    async def go() -> list[int]:
        assert sc.bk is not None
        info = await (await sc.bk.namespace(ns)).stream_info(stream)
        return [s.ledger_id for s in info.segments]

    return sc.run(go())


def assert_gone(sc: ClusterThread, ledgers: list[int] | set[int], why: str) -> None:
    left = sorted(lid for lid in ledgers if ledger_exists(sc, lid))
    assert not left, f"ledgers staged by {why} still exist: {left}"


def data_of(records: list[StreamRecord]) -> list[bytes]:
    return [r.data for r in records]


# ---------------------------------------------------------------------- protocol


def test_crash_after_tasks_before_commit(spark_cluster: ClusterThread, ns: str) -> None:
    """(a) The tasks of batch 0 wrote, the driver died before the commit: nothing is
    visible.  The restarted driver's replay writes the batch again and commits it: each
    row once, in partition order, the replay's ledgers are the stream's segments and the
    dead driver's staged ledgers were swept by that commit."""
    p0, p1 = rows("a0", 5), rows("a1", 3)
    dead = stream_writer(spark_cluster, ns, "out")
    lost = [dead.write(iter(p0)), dead.write(iter(p1))]
    assert all(ledger_exists(spark_cluster, lid) for lid in staged(lost))
    assert read_stream(spark_cluster, ns, "out") == []

    w = stream_writer(spark_cluster, ns, "out")
    msgs = [w.write(iter(p0)), w.write(iter(p1))]
    w.commit(msgs, 0)
    assert data_of(read_stream(spark_cluster, ns, "out")) == payloads(p0) + payloads(p1)
    assert segment_ledgers(spark_cluster, ns, "out")[-2:] == staged(msgs)
    assert_gone(spark_cluster, staged(lost), "the driver that died before its commit")

    p2 = rows("b1", 4)
    msgs = [w.write(iter(p2))]
    w.commit(msgs, 1)
    assert data_of(read_stream(spark_cluster, ns, "out")) == \
        payloads(p0) + payloads(p1) + payloads(p2)


def test_crash_after_commit_replay_adds_nothing(spark_cluster: ClusterThread, ns: str) -> None:
    """(b) Batch 0's commit landed but Spark did not record it: the restarted driver
    replays batch 0 (tasks write again, commit with the same batch id): nothing is added
    and the replay's staged ledgers are deleted; the next batch is committed after it."""
    p0, p1 = rows("a0", 4), rows("a1", 6)
    w = stream_writer(spark_cluster, ns, "out")
    w.commit([w.write(iter(p0)), w.write(iter(p1))], 0)
    first = read_stream(spark_cluster, ns, "out")
    assert data_of(first) == payloads(p0) + payloads(p1)

    w2 = stream_writer(spark_cluster, ns, "out")
    replay = [w2.write(iter(p0)), w2.write(iter(p1))]
    w2.commit(replay, 0)
    assert read_stream(spark_cluster, ns, "out") == first
    assert_gone(spark_cluster, staged(replay), "a replay of a committed batch")

    p2 = rows("b0", 3)
    w2.commit([w2.write(iter(p2))], 1)
    assert data_of(read_stream(spark_cluster, ns, "out")) == \
        payloads(p0) + payloads(p1) + payloads(p2)


def test_abort_leaves_nothing(spark_cluster: ClusterThread, ns: str) -> None:
    """(c) An aborted batch is invisible and its staged ledgers are deleted; the same
    batch id committed afterwards (Spark's retry) is visible once."""
    p0 = rows("a0", 5)
    w = stream_writer(spark_cluster, ns, "out")
    w.commit([w.write(iter(p0))], 0)

    p1, p2 = rows("b0", 3), rows("b1", 3)
    aborted = [w.write(iter(p1)), w.write(iter(p2))]
    w.abort(aborted, 1)
    assert data_of(read_stream(spark_cluster, ns, "out")) == payloads(p0)
    assert_gone(spark_cluster, staged(aborted), "an aborted batch")

    w.commit([w.write(iter(p1)), w.write(iter(p2))], 1)
    assert data_of(read_stream(spark_cluster, ns, "out")) == \
        payloads(p0) + payloads(p1) + payloads(p2)


DIE_MID_WRITE = textwrap.dedent("""
    import json, os, signal, sys
    from pyspark.sql import Row
    from asyncbk.spark import AsyncbkDataSource
    w = AsyncbkDataSource(json.loads(sys.argv[1])).streamWriter(None, False)
    def rows():
        for i in range(20000):
            if i == 15000:
                os.kill(os.getpid(), signal.SIGKILL)
            yield Row(data=b"doomed-%d" % i + b"." * 100)
    w.write(rows())
""")


def test_task_attempt_dead_mid_write_is_swept(spark_cluster: ClusterThread, ns: str) -> None:
    """(d) Task attempts that failed mid-write: one whose row iterator raised, one whose
    process was SIGKILLed while writing (its ledger left open and staged).  Neither
    is ever visible, and the commit of the retried batch sweeps their ledgers."""
    p0 = rows("a0", 5)
    w = stream_writer(spark_cluster, ns, "out")
    w.commit([w.write(iter(p0))], 0)
    before = ledger_ids(spark_cluster)

    def failing() -> Iterator[Row]:
        yield from rows("broken", 50)
        raise RuntimeError("task attempt failed")

    with pytest.raises(RuntimeError, match="task attempt failed"):
        w.write(failing())
    proc = subprocess.run(
        [sys.executable, "-c", DIE_MID_WRITE,
         json.dumps(sink_options(spark_cluster, ns, "out"))],
        capture_output=True, timeout=60, env=os.environ.copy())
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    leftovers = ledger_ids(spark_cluster) - before
    assert leftovers, "the killed attempt left its staged ledger"
    assert data_of(read_stream(spark_cluster, ns, "out")) == payloads(p0)

    p1, p2 = rows("b0", 4), rows("b1", 4)
    msgs = [w.write(iter(p1)), w.write(iter(p2))]
    w.commit(msgs, 1)
    assert data_of(read_stream(spark_cluster, ns, "out")) == \
        payloads(p0) + payloads(p1) + payloads(p2)
    assert_gone(spark_cluster, leftovers, "failed task attempts")
    assert ledger_ids(spark_cluster) - before == set(staged(msgs))


# ---------------------------------------------------------------------- real queries


def put(sc: ClusterThread, ns: str, stream: str, n: int, prefix: str,
        rolling_entries: int | None = None) -> list[bytes]:
    """Create ``stream`` and write ``n`` records ``<prefix>-<i>``; returns the payloads."""

    async def go() -> list[bytes]:
        assert sc.bk is not None
        nsobj = await sc.bk.namespace(ns)
        await nsobj.create_stream(
            stream, **({} if rolling_entries is None else {"rolling_entries": rolling_entries}))
        data = [f"{prefix}-{i}".encode() for i in range(n)]
        async with await nsobj.open_writer(stream) as w:
            for lo in range(0, n, 20):
                for fut in [w.write_nowait(d) for d in data[lo:lo + 20]]:
                    await fut
        return data

    return sc.run(go())


def activate(spark: SparkSession) -> None:
    """Make ``spark`` the active session of this thread's JVM peer again.

    ``writeStream.format(<a Python data source>)`` finds the source through the JVM
    thread's active session.  A subprocess started from a uvloop thread (the cluster
    fixture starting bookies) breaks this thread's py4j connection; the new one is
    served by a JVM thread without an active session, and the lookup then fails with
    DATA_SOURCE_NOT_FOUND."""
    jvm = spark._jvm
    assert jvm is not None
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def run_query(df: DataFrame, sc: ClusterThread, ns: str, out: str, ckpt: Path) -> None:
    """An availableNow query writing ``df`` to ``out`` (bounded; raises its failure)."""
    activate(df.sparkSession)
    q = (df.writeStream.format("asyncbk").option("metadataUri", sc.metadata_uri)
         .option("namespace", ns).option("stream", out)
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(QUERY_TIMEOUT_S), \
            f"query not done after {QUERY_TIMEOUT_S}s: {q.status}"
    finally:
        q.stop()


def test_streaming_query_killed_and_restarted(spark: SparkSession,
                                              spark_cluster: ClusterThread, ns: str,
                                              tmp_path: Path) -> None:
    """A streaming query from a source stream to ``format("asyncbk")`` in batches of
    100 records (2 partitions each) is killed in its second batch by a UDF failing on
    its first attempt, then restarted from the checkpoint: the out stream holds each
    input record once, in order, with one txid per batch.  Then the last batch's commit
    record is removed from the checkpoint (as if the driver died between the sink's
    commit and Spark's): the restart replays that batch and nothing is added."""
    expected = put(spark_cluster, ns, "in", 200, "in", rolling_entries=5)
    flag = str(tmp_path / "udf-failed")

    def fail_once(data: bytes) -> bytes:
        if bytes(data) == b"in-150" and not os.path.exists(flag):
            open(flag, "w").close()
            raise RuntimeError("injected UDF failure")
        return bytes(data)

    udf = F.udf(fail_once, BinaryType(), useArrow=False)  # a plain UDF: nothing to infer
    df = (spark.readStream.format("asyncbk").option("metadataUri", spark_cluster.metadata_uri)
          .option("namespace", ns).option("streams", "in")
          .option("startingPositions", "earliest").option("maxRecordsPerTrigger", "100")
          .option("maxRecordsPerPartition", "50").load()
          .select(udf(F.col("data")).alias("data")))
    ckpt = tmp_path / "ckpt"
    with pytest.raises(StreamingQueryException) as exc_info:
        run_query(df, spark_cluster, ns, "out", ckpt)
    assert "injected UDF failure" in str(exc_info.value)
    assert os.path.exists(flag)
    partial = read_stream(spark_cluster, ns, "out")
    assert data_of(partial) == expected[:len(partial)], "only whole batches, in order"
    assert len(partial) < 200

    run_query(df, spark_cluster, ns, "out", ckpt)
    out = read_stream(spark_cluster, ns, "out")
    assert data_of(out) == expected
    txids = [r.txid for r in out]
    assert txids == sorted(txids), "txids are non-decreasing"
    assert len(set(txids)) >= 2, "one txid per batch"

    commits = sorted((p for p in (ckpt / "commits").iterdir() if p.name.isdigit()),
                     key=lambda p: int(p.name))
    last = commits[-1]
    last.unlink()
    crc = last.with_name(f".{last.name}.crc")
    if crc.exists():
        crc.unlink()
    before = ledger_ids(spark_cluster)
    run_query(df, spark_cluster, ns, "out", ckpt)
    assert (ckpt / "commits" / last.name).exists(), "the batch was replayed"
    assert read_stream(spark_cluster, ns, "out") == out
    assert ledger_ids(spark_cluster) - before == set(), "the replay's ledgers were deleted"


def batch_write(spark: SparkSession, sc: ClusterThread, ns: str, out: str, df: DataFrame
                ) -> None:
    (df.write.format("asyncbk").option("metadataUri", sc.metadata_uri)
     .option("namespace", ns).option("stream", out).mode("append").save())


def two_partitions(spark: SparkSession, data: list[tuple[bytes, int]] | list[bytes]
                   ) -> DataFrame:
    """A DataFrame whose first half is partition 0 and second half partition 1."""
    if data and isinstance(data[0], tuple):
        return spark.createDataFrame(spark.sparkContext.parallelize(data, 2),
                                     "data binary, txid long")
    return spark.createDataFrame(spark.sparkContext.parallelize([(d,) for d in data], 2),
                                 "data binary")


def test_txids(spark: SparkSession, spark_cluster: ClusterThread, ns: str) -> None:
    """Without a ``txid`` column every row of a write gets one txid, the stream's last
    + 1, so txids are one per batch and increasing and ``open_reader(txid=)`` finds a
    batch's first row.  A ``txid`` column is kept as given; one that decreases across
    partitions, or goes below the stream's last txid, fails the commit with a message
    saying so, leaving nothing visible and no ledger behind."""
    first = [b"w1-%d" % i for i in range(6)]
    second = [b"w2-%d" % i for i in range(4)]
    batch_write(spark, spark_cluster, ns, "out", two_partitions(spark, first))
    batch_write(spark, spark_cluster, ns, "out", two_partitions(spark, second))
    recs = read_stream(spark_cluster, ns, "out")
    assert data_of(recs) == first + second
    t1, t2 = {r.txid for r in recs[:6]}, {r.txid for r in recs[6:]}
    assert len(t1) == 1 and len(t2) == 1 and max(t1) < min(t2), (t1, t2)

    async def from_txid(txid: int) -> bytes:
        assert spark_cluster.bk is not None
        nsobj = await spark_cluster.bk.namespace(ns)
        async with await nsobj.open_reader("out", txid=txid) as r:
            return (await r.read_next()).data

    assert spark_cluster.run(from_txid(min(t2))) == second[0]

    given = [(b"g-0", 100), (b"g-1", 101), (b"g-2", 102), (b"g-3", 103)]
    batch_write(spark, spark_cluster, ns, "out", two_partitions(spark, given))
    recs = read_stream(spark_cluster, ns, "out")
    assert [(r.data, r.txid) for r in recs[10:]] == given

    before = ledger_ids(spark_cluster)
    decreasing = [(b"d-0", 200), (b"d-1", 201), (b"d-2", 150), (b"d-3", 151)]
    with pytest.raises((PySparkException, Py4JJavaError)) as exc_info:
        batch_write(spark, spark_cluster, ns, "out", two_partitions(spark, decreasing))
    message = str(exc_info.value)
    assert "txid" in message and "150" in message, message
    assert read_stream(spark_cluster, ns, "out") == recs
    assert ledger_ids(spark_cluster) - before == set(), "the failed write's ledgers are gone"

    # Below the stream's last txid (103), through the writer objects as Spark calls
    # them: the tasks write, the commit refuses, Spark aborts.
    schema = StructType([StructField("data", BinaryType()), StructField("txid", LongType())])
    w = AsyncbkDataSource(sink_options(spark_cluster, ns, "out")).writer(schema, False)
    msgs = [w.write(iter([Row(data=b"l-0", txid=50), Row(data=b"l-1", txid=51)]))]
    with pytest.raises(InvalidTxidError, match="103") as exc_info2:
        w.commit(msgs)
    assert "50" in str(exc_info2.value)
    w.abort(msgs)
    assert read_stream(spark_cluster, ns, "out") == recs
    assert ledger_ids(spark_cluster) - before == set(), "the aborted write's ledgers are gone"


def open_plain_writer(sc: ClusterThread, ns: str, stream: str, n: int
                      ) -> tuple[Any, list[bytes]]:
    """Create ``stream``, open a plain StreamWriter on it and have ``n`` records
    acknowledged (the writer stays open)."""

    async def go() -> tuple[Any, list[bytes]]:
        assert sc.bk is not None
        nsobj = await sc.bk.namespace(ns)
        await nsobj.create_stream(stream)
        w = await nsobj.open_writer(stream)
        data = [b"plain-%d" % i for i in range(n)]
        for fut in [w.write_nowait(d) for d in data]:
            await fut
        return w, data

    return sc.run(go())


def test_spark_commit_with_txids_fences_plain_writer(spark_cluster: ClusterThread,
                                                     ns: str) -> None:
    """The same fencing with a ``txid`` column above the plain writer's txids (a
    streaming commit through the writer objects): the commit completes the plain
    writer's open segment, whose next write fails with WriterFencedError; all it had
    acknowledged stays, before the committed rows."""
    w, acked = open_plain_writer(spark_cluster, ns, "out", 20)
    try:
        schema = StructType([StructField("data", BinaryType()),
                             StructField("txid", LongType())])
        sw = AsyncbkDataSource(sink_options(spark_cluster, ns, "out")).streamWriter(schema,
                                                                                    False)
        part = [Row(data=b"spark-%d" % i, txid=1000 + i) for i in range(5)]
        sw.commit([sw.write(iter(part))], 0)
        with pytest.raises(WriterFencedError):
            spark_cluster.run(w.write(b"late"))
    finally:
        spark_cluster.run(w.abort())
    recs = read_stream(spark_cluster, ns, "out")
    assert data_of(recs) == acked + payloads(part)
    assert [r.txid for r in recs[20:]] == [1000 + i for i in range(5)]


def test_spark_commit_fences_plain_writer(spark: SparkSession, spark_cluster: ClusterThread,
                                          ns: str) -> None:
    """A plain StreamWriter open on the sink's stream is fenced by a Spark commit (rows
    with default txids): its next write fails with WriterFencedError, every record it
    had acknowledged is kept (before the Spark rows), and nothing it wrote after is
    visible."""
    w, acked = open_plain_writer(spark_cluster, ns, "out", 20)
    try:
        spark_rows = [b"spark-%d" % i for i in range(10)]
        batch_write(spark, spark_cluster, ns, "out", two_partitions(spark, spark_rows))
        with pytest.raises(WriterFencedError):
            spark_cluster.run(w.write(b"late"))
    finally:
        spark_cluster.run(w.abort())
    recs = read_stream(spark_cluster, ns, "out")
    assert data_of(recs) == acked + spark_rows
    txids = [r.txid for r in recs]
    assert txids == sorted(txids)
