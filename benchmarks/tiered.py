"""Tiered storage against same-run baselines.

One local cluster (etcd, three bookie processes on loopback with journals fsynced
before every acknowledgement, and SeaweedFS as the S3-compatible store, requests
signed), one client in this process (uvloop).  Two streams of ``--records``
records of 100 B each (1,000,000; E3 Qw2 Qa2, segments of ``--records / 10``
records), written alike: ``obj`` is offloaded (with a 1-hour policy: the
offloader's clock is set an hour ahead) and its ledgers deleted, ``bk`` stays on
the bookies.

1. **offload**: the offloader's pass over ``obj`` (read from the bookies, upload,
   read back whole to verify, record), MB/s of objects written; the baseline is a
   plain upload of the same bytes with the same client (``put`` of each object's
   bytes, multipart above 8 MiB), MB/s.
2. **disk**: the bookies' entry-log bytes before the offload, and after the
   ledgers' deletion and a forced GC (``PUT /api/v1/bookie/gc``).
3. **catch-up read**: a stream reader from the earliest record to the last,
   records/s, ``obj`` (from the object store) against ``bk`` (from the bookies),
   in ``--rounds`` rounds taking turns; the ratio is the median of each round's.
   Target: >= 1.0.
4. **spark** (``--parts`` with spark; needs Java 17+): a Spark batch read
   (``sum(length(data))``) of each stream, rounds taking turns.

    python benchmarks/tiered.py [--quick] [--records N] [--rounds 3]
        [--parts offload,read,spark] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from asyncbk.cli.bench_record import versions
from asyncbk.clock import SystemClock
from asyncbk.offload.offloader import Offloader, OffloaderOptions
from asyncbk.stream import Position
from asyncbk.testing import LocalCluster
from asyncbk.tiered.location import Credentials, ObjectStoreUri
from asyncbk.tiered.store import S3ObjectStore

RECORD = 100
SEGMENTS = 10
SHAPE = {"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2}


class AheadClock(SystemClock):
    """The wall clock ``ahead_s`` seconds ahead (segments look older)."""

    def __init__(self, ahead_s: float) -> None:
        self.ahead_s = ahead_s

    def wall_s(self) -> float:
        return time.time() + self.ahead_s


def cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 if gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds so far of the object store and of the bookies."""
    store = cluster.object_store
    return {"object_store": cpu_s(store.pid if store else None),
            "bookies": sum(cpu_s(b.pid) for b in cluster.bookies)}


def entrylog_bytes(cluster: LocalCluster) -> int:
    return sum(p.stat().st_size for b in cluster.bookies
               for p in (b.ledger_dir / "entrylog").iterdir())


async def write(ns: Any, stream: str, records: int, **overrides: Any) -> float:
    await ns.create_stream(stream, rolling_entries=max(1, records // SEGMENTS), **overrides)
    payload = b"x" * RECORD
    t0 = time.perf_counter()
    async with await ns.open_writer(stream) as w:
        pending: list[Any] = []
        for _ in range(records):
            pending.append(w.write_nowait(payload))
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    return records / (time.perf_counter() - t0)


async def catch_up(ns: Any, stream: str, records: int) -> float:
    t0 = time.perf_counter()
    n = 0
    async with await ns.open_reader(stream, Position.EARLIEST, readahead_entries=64) as r:
        while n < records:
            n += len(await r.read_batch(10_000, wait_s=5.0))
    return n / (time.perf_counter() - t0)


async def plain_upload(store: S3ObjectStore, keys: list[str]) -> tuple[int, float]:
    """Each object's bytes put again under another key: (bytes, seconds)."""
    bodies = []
    for k in keys:
        info = await store.head(k)
        assert info is not None
        bodies.append((k, await store.get_range(k, 0, info.size)))
    t0 = time.perf_counter()
    for k, body in bodies:
        await store.put(f"baseline/{k}", body)
    spent = time.perf_counter() - t0
    for k, _ in bodies:
        await store.delete(f"baseline/{k}")
    return sum(len(b) for _, b in bodies), spent


async def force_gc(cluster: LocalCluster) -> None:
    async with aiohttp.ClientSession() as s:
        for b in cluster.bookies:
            async with s.put(f"{b.http_url}/api/v1/bookie/gc") as r:
                if r.status != 200:
                    raise RuntimeError(f"GC on {b.id} failed: {await r.text()}")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    parts = set(args.parts.split(","))
    out: dict[str, Any] = {"records": args.records, "record_bytes": RECORD,
                           "versions": versions()}
    with tempfile.TemporaryDirectory(prefix="bench-tiered-") as tmp:
        # (entry logs of 16 MiB: GC frees whole logs, and the active one never)
        async with LocalCluster(bookies=3, data_dir=Path(tmp) / "c", object_store=True,
                                bookie_config={"entry_log_bytes_max": 16 * 1024 * 1024}) as c:
            creds = c.object_store_credentials()
            assert creds is not None
            store = S3ObjectStore(ObjectStoreUri.parse(c.object_store_uri), Credentials(*creds))
            bk = await c.client()
            ns = await bk.namespace("bench", create=True, **SHAPE, offload_after_s=3600.0,
                                    offload_deletion_lag_s=0.0)
            for stream, overrides in (("obj", {}), ("bk", {"offload_after_s": 0.0})):
                rate = await write(ns, stream, args.records, **overrides)
                print(f"wrote {stream}: {args.records:,} records ({rate:,.0f} records/s)",
                      flush=True)
            await force_gc(c)
            disk_before = entrylog_bytes(c)
            offloader = Offloader(bk, store, OffloaderOptions(segments_per_pass=1000),
                                  clock=AheadClock(3601.0))
            t0 = time.perf_counter()
            report = await offloader.run_pass([ns.name])
            offload_s = time.perf_counter() - t0
            if report.failures:
                raise SystemExit(f"offload failed: {report.failures}")
            obj_keys = [s.offload.key for s in await ns.md.segments(ns.name, "obj")
                        if s.offload is not None]
            obj_bytes = 0
            for k in obj_keys:
                info = await store.head(k)
                assert info is not None
                obj_bytes += info.size
            base_bytes, base_s = await plain_upload(store, obj_keys)
            out["offload"] = {
                "segments": len(report.offloaded), "object_bytes": report.offloaded_bytes,
                "seconds": offload_s, "mb_per_s": report.offloaded_bytes / offload_s / 1e6,
                "plain_upload_mb_per_s": base_bytes / base_s / 1e6,
                "ratio": (report.offloaded_bytes / offload_s) / (base_bytes / base_s)}
            print(f"offload: {report.offloaded_bytes / 1e6:.1f} MB in {offload_s:.1f} s = "
                  f"{out['offload']['mb_per_s']:.1f} MB/s; plain upload of the same bytes "
                  f"{out['offload']['plain_upload_mb_per_s']:.1f} MB/s "
                  f"(ratio {out['offload']['ratio']:.2f})", flush=True)
            report2 = await offloader.run_pass([ns.name])  # the lag (0) passed: ledgers go
            await force_gc(c)
            disk_after = entrylog_bytes(c)
            out["disk"] = {"entrylog_bytes_before": disk_before,
                           "entrylog_bytes_after": disk_after,
                           "ledgers_deleted": len(report2.ledgers_deleted),
                           "obj_object_bytes": obj_bytes}
            print(f"bookie entry logs: {disk_before / 1e6:.1f} MB -> {disk_after / 1e6:.1f} MB "
                  f"after {len(report2.ledgers_deleted)} ledgers left the bookies", flush=True)
            info = await ns.stream_info("obj")
            assert {s.storage for s in info.segments if s.records} == {"object"}
            if "read" in parts:
                rounds: list[dict[str, float]] = []
                for r in range(args.rounds):
                    order = ("obj", "bk") if r % 2 == 0 else ("bk", "obj")
                    got: dict[str, float] = {}
                    for s in order:
                        before = server_cpu(c)
                        got[s] = await catch_up(ns, s, args.records)
                        after = server_cpu(c)
                        server = "object_store" if s == "obj" else "bookies"
                        got[f"{s}_server_cpu_s"] = after[server] - before[server]
                    rounds.append(got)
                    print(f"  round {r + 1}: object store {got['obj']:,.0f} records/s, "
                          f"bookies {got['bk']:,.0f} records/s", flush=True)
                out["catch_up"] = {
                    "object_rps": statistics.median(x["obj"] for x in rounds),
                    "bookies_rps": statistics.median(x["bk"] for x in rounds),
                    "ratio": statistics.median(x["obj"] / x["bk"] for x in rounds),
                    "rounds": rounds}
                print(f"catch-up read: object/bookies = {out['catch_up']['ratio']:.2f}; server "
                      f"CPU per read: object store "
                      f"{statistics.median(x['obj_server_cpu_s'] for x in rounds):.2f} s, "
                      f"bookies {statistics.median(x['bk_server_cpu_s'] for x in rounds):.2f} s",
                      flush=True)
            if "spark" in parts:
                out["spark"] = await asyncio.to_thread(spark_part, c, ns.name, args, creds)
    return out


def spark_part(c: LocalCluster, namespace: str, args: argparse.Namespace,
               creds: tuple[str, str]) -> dict[str, Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = creds
    from asyncbk.spark import local_session

    spark = local_session("asyncbk-bench-tiered")
    try:
        cpu: dict[str, list[float]] = {"obj": [], "bk": []}

        def read(stream: str) -> float:
            before = server_cpu(c)
            t0 = time.perf_counter()
            row = (spark.read.format("asyncbk").option("metadataUri", c.metadata_uri)
                   .option("namespace", namespace).option("streams", stream).load()
                   .selectExpr("count(*) AS n", "sum(length(data)) AS b").collect()[0])
            spent = time.perf_counter() - t0
            after = server_cpu(c)
            server = "object_store" if stream == "obj" else "bookies"
            cpu[stream].append(after[server] - before[server])
            assert row["n"] == args.records, row
            return spent

        read("obj")
        read("bk")  # warm-up
        rounds = []
        for r in range(args.rounds):
            order = ("obj", "bk") if r % 2 == 0 else ("bk", "obj")
            got = {s: read(s) for s in order}
            rounds.append(got)
            print(f"  spark round {r + 1}: object store {got['obj']:.2f} s, bookies "
                  f"{got['bk']:.2f} s", flush=True)
        result = {"object_server_cpu_s": statistics.median(cpu["obj"]),
                  "bookies_server_cpu_s": statistics.median(cpu["bk"]),
                  "object_s": min(x["obj"] for x in rounds),
                  "bookies_s": min(x["bk"] for x in rounds),
                  "ratio_time": statistics.median(x["obj"] / x["bk"] for x in rounds),
                  "rounds": rounds}
        print(f"spark batch read: object/bookies time = {result['ratio_time']:.2f}; server CPU "
              f"per read: object store {result['object_server_cpu_s']:.2f} s, bookies "
              f"{result['bookies_server_cpu_s']:.2f} s", flush=True)
        return result
    finally:
        spark.stop()


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--parts", default="offload,read,spark")
    p.add_argument("--quick", action="store_true", help="200,000 records, 2 rounds")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if args.quick:
        args.records, args.rounds = 200_000, 2
    import uvloop

    result = uvloop.run(main(args))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    cli()
