"""What tracing costs on the append path, against the code before tracing existed.

Three variants, each a fresh local cluster (etcd, 3 bookie processes) and one client
appending N entries of B bytes with K in flight (E3 Qw2 Qa2), in interleaved rounds
(the machine is shared and noisy: each round runs every variant once, in a rotating
order):

* ``before``: the source tree of the commit before tracing was added (``git archive``
  into a temporary directory, put first on ``PYTHONPATH`` for the client and its
  bookies);
* ``off``: this tree, tracing off (the default);
* ``on``: this tree, the client traced through an SDK tracer provider (batch span
  processor, spans written to /dev/null as JSON lines) and the bookies with
  ``otel_exporter = "jsonl:/dev/null"``: every append makes a client span, two bookie
  spans and two journal spans;
* ``sampled``: as ``on``, with the provider sampling 1 trace in 100 (OpenTelemetry's
  ``TraceIdRatioBased(0.01)``), as a busy application would: the others make
  non-recording spans on the client and send no context.

Reports the median of each variant's throughput and latency percentiles, and each as
a ratio to ``before`` measured in the same run.

    python benchmarks/tracing.py [--rounds 5] [--entries 50000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

WORKLOAD = r"""
import asyncio, json, sys, time, tempfile
from pathlib import Path
import uvloop
from asyncbk.testing import LocalCluster

variant, entries, inflight, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

async def main():
    options, bookie_config = {}, {}
    if variant in ("on", "sampled"):
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, TraceIdRatioBased
        from asyncbk.tracing import JsonLinesExporter
        provider = TracerProvider(sampler=ALWAYS_ON if variant == "on"
                                  else TraceIdRatioBased(0.01))
        provider.add_span_processor(BatchSpanProcessor(JsonLinesExporter("/dev/null")))
        options["tracer_provider"] = provider
        bookie_config["otel_exporter"] = "jsonl:/dev/null"
    with tempfile.TemporaryDirectory() as tmp:
        async with LocalCluster(bookies=3, data_dir=Path(tmp),
                                bookie_config=bookie_config or None) as cluster:
            bk = await cluster.client(**options)
            lh = await bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2,
                                        password=b"pw")
            data = b"x" * size
            await asyncio.gather(*(lh.append(data) for _ in range(2000)))  # warm-up
            loop = asyncio.get_running_loop()
            latencies = []
            pending = []
            start = loop.time()
            clock = time.perf_counter
            for _ in range(entries):
                t0 = clock()
                fut = lh.append(data)
                fut.add_done_callback(lambda f, t0=t0: latencies.append(clock() - t0))
                pending.append(fut)
                if len(pending) >= inflight:
                    await pending.pop(0)
            await asyncio.gather(*pending)
            elapsed = loop.time() - start
            await lh.close()
    latencies.sort()
    q = lambda p: latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000
    print(json.dumps({"variant": variant, "throughput": entries / elapsed,
                      "p50_ms": q(0.50), "p99_ms": q(0.99), "p999_ms": q(0.999)}))

uvloop.run(main())
"""


def before_commit() -> str:
    """The commit before the one that added src/asyncbk/tracing.py."""
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--",
                            "src/asyncbk/tracing.py"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    if not added:
        raise SystemExit("src/asyncbk/tracing.py is not committed yet: commit it, or give "
                         "--base REF")
    return f"{added[-1]}^"


def export_src(ref: str, into: Path) -> Path:
    """``ref``'s src/ tree, unpacked under ``into``."""
    tar = subprocess.run(["git", "archive", "--format=tar", ref, "src"], cwd=ROOT,
                         capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    return into / "src"


def run_variant(variant: str, src: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(src))
    r = subprocess.run([sys.executable, "-c", WORKLOAD, variant, str(args.entries),
                        str(args.inflight), str(args.entry_size)], env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"variant {variant} failed:\n{r.stderr[-3000:]}")
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--entries", type=int, default=50_000)
    p.add_argument("--inflight", type=int, default=256)
    p.add_argument("--entry-size", type=int, default=100)
    p.add_argument("--base", default=None, help="the commit to compare with (default: "
                   "the one before tracing was added)")
    p.add_argument("--json", default=None, help="write the results to this file")
    args = p.parse_args()
    base = args.base or before_commit()
    results: dict[str, list[dict[str, Any]]] = {"before": [], "off": [], "sampled": [],
                                                 "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": export_src(base, Path(tmp)), "off": ROOT / "src",
                 "sampled": ROOT / "src", "on": ROOT / "src"}
        order = list(results)
        for rnd in range(args.rounds):
            for variant in order[rnd % 4:] + order[:rnd % 4]:
                r = run_variant(variant, trees[variant], args)
                results[variant].append(r)
                print(f"round {rnd + 1} {variant:7} {r['throughput']:9.0f}/s  "
                      f"p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms", flush=True)
    summary: dict[str, dict[str, float]] = {}
    for variant, runs in results.items():
        summary[variant] = {k: statistics.median(r[k] for r in runs)
                            for k in ("throughput", "p50_ms", "p99_ms", "p999_ms")}
    print(f"\nmedians of {args.rounds} rounds, {args.entries} appends of {args.entry_size} "
          f"bytes, {args.inflight} in flight; ratios to 'before' ({base}):")
    for variant, m in summary.items():
        ratios = {k: m[k] / summary["before"][k] for k in m}
        print(f"{variant:7} {m['throughput']:9.0f}/s ({ratios['throughput']:.3f}x)  "
              f"p50 {m['p50_ms']:6.2f} ms ({ratios['p50_ms']:.3f}x)  "
              f"p99 {m['p99_ms']:6.2f} ms ({ratios['p99_ms']:.3f}x)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"base": base, "args": vars(args),
                                               "runs": results, "medians": summary},
                                              indent=2))


if __name__ == "__main__":
    main()
