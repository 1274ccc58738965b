"""Where an open-loop append's latency goes: the generator, the bookies, the disk.

``asyncbk bench write --rate R`` measures each append from its due time (so a
generator that falls behind cannot hide queueing). This script runs the same
kind of load against a local cluster (etcd + 3 bookie processes, E=3 Qw=3 Qa=2,
journals fdatasync'd before every acknowledgement) and splits that latency:

- generator lag: how late each append was issued after its due time (the
  generator wakes on event-loop timers, which have 1 ms resolution);
- acknowledgement from the append call, and from the due time;
- inside the bookies (from their metrics): mean add latency, mean journal
  fdatasync time, records per group commit, group commits per second;
- the client's garbage-collector passes (count and longest, per generation).

    python benchmarks/openloop_parts.py --rate 15000 --duration 10
    python benchmarks/openloop_parts.py --bookie-config entry_log_flush_bytes=4194304
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import gc
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from asyncbk.config import BookieConfig
from asyncbk.testing import LocalCluster

METRICS = ("add_latency_seconds", "journal_fsync_seconds", "journal_batch_records")


def _quantiles(values: list[float]) -> str:
    values.sort()
    n = len(values)
    return "  ".join(f"p{q} {values[min(n - 1, int(n * q / 100))] * 1e6:7,.0f}"
                     for q in (50, 90, 99))


async def _bookie_means(cluster: LocalCluster, seconds: float) -> list[str]:
    lines = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for bookie in cluster.bookies:
            async with session.get(bookie.http_url + "/metrics") as resp:
                text = await resp.text()
            sums: dict[str, float] = {}
            for name in METRICS:
                for part in ("sum", "count"):
                    m = re.search(rf"^asyncbk_bookie_{name}_{part}\{{[^}}]*\}} (\S+)$", text,
                                  re.MULTILINE)
                    sums[f"{name}_{part}"] = float(m.group(1)) if m else float("nan")
            adds = sums["add_latency_seconds_count"]
            fsyncs = sums["journal_fsync_seconds_count"]
            lines.append(
                f"{bookie.id}: add mean {sums['add_latency_seconds_sum'] / adds * 1e6:,.0f} us; "
                f"fdatasync mean {sums['journal_fsync_seconds_sum'] / fsyncs * 1e6:,.0f} us; "
                f"{sums['journal_batch_records_sum'] / fsyncs:.1f} records per group commit; "
                f"{fsyncs / seconds:,.0f} group commits/s (warm-up included)")
    return lines


async def run(rate: int, duration: float, entry_size: int,
              bookie_config: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with LocalCluster(data_dir=Path(tmp) / "cluster", bookies=3,
                                bookie_config=bookie_config) as cluster:
            bk = await cluster.client()
            lh = await bk.create_ledger(3, 3, 2)
            payload = os.urandom(entry_size)
            for _ in range(2000):  # warm-up, not counted
                await lh.append(payload)
            loop = asyncio.get_running_loop()
            lags: list[float] = []
            from_call: list[float] = []
            from_due: list[float] = []
            pending = 0
            stopped = False
            all_done = loop.create_future()
            collections: list[tuple[int, float]] = []
            gc_started = [0.0]

            def on_gc(phase: str, info: dict[str, Any]) -> None:
                if phase == "start":
                    gc_started[0] = time.perf_counter()
                else:
                    collections.append((info["generation"], time.perf_counter() - gc_started[0]))

            def acked(fut: asyncio.Future[int], due: float, called: float) -> None:
                nonlocal pending
                now = time.perf_counter()
                fut.result()
                from_call.append(now - called)
                from_due.append(now - due)
                pending -= 1
                if stopped and pending == 0 and not all_done.done():
                    all_done.set_result(None)

            gc.callbacks.append(on_gc)
            started = time.perf_counter()
            sent = 0
            try:
                while (now := time.perf_counter()) - started < duration:
                    due_count = int((now - started) * rate) + 1
                    while sent < due_count:
                        due = started + sent / rate
                        called = time.perf_counter()
                        lags.append(called - due)
                        fut = lh.append(payload)
                        fut.add_done_callback(functools.partial(acked, due=due, called=called))
                        pending += 1
                        sent += 1
                    await asyncio.sleep(0.001)
                stopped = True
                if pending:
                    await asyncio.wait_for(all_done, 60)
            finally:
                gc.callbacks.remove(on_gc)
            elapsed = time.perf_counter() - started
            print(f"open loop, {rate:,}/s offered, {entry_size} B, {sent:,} appends in "
                  f"{elapsed:.1f} s (E=3 Qw=3 Qa=2"
                  + "".join(f", {k}={v}" for k, v in bookie_config.items())
                  + "), microseconds:")
            print(f"  generator lag         {_quantiles(lags)}")
            print(f"  ack from the call     {_quantiles(from_call)}")
            print(f"  ack from the due time {_quantiles(from_due)}")
            for line in await _bookie_means(cluster, elapsed):
                print("  " + line)
            for generation in (0, 1, 2):
                times = [t for g, t in collections if g == generation]
                if times:
                    print(f"  client gc generation {generation}: {len(times)} passes, longest "
                          f"{max(times) * 1e3:.1f} ms")
            await lh.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=15_000,
                        help="appends offered per second (default: 15000)")
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds of load (default: 10)")
    parser.add_argument("--entry-size", type=int, default=1024,
                        help="bytes per entry (default: 1024)")
    parser.add_argument("--bookie-config", action="append", default=[], metavar="KEY=VALUE",
                        help="a bookie setting for the run (a JSON value, or a string), "
                             "e.g. entry_log_flush_bytes=4194304; repeatable")
    args = parser.parse_args()
    if args.rate <= 0 or args.duration <= 0 or args.entry_size <= 0:
        parser.error("--rate, --duration and --entry-size must be positive")
    known = {f.name for f in dataclasses.fields(BookieConfig)}
    bookie_config: dict[str, Any] = {}
    for item in args.bookie_config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--bookie-config takes KEY=VALUE, not {item!r}")
        if key not in known:
            parser.error(f"--bookie-config: {key!r} is not a bookie setting "
                         "(see docs/configuration.md)")
        try:
            bookie_config[key] = json.loads(value)
        except ValueError:
            bookie_config[key] = value
    uvloop.run(run(args.rate, args.duration, args.entry_size, bookie_config))


if __name__ == "__main__":
    main()
