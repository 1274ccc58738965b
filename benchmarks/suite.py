"""The benchmark suite: every workload of ``asyncbk bench`` in one run, as one table.

Each row is one ``asyncbk bench`` run against a fresh local cluster (etcd + 3
bookie processes on loopback, journals fsynced before every ack), 1 KiB
entries and E=3 Qw=3 Qa=2 unless the row says otherwise:

- write, sequential (1 in flight) and pipelined (256 in flight);
- write, open loop at half the pipelined rate measured just before;
- read, catch-up from a closed ledger (ranges of 1000) and tailing behind a
  writer offered 5,000 appends/s;
- write with 1, 10 and 100 ledgers in parallel (256 in flight in total);
- write with entry sizes from 100 B to 64 KiB (MB/s);
- write from 2 client processes.

JSON of every run and PNG plots of the main ones go to ``--out``
(``bench-results/``), the table to stdout and ``--out/suite.md``.

    python benchmarks/suite.py [--quick] [--out bench-results]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def run(out_dir: Path, name: str, workload: list[str], plot: bool = False) -> dict[str, Any]:
    out = out_dir / f"{name}.json"
    cmd = [sys.executable, "-m", "asyncbk", "bench", *workload, "--json", str(out)]
    if plot:
        cmd += ["--plot", str(out_dir / f"{name}.png")]
    print(f"== {name}: asyncbk bench {' '.join(workload)}", flush=True)
    subprocess.run(cmd, check=True, timeout=1800)
    return dict(json.loads(out.read_text()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench-results")
    p.add_argument("--quick", action="store_true", help="about a fifth of the entries")
    args = p.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    scale = 0.2 if args.quick else 1.0

    def n(count: int) -> str:
        return str(max(500, int(count * scale)))

    q332 = ["--ensemble", "3", "--write-quorum", "3", "--ack-quorum", "2"]
    rows: list[tuple[str, dict[str, Any]]] = []
    t0 = time.monotonic()
    rows.append(("write sequential, 1 in flight",
                 run(out_dir, "write-sequential", ["write", "--entries", n(5000),
                                                   "--inflight", "1", *q332])))
    pipelined = run(out_dir, "write-pipelined", ["write", "--entries", n(60000),
                                                 "--inflight", "256", *q332], plot=True)
    rows.append(("write pipelined, 256 in flight", pipelined))
    half = pipelined["throughput_eps"] / 2
    rows.append((f"write open loop at half max ({half:,.0f}/s offered)",
                 run(out_dir, "write-open-loop-half", [
                     "write", "--rate", f"{half:.0f}", "--duration", str(10 * scale),
                     "--entries", str(int(half * 10 * scale) + 1), *q332], plot=True)))
    rows.append(("read catch-up, ranges of 1000",
                 run(out_dir, "read-catchup", ["read", "--mode", "catchup", "--entries",
                                               n(200000), "--batch", "1000", *q332], plot=True)))
    rows.append(("read tail, writer offered 5,000/s",
                 run(out_dir, "read-tail", ["read", "--mode", "tail", "--rate", "5000",
                                            "--entries", n(30000), *q332], plot=True)))
    for ledgers in (1, 10, 100):
        rows.append((f"write pipelined, {ledgers} ledgers",
                     run(out_dir, f"write-ledgers-{ledgers}", [
                         "write", "--entries", n(60000), "--ledgers", str(ledgers), *q332])))
    for size in (100, 1024, 4096, 16384, 65536):
        entries = min(60000, max(2000, 64 * 1024 * 1024 // size))
        rows.append((f"write pipelined, {size} B entries",
                     run(out_dir, f"write-size-{size}", [
                         "write", "--entries", n(entries), "--entry-size", str(size), *q332])))
    rows.append(("write pipelined, 2 client processes",
                 run(out_dir, "write-clients-2", ["write", "--entries", n(60000),
                                                  "--clients", "2", *q332])))

    lines = ["| workload | entries/s | MB/s | p50 µs | p99 µs | p999 µs | CPU % client / bookies |",
             "|---|---|---|---|---|---|---|"]
    for name, r in rows:
        lat, cpu = r["latency_us"], r["cpu_percent"]
        bookies = "/".join(f"{v:.0f}" for k, v in cpu.items() if k.startswith("bookie"))
        lines.append(f"| {name} | {r['throughput_eps']:,.0f} | {r['throughput_mbps']:.1f} "
                     f"| {lat['p50']:,} | {lat['p99']:,} | {lat['p999']:,} "
                     f"| {cpu.get('client', 0):.0f} / {bookies} |")
    table = "\n".join(lines)
    print()
    print(table)
    print(f"\n(catch-up latency is per range read of 1000 entries; tail latency is from "
          f"append to delivery; suite took {time.monotonic() - t0:.0f} s)")
    (out_dir / "suite.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
