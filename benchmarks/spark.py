"""Spark reading asyncbk (``format("asyncbk")``), against Spark reading a local file,
measured in the same run.

Against a fresh local cluster (etcd + 3 bookie processes on loopback, journals
fsynced before every acknowledgement; E=3 Qw=3 Qa=2) unless ``--metadata-uri`` is
given, and a SparkSession ``local[2]`` (1 GiB driver, 2 shuffle partitions):

(a) **Batch read throughput.**  ``--records`` records (1,000,000) of
    ``--record-size`` bytes (100) are written once per segment count (1, 4, 16;
    one stream each, one writer per segment: closing a writer seals its segment,
    the next one starts a new segment), then read by
    ``spark.read.format("asyncbk")...load().selectExpr("sum(length(data))")``,
    which makes Spark materialise every record's bytes.  The baseline reads the
    same records from a local file with the same aggregation: ``spark.read.text``
    of a file of one record per line (and, for reference, ``spark.read.json`` of
    ``{"data": ...}`` lines).  Each source is read once to warm up, then in 3
    rounds, each reading every source once (the machine's drifting load falls on
    all alike); the best time of each counts.
(b) **Streaming end-to-end latency.**  A writer appends ``--rate`` records/s
    (1,000, open loop) for ``--latency-s`` (20) seconds, each carrying the wall-clock
    time it was due; a streaming query (trigger 1 s) collects each micro-batch in
    ``foreachBatch`` and takes now - due for each row: p50 / p99 / max.  The
    baseline is Spark's own floor for that trigger: Spark's built-in ``socket``
    source (lines from a TCP server in this process, buffered in Spark's driver as
    they arrive) fed the same way, through the same foreachBatch.  Rows sent in the
    first 3 s (the first batches start Spark's Python workers) are not counted.

It prints tables with the ratios and writes JSON to ``--json``.

    python benchmarks/spark.py [--quick] [--records N] [--json FILE] [--metadata-uri URI]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import platform
import random
import shutil
import socket
import statistics
import string
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
REPEATS = 3
BURST = 1000  # records per write_nowait burst (one event-loop turn: one ledger entry)
BURSTS_IN_FLIGHT = 50
LATENCY_TICK_S = 0.005
PHASES = ["latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit", "commitOffsets",
          "triggerExecution"]
Q332 = {"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2}


class Cluster:
    """The asyncbk side: a LocalCluster (or the cluster at ``uri``) and a client, on an
    event loop in a thread of its own; ``run(coro)`` runs a coroutine there."""

    def __init__(self, uri: str | None, data_dir: Path) -> None:
        import uvloop

        self.uri = uri
        self.data_dir = data_dir
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="asyncbk",
                                       daemon=True)
        self.local: Any = None
        self.bk: Any = None

    def start(self) -> None:
        from asyncbk import BookKeeper
        from asyncbk.testing import LocalCluster

        self.thread.start()
        if self.uri is None:
            self.local = LocalCluster(bookies=3, data_dir=self.data_dir)
            self.run(self.local.start())
            self.uri = self.local.metadata_uri
            self.bk = self.run(self.local.client())
        else:
            self.bk = self.run(BookKeeper.connect(self.uri))

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 1800) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        try:
            if self.local is not None:
                self.run(self.local.stop(), 120)
            elif self.bk is not None:
                self.run(self.bk.close(), 60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)


def payloads(records: int, size: int) -> list[bytes]:
    """``records`` distinct printable records of ``size`` bytes (no newline, no quote)."""
    rnd = random.Random(7)
    alphabet = (string.ascii_letters + string.digits).encode()
    filler = bytes(rnd.choice(alphabet) for _ in range(size + 4096))
    head = 12
    return [b"%011d " % i + filler[i % 4096:i % 4096 + size - head] for i in range(records)]


async def write_segments(ns: Any, stream: str, data: list[bytes], segments: int) -> dict[str, Any]:
    """Write ``data`` to a new stream in ``segments`` segments (one writer each)."""
    await ns.create_stream(stream, rolling_bytes=1 << 40, rolling_s=0, rolling_entries=0)
    per = -(-len(data) // segments)
    t0 = time.perf_counter()
    for s in range(segments):
        async with await ns.open_writer(stream) as w:
            chunk = data[s * per:(s + 1) * per]
            tails: list[Any] = []
            for i in range(0, len(chunk), BURST):
                futs = [w.write_nowait(d) for d in chunk[i:i + BURST]]
                tails.append(futs[-1])
                if len(tails) >= BURSTS_IN_FLIGHT:
                    await tails.pop(0)
                await asyncio.sleep(0)  # the burst leaves as one entry
            for f in tails:
                await f
    elapsed = time.perf_counter() - t0
    info = await ns.stream_info(stream)
    segs = [s for s in info.segments if s.records]
    return {"stream": stream, "segments": len(segs), "records": sum(s.records for s in segs),
            "write_s": elapsed, "write_rps": len(data) / elapsed}


def batch_reads(spark: Any, cluster: Cluster, ns_name: str, args: argparse.Namespace,
                work: Path) -> dict[str, Any]:
    """Write the records (file, streams), then read each source once to warm up and
    ``repeats`` rounds more, every source once per round (so the machine's drifting
    load falls on all of them alike); the best time of each counts."""
    data = payloads(args.records, args.record_size)
    expected = sum(len(d) for d in data)
    text_path = work / "records.txt"
    json_path = work / "records.jsonl"
    with open(text_path, "wb") as f:
        for d in data:
            f.write(d + b"\n")
    with open(json_path, "wb") as f:
        for d in data:
            f.write(b'{"data":"' + d + b'"}\n')
    ns = cluster.run(cluster.bk.namespace(ns_name))
    print(f"== (a) batch reads of {args.records:,} records of {args.record_size} B", flush=True)

    sources: list[dict[str, Any]] = [
        {"name": "spark.read.text (local file)", "col": "value", "baseline": True,
         "df": lambda: spark.read.text(str(text_path))}]
    for segments in args.segments:
        stream = f"seg{segments}"
        w = cluster.run(write_segments(ns, stream, data, segments))
        print(f"  wrote {stream}: {w['records']:,} records in {w['segments']} segments "
              f"({w['write_rps']:,.0f} records/s)", flush=True)
        if w["segments"] != segments or w["records"] != args.records:
            raise SystemExit(f"{stream}: expected {segments} segments of {args.records} "
                             f"records in all, got {w}")

        for per_partition in args.partition_records or [None]:
            def df(stream: str = stream, per_partition: int | None = per_partition) -> Any:
                r = (spark.read.format("asyncbk").option("metadataUri", cluster.uri)
                     .option("namespace", ns_name).option("streams", stream))
                if per_partition:
                    r = r.option("maxRecordsPerPartition", per_partition)
                return r.load()

            name = f"asyncbk, {segments} segment{'s' if segments > 1 else ''}"
            if per_partition:
                name += f", {per_partition:,} records a partition"
            sources.append({"name": name, "col": "data", "segments": segments, "write": w,
                            "df": df, "max_records_per_partition": per_partition})
    sources.append({"name": "spark.read.json (local file)", "col": "data", "reference": True,
                    "df": lambda: spark.read.schema("data string").json(str(json_path))})

    def read(src: dict[str, Any]) -> float:
        t0 = time.perf_counter()
        total = src["df"]().selectExpr(f"sum(length({src['col']}))").collect()[0][0]
        elapsed = time.perf_counter() - t0
        if total != expected:
            raise SystemExit(f"{src['name']}: sum(length) = {total}, expected {expected}")
        return elapsed

    for src in sources:  # warm-up (and the check that every source reads it all)
        src["warmup_s"] = read(src)
        src["partitions"] = src["df"]().rdd.getNumPartitions()
        src["times_s"] = []
    for i in range(args.repeats):
        for src in sources:
            src["times_s"].append(read(src))
        print(f"  round {i + 1}: " + ", ".join(f"{src['name']} {src['times_s'][-1]:.2f} s"
                                               for src in sources), flush=True)
    rows = []
    for src in sources:
        best = min(src["times_s"])
        rows.append({"name": src["name"], "best_s": best, "rows_per_s": args.records / best,
                     "mb_per_s": expected / best / 1e6,
                     **{k: v for k, v in src.items() if k not in ("df", "col", "name")}})
    base = rows[0]
    for r in rows:
        r["ratio_to_text"] = r["rows_per_s"] / base["rows_per_s"]
    return {"records": args.records, "record_size": args.record_size, "rows": rows}


class Latencies:
    """foreachBatch: now - the row's send time, for each row sent at ``since`` or later (ms)."""

    def __init__(self, sent_expr: str) -> None:
        self.sent_expr = sent_expr
        self.values_ms: list[float] = []
        self.rows = 0
        self.batches = 0
        self.since = float("inf")
        self.lock = threading.Lock()

    def __call__(self, batch: Any, batch_id: int) -> None:
        sent = [r[0] for r in batch.selectExpr(f"{self.sent_expr} as sent").collect()]
        now = time.time()
        with self.lock:
            self.batches += 1
            self.rows += len(sent)
            self.values_ms.extend((now - s) * 1000 for s in sent if s >= self.since)


def summarise(values_ms: list[float]) -> dict[str, Any]:
    if not values_ms:
        return {"rows": 0}
    v = sorted(values_ms)

    def pct(p: float) -> float:
        return v[min(len(v) - 1, int(p / 100 * len(v)))]

    return {"rows": len(v), "p50_ms": pct(50), "p99_ms": pct(99), "max_ms": v[-1],
            "mean_ms": statistics.fmean(v)}


def due_times(rate: float, seconds: float) -> Iterator[list[float]]:
    """Open loop: at each tick, the wall-clock due times of the records that fell due
    since the last one (the caller sleeps LATENCY_TICK_S after each tick)."""
    t0_mono, t0_wall = time.monotonic(), time.time()
    total, sent = int(rate * seconds), 0
    while sent < total:
        due = min(total, int((time.monotonic() - t0_mono) * rate) + 1)
        yield [t0_wall + i / rate for i in range(sent, due)]
        sent = due


async def asyncbk_feed(ns: Any, stream: str, rate: float, seconds: float,
                       stop: threading.Event) -> int:
    """Append ``rate`` records/s for ``seconds``, each carrying its due wall-clock time."""
    sent = 0
    pending: list[Any] = []
    async with await ns.open_writer(stream) as w:
        for due in due_times(rate, seconds):
            if stop.is_set():
                break
            for t in due:
                pending.append(w.write_nowait(b"%.6f" % t))
            sent += len(due)
            if len(pending) > 2 * rate:
                await pending[-1]
                pending.clear()
            await asyncio.sleep(LATENCY_TICK_S)
        if pending:
            await pending[-1]
    return sent


class SocketFeed:
    """The baseline's producer: a TCP server on loopback that Spark's ``socket`` source
    connects to; ``start()`` sends ``rate`` lines/s (each its due wall-clock time)."""

    def __init__(self, rate: float, seconds: float) -> None:
        self.rate, self.seconds = rate, seconds
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.stop = threading.Event()
        self.future: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._go = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="socket-feed", daemon=True)
        self._thread.start()

    def start(self) -> concurrent.futures.Future[int]:
        self._go.set()
        return self.future

    def _serve(self) -> None:
        try:
            self.server.settimeout(120)
            conn, _ = self.server.accept()
            with conn:
                while not self._go.wait(0.1):
                    if self.stop.is_set():
                        return
                sent = 0
                for due in due_times(self.rate, self.seconds):
                    if self.stop.is_set():
                        break
                    if due:
                        conn.sendall(b"".join(b"%.6f\n" % t for t in due))
                        sent += len(due)
                    time.sleep(LATENCY_TICK_S)
                self.future.set_result(sent)
                self.stop.wait(600)  # keep the connection until the query stops
        except BaseException as exc:  # handed to the waiting thread
            if not self.future.done():
                self.future.set_exception(exc)
        finally:
            self.server.close()

    def close(self) -> None:
        self.stop.set()
        self._thread.join(10)


def run_query(df: Any, sink: Latencies, checkpoint: Path, warmup_s: float,
              feed: Callable[[], Any]) -> dict[str, Any]:
    """Start ``df`` with a 1 s trigger into ``sink``; once it waits for data, start
    ``feed()`` (a future of the records sent); rows sent in its first ``warmup_s``
    are not recorded."""
    q = (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
         .trigger(processingTime="1 second").start())
    try:
        deadline = time.monotonic() + 120
        while not str(q.status.get("message", "")).startswith("Waiting"):
            if q.exception() is not None:
                raise SystemExit(f"query failed: {q.exception()}")
            if time.monotonic() > deadline:
                raise SystemExit(f"the streaming query did not start in 120 s: {q.status}")
            time.sleep(0.2)
        with sink.lock:
            sink.since = time.time() + warmup_s
        sent = feed().result(3600)
        deadline = time.monotonic() + 60
        while sink.rows < sent and time.monotonic() < deadline:
            if q.exception() is not None:
                raise SystemExit(f"query failed: {q.exception()}")
            time.sleep(0.2)
        if q.exception() is not None:
            raise SystemExit(f"query failed: {q.exception()}")
        progress = [p for p in q.recentProgress if p["numInputRows"]]
    finally:
        q.stop()
    out = summarise(sink.values_ms)
    out.update(sent=sent, delivered=sink.rows, batches=sink.batches)
    # where a micro-batch's time goes (Spark's own accounting, ms, mean over the
    # batches with rows): latestOffset, getBatch, queryPlanning, addBatch (the read and
    # the foreachBatch), walCommit, commitOffsets, triggerExecution (all of it)
    phases: dict[str, list[float]] = {}
    for p in progress:
        for k, v in dict(p["durationMs"]).items():
            phases.setdefault(k, []).append(float(v))
    out["batch_ms_mean"] = {k: statistics.fmean(v) for k, v in sorted(phases.items())}
    return out


def streaming_latency(spark: Any, cluster: Cluster, ns_name: str, args: argparse.Namespace,
                      work: Path) -> dict[str, Any]:
    print(f"== (b) streaming latency: {args.rate:,.0f} records/s for {args.latency_s:.0f} s, "
          "trigger 1 s", flush=True)
    warmup_s = 3.0
    seconds = args.latency_s + warmup_s
    feed = SocketFeed(args.rate, seconds)
    try:
        socket_df = (spark.readStream.format("socket").option("host", "127.0.0.1")
                     .option("port", feed.port).load())
        base = run_query(socket_df, Latencies("cast(value as double)"), work / "ck-socket",
                         warmup_s, feed.start)
    finally:
        feed.close()
    print(f"  spark socket source: {fmt_lat(base)}", flush=True)

    ns = cluster.run(cluster.bk.namespace(ns_name))
    cluster.run(ns.create_stream("latency"))
    stop = threading.Event()
    df = (spark.readStream.format("asyncbk").option("metadataUri", cluster.uri)
          .option("namespace", ns_name).option("streams", "latency")
          .option("startingPositions", "earliest").load())
    try:
        ours = run_query(df, Latencies("cast(cast(data as string) as double)"),
                         work / "ck-asyncbk", warmup_s,
                         lambda: cluster.submit(asyncbk_feed(ns, "latency", args.rate,
                                                             seconds, stop)))
    finally:
        stop.set()
    print(f"  asyncbk: {fmt_lat(ours)}", flush=True)
    ratios = {k: ours[k] / base[k] for k in ("p50_ms", "p99_ms", "max_ms")
              if base.get(k) and k in ours}
    return {"rate": args.rate, "seconds": args.latency_s, "warmup_s": warmup_s,
            "trigger_s": 1.0, "spark_socket_source": base, "asyncbk": ours,
            "ratio_to_socket_source": ratios}


def fmt_lat(r: dict[str, Any]) -> str:
    if not r.get("rows"):
        return "no rows"
    return (f"{r['delivered']:,} of {r['sent']:,} rows delivered in {r['batches']} batches; "
            f"of the {r['rows']:,} recorded: p50 {r['p50_ms']:,.0f} ms, "
            f"p99 {r['p99_ms']:,.0f} ms, max {r['max_ms']:,.0f} ms")


def spark_session(work: Path) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from asyncbk.spark import local_session

    return local_session("asyncbk-bench-spark",
                         conf={"spark.local.dir": str(work / "spark-local")})


def report(result: dict[str, Any]) -> str:
    a, b = result.get("batch"), result.get("streaming")
    lines = []
    if a:
        lines += [f"Batch read, {a['records']:,} records of {a['record_size']} B, "
                  f"`sum(length(data))`, best of {result['config']['repeats']}:", "",
                  "| source | partitions | best s | rows/s | MB/s | ÷ spark.read.text |",
                  "|---|---|---|---|---|---|"]
        for r in a["rows"]:
            lines.append(f"| {r['name']} | {r.get('partitions', '-')} | {r['best_s']:.2f} "
                         f"| {r['rows_per_s']:,.0f} | {r['mb_per_s']:.1f} "
                         f"| {r['ratio_to_text']:.2f}x |")
    if b:
        base, ours = b["spark_socket_source"], b["asyncbk"]
        lines += ["", f"Streaming, {b['rate']:,.0f} records/s for {b['seconds']:.0f} s, "
                  "trigger 1 s, latency = foreachBatch time - send time:", "",
                  "| source | delivered / sent | rows recorded | p50 ms | p99 ms | max ms |",
                  "|---|---|---|---|---|---|"]
        for name, r in (("spark `socket` source (baseline)", base), ("asyncbk", ours)):
            if r.get("rows"):
                lines.append(f"| {name} | {r['delivered']:,} / {r['sent']:,} | {r['rows']:,} "
                             f"| {r['p50_ms']:,.0f} | {r['p99_ms']:,.0f} | {r['max_ms']:,.0f} |")
        rr = b["ratio_to_socket_source"]
        if rr:
            lines.append("| asyncbk ÷ socket source | | | "
                         + " | ".join(f"{rr[k]:.2f}x" for k in ("p50_ms", "p99_ms", "max_ms")
                                      if k in rr) + " |")
        lines += ["", "Mean time of a micro-batch with rows, by phase (Spark's durationMs):", "",
                  "| source | " + " | ".join(PHASES) + " |", "|---|" + "---|" * len(PHASES)]
        for name, r in (("spark `socket` source", base), ("asyncbk", ours)):
            ms = r.get("batch_ms_mean", {})
            lines.append(f"| {name} | " + " | ".join(f"{ms[k]:,.0f}" if k in ms else "-"
                                                     for k in PHASES) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--records", type=int, default=None,
                   help="records for the batch reads (default 1,000,000; --quick 100,000)")
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--segments", default="1,4,16", help="segment counts (default 1,4,16)")
    p.add_argument("--repeats", type=int, default=REPEATS, help="timed runs per read")
    p.add_argument("--partition-records", default=None,
                   help="maxRecordsPerPartition values to read with, comma-separated "
                        "(default: the option's default)")
    p.add_argument("--rate", type=float, default=1000.0, help="streaming records/s")
    p.add_argument("--latency-s", type=float, default=None,
                   help="streaming measurement seconds (default 20; --quick 8)")
    p.add_argument("--quick", action="store_true", help="100,000 records, 8 s of streaming")
    p.add_argument("--skip", choices=["batch", "streaming"], help="leave one part out")
    p.add_argument("--metadata-uri", help="an existing cluster (default: a local one)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    args.records = args.records or (100_000 if args.quick else 1_000_000)
    args.latency_s = args.latency_s or (8.0 if args.quick else 20.0)
    args.segments = [int(s) for s in args.segments.split(",")]
    args.partition_records = [int(s) for s in args.partition_records.split(",")] \
        if args.partition_records else None
    if args.record_size < 16:
        p.error("--record-size must be >= 16")

    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="asyncbk-bench-spark-"))
    cluster = Cluster(args.metadata_uri, work / "cluster")
    result: dict[str, Any] = {
        "config": {"records": args.records, "record_size": args.record_size,
                   "segments": args.segments, "repeats": args.repeats, "rate": args.rate,
                   "latency_s": args.latency_s, "quick": args.quick,
                   "cluster": "given" if args.metadata_uri else "local, 3 bookies",
                   "ledger_shape": "E3 Qw3 Qa2", "master": "local[2]"},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "loadavg_start": os.getloadavg()},
    }
    ns_name = f"bench-spark-{uuid.uuid4().hex[:8]}"
    spark = None
    try:
        cluster.start()
        cluster.run(cluster.bk.namespace(ns_name, create=True, **Q332))
        spark = spark_session(work)
        import pyspark

        result["machine"]["pyspark"] = pyspark.__version__
        if args.skip != "batch":
            result["batch"] = batch_reads(spark, cluster, ns_name, args, work)
        if args.skip != "streaming":
            result["streaming"] = streaming_latency(spark, cluster, ns_name, args, work)
    finally:
        if spark is not None:
            spark.stop()
        if args.metadata_uri and cluster.bk is not None:
            try:
                ns = cluster.run(cluster.bk.namespace(ns_name))
                cluster.run(ns.delete(force=True), 300)
            except Exception as exc:  # clean-up is best effort
                print(f"could not delete namespace {ns_name}: {exc}", file=sys.stderr)
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    result["elapsed_s"] = time.monotonic() - t0
    result["machine"]["loadavg_end"] = os.getloadavg()
    text = report(result)
    text += ("\n\nload average (1/5/15 min) at the start "
             + "/".join(f"{x:.1f}" for x in result["machine"]["loadavg_start"]) + ", at the end "
             + "/".join(f"{x:.1f}" for x in result["machine"]["loadavg_end"])
             + f", on {os.cpu_count()} cores")
    print()
    print(text)
    print(f"\n(took {result['elapsed_s']:.0f} s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
