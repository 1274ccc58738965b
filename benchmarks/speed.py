"""Speed, round three: this tree against a base commit (and each build of this tree),
interleaved, with CPU per entry on each side.

Each run is ``asyncbk bench write`` (its own local cluster: etcd and 3 bookie processes,
E3 Qw3 Qa2, one client process) of one variant:

* ``base``: the source tree of ``--base`` (``git archive`` into a temporary directory,
  first on ``PYTHONPATH`` for the client and its bookies; pure Python, as it was built);
* ``pure``: this tree with ``ASYNCBK_PURE=1`` (the pure-Python reference modules);
* ``compiled``: this tree as installed (the compiled build, where it is).

Two loads: pipelined (``--entries`` of ``--entry-size`` bytes, ``--inflight`` in flight)
and sequential (``--sequential-entries``, one in flight).  Rounds interleave the
variants in a rotating order (the machine is shared and noisy); reported are medians
and each variant's ratio to the first one given in ``--variants``.  CPU per entry:
each process's CPU time (user + system, from /proc, over the measured window) divided
by the entries; "bookie" is the mean of the three bookies.

    python benchmarks/speed.py --base REF [--rounds 3] [--variants base,pure,compiled]
        [--entries 100000] [--sequential-entries 3000] [--json FILE]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tracing import export_src

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("base", "pure", "compiled")


def run(variant: str, base_src: Path | None, inflight: int, entries: int, size: int,
        out: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("ASYNCBK_PURE", "PYTHONPATH")}
    if variant == "base":
        assert base_src is not None
        env["PYTHONPATH"] = str(base_src)
    elif variant == "pure":
        env["ASYNCBK_PURE"] = "1"
    cmd = [sys.executable, "-m", "asyncbk", "bench", "write", "--entries", str(entries),
           "--inflight", str(inflight), "--entry-size", str(size), "--ensemble", "3",
           "--write-quorum", "3", "--ack-quorum", "2", "--json", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"{variant} failed:\n{done.stderr[-3000:]}")
    r = json.loads(out.read_text())
    n, elapsed, cpu = r["entries_done"], r["elapsed_s"], r["cpu_percent"]
    per_entry = {k: v / 100 * elapsed / n * 1e6 for k, v in cpu.items()}
    bookies = [v for k, v in per_entry.items() if k.startswith("bookie")]
    return {"throughput": r["throughput_eps"], "p50_us": r["latency_us"]["p50"],
            "p99_us": r["latency_us"]["p99"], "client_us": per_entry.get("client", 0.0),
            "bookie_us": statistics.mean(bookies) if bookies else 0.0,
            "cpu_percent": cpu}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--base", default=None, help="the commit to compare with (needed for "
                   "the base variant)")
    p.add_argument("--variants", default="base,pure",
                   help=f"comma-separated, of {', '.join(VARIANTS)}; the first is the baseline")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--entries", type=int, default=100_000, help="pipelined entries per run")
    p.add_argument("--inflight", type=int, default=256)
    p.add_argument("--sequential-entries", type=int, default=3000,
                   help="entries of the sequential run (0: none)")
    p.add_argument("--entry-size", type=int, default=1024)
    p.add_argument("--json", default=None, help="write the results to this file")
    args = p.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or set(variants) - set(VARIANTS):
        p.error(f"--variants: choose from {', '.join(VARIANTS)}")
    if "base" in variants and not args.base:
        p.error("the base variant needs --base REF")
    if "compiled" in variants:
        from asyncbk.build import build_info

        if build_info().kind != "compiled":
            p.error("the compiled variant needs the compiled build installed "
                    "(ASYNCBK_COMPILE=1 python -m pip install -e .); this one is "
                    f"{build_info().describe()}")
    loads = [("pipelined", args.inflight, args.entries)]
    if args.sequential_entries:
        loads.append(("sequential", 1, args.sequential_entries))
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        load: {v: [] for v in variants} for load, _, _ in loads}
    with tempfile.TemporaryDirectory() as tmp:
        base_src = export_src(args.base, Path(tmp)) if "base" in variants else None
        out = Path(tmp) / "bench.json"
        for rnd in range(args.rounds):
            order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
            for load, inflight, entries in loads:
                for v in order:
                    r = run(v, base_src, inflight, entries, args.entry_size, out)
                    results[load][v].append(r)
                    print(f"round {rnd + 1} {load:10} {v:8} {r['throughput']:8.0f}/s  "
                          f"p50 {r['p50_us']:6.0f} us  p99 {r['p99_us']:6.0f} us  "
                          f"client {r['client_us']:5.1f} us/entry  "
                          f"bookie {r['bookie_us']:5.1f} us/entry", flush=True)
    keys = ("throughput", "p50_us", "p99_us", "client_us", "bookie_us")
    medians = {load: {v: {k: statistics.median(r[k] for r in runs) for k in keys}
                      for v, runs in by_variant.items()} for load, by_variant in results.items()}
    first = variants[0]
    print(f"\nmedians of {args.rounds} rounds; ratios to {first}"
          + (f" ({args.base})" if "base" in variants else ""))
    for load, by_variant in medians.items():
        for v, m in by_variant.items():
            ref = by_variant[first]
            ratio = {k: m[k] / ref[k] if ref[k] else 0.0 for k in keys}
            print(f"{load:10} {v:8} {m['throughput']:8.0f}/s ({ratio['throughput']:.3f}x)  "
                  f"p50 {m['p50_us']:6.0f} us ({ratio['p50_us']:.2f}x)  "
                  f"p99 {m['p99_us']:6.0f} us ({ratio['p99_us']:.2f}x)  "
                  f"client {m['client_us']:5.1f} us/entry ({ratio['client_us']:.2f}x)  "
                  f"bookie {m['bookie_us']:5.1f} us/entry ({ratio['bookie_us']:.2f}x)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"base": args.base, "args": vars(args),
                                               "runs": results, "medians": medians},
                                              indent=2))


if __name__ == "__main__":
    main()
