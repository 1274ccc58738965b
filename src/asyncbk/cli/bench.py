"""``asyncbk bench write``: append throughput and latency against a cluster.

Closed loop: ``--inflight`` appends are kept in flight on one ledger until
``--entries`` have been acknowledged; each append's latency is measured from
submission to acknowledgement.  Without ``--metadata-uri`` it starts its own
LocalCluster (etcd + bookies as separate processes) and stops it afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import resource
import sys
import time
from typing import Any

import aiofiles

from .._version import __version__
from .main import CliError

LATENCY_US_MAX = 60_000_000
"""Highest latency the histogram tracks (60 s); larger values are clamped."""


def new_histogram() -> Any:
    try:
        from hdrh.histogram import HdrHistogram
    except ImportError:
        raise CliError("the benchmark needs hdrhistogram: pip install 'asyncbk[bench]'") from None
    return HdrHistogram(1, LATENCY_US_MAX, 3)


def _process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (Linux /proc); None where unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def _write_load(bk: Any, args: argparse.Namespace, entries: int,
                      latencies_us: Any | None) -> float:
    lh = await bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum,
                                digest=args.digest)
    payload = os.urandom(args.entry_size)
    window = asyncio.Semaphore(args.inflight)
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    remaining = entries
    t0 = time.perf_counter()
    last_report = t0

    def on_done(start: float, fut: asyncio.Future[int]) -> None:
        nonlocal remaining
        window.release()
        if fut.exception() is not None:
            if not done.done():
                done.set_exception(fut.exception())  # type: ignore[arg-type]
            return
        if latencies_us is not None:
            latencies_us.record_value(min(LATENCY_US_MAX,
                                          max(1, int((time.perf_counter() - start) * 1e6))))
        remaining -= 1
        if remaining == 0 and not done.done():
            done.set_result(None)

    for i in range(entries):
        await window.acquire()
        if done.done():
            break
        start = time.perf_counter()
        lh.append(payload).add_done_callback(lambda f, s=start: on_done(s, f))
        now = time.perf_counter()
        if latencies_us is not None and sys.stderr.isatty() and now - last_report > 1:
            last_report = now
            print(f"\r  {i}/{entries} appended", end="", file=sys.stderr, flush=True)
    await done
    elapsed = time.perf_counter() - t0
    await lh.close()
    return elapsed


def _version_of(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


async def run_write_bench(args: argparse.Namespace) -> int:
    if not args.ensemble >= args.write_quorum >= args.ack_quorum:
        raise ValueError("need --ensemble >= --write-quorum >= --ack-quorum")
    from ..client.client import BookKeeper
    from ..testing.cluster import LocalCluster

    cluster = None
    if args.metadata_uri:
        bk = await BookKeeper.connect(args.metadata_uri)
    else:
        print(f"starting a local cluster (etcd + {args.bookies} bookies) ...", file=sys.stderr)
        cluster = LocalCluster(bookies=args.bookies)
        await cluster.start()
    try:
        if cluster is not None:
            bk = await cluster.client()
        if args.warmup > 0:
            await _write_load(bk, args, args.warmup, None)
        latencies = new_histogram()
        pids: dict[str, int] = {}
        if cluster is not None:
            pids = {f"bookie-{b.index}": b.pid for b in cluster.bookies if b.pid}
            if cluster.etcd is not None and cluster.etcd.pid:
                pids["etcd"] = cluster.etcd.pid
        cpu_before = {name: _process_cpu_s(pid) for name, pid in pids.items()}
        client_before = _self_cpu_s()
        elapsed = await _write_load(bk, args, args.entries, latencies)
        cpu_percent: dict[str, float] = {"client": 100 * (_self_cpu_s() - client_before) / elapsed}
        for name, pid in pids.items():
            before, after = cpu_before[name], _process_cpu_s(pid)
            if before is not None and after is not None:
                cpu_percent[name] = 100 * (after - before) / elapsed
    finally:
        if cluster is not None:
            await cluster.stop()
        else:
            await bk.close()
    eps = args.entries / elapsed
    result = {
        "workload": "write",
        "throughput_eps": eps,
        "throughput_mbps": eps * args.entry_size / 1e6,
        "latency_us": {
            "p50": latencies.get_value_at_percentile(50),
            "p99": latencies.get_value_at_percentile(99),
            "p999": latencies.get_value_at_percentile(99.9),
            "max": latencies.get_max_value(),
            "mean": latencies.get_mean_value(),
        },
        "cpu_percent": {k: round(v, 1) for k, v in cpu_percent.items()},
        "elapsed_s": elapsed,
        "config": {k: getattr(args, k) for k in ("entries", "inflight", "entry_size", "ensemble",
                                                  "write_quorum", "ack_quorum", "digest",
                                                  "bookies", "warmup")},
        "versions": {"asyncbk": __version__, "python": platform.python_version(),
                     "msgpack": _version_of("msgpack"), "uvloop": _version_of("uvloop")},
    }
    lat = result["latency_us"]
    print(f"write: {args.entries} x {args.entry_size} B, {args.inflight} in flight, "
          f"E={args.ensemble} Qw={args.write_quorum} Qa={args.ack_quorum}: "
          f"{eps:,.0f} entries/s ({result['throughput_mbps']:.1f} MB/s); latency us "
          f"p50 {lat['p50']:.0f}  p99 {lat['p99']:.0f}  p999 {lat['p999']:.0f}  max {lat['max']:.0f}")
    print("cpu %: " + "  ".join(f"{k} {v:.0f}" for k, v in result["cpu_percent"].items()))
    if args.json:
        async with aiofiles.open(args.json, "w") as fh:
            await fh.write(json.dumps(result, indent=2))
    return 0
