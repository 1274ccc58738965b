"""Spark, round two: keys, headers and times through the source and the sink, time
bounds, admission limits, the ``subscription`` mirror, rows routed to several
streams in one transaction, and writes from a thread of their own.

Real etcd, bookies and Spark (local mode); the streaming reader and the stream
writer are also driven directly, as Spark's driver calls them, where a test needs
to stop between two of Spark's steps."""

from __future__ import annotations

import datetime
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import Row, SparkSession
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from asyncbk.spark import AsyncbkDataSource, activate_session
from asyncbk.spark.errors import SparkOptionError
from asyncbk.spark.options import read_options
from asyncbk.spark.sink import row_layout
from asyncbk.stream import Position
from asyncbk.stream.reader import resolve_start

from .test_sink import read_stream

if TYPE_CHECKING:
    from .conftest import ClusterThread

pytestmark = pytest.mark.spark

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def write_timed(sc: ClusterThread, ns: str, stream: str, n: int, step_ms: int = 10,
                keyed: bool = True, **overrides: Any) -> list[Position]:
    """``n`` records at times T0, T0 + step, ...; every third with a key and headers."""

    async def go() -> list[Position]:
        assert sc.bk is not None
        nsobj = await sc.bk.namespace(ns)
        if not await nsobj.stream_exists(stream):
            await nsobj.create_stream(stream, **overrides)
        out = []
        async with await nsobj.open_writer(stream) as w:
            for i in range(n):
                extra: dict[str, Any] = {}
                if keyed and i % 3 == 0:
                    extra = {"key": b"k%d" % i, "headers": {"h": b"v%d" % i, "n": b""}}
                out.append(await w.write(b"r%04d" % i, timestamp_ms=T0 + i * step_ms, **extra))
        return out

    return sc.run(go())


def ms_of(t: datetime.datetime) -> int:
    """A datetime as Spark's collect() gives it (naive, local time) in ms since the epoch."""
    return int(t.replace(microsecond=0).timestamp()) * 1000 + t.microsecond // 1000


def seek(sc: ClusterThread, ns: str, stream: str, ts: int) -> Position:
    async def go() -> Position:
        assert sc.bk is not None
        nsobj = await sc.bk.namespace(ns)
        return await resolve_start(nsobj.context, stream, None, None, ts)  # open_reader's

    return sc.run(go())


def read(spark: SparkSession, sc: ClusterThread, ns: str, **options: Any) -> list[Any]:
    r = (spark.read.format("asyncbk").option("metadataUri", sc.metadata_uri)
         .option("namespace", ns))
    for k, v in options.items():
        r = r.option(k, v)
    return sorted(r.load().collect(), key=lambda row: (row.stream, Position.parse(row.position)))


def test_time_bounded_reads_equal_the_stream_layers_seek(
        spark: SparkSession, spark_cluster: ClusterThread, ns: str) -> None:
    """startingTimestamp / endingTimestamp / startingPositionsByTimestamp start and end
    where ``open_reader(timestamp_ms=)`` does; a start past the end reads nothing, an
    end past the end reads to the end; rows carry key, time and (includeHeaders)
    headers."""
    sc = spark_cluster
    pos = write_timed(sc, ns, "a", 60)
    write_timed(sc, ns, "b", 20, step_ms=100)
    lo, hi = T0 + 105, T0 + 333
    rows = read(spark, sc, ns, streams="a", startingTimestamp=lo, endingTimestamp=hi,
                includeHeaders="true")
    first, stop = seek(sc, ns, "a", lo), seek(sc, ns, "a", hi)
    want = [p for p in pos if first <= p < stop]
    assert [Position.parse(r.position) for r in rows] == want and len(want) == 23
    for r in rows:
        i = int(r.data[1:])
        ms = T0 + i * 10
        assert ms_of(r.timestamp) == ms
        if i % 3 == 0:
            assert r.key == b"k%d" % i and r.headers == {"h": b"v%d" % i, "n": b""}
        else:
            assert r.key is None and r.headers == {}
    # Per stream, with precedence over startingPositions; the default for the others.
    rows = read(spark, sc, ns, streams="a,b", startingPositions="latest",
                startingPositionsByTimestamp=f'{{"b": {T0 + 1500}}}')
    assert {r.stream for r in rows} == {"b"} and len(rows) == 5
    # Past the end: nothing to start from, everything to end at.
    assert read(spark, sc, ns, streams="a", startingTimestamp=T0 + 10**9) == []
    assert len(read(spark, sc, ns, streams="a", endingTimestamp=T0 + 10**9)) == 60


def test_keys_headers_and_times_round_trip_through_the_sink(
        spark: SparkSession, spark_cluster: ClusterThread, ns: str) -> None:
    """A DataFrame with key, headers, timestamp and stream columns is written (two
    streams, created on first use, in one commit) and read back the same, through
    Spark and through the stream layer."""
    sc = spark_cluster
    schema = StructType([StructField("stream", StringType()), StructField("key", StringType()),
                         StructField("headers", MapType(StringType(), BinaryType())),
                         StructField("timestamp", TimestampType()),
                         StructField("data", BinaryType())])
    base = datetime.datetime(2026, 3, 1, 12, 0, 0)
    rows = [("x" if i % 2 else "y", None if i % 4 == 0 else f"key-{i}",
             None if i % 5 == 0 else {"i": str(i).encode(), "z": b""},
             base + datetime.timedelta(milliseconds=7 * i), b"d%03d" % i) for i in range(40)]
    (spark.createDataFrame(rows, schema).coalesce(1).write.format("asyncbk")
     .option("metadataUri", sc.metadata_uri).option("namespace", ns)
     .option("createStreams", "true").mode("append").save())
    got = read(spark, sc, ns, streams="x,y", includeHeaders="true")
    assert len(got) == 40
    for r in got:
        i = int(r.data[1:])
        stream, key, headers, ts, _ = rows[i]
        assert r.stream == stream
        assert r.key == (key.encode() if key is not None else None)
        assert r.headers == (headers or {})
        assert r.timestamp == ts
    for stream in ("x", "y"):
        recs = read_stream(sc, ns, stream)
        assert [(r.data, r.key, r.headers) for r in recs] == [
            (d, k.encode() if k else None, h or {}) for s, k, h, _, d in rows if s == stream]
        assert [r.timestamp_ms for r in recs] == [ms_of(t) for s, _, _, t, _ in rows
                                                  if s == stream]


def routed_writer(sc: ClusterThread, ns: str, sink_id: str) -> Any:
    """A fresh driver's stream writer for rows with a stream column (as after a
    restart of the driver)."""
    schema = StructType([StructField("stream", StringType()), StructField("data", BinaryType())])
    opts = {"metadataUri": sc.metadata_uri, "namespace": ns, "sinkId": sink_id,
            "createStreams": "true", "stream": "s0"}
    return AsyncbkDataSource(opts).streamWriter(schema, False)


def test_a_batch_routed_to_three_streams_is_committed_once_in_all(
        spark_cluster: ClusterThread, ns: str) -> None:
    """Rows routed to three streams (and the default one for a null stream) commit in
    one transaction; the driver killed after the commit, before Spark recorded it,
    replays the batch: every row is in its stream exactly once, and the replay's
    staged ledgers are gone."""
    sc = spark_cluster
    batch = [[Row(stream=f"s{(p + i) % 3 + 1}" if i % 7 else None, data=b"p%d-%d" % (p, i))
              for i in range(30)] for p in range(3)]
    first = routed_writer(sc, ns, "q1")
    msgs = [first.write(iter(part)) for part in batch]
    assert all(len(m.staged) == 4 for m in msgs)  # s1, s2, s3 and the default s0
    first.commit(msgs, 0)
    # The driver dies here: Spark's commit log never got batch 0, so it is replayed.
    again = routed_writer(sc, ns, "q1")
    replay = [again.write(iter(part)) for part in batch]
    again.commit(replay, 0)
    for stream in ("s0", "s1", "s2", "s3"):
        want = [r.data for part in batch for r in part if (r.stream or "s0") == stream]
        assert [r.data for r in read_stream(sc, ns, stream)] == want, stream
    # The next batch goes on, in all streams at once.
    nxt = [[Row(stream="s2", data=b"n-%d" % i) for i in range(3)]]
    again.commit([again.write(iter(p)) for p in nxt], 1)
    assert [r.data for r in read_stream(sc, ns, "s2")][-3:] == [b"n-0", b"n-1", b"n-2"]


def test_routing_errors_are_clear_and_commit_nothing(
        spark: SparkSession, spark_cluster: ClusterThread, ns: str) -> None:
    sc = spark_cluster
    from .test_options import assert_says, spark_error

    def write(rows: list[tuple[Any, ...]], schema: str, **options: str) -> None:
        w = (spark.createDataFrame(rows, schema).write.format("asyncbk")
             .option("metadataUri", sc.metadata_uri).option("namespace", ns))
        for k, v in options.items():
            w = w.option(k, v)
        w.mode("append").save()

    text = spark_error(lambda: write([("nope", b"x")], "stream string, data binary"))
    assert_says(text, "SinkCommitError", "nope", "createStreams")
    text = spark_error(lambda: write([(None, b"x")], "stream string, data binary"))
    assert_says(text, "SinkCommitError", "null")
    text = spark_error(lambda: write([(1, b"x")], "stream int, data binary", stream="s"))
    assert_says(text, "SparkOptionError", "column stream")
    text = spark_error(lambda: write([(b"x", 5)], "data binary, headers int", stream="s"))
    assert_says(text, "SparkOptionError", "column headers")

    async def streams() -> list[str]:
        assert sc.bk is not None
        return [s async for s in (await sc.bk.namespace(ns)).list_streams()]

    assert sc.run(streams()) == []  # bad columns fail before the stream option's is made


def stream_reader(sc: ClusterThread, ns: str, **options: Any) -> Any:
    opts = {"metadataUri": sc.metadata_uri, "namespace": ns, **options}
    return AsyncbkDataSource(opts).streamReader(None)  # type: ignore[arg-type]


def records_between(sc: ClusterThread, ns: str, stream: str, start: str, end: str) -> int:
    return sum(1 for r in read_stream(sc, ns, stream)
               if Position.parse(start) <= r.position < Position.parse(end))


def test_min_and_max_records_and_bytes_per_trigger(spark_cluster: ClusterThread,
                                                   ns: str) -> None:
    """As Spark's driver calls the source: a trigger with fewer than
    minRecordsPerTrigger records waiting is skipped until maxTriggerDelay has passed;
    maxRecordsPerTrigger and maxBytesPerTrigger cap a batch."""
    sc = spark_cluster
    write_timed(sc, ns, "m", 5, keyed=False)
    r = stream_reader(sc, ns, streams="m", startingPositions="earliest",
                      minRecordsPerTrigger=10, maxTriggerDelay="2s", maxRecordsPerTrigger=12)
    try:
        limit = r.getDefaultReadLimit()
        start = r.initialOffset()
        end = r.latestOffset(start, limit)  # the first trigger runs (as Kafka's does)
        assert records_between(sc, ns, "m", start["m"], end["m"]) == 5
        start = end
        write_timed(sc, ns, "m", 4, keyed=False)
        assert r.latestOffset(start, limit) == start  # 4 < 10, within the delay: skipped
        write_timed(sc, ns, "m", 20, keyed=False)
        end = r.latestOffset(start, limit)  # 24 waiting: runs, capped at 12
        assert records_between(sc, ns, "m", start["m"], end["m"]) == 12
        start = end
        end = r.latestOffset(start, limit)  # 12 waiting >= 10: runs
        assert records_between(sc, ns, "m", start["m"], end["m"]) == 12
        start = end
        write_timed(sc, ns, "m", 3, keyed=False)
        assert r.latestOffset(start, limit) == start
        time.sleep(2.1)
        end = r.latestOffset(start, limit)  # the delay passed: runs with 3
        assert records_between(sc, ns, "m", start["m"], end["m"]) == 3
    finally:
        r.stop()
    # Bytes: records of 5 bytes of data.
    rb = stream_reader(sc, ns, streams="m", startingPositions="earliest",
                       maxBytesPerTrigger=50)
    try:
        start = rb.initialOffset()
        end = rb.latestOffset(start, rb.getDefaultReadLimit())
        assert records_between(sc, ns, "m", start["m"], end["m"]) == 10
    finally:
        rb.stop()


def test_a_querys_subscription_holds_retention_until_it_catches_up(
        spark_cluster: ClusterThread, ns: str) -> None:
    """With the subscription option, the committed start of the next batch and each
    committed end are published as the subscription (created on first use); retention
    keeps every segment the query still has to read."""
    sc = spark_cluster
    write_timed(sc, ns, "r", 12, keyed=False, rolling_entries=3, retention_s=0.2)

    async def state(retention: bool = True) -> tuple[int, Position | None]:
        assert sc.bk is not None
        nsobj = await sc.bk.namespace(ns)
        if retention:
            await nsobj.apply_retention("r")
        info = await nsobj.stream_info("r")
        subs = {s.name: s for s in await nsobj.subscriptions("r")}
        return len(info.segments), subs["etl"].position if "etl" in subs else None

    r = stream_reader(sc, ns, streams="r", startingPositions="earliest", subscription="etl",
                      maxRecordsPerTrigger=6)
    try:
        start = r.initialOffset()
        total, at = sc.run(state(retention=False))
        assert at is None and total >= 4
        end = r.latestOffset(start, r.getDefaultReadLimit())  # publishes start
        time.sleep(0.3)
        assert sc.run(state()) == (total, Position.parse(start["r"]))  # all kept
        r.commit(end)  # batch 0 committed: 6 records, two whole segments of 3
        time.sleep(0.3)
        assert sc.run(state()) == (total - 2, Position.parse(end["r"]))
    finally:
        r.stop()


def test_bad_round_two_options_are_each_one_clear_error() -> None:
    base = {"metadataUri": "etcd://127.0.0.1:2379/x", "namespace": "n", "streams": "s"}
    bad = [({"maxBytesPerTrigger": "-1"}, True, "maxBytesPerTrigger"),
           ({"minRecordsPerTrigger": "0"}, True, "minRecordsPerTrigger"),
           ({"maxTriggerDelay": "soon", "minRecordsPerTrigger": "5"}, True, "maxTriggerDelay"),
           ({"maxTriggerDelay": "5s"}, True, "minRecordsPerTrigger"),
           ({"minRecordsPerTrigger": "50", "maxRecordsPerTrigger": "10"}, True, "above"),
           ({"startingTimestamp": "yesterday"}, False, "startingTimestamp"),
           ({"startingTimestamp": "-5"}, True, "startingTimestamp"),
           ({"endingTimestamp": "1.5"}, False, "endingTimestamp"),
           ({"endingTimestamp": "100"}, True, "does not apply"),
           ({"startingPositionsByTimestamp": '{"s": "x"}'}, False, "for stream 's'"),
           ({"startingPositionsByTimestamp": "[1]"}, False, "JSON object"),
           ({"includeHeaders": "maybe"}, False, "includeHeaders"),
           ({"subscription": " "}, True, "subscription"),
           ({"subscription": "x"}, False, "does not apply")]
    for extra, streaming, says in bad:
        with pytest.raises(SparkOptionError, match=says):
            read_options({**base, **extra}, streaming=streaming)
    schema = StructType([StructField("data", BinaryType()), StructField("stream", IntegerType())])
    with pytest.raises(SparkOptionError, match="column stream must be a string"):
        row_layout(schema)
    for column, dtype in (("key", IntegerType()), ("timestamp", StringType()),
                          ("headers", MapType(StringType(), IntegerType()))):
        schema = StructType([StructField("data", BinaryType()), StructField(column, dtype)])
        with pytest.raises(SparkOptionError, match=f"column {column} must be"):
            row_layout(schema)


def test_a_write_from_a_thread_of_its_own(spark: SparkSession,
                                          spark_cluster: ClusterThread, ns: str) -> None:
    """A write from a new Python thread (as ``asyncio.to_thread`` runs it) works once
    ``activate_session`` made the session active on that thread's JVM side."""
    sc = spark_cluster
    df = spark.createDataFrame([(b"t%d" % i,) for i in range(5)], "data binary")
    errors: list[BaseException] = []

    def save() -> None:
        try:
            activate_session(df.sparkSession)
            (df.write.format("asyncbk").option("metadataUri", sc.metadata_uri)
             .option("namespace", ns).option("stream", "threaded").mode("append").save())
        except BaseException as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=save)
    t.start()
    t.join(120)
    assert not t.is_alive() and not errors, errors
    assert sorted(r.data for r in read_stream(sc, ns, "threaded")) == \
        [b"t%d" % i for i in range(5)]


def test_a_query_under_byte_and_minimum_limits(spark: SparkSession,
                                               spark_cluster: ClusterThread, ns: str,
                                               tmp_path: Any) -> None:
    """Through Spark (Trigger.AvailableNow): maxBytesPerTrigger cuts 40 records of 5
    bytes into batches of 10; minRecordsPerTrigger never holds an AvailableNow query
    back (it would never finish), and every record is read once."""
    from .test_streaming import Collector, run_available_now, source

    sc = spark_cluster
    write_timed(sc, ns, "q", 40, keyed=False)
    df = source(spark, sc, ns, streams="q", startingPositions="earliest",
                maxBytesPerTrigger=50, minRecordsPerTrigger=1000, maxTriggerDelay="1h")
    sink = Collector()
    run_available_now(df, sink, tmp_path / "ckpt")
    sizes = [len(rows) for _, rows in sorted(sink.batches().items()) if rows]
    assert sizes == [10, 10, 10, 10], sizes
    assert sorted(d for _, _, _, d in sink.records()) == [b"r%04d" % i for i in range(40)]


def test_a_query_routing_to_three_streams_replayed_after_the_sinks_commit(
        spark: SparkSession, spark_cluster: ClusterThread, ns: str, tmp_path: Any) -> None:
    """A streaming query routes each row to one of three streams (created on first use)
    in batches of 100; then the last batch's commit record is removed from the
    checkpoint (the driver died between the sink's commit and Spark's): the restarted
    query replays that batch and adds nothing to any stream; each row is exactly once
    in its stream, in order."""
    from pyspark.sql import functions as F

    from .test_sink import activate, put

    sc = spark_cluster
    sent = put(sc, ns, "in", 250, "in", rolling_entries=5)
    df = (spark.readStream.format("asyncbk").option("metadataUri", sc.metadata_uri)
          .option("namespace", ns).option("streams", "in")
          .option("startingPositions", "earliest").option("maxRecordsPerTrigger", "100")
          .load()
          .select(F.concat(F.lit("out-"), (F.crc32("data") % 3).cast("string")).alias("stream"),
                  "data"))
    ckpt = tmp_path / "ckpt"

    def run() -> None:
        activate(spark)
        q = (df.writeStream.format("asyncbk").option("metadataUri", sc.metadata_uri)
             .option("namespace", ns).option("createStreams", "true")
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
        try:
            assert q.awaitTermination(120), f"query not done: {q.status}"
            assert q.exception() is None, q.exception()
        finally:
            q.stop()

    def outs() -> dict[str, list[bytes]]:
        return {s: [r.data for r in read_stream(sc, ns, s)] for s in ("out-0", "out-1", "out-2")}

    run()
    first = outs()
    assert sorted(d for v in first.values() for d in v) == sorted(sent)
    for stream, datas in first.items():
        assert datas == [d for d in sent if d in set(datas)], f"{stream} out of order"
        assert len(datas) > 40, first  # all three streams got rows
    commits = sorted((p for p in (ckpt / "commits").iterdir() if p.name.isdigit()),
                     key=lambda p: int(p.name))
    assert len(commits) >= 3
    commits[-1].unlink()
    crc = commits[-1].with_name(f".{commits[-1].name}.crc")
    if crc.exists():
        crc.unlink()
    run()
    assert (ckpt / "commits" / commits[-1].name).exists(), "the batch was replayed"
    assert outs() == first
