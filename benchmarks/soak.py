"""Soak: bookie memory under a long write load.

Runs ``asyncbk bench write`` in open loop (a fixed offered rate) for
``--duration`` seconds against its own local cluster, sampling each bookie's
RSS every 5 s, and prints RSS at the start, after the first minute and at the
end, with the growth per million entries: the whole resident set (VmRSS) and its
anonymous part (RssAnon; the lmdb index's pages are file-backed, so they count in
VmRSS only, and the kernel can drop them).

    python benchmarks/soak.py [--duration 600] [--rate 5000] [--index-backend lmdb]
                              [--json soak.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    p.add_argument("--rate", type=float, default=5000.0, help="appends/s offered (default 5000)")
    p.add_argument("--entry-size", type=int, default=1024, help="bytes (default 1024)")
    p.add_argument("--index-backend", choices=["memory", "lmdb"], default="memory",
                   help="the bookies' entry index (default: memory)")
    p.add_argument("--json", default=None,
                   help="also save the benchmark's JSON here (default: not saved)")
    p.add_argument("--plot", default=None,
                   help="PNG of latency and throughput over time (default: none)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="asyncbk-soak-") as d:
        out = Path(args.json or Path(d) / "soak.json")
        entries = int(args.rate * args.duration) + 1
        cmd = [sys.executable, "-m", "asyncbk", "bench", "write", "--entries", str(entries),
               "--rate", str(args.rate), "--duration", str(args.duration),
               "--entry-size", str(args.entry_size), "--ensemble", "3", "--write-quorum", "3",
               "--ack-quorum", "2", "--index-backend", args.index_backend, "--json", str(out)]
        if args.plot:
            cmd += ["--plot", args.plot]
        subprocess.run(cmd, check=True, timeout=args.duration + 600)
        result = json.loads(out.read_text())
    done = result["entries_done"]
    lat = result["latency_us"]
    print(f"\n{args.index_backend} index: {done:,} entries in {result['elapsed_s']:.0f} s "
          f"({result['throughput_eps']:,.0f}/s offered {args.rate:,.0f}/s); "
          f"latency p50 {lat['p50']} us, p99 {lat['p99']} us, p999 {lat['p999']} us")
    print("| bookie | MiB | start | after 1 min | end | max | growth per 1M entries "
          "| growth per 1M after 1 min |")
    print("|---|---|---|---|---|---|---|---|")
    for key, what in (("bookie_rss_mb", "VmRSS"), ("bookie_rss_anon_mb", "RssAnon")):
        for name, rss in result.get(key, {}).items():
            samples = rss["samples"]
            minute = samples[min(len(samples) - 1, 12)]  # samples every 5 s
            per_million = (rss["last"] - rss["first"]) / max(1, done) * 1e6
            # the growth once warmed up: entries after the first minute at the offered rate
            later = max(1.0, done - args.rate * 60)
            per_million_later = (rss["last"] - minute) / later * 1e6
            print(f"| {name} | {what} | {rss['first']:.0f} | {minute:.0f} | {rss['last']:.0f} "
                  f"| {rss['max']:.0f} | {per_million:.1f} | {per_million_later:.1f} |")


if __name__ == "__main__":
    main()
