"""Streams against the ledger they are built on, measured in the same run.

Each row is one ``asyncbk bench`` run against a fresh local cluster (etcd + 3
bookie processes on loopback, journals fsynced before every acknowledgement),
E=3 Qw=3 Qa=2:

- ledger writes: ``bench write``, 1 KiB entries, 256 in flight (the base), first
  and again last (the ratios use the mean of the two: the machine is shared);
- stream writes of 100 B and of 1 KiB records: ``bench stream``, 20,000
  records in flight, bursts of 1,000 records per event-loop turn (each burst
  leaves as one ledger entry);
- stream tailing: ``bench stream --mode tail`` with the writer offered 10,000
  records/s (open loop), latency from the write call to the reader.

It prints the table, the ratios to the ledger rate and the issue's targets
(100 B records >= 250,000 records/s acknowledged; tailing p99 <= 10 ms at
10,000 records/s), and writes JSON per run and ``streams.md`` to ``--out``.
``--profile`` also runs the 100 B writer once more under py-spy (``pip install
py-spy``) and prints where the client's time goes.

    python benchmarks/streams.py [--quick] [--profile] [--out bench-results]
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TARGET_RPS_100B = 250_000
TARGET_TAIL_P99_US = 10_000
TAIL_RATE = 10_000
Q332 = ["--ensemble", "3", "--write-quorum", "3", "--ack-quorum", "2"]


def run(out_dir: Path, name: str, workload: list[str]) -> dict[str, Any]:
    out = out_dir / f"{name}.json"
    cmd = [sys.executable, "-m", "asyncbk", "bench", *workload, "--json", str(out)]
    print(f"== {name}: asyncbk bench {' '.join(workload)}", flush=True)
    subprocess.run(cmd, check=True, timeout=1800)
    return dict(json.loads(out.read_text()))


def workloads(scale: float) -> dict[str, list[str]]:
    def n(count: int) -> str:
        return str(max(2000, int(count * scale)))

    return {
        "ledger-write-1k": ["write", "--entries", n(60_000), "--inflight", "256",
                            "--entry-size", "1024", *Q332],
        "stream-write-100b": ["stream", "--records", n(1_000_000), "--record-size", "100",
                              *Q332],
        "stream-write-1k": ["stream", "--records", n(300_000), "--record-size", "1024",
                            *Q332],
        "stream-tail-10k": ["stream", "--mode", "tail", "--rate", str(TAIL_RATE),
                            "--records", n(200_000), "--record-size", "100", *Q332],
    }


def _frame(text: str) -> str:
    """``name (path/file.py:123)`` -> ``name (path/file.py)``."""
    name, _, where = text.partition(" (")
    return f"{name} ({where.rstrip(')').rsplit(':', 1)[0]})" if where else name


def profile(out_dir: Path, workload: list[str]) -> str:
    """Run ``workload`` under py-spy (the client process only) and summarise where its
    time goes: the functions with the most samples on the stack, and on top."""
    raw = out_dir / "stream-write-100b.pyspy.txt"
    cmd = ["py-spy", "record", "--format", "raw", "--rate", "200", "-o", str(raw), "--",
           sys.executable, "-m", "asyncbk", "bench", *workload]
    print(f"== profile: {' '.join(cmd[:7])} -- asyncbk bench {' '.join(workload)}", flush=True)
    subprocess.run(cmd, check=True, timeout=1800)
    inclusive: collections.Counter[str] = collections.Counter()
    on_top: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [_frame(f) for f in stack.split(";")]
        for i, f in enumerate(frames):  # a dataclass's generated __init__: say whose
            if f.startswith("__create_fn__") and i:
                frames[i] = f"generated __init__, called by {frames[i - 1].split(' (')[0]}"
        if not frames[0].startswith("_run_module_as_main"):
            continue  # another thread than the event loop's (the cluster's clean-up)
        if any("_find_and_load" in f or "(asyncbk/local/" in f for f in frames):
            continue  # imports, starting and stopping the cluster
        samples = int(count)
        total += samples
        for f in set(frames):
            inclusive[f] += samples
        on_top[frames[-1]] += samples
    lines = [f"event-loop thread samples of the client: {total} (py-spy slows it: compare "
             "shares, not rates)", "", "| function | on stack | on top |",
             "|---|---|---|"]
    shown = [f for f, _ in inclusive.most_common() if inclusive[f] < 0.95 * total][:20]
    for f in shown:
        lines.append(f"| `{f}` | {100 * inclusive[f] / total:.0f}% "
                     f"| {100 * on_top[f] / total:.0f}% |")
    lines += ["", "| on top (self) | share |", "|---|---|"]
    for f, k in on_top.most_common(15):
        lines.append(f"| `{f}` | {100 * k / total:.0f}% |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench-results")
    p.add_argument("--quick", action="store_true", help="about a fifth of the records")
    p.add_argument("--profile", action="store_true",
                   help="also profile the 100 B stream writer's client with py-spy")
    args = p.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.profile and shutil.which("py-spy") is None:
        sys.exit("--profile needs py-spy: pip install py-spy")
    t0 = time.monotonic()
    todo = workloads(0.2 if args.quick else 1.0)
    r = {name: run(out_dir, name, workload) for name, workload in todo.items()}
    # the ledger base again at the end: the machine is shared, its load drifts
    again = run(out_dir, "ledger-write-1k-again", todo["ledger-write-1k"])

    first, s100, s1k, tail = (r["ledger-write-1k"], r["stream-write-100b"],
                              r["stream-write-1k"], r["stream-tail-10k"])
    ledger = {"throughput_eps": (first["throughput_eps"] + again["throughput_eps"]) / 2,
              "throughput_mbps": (first["throughput_mbps"] + again["throughput_mbps"]) / 2}
    rows = [("ledger write, 1 KiB entries, 256 in flight (first)", first,
             first["throughput_eps"], "entries"),
            ("ledger write, 1 KiB entries, 256 in flight (last)", again,
             again["throughput_eps"], "entries"),
            ("stream write, 100 B records, 20,000 in flight", s100, s100["throughput_rps"],
             "records"),
            ("stream write, 1 KiB records, 20,000 in flight", s1k, s1k["throughput_rps"],
             "records"),
            (f"stream tail, writer offered {TAIL_RATE:,} records/s (write call to reader)",
             tail, tail["throughput_rps"], "records")]
    lines = ["| workload | per s | MB/s | records per entry | p50 µs | p99 µs | p999 µs "
             "| CPU % client / bookies |", "|---|---|---|---|---|---|---|---|"]
    for name, res, rate, unit in rows:
        lat, cpu = res["latency_us"], res["cpu_percent"]
        bookies = "/".join(f"{v:.0f}" for k, v in cpu.items() if k.startswith("bookie"))
        per_entry = f"{res['records_per_entry']:,.0f}" if "records_per_entry" in res else "-"
        lines.append(f"| {name} | {rate:,.0f} {unit} | {res['throughput_mbps']:.1f} "
                     f"| {per_entry} | {lat['p50']:,} | {lat['p99']:,} | {lat['p999']:,} "
                     f"| {cpu.get('client', 0):.0f} / {bookies} |")
    ack = tail["ack_latency_us"]
    lines.append(f"\n(tail run: the writer's own acknowledgement latency p50 {ack['p50']:,} µs, "
                 f"p99 {ack['p99']:,} µs)")
    ratios = [
        "| ratio (to the mean of the two ledger runs) | value |", "|---|---|",
        f"| stream 100 B records/s ÷ ledger 1 KiB entries/s | "
        f"{s100['throughput_rps'] / ledger['throughput_eps']:.2f}x |",
        f"| stream 1 KiB records/s ÷ ledger 1 KiB entries/s (same bytes) | "
        f"{s1k['throughput_rps'] / ledger['throughput_eps']:.2f}x |",
        f"| stream 1 KiB MB/s ÷ ledger 1 KiB MB/s | "
        f"{s1k['throughput_mbps'] / ledger['throughput_mbps']:.2f}x |",
    ]
    met_rps = s100["throughput_rps"] >= TARGET_RPS_100B
    met_tail = tail["latency_us"]["p99"] <= TARGET_TAIL_P99_US
    targets = [
        "| target | measured | met? |", "|---|---|---|",
        f"| 100 B records, E3 Qw3 Qa2: >= {TARGET_RPS_100B:,} records/s | "
        f"{s100['throughput_rps']:,.0f} ({100 * s100['throughput_rps'] / TARGET_RPS_100B:.0f}% "
        f"of it) | {'yes' if met_rps else 'no'} |",
        f"| tailing at {TAIL_RATE:,} records/s: p99 <= {TARGET_TAIL_P99_US / 1000:.0f} ms | "
        f"{tail['latency_us']['p99'] / 1000:.1f} ms | {'yes' if met_tail else 'no'} |",
    ]
    text = "\n".join(lines) + "\n\n" + "\n".join(ratios) + "\n\n" + "\n".join(targets) + "\n"
    if args.profile:
        text += "\n" + profile(out_dir, todo["stream-write-100b"]) + "\n"
    print()
    print(text)
    print(f"(took {time.monotonic() - t0:.0f} s)")
    (out_dir / "streams.md").write_text(text)


if __name__ == "__main__":
    main()
