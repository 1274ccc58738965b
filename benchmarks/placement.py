"""Placement across racks and regions: what a rack- or region-aware ensemble costs (or
saves) against random, for a client in one rack of one region, measured in one run.

The cluster (``LocalCluster(topology=...)``, docs/topology-testing.md): etcd and six
bookies, each bookie on a host of its own (a network namespace), one per rack, two
regions of three racks: ``/a/r1 /a/r2 /a/r3 /b/r4 /b/r5 /b/r6``.  The client (this
process) and etcd sit in ``/a/r1``.  Round trips added between hosts, by distance:
0.2 ms within a rack, 2 ms across racks, 20 ms across regions (``Latency``: each
direction is held half of it, by the harness's NFQUEUE delay process).

Three clients, one per policy: ``random``; ``rack-aware`` (min_racks_per_write_quorum
2); ``region-aware`` (min_regions_per_write_quorum 2, min_racks_per_write_quorum 2).
Each round creates ``--ledgers`` ledgers per policy (E3 Qw3 Qa2, each with a new
ensemble from its policy), the policies taking turns ledger by ledger, their order
rotated from round to round, so that the machine's noise hits all alike.  On each
ledger: ``--warmup`` appends (not measured), then

- sequential: ``--sequential`` appends one at a time (latency in an HDR histogram);
- pipelined: ``--entries`` appends of 1 KiB, ``--inflight`` (256) in flight
  (throughput from the first append to the last acknowledgement; latency too).

A policy's figure in a round pools its ledgers of that round (entries / time;
merged histograms); the table gives the median over rounds, and ratios to random as
the median over rounds of the ratio within the round.  Every ledger's ensemble is
reported: regions and racks per write set, bookies in the client's region, and how
far the Qa-th (2nd) nearest bookie is, which bounds the acknowledgement.  Since a
policy's ensembles are random draws, the few ledgers of a run sample its choice
coarsely: each policy is also asked for 10,000 ensembles offline (the same policy
code and settings, no I/O), and the long-run figure of each policy is the figures
measured per kind of ensemble weighted by how often the policy picks that kind.

Needs Linux, root, ``ip`` and ``iptables`` with NFQUEUE; otherwise it says why and
exits with status 2.  Progress on stderr; the tables on stdout.

    python benchmarks/placement.py [--quick] [--rounds 5] [--entries 6000] [--json FILE]
        [--rack-ms 0.2 --cross-rack-ms 2 --cross-region-ms 20] [--no-latency]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from asyncbk.cli.bench_record import Recorder, latency_json, new_histogram, versions
from asyncbk.client.placement import make_policy, write_set_spread
from asyncbk.errors import BKError
from asyncbk.local.network import Latency, Topology, network_unavailable
from asyncbk.testing import LocalCluster
from asyncbk.topology import normalize_location, region_of

POLICIES = ("random", "rack-aware", "region-aware")
BOOKIES = ("/a/r1", "/a/r2", "/a/r3", "/b/r4", "/b/r5", "/b/r6")
CLIENT_LOCATION = "/a/r1"
ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 2
MIN_RACKS, MIN_REGIONS = 2, 2
POLICY_OPTIONS: dict[str, dict[str, Any]] = {
    "random": {},
    "rack-aware": {"min_racks_per_write_quorum": MIN_RACKS},
    "region-aware": {"min_regions_per_write_quorum": MIN_REGIONS,
                     "min_racks_per_write_quorum": MIN_RACKS},
}
DRAWS = 10_000
"""Ensembles asked of each policy offline, for the long-run mix of ensemble kinds."""
ACK_CLASSES = ("rack", "cross-rack", "cross-region")
"""How far the Qa-th nearest bookie of an ensemble is from the client."""
DEFAULTS = {"rounds": 5, "ledgers": 3, "entries": 6000, "sequential": 40, "warmup": 20}
QUICK = {"rounds": 3, "ledgers": 2, "entries": 1000, "sequential": 20, "warmup": 10}
PASSWORD = b"placement"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def distance(a: str, b: str) -> str:
    """``rack``, ``cross-rack`` or ``cross-region`` between two locations."""
    if region_of(a) != region_of(b):
        return "cross-region"
    return "rack" if a == b else "cross-rack"


def ack_class(locations: list[str], client: str) -> str:
    """How far the ``ACK_QUORUM``-th nearest of ``locations`` is from ``client``."""
    order = sorted(ACK_CLASSES.index(distance(client, loc)) for loc in locations)
    return ACK_CLASSES[order[ACK_QUORUM - 1]]


def spread_name(regions: int, racks: int) -> str:
    return f"{regions} region{'s' * (regions != 1)}, {racks} rack{'s' * (racks != 1)}"


def describe(locations: list[str], client: str) -> dict[str, Any]:
    """What an ensemble (by its bookies' locations) spans, seen from ``client``."""
    locs = {str(i): loc for i, loc in enumerate(locations)}
    regions, racks = write_set_spread(list(locs), WRITE_QUORUM, locs)
    return {"regions_per_write_set": regions, "racks_per_write_set": racks,
            "in_client_region": sum(region_of(loc) == region_of(client) for loc in locations),
            "in_client_rack": sum(loc == client for loc in locations),
            "ack_class": ack_class(locations, client)}


def _self_cpu_s() -> float:
    """CPU seconds of this process (the client), every thread."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _busy_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine (``/proc/stat``), in jiffies."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


# ---------------------------------------------------------------- one ledger


async def pipelined(lh: Any, payload: bytes, entries: int, inflight: int,
                    rec: Recorder) -> None:
    """``entries`` appends with ``inflight`` in flight (closed loop), into ``rec``."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    space = asyncio.Event()
    state = {"inflight": 0, "acked": 0}

    def finished(started: float, fut: asyncio.Future[int]) -> None:
        state["inflight"] -= 1
        space.set()
        exc = fut.exception()
        if exc is not None:
            rec.error(exc)
            if not done.done():
                done.set_exception(exc)
            return
        rec.record(time.perf_counter() - started)
        state["acked"] += 1
        if state["acked"] == entries and not done.done():
            done.set_result(None)

    rec.start()
    for i in range(entries):
        while state["inflight"] >= inflight:
            space.clear()
            await space.wait()
        if done.done():
            break
        started = time.perf_counter()
        state["inflight"] += 1
        lh.append(payload).add_done_callback(lambda f, s=started: finished(s, f))
        if i % 64 == 63:
            await asyncio.sleep(0)  # let acknowledgements in between bursts
    await done


async def measure_ledger(bk: Any, args: argparse.Namespace, payload: bytes) -> dict[str, Any]:
    """Create a ledger, warm it up, time its sequential then pipelined appends, close it."""
    lh = await bk.create_ledger(ENSEMBLE, WRITE_QUORUM, ACK_QUORUM, password=PASSWORD)
    ensemble = list(lh.metadata.ensembles[0][1])
    try:
        for _ in range(args.warmup):
            await lh.append(payload)
        seq = new_histogram()
        for _ in range(args.sequential):
            t = time.perf_counter()
            await lh.append(payload)
            seq.record_value(max(1, int((time.perf_counter() - t) * 1e6)))
        rec = Recorder(len(payload))
        busy0, total0 = _busy_jiffies()
        cpu0 = _self_cpu_s()
        await pipelined(lh, payload, args.entries, args.inflight, rec)
        client_cpu_s = _self_cpu_s() - cpu0
        busy1, total1 = _busy_jiffies()
        if rec.errors:
            raise BKError(f"{rec.errors} appends failed; first: {rec.first_error}")
        ensembles = len(lh.metadata.ensembles)
    finally:
        with contextlib.suppress(BKError, TimeoutError):
            async with asyncio.timeout(60):
                await lh.close()
    elapsed = rec.elapsed
    return {
        "ledger_id": lh.id, "bookies": ensemble, "ensembles": ensembles, "seq_hist": seq,
        "pipe_hist": rec.histogram,
        "sequential": {"appends": args.sequential, "latency_us": latency_json(seq)},
        "pipelined": {
            "entries": rec.count, "elapsed_s": elapsed, "throughput_eps": rec.count / elapsed,
            "latency_us": latency_json(rec.histogram),
            "client_cpu_percent": round(100 * client_cpu_s / elapsed, 1),
            "machine_cpu_busy_percent": round(100 * (busy1 - busy0) / (total1 - total0), 1)
            if total1 > total0 else None,
        },
    }


# ---------------------------------------------------------------- figures


def merged(hists: list[Any]) -> Any:
    out = new_histogram()
    for h in hists:
        out.add(h)
    return out


def pooled(ledgers: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of a set of ledgers taken together."""
    entries = sum(r["pipelined"]["entries"] for r in ledgers)
    elapsed = sum(r["pipelined"]["elapsed_s"] for r in ledgers)
    seq, pipe = merged([r["seq_hist"] for r in ledgers]), merged([r["pipe_hist"] for r in ledgers])
    return {"ledgers": len(ledgers), "pipelined_eps": entries / elapsed if elapsed else 0.0,
            "pipelined_p50_us": pipe.get_value_at_percentile(50),
            "pipelined_p99_us": pipe.get_value_at_percentile(99),
            "sequential_p50_us": seq.get_value_at_percentile(50),
            "sequential_p99_us": seq.get_value_at_percentile(99),
            "sequential_mean_us": seq.get_mean_value(),
            "ack_classes": dict(Counter(r["ack_class"] for r in ledgers))}


FIGURES = ("pipelined_eps", "pipelined_p50_us", "pipelined_p99_us", "sequential_p50_us",
           "sequential_p99_us", "sequential_mean_us")


def mixture_percentile(parts: list[tuple[float, Any]], percentile: float) -> float:
    """The ``percentile`` of a mixture of histograms, each with its weight."""
    points: list[tuple[int, float]] = []
    for weight, h in parts:
        total = h.get_total_count()
        if weight <= 0 or not total:
            continue
        for item in h.get_recorded_iterator():
            points.append((item.value_iterated_to,
                           weight * item.count_added_in_this_iter_step / total))
    points.sort()
    mass = sum(w for _, w in points)
    running = 0.0
    for value, w in points:
        running += w
        if running >= mass * percentile / 100 - 1e-12:
            return float(value)
    return float(points[-1][0]) if points else 0.0


def draw_ensembles(locations: dict[str, str], client: str, seed: int) -> dict[str, Any]:
    """What each policy chooses over ``DRAWS`` new ensembles (the client's own policy
    code and settings; no I/O)."""
    out: dict[str, Any] = {}
    for policy in POLICIES:
        opts = POLICY_OPTIONS[policy]
        chooser = make_policy(policy, min_racks_per_write_quorum=opts.get(
            "min_racks_per_write_quorum", MIN_RACKS), min_regions_per_write_quorum=opts.get(
            "min_regions_per_write_quorum", MIN_REGIONS), rng=random.Random(seed),
            log=_Quiet())
        kinds: Counter[str] = Counter()
        used: Counter[str] = Counter()
        spread: Counter[str] = Counter()
        local: Counter[int] = Counter()
        for _ in range(DRAWS):
            ensemble = chooser.new_ensemble(ENSEMBLE, WRITE_QUORUM, list(locations), locations)
            d = describe([locations[b] for b in ensemble], client)
            kinds[d["ack_class"]] += 1
            used.update(locations[b] for b in ensemble)
            spread[spread_name(d["regions_per_write_set"], d["racks_per_write_set"])] += 1
            local[d["in_client_region"]] += 1
        out[policy] = {"draws": DRAWS,
                       "ack_class": {k: kinds[k] / DRAWS for k in ACK_CLASSES if kinds[k]},
                       "spread": {k: v / DRAWS for k, v in sorted(spread.items())},
                       "ensembles_with_rack": {loc: used[loc] / DRAWS
                                               for loc in sorted(set(locations.values()))},
                       "in_client_region": {str(k): local[k] / DRAWS for k in sorted(local)}}
    return out


class _Quiet:
    def warning(self, *args: Any, **kwargs: Any) -> None:
        pass


def summarize(rows: list[dict[str, Any]], rounds: int,
              draws: dict[str, Any]) -> dict[str, Any]:
    per_round = {p: [pooled([r for r in rows if r["policy"] == p and r["round"] == k])
                     for k in range(rounds)] for p in POLICIES}
    figures: dict[str, Any] = {}
    for p in POLICIES:
        fig: dict[str, Any] = {f: statistics.median(x[f] for x in per_round[p]) for f in FIGURES}
        fig["ratio_to_random"] = {
            f: statistics.median(x[f] / b[f] for x, b in zip(per_round[p], per_round["random"],
                                                            strict=True) if b[f])
            for f in FIGURES}
        mine = [r for r in rows if r["policy"] == p]
        fig["ledgers"] = len(mine)
        fig["ack_classes"] = dict(Counter(r["ack_class"] for r in mine))
        fig["spread"] = dict(Counter(spread_name(r["regions_per_write_set"],
                                                 r["racks_per_write_set"]) for r in mine))
        fig["in_client_region"] = dict(Counter(str(r["in_client_region"]) for r in mine))
        fig["ensemble_changes"] = sum(r["ensembles"] - 1 for r in mine)
        fig["ledgers_with_rack"] = {normalize_location(b): sum(
            normalize_location(b) in r["locations"] for r in mine) for b in BOOKIES}
        figures[p] = fig
    classes = {c: pooled([r for r in rows if r["ack_class"] == c])
               for c in ACK_CLASSES if any(r["ack_class"] == c for r in rows)}
    by_policy_class = {p: {c: pooled([r for r in rows if r["policy"] == p
                                      and r["ack_class"] == c])
                           for c in ACK_CLASSES
                           if any(r["policy"] == p and r["ack_class"] == c for r in rows)}
                       for p in POLICIES}
    class_hists = {c: (merged([r["seq_hist"] for r in rows if r["ack_class"] == c]),
                       merged([r["pipe_hist"] for r in rows if r["ack_class"] == c]))
                   for c in classes}
    long_run: dict[str, Any] = {}
    for p in POLICIES:
        mix = {c: f for c, f in draws[p]["ack_class"].items()}
        missing = [c for c in mix if c not in classes]
        if missing:
            long_run[p] = {"missing_classes": missing}
            continue
        # N entries per ledger: time per entry is the mix of each kind's time per entry
        eps = 1 / sum(f / classes[c]["pipelined_eps"] for c, f in mix.items())
        seq_parts = [(f, class_hists[c][0]) for c, f in mix.items()]
        # (no median: with about half of the ensembles of each kind it falls in the gap)
        long_run[p] = {"ack_class": mix, "pipelined_eps": eps,
                       "sequential_p99_us": mixture_percentile(seq_parts, 99),
                       "sequential_mean_us": sum(f * classes[c]["sequential_mean_us"]
                                                 for c, f in mix.items())}
    base = long_run.get("random", {})
    for lr in long_run.values():
        if "pipelined_eps" in lr and "pipelined_eps" in base:
            lr["ratio_to_random"] = {f: lr[f] / base[f] for f in (
                "pipelined_eps", "sequential_p99_us", "sequential_mean_us")}
    return {"per_policy": figures,
            "per_round": {p: per_round[p] for p in POLICIES},
            "per_ack_class": classes, "per_policy_and_ack_class": by_policy_class,
            "policy_draws": draws, "long_run": long_run}


# ---------------------------------------------------------------- tables


def ms(us: float) -> str:
    return f"{us / 1000:.2f}"


def tables(summary: dict[str, Any], latency: Latency | None) -> str:
    figs = summary["per_policy"]
    lines = ["| policy | ledgers (Qa-th nearest: cross-rack / cross-region) | pipelined entries/s "
             "| × random | pipelined p99 ms | sequential p50 ms | × random | sequential p99 ms "
             "| × random | sequential mean ms | × random |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in POLICIES:
        f, r = figs[p], figs[p]["ratio_to_random"]
        kinds = f["ack_classes"]
        lines.append(
            f"| {p} | {f['ledgers']} ({kinds.get('cross-rack', 0)} / "
            f"{kinds.get('cross-region', 0)}) | {f['pipelined_eps']:,.0f} "
            f"| {r['pipelined_eps']:.2f}x | {ms(f['pipelined_p99_us'])} "
            f"| {ms(f['sequential_p50_us'])} | {r['sequential_p50_us']:.2f}x "
            f"| {ms(f['sequential_p99_us'])} | {r['sequential_p99_us']:.2f}x "
            f"| {ms(f['sequential_mean_us'])} | {r['sequential_mean_us']:.2f}x |")
    racks = [normalize_location(b) for b in BOOKIES]
    lines += ["", "| policy, this run's ledgers | regions, racks per write set "
              "| bookies in the client's region: 0/1/2/3 "
              f"| ledgers using {' '.join(racks)} | ensemble changes |",
              "|---|---|---|---|---|"]
    for p in POLICIES:
        f = figs[p]
        spread = "; ".join(f"{k}: {v}" for k, v in sorted(f["spread"].items()))
        local = " / ".join(str(f["in_client_region"].get(str(k), 0)) for k in range(4))
        use = " / ".join(str(f["ledgers_with_rack"].get(r, 0)) for r in racks)
        lines.append(f"| {p} | {spread} | {local} | {use} | {f['ensemble_changes']} |")
    lines += ["", f"| policy, {DRAWS:,} ensembles drawn offline | 1 region / 2 regions per "
              "write set | Qa-th nearest cross-rack / cross-region "
              f"| ensembles using {' '.join(racks)} |", "|---|---|---|---|"]
    for p in POLICIES:
        d = summary["policy_draws"][p]
        one = sum(v for k, v in d["spread"].items() if k.startswith("1 region,"))
        kinds = d["ack_class"]
        use = " / ".join(f"{100 * d['ensembles_with_rack'].get(r, 0):.0f}%" for r in racks)
        lines.append(f"| {p} | {100 * one:.0f}% / {100 * (1 - one):.0f}% "
                     f"| {100 * kinds.get('cross-rack', 0):.0f}% / "
                     f"{100 * kinds.get('cross-region', 0):.0f}% | {use} |")
    rtt = {c: (latency.rack_ms if c == "rack" else latency.cross_rack_ms if c == "cross-rack"
               else latency.cross_region_ms) if latency else 0.0 for c in ACK_CLASSES}
    lines += ["", "| Qa-th nearest bookie (all policies) | its added round trip | ledgers "
              "| pipelined entries/s | pipelined p50 ms | sequential p50 ms "
              "| sequential p99 ms |", "|---|---|---|---|---|---|---|"]
    for c, f in summary["per_ack_class"].items():
        lines.append(f"| {c} | {rtt[c]:g} ms | {f['ledgers']} | {f['pipelined_eps']:,.0f} "
                     f"| {ms(f['pipelined_p50_us'])} | {ms(f['sequential_p50_us'])} "
                     f"| {ms(f['sequential_p99_us'])} |")
    lines += ["", "| Qa-th nearest bookie: pipelined entries/s, sequential p50 ms (ledgers) | "
              + " | ".join(POLICIES) + " |", "|---|" + "---|" * len(POLICIES)]
    for c in summary["per_ack_class"]:
        cells = []
        for p in POLICIES:
            f = summary["per_policy_and_ack_class"][p].get(c)
            cells.append("-" if f is None else f"{f['pipelined_eps']:,.0f}, "
                         f"{ms(f['sequential_p50_us'])} ({f['ledgers']})")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += ["", "| policy, long run: each kind's figures × how often the policy picks it "
              "| Qa-th nearest cross-region | pipelined entries/s | × random "
              "| sequential mean ms | × random | sequential p99 ms | × random |",
              "|---|---|---|---|---|---|---|---|"]
    for p in POLICIES:
        lr = summary["long_run"][p]
        if "pipelined_eps" not in lr:
            lines.append(f"| {p} | (no ledger of kind {', '.join(lr['missing_classes'])} "
                         f"measured) | | | | | | |")
            continue
        r = lr.get("ratio_to_random", {})
        lines.append(f"| {p} | {100 * lr['ack_class'].get('cross-region', 0):.0f}% "
                     f"| {lr['pipelined_eps']:,.0f} | {r.get('pipelined_eps', 0):.2f}x "
                     f"| {ms(lr['sequential_mean_us'])} | {r.get('sequential_mean_us', 0):.2f}x "
                     f"| {ms(lr['sequential_p99_us'])} | {r.get('sequential_p99_us', 0):.2f}x |")
    return "\n".join(lines)


# ---------------------------------------------------------------- the run


async def wait_for_bookies(bk: Any, count: int, timeout_s: float = 30) -> dict[str, str]:
    """The bookies' locations, once the client knows all ``count`` of them."""
    async with asyncio.timeout(timeout_s):
        while True:
            locations = bk.bookie_locations()
            wanted = {normalize_location(b) for b in BOOKIES}
            if len(locations) >= count and set(locations.values()) >= wanted:
                return locations
            await asyncio.sleep(0.2)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    latency = None if args.no_latency else Latency(
        rack_ms=args.rack_ms, cross_rack_ms=args.cross_rack_ms,
        cross_region_ms=args.cross_region_ms)
    topology = Topology(bookies=list(BOOKIES), client=CLIENT_LOCATION, etcd=CLIENT_LOCATION,
                        latency=latency)
    client = normalize_location(CLIENT_LOCATION)
    payload = os.urandom(args.entry_size)
    rows: list[dict[str, Any]] = []
    t_start = time.monotonic()
    log(f"starting etcd and {len(BOOKIES)} bookies on hosts of their own ...")
    async with LocalCluster(topology=topology, owner="benchmarks/placement.py") as cluster:
        hosts = {b.id: f"bookie-{b.index}" for b in cluster.bookies}
        clients = {p: await cluster.client(placement_policy=p, **POLICY_OPTIONS[p])
                   for p in POLICIES}
        locations = await wait_for_bookies(clients["random"], len(BOOKIES))
        for p in POLICIES[1:]:
            await wait_for_bookies(clients[p], len(BOOKIES))
        total = args.rounds * args.ledgers * len(POLICIES)
        for rnd in range(args.rounds):
            order = POLICIES[rnd % len(POLICIES):] + POLICIES[:rnd % len(POLICIES)]
            for k in range(args.ledgers):
                for p in order:
                    r = await measure_ledger(clients[p], args, payload)
                    locs = [locations[b] for b in r["bookies"]]
                    r.update(round=rnd, policy=p, ledger=k,
                             ensemble=[hosts.get(b, "?") for b in r.pop("bookies")],
                             locations=locs, **describe(locs, client))
                    rows.append(r)
                    log(f"[{len(rows)}/{total}] round {rnd + 1} {p:>12}: "
                        f"{' '.join(locs)} ({r['in_client_region']} in the client's region, "
                        f"Qa-th nearest {r['ack_class']}): sequential p50 "
                        f"{ms(r['sequential']['latency_us']['p50'])} ms, pipelined "
                        f"{r['pipelined']['throughput_eps']:,.0f}/s "
                        f"({time.monotonic() - t_start:.0f} s)")
        draws = draw_ensembles(locations, client, args.seed)
        summary = summarize(rows, args.rounds, draws)
    for r in rows:
        del r["seq_hist"], r["pipe_hist"]
    return {
        "benchmark": "placement",
        "config": {
            "rounds": args.rounds, "ledgers_per_policy_per_round": args.ledgers,
            "entries_per_ledger": args.entries, "sequential_per_ledger": args.sequential,
            "warmup_per_ledger": args.warmup, "inflight": args.inflight,
            "entry_size": args.entry_size, "ensemble": ENSEMBLE, "write_quorum": WRITE_QUORUM,
            "ack_quorum": ACK_QUORUM, "policies": POLICY_OPTIONS, "seed": args.seed,
            "quick": args.quick,
            "bookies": {f"bookie-{i}": normalize_location(b) for i, b in enumerate(BOOKIES)},
            "client_location": client, "etcd_location": client,
            "latency_round_trip_ms": None if latency is None else {
                "rack": latency.rack_ms, "cross_rack": latency.cross_rack_ms,
                "cross_region": latency.cross_region_ms},
            "machine_cpus": os.cpu_count(),
        },
        "versions": {**versions(), "hdrhistogram": _version("hdrhistogram")},
        "elapsed_s": round(time.monotonic() - t_start, 1),
        "figures": summary,
        "ledgers": rows,
    }


def _version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n", 1)[0].split()),
        epilog="Needs root and network namespaces (exits with status 2 where unavailable).")
    p.add_argument("--quick", action="store_true",
                   help=f"a short run: {QUICK['rounds']} rounds of {QUICK['ledgers']} ledgers "
                        f"per policy, {QUICK['entries']} pipelined and {QUICK['sequential']} "
                        f"sequential appends each (default: off)")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"rounds; the policies take turns in each (default {DEFAULTS['rounds']}; "
                        f"{QUICK['rounds']} with --quick)")
    p.add_argument("--ledgers", type=int, default=None,
                   help=f"ledgers (new ensembles) per policy per round (default "
                        f"{DEFAULTS['ledgers']}; {QUICK['ledgers']} with --quick)")
    p.add_argument("--entries", type=int, default=None,
                   help=f"pipelined appends per ledger (default {DEFAULTS['entries']}; "
                        f"{QUICK['entries']} with --quick)")
    p.add_argument("--sequential", type=int, default=None,
                   help=f"sequential appends (one at a time) per ledger (default "
                        f"{DEFAULTS['sequential']}; {QUICK['sequential']} with --quick)")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"appends per ledger before measuring (default {DEFAULTS['warmup']}; "
                        f"{QUICK['warmup']} with --quick)")
    p.add_argument("--inflight", type=int, default=256,
                   help="pipelined appends in flight (default 256)")
    p.add_argument("--entry-size", type=int, default=1024, help="bytes per entry (default 1024)")
    p.add_argument("--rack-ms", type=float, default=0.2,
                   help="round trip added within a rack, ms (default 0.2)")
    p.add_argument("--cross-rack-ms", type=float, default=2.0,
                   help="round trip added across racks of a region, ms (default 2)")
    p.add_argument("--cross-region-ms", type=float, default=20.0,
                   help="round trip added across regions, ms (default 20)")
    p.add_argument("--no-latency", action="store_true",
                   help="add no latency (the same hosts; a control run) (default: off)")
    p.add_argument("--seed", type=int, default=1,
                   help="seed of the offline ensemble draws (default 1)")
    p.add_argument("--timeout", type=float, default=3600,
                   help="give up (and stop everything) after this many seconds (default 3600)")
    p.add_argument("--json", default=None, help="write the results here (default: none)")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("rounds", "ledgers", "entries", "sequential", "inflight", "entry_size"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    return args


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)  # stop the cluster on SIGTERM too
    try:
        async with asyncio.timeout(args.timeout):
            return await run(args)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    why = network_unavailable()
    if why is not None:
        print(f"placement benchmark not run: {why}", file=sys.stderr)
        return 2
    from asyncbk.log import configure

    configure("warning")
    try:
        import uvloop
    except ImportError:
        runner: Any = asyncio.run
    else:
        runner = uvloop.run
    try:
        result = runner(amain(args))
    except (asyncio.CancelledError, KeyboardInterrupt):
        print("placement benchmark interrupted; what it started is stopped", file=sys.stderr)
        return 130
    except TimeoutError:
        print(f"placement benchmark: not done after --timeout {args.timeout:g} s; what it "
              "started is stopped", file=sys.stderr)
        return 1
    latency = result["config"]["latency_round_trip_ms"]
    print()
    print(tables(result["figures"], None if latency is None else Latency(
        rack_ms=latency["rack"], cross_rack_ms=latency["cross_rack"],
        cross_region_ms=latency["cross_region"])))
    print(f"\n(medians over {args.rounds} rounds; × random: median of the ratios within "
          f"each round; took {result['elapsed_s']:.0f} s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        log(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
