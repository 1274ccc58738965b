"""``asyncbk bench write``: append throughput and latency against a cluster.

Closed loop: ``--inflight`` appends are kept in flight on one ledger until
``--entries`` have been acknowledged; each append's latency is measured from
submission to acknowledgement.  Without ``--metadata-uri`` it starts its own
LocalCluster (etcd + bookies as separate processes) and stops it afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from typing import Any

import aiofiles

from .._version import __version__


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


async def _write_load(bk: Any, args: argparse.Namespace, entries: int,
                      latencies_us: list[float] | None) -> float:
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
            latencies_us.append((time.perf_counter() - start) * 1e6)
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
        latencies: list[float] = []
        elapsed = await _write_load(bk, args, args.entries, latencies)
    finally:
        if cluster is not None:
            await cluster.stop()
        else:
            await bk.close()
    latencies.sort()
    eps = args.entries / elapsed
    result = {
        "workload": "write",
        "throughput_eps": eps,
        "throughput_mbps": eps * args.entry_size / 1e6,
        "latency_us": {
            "p50": percentile(latencies, 0.50), "p99": percentile(latencies, 0.99),
            "p999": percentile(latencies, 0.999), "max": latencies[-1] if latencies else 0.0,
            "mean": sum(latencies) / len(latencies) if latencies else 0.0,
        },
        "elapsed_s": elapsed,
        "config": {k: getattr(args, k) for k in ("entries", "inflight", "entry_size", "ensemble",
                                                  "write_quorum", "ack_quorum", "digest",
                                                  "bookies", "warmup")},
        "versions": {"asyncbk": __version__, "python": platform.python_version()},
    }
    lat = result["latency_us"]
    print(f"write: {args.entries} x {args.entry_size} B, {args.inflight} in flight, "
          f"E={args.ensemble} Qw={args.write_quorum} Qa={args.ack_quorum}: "
          f"{eps:,.0f} entries/s ({result['throughput_mbps']:.1f} MB/s); latency us "
          f"p50 {lat['p50']:.0f}  p99 {lat['p99']:.0f}  p999 {lat['p999']:.0f}  max {lat['max']:.0f}")
    if args.json:
        async with aiofiles.open(args.json, "w") as fh:
            await fh.write(json.dumps(result, indent=2))
    return 0
