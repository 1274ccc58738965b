"""What ``asyncbk bench`` measures with, and how a result is put together: latency
histograms, the per-process recorder and progress line, the CPU and memory monitor of
the cluster's processes, the parts every result has, and its plot.  The workloads
themselves are in :mod:`asyncbk.cli.bench` (ledgers) and :mod:`.bench_stream`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import os
import platform
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

from .._version import __version__
from .common import CliError

LATENCY_US_MAX = 60_000_000
"""Highest latency the histogram tracks (60 s); larger values are clamped."""

TIMELINE_INTERVAL_S = 0.1
"""Width of the completion-count buckets of the throughput timeline."""

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


FOLD_DISTINCT = 200_000
"""Distinct latencies a :class:`BufferedHistogram` counts before it folds them in (a
fold stops the event loop about 1 µs per distinct value; latencies in microseconds
rarely reach this many distinct values, so a run folds once, when it is read)."""


class BufferedHistogram:
    """An HDR histogram (microseconds) that takes one value for ~0.2 µs: each distinct
    value is counted in a dict and recorded once with its count when the histogram is
    read (hdrh's ``record_value`` is Python, ~0.9 µs a call).  The histogram is the
    same as recording each value at once.  Nothing is folded during a run (unless
    ``FOLD_DISTINCT`` distinct values come): a fold in the middle of a run stopped the
    event loop for 14 ms every 65,536 values, which an open-loop run measured as its
    own tail.  ``asyncbk bench`` and every system of ``benchmarks/peers.py`` record
    through this: none pays more to be measured."""

    __slots__ = ("_counts", "_histogram")

    def __init__(self) -> None:
        self._histogram = new_histogram()
        self._counts: dict[int, int] = {}

    def record(self, value_us: int, count: int = 1) -> None:
        """``count`` samples of ``value_us`` (clamped to 1 .. ``LATENCY_US_MAX``)."""
        if not 1 <= value_us <= LATENCY_US_MAX:
            value_us = 1 if value_us < 1 else LATENCY_US_MAX
        counts = self._counts
        counts[value_us] = counts.get(value_us, 0) + count
        if len(counts) >= FOLD_DISTINCT:
            self._fold()

    def _fold(self) -> None:
        record_value = self._histogram.record_value
        for value, count in self._counts.items():
            record_value(value, count)
        self._counts.clear()

    @property
    def histogram(self) -> Any:
        """The ``HdrHistogram`` with every value recorded so far."""
        if self._counts:
            self._fold()
        return self._histogram

    def reset(self) -> None:
        self._counts.clear()
        self._histogram.reset()


def decode_histogram(text: str) -> Any:
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


def self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _version_of(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"




class Recorder:
    """Latencies (HDR histogram), completions per 100 ms and errors of one process."""

    def __init__(self, entry_size: int) -> None:
        self.latencies = BufferedHistogram()
        self.entry_size = entry_size
        self.count = 0
        self.errors = 0
        self.first_error = ""
        self.t0 = time.perf_counter()
        self.end = self.t0
        self.cpu0 = self_cpu_s()
        self.wall_t0 = time.time()
        self.timeline: list[int] = []

    def start(self) -> None:
        """Measuring starts now (after set-up and warm-up)."""
        self.t0 = self.end = time.perf_counter()
        self.cpu0 = self_cpu_s()
        self.wall_t0 = time.time()

    def record(self, latency_s: float, entries: int = 1, samples: int = 1) -> None:
        """``entries`` completed now; ``samples`` latencies of ``latency_s`` (one per range
        read; one per record when a batch of records shares its start and end)."""
        now = time.perf_counter()
        self.latencies.record(int(latency_s * 1e6), samples)
        self.count += entries
        self.end = now
        slot = int((now - self.t0) / TIMELINE_INTERVAL_S)
        while len(self.timeline) <= slot:
            self.timeline.append(0)
        self.timeline[slot] += entries

    @property
    def histogram(self) -> Any:
        """The ``HdrHistogram`` of every latency recorded so far."""
        return self.latencies.histogram

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
                "cpu_s": self_cpu_s() - self.cpu0, "wall_t0": self.wall_t0}


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


class ProcessMonitor:
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
