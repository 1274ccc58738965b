"""The streaming reader's driver-side calls, made directly (no Spark JVM): offsets,
both signatures of latestOffset, admission control, Trigger.AvailableNow, and
plans that do not change when Spark asks again (a replayed batch)."""

from __future__ import annotations

import pickle
from typing import Any

from pyspark import cloudpickle
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from asyncbk.spark import AsyncbkDataSource
from asyncbk.spark.source import StreamMicroBatchReader
from asyncbk.stream.position import Position

from .conftest import ClusterThread


def _reader(spark_cluster: ClusterThread, ns: str, **options: Any) -> StreamMicroBatchReader:
    opts = {"metadataUri": spark_cluster.metadata_uri, "namespace": ns, **options}
    reader = AsyncbkDataSource(opts).streamReader(None)  # type: ignore[arg-type]
    assert isinstance(reader, StreamMicroBatchReader)
    return reader


def _write(spark_cluster: ClusterThread, ns: str, stream: str, n: int, first: int = 0,
           close: bool = True, **overrides: Any) -> None:
    async def go() -> None:
        assert spark_cluster.bk is not None
        nsobj = await spark_cluster.bk.namespace(ns)
        if not await nsobj.stream_exists(stream):
            await nsobj.create_stream(stream, **overrides)
        w = await nsobj.open_writer(stream, batch_bytes_max=200)
        for i in range(first, first + n):
            w.write_nowait(b"%s-%05d" % (stream.encode(), i))
        await w.flush()
        if close:
            await w.close()
        else:
            w_holder.append(w)

    w_holder: list[Any] = []
    spark_cluster.run(go())
    _open_writers.extend(w_holder)


_open_writers: list[Any] = []


def _count(reader: StreamMicroBatchReader, start: dict[str, str], end: dict[str, str]) -> int:
    total = 0
    for p in reader.partitions(start, end):
        for batch in reader.read(p):
            total += batch.num_rows
    return total


def test_offsets_limits_and_both_latest_offset_signatures(spark_cluster: ClusterThread,
                                                          ns: str) -> None:
    _write(spark_cluster, ns, "big", 900, rolling_entries=12)
    _write(spark_cluster, ns, "small", 30)
    reader = _reader(spark_cluster, ns, streams="big,small", startingPositions="earliest",
                     maxRecordsPerTrigger="100")
    try:
        start = reader.initialOffset()
        assert start == {"big": "1:0:0", "small": "1:0:0"} and list(start) == sorted(start)
        assert reader.getDefaultReadLimit() == ReadMaxRows(100)
        end = reader.latestOffset(start, ReadMaxRows(100))
        n = _count(reader, start, end)
        assert 100 <= n <= 102  # each stream with a backlog gets >= 1
        assert Position.parse(end["small"]) > Position.parse(start["small"])  # not starved
        everything = reader.latestOffset(start, ReadAllAvailable())
        assert _count(reader, start, everything) == 930
        assert everything == reader.reportLatestOffset()
        # Spark 4.0/4.1: no arguments; the limit applies from the last answer on
        old = _reader(spark_cluster, ns, streams="big,small", startingPositions="earliest",
                      maxRecordsPerTrigger="100")
        first = old.latestOffset()
        assert _count(old, start, first) == 930  # no start known: all that is there
        _write(spark_cluster, ns, "big", 300, first=900)
        second = old.latestOffset()
        assert 100 <= _count(old, first, second) <= 101
        old.stop()
        # nothing new: the same offsets back, so Spark runs no empty batch
        assert reader.latestOffset(everything, ReadAllAvailable()) != everything
        done = reader.latestOffset(everything, ReadAllAvailable())
        assert reader.latestOffset(done, ReadAllAvailable()) == done
    finally:
        reader.stop()


def test_available_now_stops_at_what_was_there(spark_cluster: ClusterThread, ns: str) -> None:
    _write(spark_cluster, ns, "s", 200)
    reader = _reader(spark_cluster, ns, streams="s", startingPositions="earliest")
    try:
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        _write(spark_cluster, ns, "s", 50, first=200)
        end = reader.latestOffset(start, ReadMaxRows(150))
        assert _count(reader, start, end) == 150
        end2 = reader.latestOffset(end, ReadMaxRows(150))
        assert _count(reader, end, end2) == 50  # up to the target, not the 50 added after
        assert reader.latestOffset(end2, ReadMaxRows(150)) == end2
    finally:
        reader.stop()


def test_a_replayed_batch_plans_the_same_records(spark_cluster: ClusterThread, ns: str) -> None:
    """Planned while the writer's segment is open, planned again after it rolled and
    closed: the same partitions, the same records."""
    _write(spark_cluster, ns, "s", 500, close=False, rolling_entries=50)
    reader = _reader(spark_cluster, ns, streams="s", startingPositions="earliest",
                     maxRecordsPerPartition="64")
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        first = [p.part for p in reader.partitions(start, end)]
        rows_first = [tuple(b.column("position").to_pylist())
                      for p in reader.partitions(start, end) for b in reader.read(p)]
        w = _open_writers.pop()
        spark_cluster.run(w.close())
        _write(spark_cluster, ns, "s", 300, first=500)
        assert [p.part for p in reader.partitions(start, end)] == first
        rows_again = [tuple(b.column("position").to_pylist())
                      for p in reader.partitions(start, end) for b in reader.read(p)]
        assert rows_again == rows_first
        # up to the LAC the plan saw (the writer's last entry may still have been above it)
        assert 400 < sum(len(r) for r in rows_first) <= 500
        # the reader pickles (Spark ships it to the tasks) without its loop or client
        clone = pickle.loads(cloudpickle.dumps(reader))
        assert clone._rt is None
    finally:
        reader.stop()
