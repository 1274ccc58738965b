"""Soak: the bookies under a long open-loop write load, per index backend.

Runs ``asyncbk bench write`` in open loop (a fixed offered rate) for ``--duration``
seconds against its own local cluster, once per index backend and round, the
backends alternating (lmdb, memory, lmdb, memory, ... with ``--index-backend lmdb
memory``), so both see the same machine.  For each run it prints throughput, latency
percentiles (p50, p99, p999, max), the 100 ms windows in which no append completed
(*empty windows*: stalls) and the load average around it; with two backends, the
ratios of the first to the second (medians over the rounds); then each bookie's RSS
at the start, after the first minute and at the end, with the growth per million
entries: the whole resident set (VmRSS) and its anonymous part (RssAnon; the lmdb
index's pages are file-backed, so they count in VmRSS only, and the kernel can drop
them).

    python benchmarks/soak.py [--duration 600] [--rate 5000]
                              [--index-backend lmdb memory] [--rounds 3]
                              [--json soak.json] [--plot soak.png]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

WINDOW_S = 0.1
"""The width of the bench's throughput timeline slots (an empty one is a stall)."""


def empty_windows(result: dict[str, Any]) -> int:
    """100 ms windows of the measured run in which no append completed (the last,
    partial slot left out)."""
    return sum(1 for n in result["timeline"]["completed"][:-1] if n == 0)


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """What the soak compares of one run."""
    lat = result["latency_us"]
    return {"throughput_eps": result["throughput_eps"], "p50_ms": lat["p50"] / 1000,
            "p99_ms": lat["p99"] / 1000, "p999_ms": lat["p999"] / 1000,
            "max_ms": lat["max"] / 1000, "empty_windows": empty_windows(result),
            "entries": result["entries_done"]}


def run_once(args: argparse.Namespace, backend: str, out: Path, plot: str | None
             ) -> dict[str, Any]:
    entries = int(args.rate * args.duration) + 1
    cmd = [sys.executable, "-m", "asyncbk", "bench", "write", "--entries", str(entries),
           "--rate", str(args.rate), "--duration", str(args.duration),
           "--entry-size", str(args.entry_size), "--ensemble", "3", "--write-quorum", "3",
           "--ack-quorum", "2", "--index-backend", backend, "--json", str(out)]
    if plot:
        cmd += ["--plot", plot]
    load_before = os.getloadavg()
    subprocess.run(cmd, check=True, timeout=args.duration + 600)
    result: dict[str, Any] = json.loads(out.read_text())
    result["soak"] = {"backend": backend, "load_before": load_before,
                      "load_after": os.getloadavg(), **summary(result)}
    return result


def print_run(n: int, result: dict[str, Any], rate: float) -> None:
    s = result["soak"]
    print(f"run {n}: {s['backend']:6} {s['entries']:,} entries, {s['throughput_eps']:,.0f}/s "
          f"(offered {rate:,.0f}/s); latency p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f}"
          f" ms, p999 {s['p999_ms']:.1f} ms, max {s['max_ms']:.0f} ms; {s['empty_windows']}"
          f" empty 100 ms windows; load {s['load_before'][0]:.1f} -> "
          f"{s['load_after'][0]:.1f}", flush=True)


def print_comparison(runs: list[dict[str, Any]], backends: list[str]) -> dict[str, Any]:
    """Per backend: medians over its runs; with two backends, the first's ratios to
    the second's."""
    medians: dict[str, dict[str, float]] = {}
    print("\n| backend | runs | throughput/s | p50 ms | p99 ms | p999 ms | max ms "
          "| empty windows (each run) |")
    print("|---|---|---|---|---|---|---|---|")
    for backend in backends:
        mine = [r["soak"] for r in runs if r["soak"]["backend"] == backend]
        med = {k: statistics.median(s[k] for s in mine)
               for k in ("throughput_eps", "p50_ms", "p99_ms", "p999_ms", "max_ms",
                         "empty_windows")}
        medians[backend] = med
        print(f"| {backend} | {len(mine)} | {med['throughput_eps']:,.0f} | {med['p50_ms']:.1f} "
              f"| {med['p99_ms']:.1f} | {med['p999_ms']:.1f} | {med['max_ms']:.0f} | "
              f"{', '.join(str(s['empty_windows']) for s in mine)} |")
    out: dict[str, Any] = {"medians": medians}
    if len(backends) == 2:
        a, b = (medians[x] for x in backends)
        ratios = {k: a[k] / b[k] if b[k] else float("inf") if a[k] else 1.0
                  for k in ("throughput_eps", "p50_ms", "p99_ms", "p999_ms")}
        out["ratios"] = ratios
        print(f"\n{backends[0]} / {backends[1]} (medians): throughput "
              f"{ratios['throughput_eps']:.2f}x, p50 {ratios['p50_ms']:.2f}x, p99 "
              f"{ratios['p99_ms']:.2f}x, p999 {ratios['p999_ms']:.2f}x; empty windows "
              f"{a['empty_windows']:.0f} against {b['empty_windows']:.0f}")
    return out


def print_memory(result: dict[str, Any], rate: float) -> None:
    done = result["entries_done"]
    print(f"\n{result['soak']['backend']} index, bookie memory (MiB):")
    print("| bookie | MiB | start | after 1 min | end | max | growth per 1M entries "
          "| growth per 1M after 1 min |")
    print("|---|---|---|---|---|---|---|---|")
    for key, what in (("bookie_rss_mb", "VmRSS"), ("bookie_rss_anon_mb", "RssAnon")):
        for name, rss in result.get(key, {}).items():
            samples = rss["samples"]
            minute = samples[min(len(samples) - 1, 12)]  # samples every 5 s
            per_million = (rss["last"] - rss["first"]) / max(1, done) * 1e6
            # the growth once warmed up: entries after the first minute at the offered rate
            later = max(1.0, done - rate * 60)
            per_million_later = (rss["last"] - minute) / later * 1e6
            print(f"| {name} | {what} | {rss['first']:.0f} | {minute:.0f} | {rss['last']:.0f} "
                  f"| {rss['max']:.0f} | {per_million:.1f} | {per_million_later:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=600.0,
                   help="seconds per run (default 600)")
    p.add_argument("--rate", type=float, default=5000.0, help="appends/s offered (default 5000)")
    p.add_argument("--entry-size", type=int, default=1024, help="bytes (default 1024)")
    p.add_argument("--index-backend", choices=["memory", "lmdb"], nargs="+",
                   default=["memory"],
                   help="the bookies' entry index; several: alternated, and compared "
                        "(default: memory)")
    p.add_argument("--rounds", type=int, default=1,
                   help="runs per backend, alternating (default 1)")
    p.add_argument("--json", default=None,
                   help="also save the results as JSON here: the benchmark's own for one "
                        "run, {'runs': [...], 'comparison': {...}} for several "
                        "(default: not saved)")
    p.add_argument("--plot", default=None,
                   help="PNG of latency and throughput over time; with several runs, one "
                        "per run, suffixed -<backend>-<round> (default: none)")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    backends = list(dict.fromkeys(args.index_backend))
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="asyncbk-soak-") as d:
        for rnd in range(1, args.rounds + 1):
            for backend in backends:
                plot = args.plot
                if plot and (len(backends) > 1 or args.rounds > 1):
                    stem = Path(plot)
                    plot = str(stem.with_name(f"{stem.stem}-{backend}-{rnd}{stem.suffix}"))
                result = run_once(args, backend, Path(d) / f"soak-{backend}-{rnd}.json", plot)
                runs.append(result)
                print_run(len(runs), result, args.rate)
    comparison = print_comparison(runs, backends)
    for backend in backends:
        print_memory([r for r in runs if r["soak"]["backend"] == backend][-1], args.rate)
    if args.json:
        data: Any = runs[0] if len(runs) == 1 else {"runs": runs, "comparison": comparison}
        Path(args.json).write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
