"""Click events -> asyncbk -> Spark Structured Streaming -> asyncbk, in one command.

    asyncbk standalone                                   # terminal 1: prints the metadata URI
    python examples/spark_pipeline.py --metadata-uri etcd://127.0.0.1:2379/asyncbk   # terminal 2

What runs (all in this process, except Spark's JVM and its Python workers):

1. A producer (the asyncbk stream writer, on an asyncio event loop in a thread of
   its own) appends JSON click events ``{"user": ..., "page": ..., "ts": ...}``
   (``ts``: wall-clock seconds) to stream ``events`` of namespace ``demo`` (both
   created if absent) at ``--rate`` records/s, until ``--records`` are written or
   ``--seconds`` have passed.
2. Query ``page-counts``: ``spark.readStream.format("asyncbk")`` reads ``events``,
   parses ``data`` with ``from_json``, counts clicks per page in 5 s tumbling
   event-time windows (watermark 5 s) and appends each closed window's counts to
   stream ``page-counts`` with ``writeStream.format("asyncbk")`` (column ``data`` =
   the row as JSON; the sink is exactly-once per micro-batch).  asyncbk's sink
   takes append mode, so a window is written once, when the watermark passes its
   end; the producer's last record is a heartbeat event, far enough ahead in event
   time that every window of real clicks closes (its own window never does, so it
   is never counted).
3. Query ``printer``: reads ``page-counts`` back as a stream and prints each
   window's counts.
4. When the producer is done, the pipeline waits (at most ``--drain-s``) until
   the printed counts add up to the events produced, stops both queries and the
   producer's client, and prints a summary.  Exit status 0 when
   counted == produced.

Each run reads only the records of its own run (it starts both streams at their
next txid), and keeps its Spark checkpoints in a temporary directory (or
``--checkpoint-dir``).
"""

# ruff: noqa: T201 - an example program: it prints

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

WINDOW_S = 5
WATERMARK_S = 5
PAGES = ["/home", "/search", "/products", "/products/42", "/cart", "/checkout", "/about"]
WEIGHTS = [30, 20, 20, 10, 10, 5, 5]
HEARTBEAT_PAGE = "__heartbeat__"


class Producer:
    """The asyncbk stream writer on an event loop in a thread of its own.

    ``start()`` connects, creates the namespace and streams if absent and opens the
    writer (which takes the stream over); ``first_txid`` is then the txid of the
    first event this run writes.  ``go()`` starts writing; ``stop()`` asks it to end
    early.  It always ends with the heartbeat event and closes the writer."""

    def __init__(self, uri: str, namespace: str, records: int, rate: float) -> None:
        self.uri, self.namespace, self.records, self.rate = uri, namespace, records, rate
        self.produced = 0
        self.first_txid = 0
        self.counts_first_txid = 0
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.done = threading.Event()
        self._go = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="producer", daemon=True)

    def start(self, timeout_s: float = 60.0) -> None:
        self._thread.start()
        if not self.ready.wait(timeout_s):
            raise SystemExit(f"could not connect to {self.uri} within {timeout_s:.0f} s")
        if self.error is not None:
            raise SystemExit(f"producer: {type(self.error).__name__}: {self.error}")

    def go(self) -> None:
        self._go.set()

    def stop(self) -> None:
        self._stop.set()
        self._go.set()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        finally:
            self.ready.set()
            self.done.set()

    async def _run(self) -> None:
        from asyncbk import BookKeeper

        async with await BookKeeper.connect(self.uri) as bk:
            ns = await bk.namespace(self.namespace, create=True)
            for stream in ("events", "page-counts"):
                if not await ns.stream_exists(stream):
                    await ns.create_stream(stream)
            info = await ns.stream_info("page-counts")  # the sink writes completed segments
            self.counts_first_txid = max((s.last_txid + 1 for s in info.segments
                                          if s.records), default=0)
            async with await ns.open_writer("events") as w:
                self.first_txid = w.last_txid + 1
                self.ready.set()
                await asyncio.to_thread(self._go.wait)
                last_ts = await self._produce(w)
                # The heartbeat: far enough ahead in event time to close every window.
                hb = {"user": None, "page": HEARTBEAT_PAGE,
                      "ts": last_ts + WINDOW_S + WATERMARK_S + 1}
                await w.write(json.dumps(hb).encode())

    async def _produce(self, w: Any) -> float:
        rnd = random.Random()
        users = [f"user-{i}" for i in range(1, 51)]
        t0 = time.monotonic()
        last_ts = time.time()
        pending: list[asyncio.Future[Any]] = []
        while self.produced < self.records and not self._stop.is_set():
            due = min(self.records, int((time.monotonic() - t0) * self.rate) + 1)
            while self.produced < due:
                last_ts = time.time()
                event = {"user": rnd.choice(users),
                         "page": rnd.choices(PAGES, WEIGHTS)[0], "ts": last_ts}
                pending.append(w.write_nowait(json.dumps(event).encode()))
                self.produced += 1
            if len(pending) > 5000:  # keep the unacknowledged records bounded
                await pending[-1]
                pending.clear()
            await asyncio.sleep(0.01)
        if pending:
            await pending[-1]  # futures resolve in order: all of them are durable
        return last_ts


def positions(stream: str, first_txid: int) -> str:
    """The startingPositions option: this run's first record of ``stream`` on."""
    return json.dumps({stream: {"txid": first_txid}}) if first_txid > 0 else "earliest"


class Printer:
    """foreachBatch of the ``printer`` query: print each closed window, add up the counts."""

    def __init__(self) -> None:
        self.counted = 0
        self.windows: set[tuple[str, str]] = set()
        self.per_page: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, batch: Any, batch_id: int) -> None:
        rows = [json.loads(r.data) for r in batch.selectExpr("cast(data as string) as data")
                .collect()]
        if not rows:
            return
        rows.sort(key=lambda r: (r["window_start"], -r["count"], r["page"]))
        with self.lock:
            for r in rows:
                self.counted += r["count"]
                self.windows.add((r["window_start"], r["page"]))
                self.per_page[r["page"]] = self.per_page.get(r["page"], 0) + r["count"]
            total = self.counted
        for r in rows:
            print(f"  window {r['window_start'][11:19]}-{r['window_end'][11:19]}  "
                  f"{r['page']:<14} {r['count']:>6}", flush=True)
        print(f"[printer] batch {batch_id}: {len(rows)} window/page counts; "
              f"{total} clicks counted so far", flush=True)


def spark_session(args: argparse.Namespace) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's Python workers: this venv
    from asyncbk.spark import local_session  # registers format("asyncbk")

    return local_session("asyncbk-spark-pipeline", args.master,
                         conf={"spark.sql.session.timeZone": "UTC"})


def start_queries(spark: Any, args: argparse.Namespace, producer: Producer,
                  checkpoints: str, printer: Printer) -> list[Any]:
    from pyspark.sql import functions as F

    from asyncbk.spark import activate_session

    # Writes find format("asyncbk") through the calling thread's active session: this
    # makes starting the queries safe from any thread (asyncio.to_thread, a pool).
    activate_session(spark)

    def source(stream: str, first_txid: int) -> Any:
        return (spark.readStream.format("asyncbk")
                .option("metadataUri", args.metadata_uri)
                .option("namespace", args.namespace)
                .option("streams", stream)
                .option("startingPositions", positions(stream, first_txid))
                .load())

    schema = "user STRING, page STRING, ts DOUBLE"
    clicks = (source("events", producer.first_txid)
              .select(F.from_json(F.col("data").cast("string"), schema).alias("e"))
              .select("e.*")
              .withColumn("event_time", F.timestamp_seconds("ts"))
              .withWatermark("event_time", f"{WATERMARK_S} seconds"))
    counts = (clicks.groupBy(F.window("event_time", f"{WINDOW_S} seconds"), "page").count()
              .select(F.to_json(F.struct(
                  F.date_format("window.start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start"),
                  F.date_format("window.end", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_end"),
                  "page", "count")).alias("data")))
    to_asyncbk = (counts.writeStream.queryName("page-counts").format("asyncbk")
                  .outputMode("append")
                  .option("metadataUri", args.metadata_uri)
                  .option("namespace", args.namespace)
                  .option("stream", "page-counts")
                  .option("checkpointLocation", os.path.join(checkpoints, "page-counts"))
                  .trigger(processingTime="2 seconds")
                  .start())
    printing = (source("page-counts", producer.counts_first_txid)
                .writeStream.queryName("printer").foreachBatch(printer)
                .option("checkpointLocation", os.path.join(checkpoints, "printer"))
                .trigger(processingTime="1 second")
                .start())
    return [to_asyncbk, printing]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        epilog="Start `asyncbk standalone` first: it prints the metadata URI.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--metadata-uri", required=True,
                   help="the cluster's metadata URI, e.g. etcd://127.0.0.1:2379/asyncbk")
    p.add_argument("--namespace", default="demo", help="namespace (created if absent)")
    p.add_argument("--records", type=int, default=30_000,
                   help="click events to produce (default 30,000)")
    p.add_argument("--rate", type=float, default=500.0,
                   help="events per second (default 500)")
    p.add_argument("--seconds", type=float, default=60.0,
                   help="stop producing after this long even if --records are not all "
                        "written (default 60)")
    p.add_argument("--drain-s", type=float, default=120.0,
                   help="then wait at most this long for the counts to catch up (default "
                        "120; Spark's first micro-batches start its Python workers, which "
                        "takes a while on a busy machine)")
    p.add_argument("--checkpoint-dir", help="Spark checkpoints (default: a temporary "
                   "directory, removed at the end)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    args = p.parse_args(argv)
    for name in ("records", "rate", "seconds"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    producer = Producer(args.metadata_uri, args.namespace, args.records, args.rate)
    producer.start()
    print(f"namespace {args.namespace}: events from txid {producer.first_txid}, "
          f"page-counts from txid {producer.counts_first_txid}", flush=True)
    checkpoints = args.checkpoint_dir or tempfile.mkdtemp(prefix="asyncbk-pipeline-")
    printer = Printer()
    spark = spark_session(args)
    queries: list[Any] = []
    drained = False
    try:
        queries = start_queries(spark, args, producer, checkpoints, printer)
        print(f"producing {args.records:,} click events at {args.rate:,.0f}/s "
              f"(at most {args.seconds:.0f} s) ...", flush=True)
        producer.go()
        deadline = time.monotonic() + args.seconds
        while not producer.done.wait(0.5):
            if time.monotonic() >= deadline:
                producer.stop()
                producer.join(30)
                break
            for q in queries:
                if q.exception() is not None:
                    raise SystemExit(f"query {q.name} failed: {q.exception()}")
        if producer.error is not None:
            raise SystemExit(f"producer: {type(producer.error).__name__}: {producer.error}")
        print(f"produced {producer.produced:,} events; waiting for the last windows "
              f"(at most {args.drain_s:.0f} s) ...", flush=True)
        drain_until = time.monotonic() + args.drain_s
        next_note = time.monotonic() + 15
        while time.monotonic() < drain_until:
            for q in queries:
                if q.exception() is not None:
                    raise SystemExit(f"query {q.name} failed: {q.exception()}")
            with printer.lock:
                counted = printer.counted
            if counted >= producer.produced:
                drained = True
                break
            if time.monotonic() >= next_note:
                next_note += 15
                print(f"... {counted:,} of {producer.produced:,} counted so far", flush=True)
            time.sleep(0.5)
    finally:
        producer.stop()
        for q in queries:
            try:
                q.stop()
            except Exception as exc:  # report it and go on stopping
                print(f"stopping query {q.name}: {exc}", file=sys.stderr)
        spark.stop()
        producer.join(30)
        if not args.checkpoint_dir:
            shutil.rmtree(checkpoints, ignore_errors=True)
    with printer.lock:
        counted, windows = printer.counted, len(printer.windows)
        per_page = sorted(printer.per_page.items(), key=lambda kv: -kv[1])
    if per_page:
        print("clicks per page: " + ", ".join(f"{page} {n}" for page, n in per_page))
    ok = drained and counted == producer.produced
    print(f"summary: produced={producer.produced} counted={counted} "
          f"window_page_counts={windows} {'OK' if ok else 'MISMATCH'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
