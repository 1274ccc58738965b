"""``asyncbk bench``: throughput and latency of writes and reads against a cluster.

Workloads:

* ``write``: appends of ``--entry-size`` bytes spread round-robin over
  ``--ledgers`` ledgers.  Closed loop by default (``--inflight`` appends kept in
  flight, latency from submission to acknowledgement); with ``--rate`` an open
  loop: appends are offered at a fixed rate whatever the answers, and latency
  is measured from the moment each append was *due*, so a stall shows up in
  the latency of everything that queued behind it (no coordinated omission).
* ``read --mode catchup``: the entries are written first (not timed), the
  ledgers closed, then read back in ranges of ``--batch`` entries, one range
  call at a time per ledger; latency is per range call.
* ``read --mode tail``: a writer appends (closed or open loop, as ``write``)
  while a reader follows each ledger with ``tail()``; latency is from the append
  call to the entry reaching the reader.

Every run is bounded by ``--entries`` and, optionally, ``--duration``.  Without
``--metadata-uri`` the benchmark starts its own local cluster (etcd + bookies as
separate processes) and stops it afterwards.  ``--clients P`` runs the workload
in P client processes at once (each with its share of the entries and ledgers)
and merges their histograms.  Latencies go into HDR histograms; a progress line
is printed while running; ``--json`` writes the results and ``--plot`` a PNG of
the latency distribution and the throughput over time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiofiles

from ..local.process import guarded
from .bench_record import (
    ProcessMonitor,
    Progress,
    Recorder,
    check_extras,
    decode_histogram,
    measured,
    plot,
    self_cpu_s,
)
from .common import CliError, count_text

WORKER_START_DELAY_S = 3.0
"""How far ahead of now the parent sets the common start of its client processes."""

WORKER_EXIT_MARGIN_S = 120.0
"""How long past the expected end the parent waits for a client process."""

OPEN_LOOP_INFLIGHT_MAX = 50_000
"""Appends in flight in an open-loop run; past it sending waits (latency still counts
from each append's due time)."""


# ----------------------------------------------------------------- workloads


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


async def _create_ledgers(bk: Any, args: argparse.Namespace, count: int) -> list[Any]:
    return list(await asyncio.gather(*(
        bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum, digest=args.digest)
        for _ in range(count))))


async def _append_load(handles: list[Any], args: argparse.Namespace, entries: int,
                       deadline: float | None, rec: Recorder | None,
                       on_sent: Callable[[int, int, float], None] | None = None) -> None:
    """Append ``entries`` payloads round-robin over ``handles``, closed loop
    (``--inflight`` in flight) or open loop (``--rate``); stop early at ``deadline``."""
    payload = os.urandom(args.entry_size)
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    inflight = 0
    sent = 0
    space = asyncio.Event()
    space.set()

    def finished(started: float, fut: asyncio.Future[int]) -> None:
        nonlocal inflight
        inflight -= 1
        if inflight < args.inflight:
            space.set()
        exc = fut.exception()
        if exc is not None:
            if rec is not None:
                rec.error(exc)
            if not done.done():
                done.set_exception(exc)
            return
        if rec is not None:
            rec.record(time.perf_counter() - started)
        if inflight == 0 and sent == entries and not done.done():
            done.set_result(None)

    def send(due: float) -> None:
        nonlocal inflight, sent
        lh = handles[sent % len(handles)]
        fut = lh.append(payload)
        if on_sent is not None:
            on_sent(lh.id, sent // len(handles), due)
        inflight += 1
        sent += 1
        fut.add_done_callback(functools.partial(finished, due))

    rate = getattr(args, "rate", None)
    t0 = time.perf_counter()
    while sent < entries and not done.done():
        now = time.perf_counter()
        if deadline is not None and now >= deadline:
            break
        if rate:
            due_count = min(entries, int((now - t0) * rate) + 1)
            while sent < due_count and inflight < OPEN_LOOP_INFLIGHT_MAX:
                send(t0 + sent / rate)
            await asyncio.sleep(0.001)
        else:
            while inflight >= args.inflight:
                space.clear()
                await space.wait()
            send(time.perf_counter())
            if sent % 1024 == 0:
                await asyncio.sleep(0)  # let answers in between long bursts
    entries = sent  # a deadline may have cut the run short: wait for what was sent
    if inflight == 0 and not done.done():
        done.set_result(None)
    await done


async def _write_workload(bk: Any, args: argparse.Namespace, entries: int, ledgers: int,
                          rec: Recorder, deadline: float | None) -> None:
    handles = await _create_ledgers(bk, args, ledgers)
    if args.warmup > 0:
        await _append_load(handles, args, args.warmup, None, None)
    # What a latency-minded application does after start-up (docs/performance.md): the
    # objects made so far are left out of the collector's passes, whose full passes
    # otherwise stop this client for 20-35 ms, twice in ten seconds at 33,000/s.
    gc.freeze()
    rec.start()
    with Progress(entries, "appended", lambda: rec.count, args.duration):
        await _append_load(handles, args, entries, deadline, rec)
    await asyncio.gather(*(lh.close() for lh in handles))


async def _prepare_closed_ledgers(bk: Any, args: argparse.Namespace) -> list[int]:
    """Write the entries to be read back (not timed) and close the ledgers."""
    handles = await _create_ledgers(bk, args, args.ledgers)
    counter = Recorder(args.entry_size)
    with Progress(args.entries, "writing the data to read", lambda: counter.count):
        await _append_load(handles, args, args.entries, None, counter)
    await asyncio.gather(*(lh.close() for lh in handles))
    return [lh.id for lh in handles]


async def _catchup_workload(bk: Any, args: argparse.Namespace, ledger_ids: list[int],
                            rec: Recorder, deadline: float | None) -> None:
    handles = await asyncio.gather(*(bk.open_ledger(i, recovery=False) for i in ledger_ids))
    total = sum(rh.last_add_confirmed + 1 for rh in handles)

    async def read_all(rh: Any) -> None:
        last = rh.last_add_confirmed
        for lo in range(0, last + 1, args.batch):
            if deadline is not None and time.perf_counter() >= deadline:
                return
            hi = min(last, lo + args.batch - 1)
            t = time.perf_counter()
            got = await rh.read(lo, hi)
            rec.record(time.perf_counter() - t, len(got))

    rec.start()
    with Progress(total, "read", lambda: rec.count, args.duration):
        await asyncio.gather(*(read_all(rh) for rh in handles))


async def _tail_workload(bk: Any, reader_bk: Any, args: argparse.Namespace, entries: int,
                         ledgers: int, rec: Recorder, deadline: float | None) -> None:
    handles = await _create_ledgers(bk, args, ledgers)
    sent_at: dict[tuple[int, int], float] = {}

    def on_sent(ledger_id: int, entry_id: int, due: float) -> None:
        sent_at[(ledger_id, entry_id)] = due

    readers = await asyncio.gather(*(reader_bk.open_ledger(lh.id, recovery=False)
                                     for lh in handles))

    async def follow(rh: Any) -> None:
        async for entry in rh.tail(0, poll_s=0.5):
            started = sent_at.pop((entry.ledger_id, entry.entry_id), None)
            if started is not None:
                rec.record(time.perf_counter() - started)

    rec.start()
    tails = [asyncio.create_task(follow(rh)) for rh in readers]
    try:
        with Progress(entries, "tailed", lambda: rec.count, args.duration):
            await _append_load(handles, args, entries, deadline, None, on_sent)
            await asyncio.gather(*(lh.close() for lh in handles))
            async with asyncio.timeout(60):
                await asyncio.gather(*tails)
    finally:
        for t in tails:
            t.cancel()
        await asyncio.gather(*tails, return_exceptions=True)


# ----------------------------------------------------------------- one process


async def _run_in_process(bk: Any, args: argparse.Namespace, entries: int, ledgers: int,
                          rec: Recorder) -> None:
    deadline = None
    if args.start_at:
        await asyncio.sleep(max(0.0, args.start_at - time.time()))
    if args.duration:
        deadline = time.perf_counter() + args.duration
    if args.workload == "write":
        await _write_workload(bk, args, entries, ledgers, rec, deadline)
    elif args.mode == "catchup":
        await _catchup_workload(bk, args, args.ledger_ids, rec, deadline)
    else:
        await _tail_workload(bk, bk, args, entries, ledgers, rec, deadline)


async def run_worker(args: argparse.Namespace) -> int:
    """A client process of a ``--clients`` run: run the workload, write raw results."""
    from ..client.client import BookKeeper

    bk = await BookKeeper.connect(args.metadata_uri)
    rec = Recorder(args.entry_size)
    try:
        await _run_in_process(bk, args, args.entries, args.ledgers, rec)
    except Exception as exc:  # reported to the parent, which fails the run
        rec.error(exc)
    finally:
        await bk.close()
    async with aiofiles.open(args.worker_out, "w") as fh:
        await fh.write(json.dumps(rec.to_json()))
    return 0


def _worker_command(args: argparse.Namespace, metadata_uri: str, entries: int, ledgers: int,
                    ledger_ids: list[int], start_at: float, out: str) -> list[str]:
    cmd = [sys.executable, "-m", "asyncbk", "bench", args.workload,
           "--metadata-uri", metadata_uri, "--worker-out", out, "--start-at", f"{start_at:.3f}",
           "--entries", str(max(1, entries)), "--ledgers", str(max(1, ledgers)),
           "--inflight", str(args.inflight), "--entry-size", str(args.entry_size),
           "--ensemble", str(args.ensemble), "--write-quorum", str(args.write_quorum),
           "--ack-quorum", str(args.ack_quorum), "--digest", args.digest,
           "--warmup", str(args.warmup)]
    if args.rate:
        cmd += ["--rate", str(args.rate)]
    if args.duration:
        cmd += ["--duration", str(args.duration)]
    if args.workload == "read":
        cmd += ["--mode", args.mode, "--batch", str(args.batch)]
        if ledger_ids:
            cmd += ["--ledger-ids", ",".join(map(str, ledger_ids))]
    return cmd


async def _run_processes(args: argparse.Namespace, metadata_uri: str, ledger_ids: list[int],
                         workdir: str) -> tuple[Recorder, float]:
    """Run the workload in ``--clients`` processes; merge their results."""
    entries = _split(args.entries, args.clients)
    ledgers = _split(max(args.ledgers, args.clients), args.clients)
    ids = [ledger_ids[i::args.clients] for i in range(args.clients)]
    if args.rate:  # each process offers its share of the rate
        args = argparse.Namespace(**{**vars(args), "rate": args.rate / args.clients})
    start_at = time.time() + WORKER_START_DELAY_S
    outs = [os.path.join(workdir, f"worker-{i}.json") for i in range(args.clients)]
    # guarded: a client process dies with this one, even if this one is SIGKILLed
    procs = [await asyncio.create_subprocess_exec(*guarded(
        _worker_command(args, metadata_uri, entries[i], ledgers[i], ids[i], start_at, outs[i])))
        for i in range(args.clients)]
    expected_s = WORKER_START_DELAY_S + (args.duration or 3600.0)
    try:
        async with asyncio.timeout(expected_s + WORKER_EXIT_MARGIN_S):
            codes = [await p.wait() for p in procs]
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
    if any(codes):
        raise CliError(f"a client process failed (exit codes {codes})")
    merged = Recorder(args.entry_size)
    cpu_s = 0.0
    parts = []
    for out in outs:
        async with aiofiles.open(out) as fh:
            parts.append(json.loads(await fh.read()))
    merged.wall_t0 = min(part["wall_t0"] for part in parts)
    end = max(part["wall_t0"] + part["elapsed_s"] for part in parts)
    for part in parts:
        merged.histogram.add(decode_histogram(part["histogram"]))
        merged.count += part["count"]
        merged.errors += part["errors"]
        merged.first_error = merged.first_error or part["first_error"]
        cpu_s += part["cpu_s"]
        for slot, n in enumerate(part["timeline"]):
            while len(merged.timeline) <= slot:
                merged.timeline.append(0)
            merged.timeline[slot] += n
    merged.end = merged.t0 + (end - merged.wall_t0)
    return merged, cpu_s


# ----------------------------------------------------------------- the command


def validate(args: argparse.Namespace) -> None:
    """The options of a run agree (CliError if not) and the packages it needs are there."""
    if not args.ensemble >= args.write_quorum >= args.ack_quorum:
        raise CliError("need --ensemble >= --write-quorum >= --ack-quorum")
    if args.metadata_uri is None and args.ensemble > args.bookies:
        raise CliError(f"--ensemble {args.ensemble} needs at least that many --bookies")
    if args.rate is not None and args.rate <= 0:
        raise CliError("--rate must be > 0 entries/s")
    if args.duration is not None and args.duration <= 0:
        raise CliError("--duration must be > 0 seconds")
    if args.metadata_uri is not None and getattr(args, "index_backend", None) is not None:
        raise CliError("--index-backend sets the local cluster's bookies: not with "
                       "--metadata-uri")
    check_extras(args)


@contextlib.asynccontextmanager
async def bench_cluster(args: argparse.Namespace) -> AsyncIterator[tuple[str, ProcessMonitor]]:
    """The cluster to measure: ``--metadata-uri``, or a local cluster of ``--bookies``
    started here and stopped on exit; and a (not yet started) monitor of its processes."""
    from ..local import LocalCluster

    cluster = None
    metadata_uri = args.metadata_uri
    if metadata_uri is None:
        print(f"starting a local cluster (etcd + {count_text(args.bookies, 'bookie')}) ...",
              file=sys.stderr)
        backend = getattr(args, "index_backend", None)
        cluster = LocalCluster(bookies=args.bookies,
                               bookie_config={"index_backend": backend} if backend else None)
        await cluster.start()
        metadata_uri = cluster.metadata_uri
    try:
        pids: dict[str, int] = {}
        if cluster is not None:
            pids = {f"bookie-{b.index}": b.pid for b in cluster.bookies if b.pid}
            if cluster.etcd is not None and cluster.etcd.pid:
                pids["etcd"] = cluster.etcd.pid
        monitor = ProcessMonitor(pids)
        try:
            yield metadata_uri, monitor
        finally:
            await monitor.stop()
    finally:
        if cluster is not None:
            await cluster.stop()


async def save(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """``--json`` and ``--plot``."""
    if args.json:
        async with aiofiles.open(args.json, "w") as fh:
            await fh.write(json.dumps(result, indent=2))
    if args.plot:
        await asyncio.to_thread(plot, result, args.plot)
        print(f"plot: {args.plot}")


async def run_bench(args: argparse.Namespace) -> int:
    """``asyncbk bench write|read``: see the module docstring."""
    if getattr(args, "worker_out", None):
        return await run_worker(args)
    validate(args)
    from ..client.client import BookKeeper

    async with bench_cluster(args) as (metadata_uri, monitor):
        bk = await BookKeeper.connect(metadata_uri)
        try:
            ledger_ids: list[int] = []
            if args.workload == "read" and args.mode == "catchup":
                ledger_ids = await _prepare_closed_ledgers(bk, args)
                args.ledger_ids = ledger_ids
            monitor.start()
            if args.clients > 1:
                with tempfile.TemporaryDirectory(prefix="asyncbk-bench-") as workdir:
                    rec, client_cpu_s = await _run_processes(args, metadata_uri, ledger_ids,
                                                             workdir)
            else:
                rec = Recorder(args.entry_size)
                await _run_in_process(bk, args, args.entries, args.ledgers, rec)
                client_cpu_s = self_cpu_s() - rec.cpu0
            cpu_percent = {"client": 100 * client_cpu_s / rec.elapsed,
                           **monitor.cpu_percent(rec.wall_t0, rec.wall_t0 + rec.elapsed)}
        finally:
            await bk.close()
    if rec.errors:
        raise CliError(f"{rec.errors} operations failed; first: {rec.first_error}")
    result = _result(args, rec, cpu_percent, monitor.rss_mb(), monitor.rss_mb("RssAnon"))
    _print_summary(args, result)
    await save(args, result)
    return 0


def _result(args: argparse.Namespace, rec: Recorder, cpu_percent: dict[str, float],
            rss_mb: dict[str, Any], rss_anon_mb: dict[str, Any]) -> dict[str, Any]:
    eps = rec.count / rec.elapsed
    workload = args.workload if args.workload == "write" else f"read-{args.mode}"
    config_keys = ["entries", "inflight", "entry_size", "ensemble", "write_quorum",
                   "ack_quorum", "digest", "bookies", "warmup", "ledgers", "clients", "rate",
                   "duration", "index_backend"]
    if args.workload == "read":
        config_keys += ["mode", "batch"]
    return {
        "workload": workload,
        "entries_done": rec.count,
        "throughput_eps": eps,
        "throughput_mbps": eps * args.entry_size / 1e6,
        **measured(args, rec, cpu_percent, rss_mb, config_keys, rss_anon_mb),
    }


def _print_summary(args: argparse.Namespace, result: dict[str, Any]) -> None:
    lat = result["latency_us"]
    loop = f"offered {args.rate:,.0f}/s" if args.rate else f"{args.inflight} in flight"
    unit = "per range read" if result["workload"] == "read-catchup" else "per entry"
    print(f"{result['workload']}: {result['entries_done']:,} x {args.entry_size} B, {loop}, "
          f"{args.ledgers} ledger(s), {args.clients} client process(es), "
          f"E={args.ensemble} Qw={args.write_quorum} Qa={args.ack_quorum}: "
          f"{result['throughput_eps']:,.0f} entries/s ({result['throughput_mbps']:.1f} MB/s); "
          f"latency us ({unit}) p50 {lat['p50']:.0f}  p99 {lat['p99']:.0f}  "
          f"p999 {lat['p999']:.0f}  max {lat['max']:.0f}")
    print("cpu %: " + "  ".join(f"{k} {v:.0f}" for k, v in result["cpu_percent"].items()))
    for key, what in (("bookie_rss_mb", "rss"), ("bookie_rss_anon_mb", "anonymous rss")):
        rss = result.get(key)
        if rss:
            print(f"bookie {what} MiB first -> last -> max: " + "  ".join(
                f"{k} {v['first']:.0f} -> {v['last']:.0f} -> {v['max']:.0f}"
                for k, v in rss.items()))


__all__ = ["bench_cluster", "run_bench", "run_worker", "save", "validate"]
