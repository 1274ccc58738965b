"""Structured Streaming reads of asyncbk streams (``spark.readStream.format("asyncbk")``).

Every test writes records with the asyncbk stream API on the session's LocalCluster,
reads them with a streaming query whose sink is ``foreachBatch`` (run in this driver
process: each delivery is kept with its batch id), and checks that every record
arrived exactly once, as (stream, position, txid, data), across restarts from the same
checkpoint, a failed batch, admission control, streams appearing while the query runs,
live appends, truncation (``failOnDataLoss``) and a SIGKILLed bookie.

Waits are bounded (``awaitTermination(timeout)`` or polling with a deadline) and every
query is stopped in ``finally``.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from asyncbk.stream import Position

if TYPE_CHECKING:
    from .conftest import ClusterThread

pytestmark = pytest.mark.spark

Rec = tuple[str, str, int, bytes]
"""A record as the tests compare it: (stream, position, txid, data)."""

QUERY_TIMEOUT_S = 60.0
"""Longest wait for an availableNow query to finish, or for records to arrive."""


# ---------------------------------------------------------------------- helpers


def put(sc: ClusterThread, ns: str, stream: str, n: int, *, first: int = 0,
        create: bool = False, rolling_entries: int | None = None,
        per_round: int = 50) -> list[Rec]:
    """Write ``n`` records ``<stream>-<i>`` (i from ``first``) to ``stream`` with one
    writer, ``per_round`` pipelined at a time (about one entry a round); with
    ``create`` the stream is created first.  Returns what was written."""

    async def go() -> list[Rec]:
        assert sc.bk is not None
        nsobj = await sc.bk.namespace(ns)
        if create:
            overrides = {} if rolling_entries is None else {"rolling_entries": rolling_entries}
            await nsobj.create_stream(stream, **overrides)
        out: list[Rec] = []
        async with await nsobj.open_writer(stream) as w:
            for start in range(first, first + n, per_round):
                round_ = []
                for i in range(start, min(first + n, start + per_round)):
                    data = f"{stream}-{i}".encode()
                    round_.append((w.last_txid + 1, data, w.write_nowait(data)))
                for txid, data, fut in round_:
                    out.append((stream, str(await fut), txid, data))
        return out

    return sc.run(go())


def source(spark: SparkSession, sc: ClusterThread, ns: str, **options: object) -> DataFrame:
    """A streaming DataFrame of ``format("asyncbk")`` over namespace ``ns``."""
    reader = (spark.readStream.format("asyncbk").option("metadataUri", sc.metadata_uri)
              .option("namespace", ns))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


class Collector:
    """A ``foreachBatch`` function that keeps every delivery with its batch id.

    ``fail(batch_id)`` returning true makes the delivery raise (after its rows were
    seen: they are kept in ``attempts``, not in ``deliveries``).  foreachBatch is
    at-least-once per batch id, so ``batches()`` keeps the last completed delivery of
    each batch id."""

    def __init__(self, fail: Callable[[int], bool] | None = None) -> None:
        self.lock = threading.Lock()
        self.fail = fail
        self.attempts: list[tuple[int, list[Rec]]] = []
        self.deliveries: list[tuple[int, list[Rec]]] = []

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = [(r.stream, r.position, r.txid, bytes(r.data)) for r in df.collect()]
        with self.lock:
            self.attempts.append((batch_id, rows))
        if self.fail is not None and self.fail(batch_id):
            raise RuntimeError(f"injected failure in batch {batch_id}")
        with self.lock:
            self.deliveries.append((batch_id, rows))

    def batches(self) -> dict[int, list[Rec]]:
        with self.lock:
            return dict(self.deliveries)

    def records(self) -> list[Rec]:
        return [rec for _, rows in sorted(self.batches().items()) for rec in rows]

    def count(self) -> int:
        return len(self.records())


def start(df: DataFrame, sink: Collector, ckpt: Path, **trigger: Any) -> StreamingQuery:
    return (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ckpt))
            .trigger(**trigger).start())


def run_available_now(df: DataFrame, sink: Collector, ckpt: Path) -> StreamingQuery:
    """Run an availableNow query to its end (bounded); raises what the query raised."""
    q = start(df, sink, ckpt, availableNow=True)
    try:
        assert q.awaitTermination(QUERY_TIMEOUT_S), \
            f"availableNow query not done after {QUERY_TIMEOUT_S}s: {q.status}"
    finally:
        q.stop()
    return q


def wait_until(what: str, cond: Callable[[], bool], q: StreamingQuery | None = None,
               timeout_s: float = QUERY_TIMEOUT_S) -> None:
    """Poll ``cond`` until true; fail after ``timeout_s`` (or at once if ``q`` died)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if q is not None and not q.isActive:
            raise AssertionError(f"query ended while waiting for {what}: {q.exception()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


def assert_exactly_once(got: Iterable[Rec], expected: Iterable[Rec]) -> None:
    got_c, exp_c = Counter(got), Counter(expected)
    dups = {r: c for r, c in got_c.items() if c > 1}
    assert not dups, f"records delivered more than once: {sorted(dups.items())[:5]}"
    missing = exp_c - got_c
    extra = got_c - exp_c
    assert not missing and not extra, \
        f"missing {len(missing)} (e.g. {sorted(missing)[:3]}), " \
        f"unexpected {len(extra)} (e.g. {sorted(extra)[:3]})"


def end_offset(q: StreamingQuery) -> dict[str, str]:
    progress = q.lastProgress
    assert progress is not None
    return json.loads(progress["sources"][0]["endOffset"])


# ---------------------------------------------------------------------- tests


def test_restart_from_checkpoint_exactly_once(spark: SparkSession, spark_cluster: ClusterThread,
                                              ns: str, tmp_path: Path) -> None:
    """Two streams read from ``earliest`` by an availableNow query, more records written,
    the query restarted on the same checkpoint: every record (stream, position, txid,
    bytes) arrives exactly once over both runs, the second run only the new ones, and
    the end offset is JSON naming each stream with the next position to read."""
    first = put(spark_cluster, ns, "a", 120, create=True, rolling_entries=4, per_round=10)
    first += put(spark_cluster, ns, "b", 80, create=True, rolling_entries=4, per_round=10)
    ckpt = tmp_path / "ckpt"
    df = source(spark, spark_cluster, ns, streams="a,b", startingPositions="earliest")

    run1 = Collector()
    q = run_available_now(df, run1, ckpt)
    assert_exactly_once(run1.records(), first)
    offsets = end_offset(q)
    assert sorted(offsets) == ["a", "b"]
    for stream in ("a", "b"):
        last = max(Position.parse(p) for s, p, _, _ in first if s == stream)
        assert Position.parse(offsets[stream]) > last, (stream, offsets, last)

    second = put(spark_cluster, ns, "a", 60, first=120, per_round=10)
    second += put(spark_cluster, ns, "b", 40, first=80, per_round=10)
    run2 = Collector()
    run_available_now(df, run2, ckpt)
    assert_exactly_once(run2.records(), second)
    assert_exactly_once(run1.records() + run2.records(), first + second)
    assert min(run2.batches()) > max(run1.batches()), "batch ids continue across restarts"


def test_failed_batch_replayed_with_identical_range(spark: SparkSession,
                                                    spark_cluster: ClusterThread, ns: str,
                                                    tmp_path: Path) -> None:
    """A foreachBatch that raises in batch 1 on its first attempt fails the query; the
    restart from the checkpoint replays batch 1 with exactly the same records, and over
    both runs (counting completed deliveries, last one per batch id) every record
    arrives exactly once."""
    written = put(spark_cluster, ns, "a", 200, create=True, rolling_entries=3, per_round=20)
    flag = tmp_path / "failed-once"

    def fail(batch_id: int) -> bool:
        if batch_id == 1 and not flag.exists():
            flag.touch()
            return True
        return False

    ckpt = tmp_path / "ckpt"
    df = source(spark, spark_cluster, ns, streams="a", startingPositions="earliest",
                maxRecordsPerTrigger=100)
    sink = Collector(fail)
    q = start(df, sink, ckpt, availableNow=True)
    try:
        with pytest.raises(StreamingQueryException) as exc_info:
            q.awaitTermination(QUERY_TIMEOUT_S)
        assert "injected failure in batch 1" in str(exc_info.value)
    finally:
        q.stop()
    assert flag.exists()
    failed_rows = next(rows for bid, rows in sink.attempts if bid == 1)
    assert failed_rows, "batch 1 had records"
    assert 1 not in sink.batches()

    run_available_now(df, sink, ckpt)
    batches = sink.batches()
    assert batches[1] == failed_rows, "the replayed batch 1 read a different range"
    assert len(batches) >= 2, sorted(batches)
    assert_exactly_once(sink.records(), written)


def test_max_records_per_trigger_splits_by_backlog(spark: SparkSession,
                                                   spark_cluster: ClusterThread, ns: str,
                                                   tmp_path: Path) -> None:
    """``maxRecordsPerTrigger=400`` over backlogs of 1500 / 150 / 15 records: no batch
    holds more than 400 (+1 per stream), the first batch reads from every stream (none
    starved by the big one), and the batches together hold every record once."""
    written = put(spark_cluster, ns, "big", 1500, create=True, per_round=250)
    written += put(spark_cluster, ns, "mid", 150, create=True)
    written += put(spark_cluster, ns, "small", 15, create=True)
    df = source(spark, spark_cluster, ns, streams="big,mid,small",
                startingPositions="earliest", maxRecordsPerTrigger=400)
    sink = Collector()
    run_available_now(df, sink, tmp_path / "ckpt")

    batches = sink.batches()
    sizes = {bid: len(rows) for bid, rows in sorted(batches.items())}
    assert all(n <= 400 + 3 for n in sizes.values()), sizes
    assert len(sizes) >= 5, sizes
    first_batch = batches[min(batches)]
    assert {s for s, _, _, _ in first_batch} == {"big", "mid", "small"}, \
        Counter(s for s, _, _, _ in first_batch)
    assert_exactly_once(sink.records(), written)


def test_streams_pattern_picks_up_new_streams(spark: SparkSession,
                                              spark_cluster: ClusterThread, ns: str,
                                              tmp_path: Path) -> None:
    """With ``streamsPattern`` (a regex, fullmatch) a running query reads streams created
    after it started, each from its first record: one created and written at once, one
    created empty and written a little later; streams that do not match are not read."""
    expected = put(spark_cluster, ns, "p1", 20, create=True)
    put(spark_cluster, ns, "x1", 10, create=True)
    df = source(spark, spark_cluster, ns, streamsPattern="p[0-9]+",
                startingPositions="earliest")
    sink = Collector()
    q = start(df, sink, tmp_path / "ckpt", processingTime="0.5 seconds")
    try:
        wait_until("p1's records", lambda: sink.count() >= 20, q)
        expected += put(spark_cluster, ns, "p2", 30, create=True)
        put(spark_cluster, ns, "p2x", 5, create=True)  # no fullmatch
        spark_cluster.run(_create(spark_cluster, ns, "p3"))
        wait_until("p2's records", lambda: sink.count() >= 50, q)
        time.sleep(1.0)  # p3 is seen empty by a trigger or two
        expected += put(spark_cluster, ns, "p3", 25)
        wait_until("p3's records", lambda: sink.count() >= 75, q)
        time.sleep(1.5)  # three more triggers: nothing else may come
    finally:
        q.stop()
    assert q.exception() is None
    assert_exactly_once(sink.records(), expected)


async def _create(sc: ClusterThread, ns: str, stream: str) -> None:
    assert sc.bk is not None
    await (await sc.bk.namespace(ns)).create_stream(stream)


def test_live_tail(spark: SparkSession, spark_cluster: ClusterThread, ns: str,
                   tmp_path: Path) -> None:
    """A processingTime query with the default start (``latest``) delivers none of the
    records written before it started and every record appended while it runs, exactly
    once: from a writer kept open (the open segment, as acknowledged) and then from a
    new writer (a new segment)."""
    put(spark_cluster, ns, "t", 50, create=True)
    df = source(spark, spark_cluster, ns, streams="t")
    sink = Collector()
    q = start(df, sink, tmp_path / "ckpt", processingTime="0.5 seconds")
    expected: list[Rec] = []

    async def open_writer() -> Any:
        assert spark_cluster.bk is not None
        return await (await spark_cluster.bk.namespace(ns)).open_writer("t")

    async def write(w: Any, lo: int, hi: int) -> list[Rec]:
        futs = [(w.last_txid + 1, f"t-{i}".encode(), w.write_nowait(f"t-{i}".encode()))
                for i in range(lo, hi)]
        return [("t", str(await f), txid, data) for txid, data, f in futs]

    w = None
    try:
        wait_until("the query's first progress", lambda: q.lastProgress is not None, q)
        w = spark_cluster.run(open_writer())
        expected += spark_cluster.run(write(w, 100, 140))
        wait_until("the first appended records", lambda: sink.count() >= 40, q)
        expected += spark_cluster.run(write(w, 140, 160))
        wait_until("the second appended records", lambda: sink.count() >= 60, q)
        spark_cluster.run(w.close())
        w = None
        expected += put(spark_cluster, ns, "t", 30, first=160)
        wait_until("the new writer's records", lambda: sink.count() >= 90, q)
        time.sleep(1.0)
    finally:
        q.stop()
        if w is not None:
            spark_cluster.run(w.close())
    assert q.exception() is None
    assert_exactly_once(sink.records(), expected)


def test_fail_on_data_loss(spark: SparkSession, spark_cluster: ClusterThread, ns: str,
                           tmp_path: Path) -> None:
    """A query read a stream and stopped; the stream was then truncated past its
    checkpointed offset (records it never read are gone).  Restarted with the default
    ``failOnDataLoss=true`` it fails with a message naming the stream; restarted with
    ``failOnDataLoss=false`` it goes on at the first live record without an error."""
    stream = "lossy"
    put(spark_cluster, ns, stream, 20, create=True, rolling_entries=2, per_round=5)
    ckpt = tmp_path / "ckpt"
    opts = {"streams": stream, "startingPositions": "earliest"}
    run1 = Collector()
    run_available_now(source(spark, spark_cluster, ns, **opts), run1, ckpt)
    assert run1.count() == 20

    later = put(spark_cluster, ns, stream, 40, first=20, per_round=5)

    async def truncate() -> Position:
        """Drop every segment before the one holding the last record written."""
        assert spark_cluster.bk is not None
        nsobj = await spark_cluster.bk.namespace(ns)
        info = await nsobj.stream_info(stream)
        last = Position.parse(later[-1][1])
        keep_from = next(s.first_position for s in info.segments if s.seq == last.segment)
        assert await nsobj.truncate(stream, before=keep_from) >= 2
        return keep_from

    keep_from = spark_cluster.run(truncate())
    assert Position.parse(later[0][1]) < keep_from, "unread records were truncated"
    live = [r for r in later if Position.parse(r[1]) >= keep_from]
    assert 0 < len(live) < len(later)

    failing = Collector()
    q = start(source(spark, spark_cluster, ns, **opts), failing, ckpt, availableNow=True)
    try:
        with pytest.raises(StreamingQueryException) as exc_info:
            q.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        q.stop()
    message = str(exc_info.value)
    assert f"{ns}/{stream}" in message or stream in message, message
    assert "failOnDataLoss" in message, message
    assert failing.count() == 0

    run3 = Collector()
    q = run_available_now(source(spark, spark_cluster, ns, failOnDataLoss="false", **opts),
                          run3, ckpt)
    assert q.exception() is None
    assert_exactly_once(run3.records(), live)


def test_bookie_killed_while_reading(spark: SparkSession, spark_cluster: ClusterThread,
                                     ns: str, tmp_path: Path) -> None:
    """A bookie SIGKILLed while a streaming query reads two streams (E3 Qw2 Qa2: every
    entry has a live replica): the query goes on, and after the bookie is back and
    more records are written, every record has arrived exactly once."""
    expected = put(spark_cluster, ns, "k1", 300, create=True, rolling_entries=5, per_round=20)
    expected += put(spark_cluster, ns, "k2", 300, create=True, rolling_entries=5, per_round=20)
    assert spark_cluster.cluster is not None
    bookie = spark_cluster.cluster.bookies[0]

    async def kill() -> None:
        bookie.kill()
        await bookie.wait()

    df = source(spark, spark_cluster, ns, streams="k1,k2", startingPositions="earliest",
                maxRecordsPerTrigger=120)
    sink = Collector()
    q = start(df, sink, tmp_path / "ckpt", processingTime="0.5 seconds")
    killed = False
    try:
        wait_until("the first batch", lambda: sink.count() > 0, q)
        spark_cluster.run(kill())
        killed = True
        assert sink.count() < 600, "the query read nothing with the bookie down"
        wait_until("every record with a bookie down", lambda: sink.count() >= 600, q)
        spark_cluster.run(bookie.start())
        killed = False
        expected += put(spark_cluster, ns, "k1", 50, first=300)
        expected += put(spark_cluster, ns, "k2", 50, first=300)
        wait_until("the records written after the restart", lambda: sink.count() >= 700, q)
        time.sleep(1.0)
    finally:
        q.stop()
        if killed:
            spark_cluster.run(bookie.start())
    assert q.exception() is None
    assert_exactly_once(sink.records(), expected)
