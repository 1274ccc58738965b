"""Write baseline: sequential append latency and pipelined throughput.

Runs ``asyncbk bench write`` twice against one fresh local cluster per run
(etcd + 3 bookie processes): 1 in flight (latency) and 256 in flight
(throughput), 1 KiB entries, E=3 Qw=2 Qa=2 by default.  Writes JSON results
to ``bench-results/`` and prints a small table, including the ratio of
pipelined to sequential throughput measured in the same run.

    python benchmarks/write_baseline.py [--entries 20000] [--write-quorum 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def bench(out_dir: Path, name: str, entries: int, inflight: int, args: argparse.Namespace) -> dict:
    out = out_dir / f"{name}.json"
    cmd = [sys.executable, "-m", "asyncbk", "bench", "write", "--entries", str(entries),
           "--inflight", str(inflight), "--entry-size", str(args.entry_size),
           "--ensemble", str(args.ensemble), "--write-quorum", str(args.write_quorum),
           "--ack-quorum", str(args.ack_quorum), "--json", str(out)]
    subprocess.run(cmd, check=True, timeout=900)
    return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=30_000)
    p.add_argument("--sequential-entries", type=int, default=5_000)
    p.add_argument("--entry-size", type=int, default=1024)
    p.add_argument("--ensemble", type=int, default=3)
    p.add_argument("--write-quorum", type=int, default=2)
    p.add_argument("--ack-quorum", type=int, default=2)
    p.add_argument("--out", default="bench-results")
    args = p.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    seq = bench(out_dir, "write-sequential", args.sequential_entries, 1, args)
    pipe = bench(out_dir, "write-pipelined", args.entries, 256, args)
    print()
    print("| workload | entries/s | p50 us | p99 us | p999 us |")
    print("|---|---|---|---|---|")
    for name, r in (("sequential (1 in flight)", seq), ("pipelined (256 in flight)", pipe)):
        lat = r["latency_us"]
        print(f"| {name} | {r['throughput_eps']:,.0f} | {lat['p50']:.0f} | {lat['p99']:.0f} "
              f"| {lat['p999']:.0f} |")
    print(f"\npipelined / sequential throughput: "
          f"{pipe['throughput_eps'] / seq['throughput_eps']:.1f}x (same run)")


if __name__ == "__main__":
    main()
