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
import importlib.metadata
import json
import os
import platform
import resource
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiofiles

from .._version import __version__
from ..local.process import guarded
from .main import CliError

LATENCY_US_MAX = 60_000_000
"""Highest latency the histogram tracks (60 s); larger values are clamped."""

WORKER_START_DELAY_S = 3.0
"""How far ahead of now the parent sets the common start of its client processes."""

WORKER_EXIT_MARGIN_S = 120.0
"""How long past the expected end the parent waits for a client process."""

TIMELINE_INTERVAL_S = 0.1
"""Width of the completion-count buckets of the throughput timeline."""

OPEN_LOOP_INFLIGHT_MAX = 50_000
"""Appends in flight in an open-loop run; past it sending waits (latency still counts
from each append's due time)."""


BENCH_EXTRA_HINT = 'pip install "asyncbk[bench]"'


def check_extras(args: argparse.Namespace) -> None:
    """The packages of the ``bench`` extra this run needs are importable (CliError, one
    line, if not); checked before any cluster is started."""
    try:
        import hdrh.histogram  # noqa: F401
    except ImportError:
        raise CliError(f"asyncbk bench needs hdrhistogram: {BENCH_EXTRA_HINT}") from None
    if getattr(args, "plot", None):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CliError(f"--plot needs matplotlib: {BENCH_EXTRA_HINT}") from None


def new_histogram() -> Any:
    try:
        from hdrh.histogram import HdrHistogram
    except ImportError:
        raise CliError(f"asyncbk bench needs hdrhistogram: {BENCH_EXTRA_HINT}") from None
    return HdrHistogram(1, LATENCY_US_MAX, 3)


def _decode_histogram(text: str) -> Any:
    from hdrh.histogram import HdrHistogram

    return HdrHistogram.decode(text.encode())


def _process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (Linux /proc); None where unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


RSS_FIELDS = ("VmRSS", "RssAnon")
"""What the monitor samples of each bookie: the resident set, and its anonymous part
(a file-backed page cache, as the lmdb index's pages, counts in VmRSS only)."""


def _process_rss_mb(pid: int) -> dict[str, float] | None:
    """``RSS_FIELDS`` of ``pid`` in MiB (Linux /proc); None where unavailable."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                name = line.split(":", 1)[0]
                if name in RSS_FIELDS:
                    out[name] = int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return out or None


def _self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _version_of(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


# ----------------------------------------------------------------- recording


class Recorder:
    """Latencies (HDR histogram), completions per 100 ms and errors of one process."""

    def __init__(self, entry_size: int) -> None:
        self.histogram = new_histogram()
        self.entry_size = entry_size
        self.count = 0
        self.errors = 0
        self.first_error = ""
        self.t0 = time.perf_counter()
        self.end = self.t0
        self.cpu0 = _self_cpu_s()
        self.wall_t0 = time.time()
        self.timeline: list[int] = []

    def start(self) -> None:
        """Measuring starts now (after set-up and warm-up)."""
        self.t0 = self.end = time.perf_counter()
        self.cpu0 = _self_cpu_s()
        self.wall_t0 = time.time()

    def record(self, latency_s: float, entries: int = 1, samples: int = 1) -> None:
        """``entries`` completed now; ``samples`` latencies of ``latency_s`` (one per range
        read; one per record when a batch of records shares its start and end)."""
        now = time.perf_counter()
        self.histogram.record_value(min(LATENCY_US_MAX, max(1, int(latency_s * 1e6))), samples)
        self.count += entries
        self.end = now
        slot = int((now - self.t0) / TIMELINE_INTERVAL_S)
        while len(self.timeline) <= slot:
            self.timeline.append(0)
        self.timeline[slot] += entries

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = f"{type(exc).__name__}: {exc}"

    @property
    def elapsed(self) -> float:
        return max(1e-9, self.end - self.t0)

    def to_json(self) -> dict[str, Any]:
        return {"histogram": self.histogram.encode().decode(), "count": self.count,
                "errors": self.errors, "first_error": self.first_error,
                "elapsed_s": self.elapsed, "timeline": self.timeline,
                "cpu_s": _self_cpu_s() - self.cpu0, "wall_t0": self.wall_t0}


class Progress:
    """A progress line on stderr: rewritten in place on a terminal, every 5 s otherwise."""

    def __init__(self, total: int, what: str, count: Callable[[], int],
                 duration_s: float | None = None) -> None:
        self.total, self.what, self.count, self.duration_s = total, what, count, duration_s
        self.tty = sys.stderr.isatty()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        t0 = time.perf_counter()
        last_n, last_t = 0, t0
        period = 1.0 if self.tty else 5.0
        while True:
            await asyncio.sleep(period)
            n, now = self.count(), time.perf_counter()
            rate = (n - last_n) / (now - last_t)
            last_n, last_t = n, now
            done = (f"{n:,}/{self.total:,} ({100 * n / max(1, self.total):.0f}%)"
                    if self.duration_s is None else f"{n:,}")
            limit = f"/{self.duration_s:.0f}" if self.duration_s is not None else ""
            line = f"  {self.what}: {done}  {rate:,.0f}/s  {now - t0:.0f}{limit}s"
            if self.tty:
                print(f"\r{line}   ", end="", file=sys.stderr, flush=True)
            else:
                print(line, file=sys.stderr, flush=True)

    def __enter__(self) -> Progress:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.tty:
            print("\r" + " " * 70 + "\r", end="", file=sys.stderr, flush=True)


class _ProcessMonitor:
    """CPU seconds (every 0.25 s) and RSS (every 5 s) of the cluster's processes, so
    CPU use can be read over exactly the measured window of any client process."""

    CPU_PERIOD_S = 0.25
    RSS_PERIOD_S = 5.0

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.cpu: list[tuple[float, dict[str, float | None]]] = []
        self.rss: list[dict[str, dict[str, float] | None]] = []
        self._task: asyncio.Task[None] | None = None

    def _sample(self) -> None:
        self.cpu.append((time.time(), {k: _process_cpu_s(p) for k, p in self.pids.items()}))

    def _sample_rss(self) -> None:
        self.rss.append({k: _process_rss_mb(p) for k, p in self.pids.items()
                         if k.startswith("bookie")})

    async def _run(self) -> None:
        last_rss = 0.0
        while True:
            self._sample()
            if time.monotonic() - last_rss >= self.RSS_PERIOD_S:
                last_rss = time.monotonic()
                self._sample_rss()
            await asyncio.sleep(self.CPU_PERIOD_S)

    def start(self) -> None:
        if self.pids:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            self._sample()
            self._sample_rss()

    def cpu_percent(self, t0: float, t1: float) -> dict[str, float]:
        """CPU % of each process between the last sample at or before ``t0`` and the
        first at or after ``t1`` (now, if the run just ended)."""
        if self._task is not None:
            self._sample()
        before = [s for s in self.cpu if s[0] <= t0] or self.cpu[:1]
        after = [s for s in self.cpu if s[0] >= t1] or self.cpu[-1:]
        if not before or not after or after[0][0] <= before[-1][0]:
            return {}
        (ta, a), (tb, b) = before[-1], after[0]
        return {k: 100 * (b[k] - a[k]) / (tb - ta)  # type: ignore[operator]
                for k in self.pids if a.get(k) is not None and b.get(k) is not None}

    def rss_mb(self, field: str = "VmRSS") -> dict[str, dict[str, float]]:
        """First, last and highest RSS (or another of ``RSS_FIELDS``) of each bookie,
        and every sample."""
        out: dict[str, dict[str, Any]] = {}
        for k in self.pids:
            values = [v for s in self.rss
                      if (fields := s.get(k)) is not None and (v := fields.get(field)) is not None]
            if values:
                out[k] = {"first": values[0], "last": values[-1], "max": max(values),
                          "samples": values}
        return out


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
        fut.add_done_callback(lambda f, s=due: finished(s, f))

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
            if sent % 64 == 0:
                await asyncio.sleep(0)  # let answers in between bursts
    entries = sent  # a deadline may have cut the run short: wait for what was sent
    if inflight == 0 and not done.done():
        done.set_result(None)
    await done


async def _write_workload(bk: Any, args: argparse.Namespace, entries: int, ledgers: int,
                          rec: Recorder, deadline: float | None) -> None:
    handles = await _create_ledgers(bk, args, ledgers)
    if args.warmup > 0:
        await _append_load(handles, args, args.warmup, None, None)
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
        merged.histogram.add(_decode_histogram(part["histogram"]))
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


def _validate(args: argparse.Namespace) -> None:
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
async def bench_cluster(args: argparse.Namespace) -> AsyncIterator[tuple[str, _ProcessMonitor]]:
    """The cluster to measure: ``--metadata-uri``, or a local cluster of ``--bookies``
    started here and stopped on exit; and a (not yet started) monitor of its processes."""
    from ..local import LocalCluster

    cluster = None
    metadata_uri = args.metadata_uri
    if metadata_uri is None:
        print(f"starting a local cluster (etcd + {args.bookies} bookies) ...", file=sys.stderr)
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
        monitor = _ProcessMonitor(pids)
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
    """``asyncbk bench write|read|stream``: see the module docstring."""
    if getattr(args, "worker_out", None):
        return await run_worker(args)
    _validate(args)
    if args.workload == "stream":
        from .bench_stream import run_stream_bench

        return await run_stream_bench(args)
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
                client_cpu_s = _self_cpu_s() - rec.cpu0
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


PERCENTILES = [0, 10, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.99, 100]


def latency_json(h: Any) -> dict[str, Any]:
    """``latency_us`` of a result: the main percentiles of histogram ``h``."""
    return {
        "p50": h.get_value_at_percentile(50),
        "p99": h.get_value_at_percentile(99),
        "p999": h.get_value_at_percentile(99.9),
        "max": h.get_max_value(),
        "mean": h.get_mean_value(),
        "samples": h.get_total_count(),
    }


def versions() -> dict[str, str]:
    return {"asyncbk": __version__, "python": platform.python_version(),
            "msgpack": _version_of("msgpack"), "uvloop": _version_of("uvloop")}


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


def measured(args: argparse.Namespace, rec: Recorder, cpu_percent: dict[str, float],
             rss_mb: dict[str, Any], config_keys: list[str],
             rss_anon_mb: dict[str, Any] | None = None) -> dict[str, Any]:
    """The parts of a result every workload has: loop kind, latency, timeline, CPU,
    bookie memory (VmRSS, and RssAnon when given), duration, settings and versions."""
    h = rec.histogram
    anon = {"bookie_rss_anon_mb": rss_anon_mb} if rss_anon_mb is not None else {}
    return {
        "loop": "open" if args.rate else "closed",
        "latency_us": latency_json(h),
        "latency_distribution_us": {str(p): h.get_value_at_percentile(p) for p in PERCENTILES},
        "timeline": {"interval_s": TIMELINE_INTERVAL_S, "completed": rec.timeline},
        "cpu_percent": {k: round(v, 1) for k, v in cpu_percent.items()},
        "bookie_rss_mb": rss_mb,
        **anon,
        "elapsed_s": rec.elapsed,
        "config": {k: _config_value(args, k) for k in config_keys},
        "versions": versions(),
    }


def _config_value(args: argparse.Namespace, key: str) -> Any:
    """A setting of the run as the result records it (the local cluster's bookies'
    index backend when not chosen: their default)."""
    value = getattr(args, key, None)
    if key == "index_backend" and value is None and args.metadata_uri is None:
        return "memory"
    return value


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


def plot(result: dict[str, Any], path: str) -> None:
    """A PNG: latency by percentile (log scale) and throughput per second."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    dist = result["latency_distribution_us"]
    xs = [1 / (1 - float(p) / 100) if float(p) < 100 else 1e5 for p in dist]
    ax1.plot(xs, [v / 1000 for v in dist.values()], marker="o")
    ax1.set_xscale("log")
    labelled = [(x, p) for x, p in zip(xs, dist, strict=True) if float(p) >= 50]
    ax1.set_xticks([x for x, _ in labelled], [p for _, p in labelled], fontsize=8)
    ax1.set_xlabel("percentile")
    ax1.set_ylabel("latency (ms)")
    ax1.set_title("latency distribution")
    ax1.grid(True, alpha=0.3)
    timeline = result["timeline"]
    step = timeline["interval_s"]
    counts = timeline["completed"][:-1] or timeline["completed"]  # the last slot is partial
    ax2.plot([i * step for i in range(len(counts))], [n / step for n in counts])
    ax2.set_xlabel("seconds")
    unit = "records" if "throughput_rps" in result else "entries"
    ax2.set_ylabel(f"{unit}/s ({step * 1000:.0f} ms windows)")
    ax2.set_ylim(bottom=0)
    ax2.set_title("throughput over time")
    ax2.grid(True, alpha=0.3)
    cfg = result["config"]
    size = cfg.get("entry_size") or cfg.get("record_size")
    rate = result.get("throughput_eps", result.get("throughput_rps", 0.0))
    fig.suptitle(f"asyncbk {result['workload']} ({result['loop']} loop): "
                 f"{size} B, E={cfg['ensemble']} Qw={cfg['write_quorum']} "
                 f"Qa={cfg['ack_quorum']}, {rate:,.0f} {unit}/s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


__all__ = ["Progress", "Recorder", "bench_cluster", "check_extras", "latency_json", "plot",
           "run_bench", "save", "versions"]
