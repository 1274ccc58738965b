"""Soak: bookie memory under a long write load.

Runs ``asyncbk bench write`` in open loop (a fixed offered rate) for
``--duration`` seconds against its own local cluster, sampling each bookie's
RSS every 5 s, and prints RSS at the start, after the first minute and at the
end, with the growth per million entries.

    python benchmarks/soak.py [--duration 600] [--rate 5000] [--json soak.json]
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
    p.add_argument("--entry-size", type=int, default=1024)
    p.add_argument("--json", default=None, help="also save the benchmark's JSON here")
    p.add_argument("--plot", default=None, help="PNG of latency and throughput over time")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="asyncbk-soak-") as d:
        out = Path(args.json or Path(d) / "soak.json")
        entries = int(args.rate * args.duration) + 1
        cmd = [sys.executable, "-m", "asyncbk", "bench", "write", "--entries", str(entries),
               "--rate", str(args.rate), "--duration", str(args.duration),
               "--entry-size", str(args.entry_size), "--ensemble", "3", "--write-quorum", "3",
               "--ack-quorum", "2", "--json", str(out)]
        if args.plot:
            cmd += ["--plot", args.plot]
        subprocess.run(cmd, check=True, timeout=args.duration + 600)
        result = json.loads(out.read_text())
    done = result["entries_done"]
    lat = result["latency_us"]
    print(f"\n{done:,} entries in {result['elapsed_s']:.0f} s "
          f"({result['throughput_eps']:,.0f}/s offered {args.rate:,.0f}/s); "
          f"latency p50 {lat['p50']} us, p99 {lat['p99']} us, p999 {lat['p999']} us")
    print("| bookie | RSS start MiB | after 1 min | end | max | growth per 1M entries |")
    print("|---|---|---|---|---|---|")
    for name, rss in result["bookie_rss_mb"].items():
        samples = rss["samples"]
        minute = samples[min(len(samples) - 1, 12)]  # samples every 5 s
        per_million = (rss["last"] - rss["first"]) / max(1, done) * 1e6
        print(f"| {name} | {rss['first']:.0f} | {minute:.0f} | {rss['last']:.0f} "
              f"| {rss['max']:.0f} | {per_million:.1f} MiB |")


if __name__ == "__main__":
    main()
