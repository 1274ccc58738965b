"""Reading streams and ledgers with ``spark.read.format("asyncbk")``, against a real cluster.

Batch reads of several multi-segment streams equal what was written (records, txids,
positions, order); partitions are slices of segments of at most
``maxRecordsPerPartition`` records; globs and ``streamsPattern`` select streams;
``startingPositions`` / ``endingPositions`` bound the read; an open segment yields
exactly its durable records; ``ledgers`` reads raw ledgers; truncated data is an error
unless ``failOnDataLoss`` is false; and a write then read round trip gives the rows back.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from asyncbk.stream import Position

from .conftest import ClusterThread

pytestmark = pytest.mark.spark

SHAPE = {"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2}
READ_SCHEMA = ("struct<stream:string,position:string,txid:bigint,data:binary,key:binary,"
               "timestamp:timestamp>")
LEDGER_SCHEMA = "struct<ledger_id:bigint,entry_id:bigint,data:binary>"


@dataclass(frozen=True)
class Rec:
    """A record as written (or as read back)."""

    position: Position
    txid: int
    data: bytes


# ---------------------------------------------------------------------- helpers


def payloads(name: str, count: int, seed: int) -> list[bytes]:
    """``count`` records of varied sizes (0 B to 4 KiB), each naming its stream and index."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        if i == 7:
            out.append(b"")  # an empty record is a record too
            continue
        size = rng.choice([0, 1, 10, 100, 300, 1000, 4096, rng.randrange(2000)])
        out.append(f"{name}:{i}:".encode() + rng.randbytes(size))
    return out


async def write_records(cs: ClusterThread, ns: str, stream: str, datas: list[bytes],
                        txids: list[int] | None = None, seed: int = 0,
                        close: bool = True, **overrides: Any) -> list[Rec]:
    """Create ``stream`` (with ``overrides``) and write ``datas`` in rounds of 1-60
    pipelined records (so entries hold varied numbers of records); returns them with
    their positions and txids, in order."""
    assert cs.bk is not None
    nsobj = await cs.bk.namespace(ns)
    await nsobj.create_stream(stream, **overrides)
    w = await nsobj.open_writer(stream)
    try:
        out = await write_rounds(w, datas, txids, seed)
    except BaseException:
        await w.abort()
        raise
    if close:
        await w.close()
    return out


async def write_rounds(w: Any, datas: list[bytes], txids: list[int] | None = None,
                       seed: int = 0) -> list[Rec]:
    rng = random.Random(seed)
    out: list[Rec] = []
    i = 0
    while i < len(datas):
        n = rng.randint(1, 60)
        batch = []
        for j in range(i, min(len(datas), i + n)):
            txid = None if txids is None else txids[j]
            expected = w.last_txid + 1 if txid is None else txid
            batch.append((expected, datas[j], w.write_nowait(datas[j], txid)))
        for txid, data, fut in batch:
            out.append(Rec(await fut, txid, data))
        i += n
    await w.flush()
    return out


def reader(spark: SparkSession, cs: ClusterThread, ns: str | None, **options: Any) -> DataFrame:
    r = spark.read.format("asyncbk").option("metadataUri", cs.metadata_uri)
    if ns is not None:
        r = r.option("namespace", ns)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def by_stream(rows: Iterable[Any]) -> dict[str, list[Rec]]:
    """Rows grouped by stream, each group in position order."""
    out: dict[str, list[Rec]] = defaultdict(list)
    for row in rows:
        out[row.stream].append(Rec(Position.parse(row.position), row.txid, bytes(row.data)))
    for recs in out.values():
        recs.sort(key=lambda r: r.position)
    return dict(out)


def error_text(action: Any) -> str:
    """The text of the error ``action()`` raises (Spark wraps ours)."""
    try:
        action()
    except (PySparkException, Py4JJavaError) as exc:
        return str(exc)
    pytest.fail("expected the read to fail")


async def await_lac(cs: ClusterThread, ledger_id: int, entry_id: int,
                    timeout_s: float = 15.0) -> None:
    """Wait until the bookies' LAC of ``ledger_id`` covers ``entry_id`` (the writer's
    explicit LAC, or a later add, carries the last entry's)."""
    assert cs.bk is not None
    rh = await cs.bk.open_ledger(ledger_id, recovery=False)
    async with asyncio.timeout(timeout_s):
        while rh.last_add_confirmed < entry_id and not rh.metadata.is_closed:
            await rh.wait_for_lac(rh.last_add_confirmed, 2.0)


async def segment_ledger(cs: ClusterThread, ns: str, stream: str, seq: int) -> tuple[int, str]:
    assert cs.bk is not None
    info = await (await cs.bk.namespace(ns)).stream_info(stream)
    seg = next(s for s in info.segments if s.seq == seq)
    return seg.ledger_id, seg.state


# ---------------------------------------------------------------------- data set


@dataclass
class DataSet:
    ns: str
    written: dict[str, list[Rec]]
    segments: dict[str, int]


def txids_step(count: int) -> list[int]:
    return [i * 3 + 7 for i in range(count)]


def txids_pairs(count: int) -> list[int]:
    return [1000 + (i // 2) * 5 for i in range(count)]  # equal in pairs: non-decreasing


@pytest.fixture(scope="module")
def data(spark_cluster: ClusterThread) -> Iterator[DataSet]:
    """One namespace of streams for the read tests: three of 2,000 records rolled
    into several segments, one of 1,500 in a single segment, a small one whose name
    only a loose pattern matches, and an empty one."""
    ns = f"r{uuid.uuid4().hex[:10]}"
    cs = spark_cluster
    assert cs.bk is not None
    specs: dict[str, tuple[int, list[int] | None, dict[str, Any]]] = {
        "orders-eu": (2000, None, {"rolling_entries": 500}),
        "orders-us": (2000, txids_pairs(2000), {"rolling_entries": 400}),
        "audit": (2000, txids_step(2000), {"rolling_entries": 450}),
        "orders-eu-archive": (5, None, {}),
        "big": (1500, None, {"rolling_entries": 0, "rolling_bytes": 1 << 30}),
    }

    async def build() -> DataSet:
        assert cs.bk is not None
        nsobj = await cs.bk.namespace(ns, create=True, **SHAPE)
        names = list(specs)
        results = await asyncio.gather(*(
            write_records(cs, ns, name, payloads(name, n, seed), txids, seed=seed, **ov)
            for seed, (name, (n, txids, ov)) in enumerate(specs.items())))
        segments = {name: len((await nsobj.stream_info(name)).segments) for name in names}
        await nsobj.create_stream("empty")
        return DataSet(ns, dict(zip(names, results, strict=True)), segments)

    ds = cs.run(build())
    for name in ("orders-eu", "orders-us", "audit"):
        assert ds.segments[name] >= 4, (name, ds.segments)
    assert ds.segments["big"] == 1
    yield ds


# ---------------------------------------------------------------------- 1. batch reads


def test_batch_read_of_several_streams_equals_what_was_written(
        spark: SparkSession, spark_cluster: ClusterThread, data: DataSet) -> None:
    """Every record of three multi-segment streams comes back once, with its bytes,
    txid and position, and the positions order each stream as it was written."""
    df = reader(spark, spark_cluster, data.ns, streams="orders-eu,orders-us,audit")
    assert df.schema.simpleString() == READ_SCHEMA
    rows = df.collect()
    assert len(rows) == 6000
    assert all(str(Position.parse(r.position)) == r.position for r in rows)
    got = by_stream(rows)
    assert set(got) == {"orders-eu", "orders-us", "audit"}
    for name, recs in got.items():
        want = data.written[name]
        assert len(recs) == len(want), name
        assert len({r.position for r in recs}) == len(recs), f"{name}: duplicate positions"
        assert [r.position for r in recs] == [r.position for r in want], name
        assert [r.txid for r in recs] == [r.txid for r in want], name
        assert [r.data for r in recs] == [r.data for r in want], name
    assert got["audit"][0].txid == 7 and got["orders-eu"][0].txid == 0
    # A stream with no record yet reads as no rows, not as an error.
    assert reader(spark, spark_cluster, data.ns, streams="empty").collect() == []


def test_partitions_are_position_ordered_slices_of_segments(
        spark: SparkSession, spark_cluster: ClusterThread, data: DataSet) -> None:
    """With maxRecordsPerPartition=300 there are more partitions than segments, each
    holds at most 300 rows of one stream in position order, and the single segment of
    ``big`` is split into several partitions."""
    df = reader(spark, spark_cluster, data.ns, streams="orders-eu,big",
                maxRecordsPerPartition=300)
    rdd = df.rdd
    nparts = rdd.getNumPartitions()
    assert nparts > data.segments["orders-eu"] + data.segments["big"]
    parts = [p for p in rdd.glom().collect() if p]
    assert sum(len(p) for p in parts) == 3500
    big_parts = 0
    for p in parts:
        assert len(p) <= 300
        assert len({r.stream for r in p}) == 1, "a partition mixes streams"
        positions = [Position.parse(r.position) for r in p]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        big_parts += p[0].stream == "big"
    assert big_parts >= 5
    got = by_stream(r for p in parts for r in p)
    for name in ("orders-eu", "big"):
        assert [(r.position, r.data) for r in got[name]] == \
            [(r.position, r.data) for r in data.written[name]]


@pytest.mark.parametrize(("option", "value", "expected"), [
    ("streams", "orders-*", {"orders-eu", "orders-us", "orders-eu-archive"}),
    ("streams", "orders-??", {"orders-eu", "orders-us"}),
    ("streams", "audit,orders-u*", {"audit", "orders-us"}),
    ("streams", "[ab]*", {"audit", "big"}),
    ("streamsPattern", "orders-(eu|us)", {"orders-eu", "orders-us"}),
    ("streamsPattern", r".*-archive|b.g", {"orders-eu-archive", "big"}),
])
def test_globs_and_patterns_select_streams(
        spark: SparkSession, spark_cluster: ClusterThread, data: DataSet,
        option: str, value: str, expected: set[str]) -> None:
    """A glob in ``streams`` (fnmatch) and ``streamsPattern`` (a regex matching the
    whole name) select exactly the matching streams, each read whole."""
    df = reader(spark, spark_cluster, data.ns, **{option: value})
    counts = Counter(r.stream for r in df.select("stream").collect())
    assert counts == {name: len(data.written[name]) for name in expected}


def test_starting_and_ending_positions(
        spark: SparkSession, spark_cluster: ClusterThread, data: DataSet) -> None:
    """startingPositions is inclusive and endingPositions exclusive, as positions (mid
    entry too) or ``{"txid": N}`` (the first record with txid >= N); ``latest`` as the
    start reads nothing, ``earliest`` everything; streams not named use the default."""
    w = data.written["audit"]
    a = next(i for i in range(700, 2000) if w[i].position.slot > 0)
    b = next(i for i in range(1300, 2000) if w[i].position.slot > 0)
    assert w[a].position.segment < w[b].position.segment

    def read(**options: Any) -> dict[str, list[Rec]]:
        return by_stream(reader(spark, spark_cluster, data.ns, **options).collect())

    got = read(streams="audit", startingPositions=json.dumps({"audit": str(w[a].position)}),
               endingPositions=json.dumps({"audit": str(w[b].position)}))
    assert got["audit"] == w[a:b]

    # By txid: audit's txids are i * 3 + 7, so T - 1 selects record 901 first.
    got = read(streams="audit",
               startingPositions=json.dumps({"audit": {"txid": w[901].txid - 1}}),
               endingPositions=json.dumps({"audit": {"txid": w[1500].txid}}))
    assert got["audit"] == w[901:1500]

    # orders-us has txids equal in pairs: the first of a pair is where a txid starts.
    us = data.written["orders-us"]
    got = read(streams="orders-us",
               startingPositions=json.dumps({"orders-us": {"txid": us[501].txid}}))
    assert us[500].txid == us[501].txid
    assert got["orders-us"] == us[500:]

    assert read(streams="audit", startingPositions="latest") == {}
    assert read(streams="audit", startingPositions=json.dumps({"audit": "latest"})) == {}
    assert read(streams="audit", startingPositions="earliest")["audit"] == w
    got = read(streams="audit,big", startingPositions=json.dumps({"audit": "earliest"}),
               endingPositions=json.dumps({"audit": "latest"}))
    assert got == {"audit": w, "big": data.written["big"]}
    got = read(streams="audit,big", startingPositions=json.dumps({"audit": str(w[b].position)}))
    assert got == {"audit": w[b:], "big": data.written["big"]}


# ---------------------------------------------------------------------- 2. open segments


def test_open_segment_reads_exactly_the_flushed_records(
        spark: SparkSession, spark_cluster: ClusterThread, ns: str) -> None:
    """With the writer still open, a batch read returns every flushed record (once the
    bookies know the LAC covering it) and nothing else; a later read sees more."""
    cs = spark_cluster
    datas = payloads("live", 280, seed=42)

    async def start() -> tuple[Any, list[Rec]]:
        assert cs.bk is not None
        nsobj = await cs.bk.namespace(ns)
        await nsobj.create_stream("live", rolling_entries=100)
        w = await nsobj.open_writer("live")
        return w, await write_rounds(w, datas[:250], seed=1)

    w, first = cs.run(start())
    try:
        assert first[-1].position.segment == 3  # two completed segments and the open one
        ledger_id, state = cs.run(segment_ledger(cs, ns, "live", 3))
        assert state == "open"
        cs.run(await_lac(cs, ledger_id, first[-1].position.entry))
        got = by_stream(reader(spark, cs, ns, streams="live").collect())
        assert got["live"] == first

        more = cs.run(write_rounds(w, datas[250:], seed=2))
        cs.run(await_lac(cs, ledger_id, more[-1].position.entry))
        got = by_stream(reader(spark, cs, ns, streams="live").collect())
        assert got["live"] == first + more
    finally:
        cs.run(w.close())


# ---------------------------------------------------------------------- 3. ledgers


def test_ledgers_option_reads_closed_and_open_ledgers(
        spark: SparkSession, spark_cluster: ClusterThread) -> None:
    """``ledgers`` reads raw ledgers (no namespace needed): every entry of a closed
    ledger, and entries 0..LAC of an open one, as ``ledger_id, entry_id, data``."""
    cs = spark_cluster
    closed_data = [b"closed-%d-" % i + b"x" * (i * 97) for i in range(20)]
    open_data = [b"open-%d-" % i + b"y" * (i * 31) for i in range(15)]

    async def make() -> tuple[Any, Any]:
        assert cs.bk is not None
        lh1 = await cs.bk.create_ledger(3, 2, 2)
        for d in closed_data:
            await lh1.append(d)
        await lh1.close()
        lh2 = await cs.bk.create_ledger(3, 2, 2)
        await asyncio.gather(*(lh2.append(d) for d in open_data))
        await await_lac(cs, lh2.id, len(open_data) - 1)
        return lh1, lh2

    lh1, lh2 = cs.run(make())
    try:
        df = reader(spark, cs, None, ledgers=f"{lh1.id},{lh2.id}")
        assert df.schema.simpleString() == LEDGER_SCHEMA
        got = sorted((r.ledger_id, r.entry_id, bytes(r.data)) for r in df.collect())
        want = [(lh1.id, i, d) for i, d in enumerate(closed_data)] + \
            [(lh2.id, i, d) for i, d in enumerate(open_data)]
        assert got == sorted(want)
        one = reader(spark, cs, None, ledgers=str(lh1.id)).collect()
        assert sorted(r.entry_id for r in one) == list(range(20))
    finally:
        cs.run(lh2.close())


# ---------------------------------------------------------------------- 4. truncation


def test_truncated_start_fails_unless_fail_on_data_loss_is_false(
        spark: SparkSession, spark_cluster: ClusterThread, ns: str) -> None:
    """Starting at a truncated position is an error naming the stream and saying how to
    skip; with failOnDataLoss=false the read returns exactly the live records."""
    cs = spark_cluster
    written = cs.run(write_records(cs, ns, "victim", payloads("victim", 500, seed=5),
                                   seed=5, rolling_entries=100))

    async def truncate() -> Position:
        assert cs.bk is not None
        nsobj = await cs.bk.namespace(ns)
        assert await nsobj.truncate("victim", before=written[250].position) >= 2
        first = (await nsobj.stream_info("victim")).first_position
        assert first is not None
        return first

    first = cs.run(truncate())
    live = [r for r in written if r.position >= first]
    assert 0 < len(live) < 300
    start = json.dumps({"victim": str(written[50].position)})

    text = error_text(lambda: reader(spark, cs, ns, streams="victim",
                                     startingPositions=start).collect())
    assert "victim" in text
    assert "DataLossError" in text
    assert "failondataloss" in text.lower()

    got = by_stream(reader(spark, cs, ns, streams="victim", startingPositions=start,
                           failOnDataLoss="false").collect())
    assert got["victim"] == live
    # The default start (earliest) is the first live record: no error.
    assert by_stream(reader(spark, cs, ns, streams="victim").collect())["victim"] == live


# ---------------------------------------------------------------------- 5. write and read


def test_write_then_read_round_trip(
        spark: SparkSession, spark_cluster: ClusterThread, ns: str) -> None:
    """``df.write`` appends a DataFrame's rows to a new stream in order (one txid for
    the batch by default), a ``txid`` column sets txids, a string ``data`` is UTF-8; a
    read gives back exactly those records."""
    cs = spark_cluster

    def write(df: DataFrame) -> None:
        (df.write.format("asyncbk").option("metadataUri", cs.metadata_uri)
         .option("namespace", ns).option("stream", "out").mode("append").save())

    def read_out() -> list[Rec]:
        return by_stream(reader(spark, cs, ns, streams="out").collect()).get("out", [])

    first = [b"row-%03d-" % i + b"z" * (i * 13 % 700) for i in range(100)] + [b""]
    write(spark.createDataFrame([(d,) for d in first], "data binary"))
    before = read_out()
    assert [r.data for r in before] == first
    assert len({r.txid for r in before}) == 1, "one batch shares one txid"
    t0 = before[0].txid

    second = [(b"tx-%d" % i, t0 + 10 + i // 3) for i in range(60)]
    write(spark.createDataFrame(second, "data binary, txid long"))
    got = read_out()
    assert got[:len(first)] == before
    assert [(r.data, r.txid) for r in got[len(first):]] == second

    third = ["héllo", "wörld", ""]
    write(spark.createDataFrame([(s,) for s in third], "data string"))
    got = read_out()
    assert len(got) == len(first) + len(second) + len(third)
    assert [r.data for r in got[-3:]] == [s.encode() for s in third]
    assert got[-1].txid > second[-1][1]

