"""Subscriptions, keyed records and time seeks against same-run baselines.

One local cluster (etcd and three bookie processes on loopback, journals fsynced
before every acknowledgement), streams of E3 Qw2 Qa2, one client (this process,
uvloop).  Four parts, each measured against a baseline in the same run, the
measurements interleaved round by round (the machine is a noisy shared box):

1. consume: ``--consume-records`` records of 100 B (400,000, written 1,000 to a
   ledger entry) in one stream, then per round, in an order rotated from round to
   round: a plain reader reading them all with ``read_batch(1000)`` (the
   baseline), a plain reader taking them one at a time with ``read_next()``
   (what a per-record await costs), and a subscription (a new name each round)
   taking each with ``read_next()`` and acknowledging it with
   ``ack(rec.position)``.  Records/s from opening to the last record, and the
   client's CPU per record (steadier than records/s on a shared box); the figure
   is the median over rounds, the ratio the median of the ratios within each
   round.  Target: the subscription >= 200,000 records/s.
2. keyed writes: pipelined writes of ``--keyed-records`` 100 B records (20,000
   in flight, 1,000 per event-loop turn, as ``asyncbk bench stream``), plain
   against with an 8-byte key and two headers (2-byte names, 8-byte values), a
   fresh stream for each, plain and keyed taking turns.  Target: keyed/plain
   >= 0.8.
3. time seek: ``--seek-records`` records (1,000,000) in 10 segments
   (rolling_entries = records / 10) with explicit times rising by 3 ms every
   second record (so pairs share a time and there are gaps between them); then
   ``--seeks`` seeks to random times (and the edges: the first and last
   record, every segment's first record and the gap before it):
   ``open_reader(timestamp_ms=t)`` + ``read_next()`` + ``close()``, each result
   checked to be the first record with a time >= t (failures must be 0).  The
   baseline, alternating with the seeks: ``open_reader(start=Position(segment,
   entry, 0))`` of a random entry + ``read_next()`` + ``close()`` (a seek with no
   search).  Target: p50 < 20 ms.
4. many subscriptions: ``--subscriptions`` (1,000) subscriptions of one stream,
   each consumer reading one more record and acknowledging it every second for
   ``--duration`` seconds (one shared loop) while a writer trickles 10 records
   a second into the stream.  The consumers read from a backlog written before
   (so 1,000 readers hold their read-ahead rather than long-poll the bookies):
   what is measured is the acknowledgement path.  The metadata store's
   ``kv_txn`` is wrapped to count and time the subscriptions' persistences; etcd's
   own revision and WAL fsync counters (its HTTP endpoints) give the server's
   view.  Reported: the etcd write load per subscription (cursor writes/s,
   expected about 1 / subscription_ack_interval_s) and in all, the etcd
   transactions carrying them (the consumers of one process share them), the
   transaction latency p50/p99 (the ``kv_txn`` call, as the client sees it), the failed
   persistences, the CPU of the client, etcd and the bookies.  Baselines in the
   same run, before it: 5 s with every subscription open and idle (no ack:
   nothing to persist), then 10 s with only 10 of them acking (the persistence
   unloaded).  The subscriptions are created one after another (timed too).

``--profile`` runs one more subscription consume round under py-spy (attached to
this process; needs py-spy and ptrace rights) and prints where its time goes.

    python benchmarks/subscriptions.py [--quick] [--json FILE] [--parts consume,keyed,seek,many]
        [--rounds 3] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import json
import os
import random
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from asyncbk import Position
from asyncbk.cli.bench_record import versions
from asyncbk.meta import keys
from asyncbk.testing import LocalCluster

TARGET_CONSUME_RPS = 200_000
TARGET_KEYED_RATIO = 0.8
TARGET_SEEK_P50_MS = 20.0
RECORD_BYTES = 100
INFLIGHT = 20_000
BURST = 1_000
KEYS = 1024
"""Distinct keys and header values, cycled (made before the clock starts)."""
QUORUM = {"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2}
PARTS = ("consume", "keyed", "seek", "many")
DEFAULTS = {"consume_records": 400_000, "keyed_records": 300_000, "seek_records": 1_000_000,
            "subscriptions": 1_000, "duration": 30.0}
QUICK = {"consume_records": 100_000, "keyed_records": 100_000, "seek_records": 200_000,
         "subscriptions": 200, "duration": 10.0}
TRICKLE_RECORDS_PER_S = 10
IDLE_WINDOW_S = 5.0
"""The many-subscriptions baseline with every consumer idle."""
FEW_SUBSCRIPTIONS = 10
FEW_WINDOW_S_MAX = 10.0
"""The many-subscriptions baseline with only FEW_SUBSCRIPTIONS consumers acking."""
DRAIN_S_MAX = 60.0
"""After the many-subscriptions window: how long the persistences still queued may
take to finish before the consumers are closed."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ measuring helpers


def pct(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(p / 100 * len(s) + 0.5) - 1))
    return s[k]


def latency_ms(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {"p50": round(pct(ms, 50), 3), "p99": round(pct(ms, 99), 3),
            "max": round(max(ms), 3) if ms else float("nan"),
            "mean": round(statistics.fmean(ms), 3) if ms else float("nan"),
            "samples": len(ms)}


def self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _proc_cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuWindow:
    """CPU seconds of this process, etcd and each bookie over a window: % of one core."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.pids: dict[str, int | None] = {"etcd": cluster.etcd.pid if cluster.etcd else None}
        for b in cluster.bookies:
            self.pids[f"bookie-{b.index}"] = b.pid
        self.t0 = 0.0
        self.cpu0: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        out = {"client": self_cpu_s()}
        out.update((name, _proc_cpu_s(pid)) for name, pid in self.pids.items())
        return out

    def start(self) -> None:
        self.cpu0 = self._now()
        self.t0 = time.perf_counter()

    def percent(self) -> dict[str, float]:
        wall = time.perf_counter() - self.t0
        now = self._now()
        return {k: round(100 * (now[k] - self.cpu0[k]) / wall, 1) for k in now}


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ------------------------------------------------------------------ writing


def make_extras() -> tuple[list[bytes], list[dict[str, bytes]]]:
    ks = [b"k%07d" % j for j in range(KEYS)]
    hs = [{"h1": b"v1-%05d" % j, "h2": b"v2-%05d" % j} for j in range(KEYS)]
    assert all(len(k) == 8 for k in ks) and all(len(v) == 8 for h in hs for v in h.values())
    return ks, hs


def ts_of(base_ms: int, i: int) -> int:
    """The time of record ``i`` of the seek stream: pairs of records share a time, 3 ms
    apart."""
    return base_ms + 3 * (i >> 1)


def first_index_at(base_ms: int, t: int) -> int:
    """The index of the first record of the seek stream with a time >= ``t``."""
    if t <= base_ms:
        return 0
    return 2 * -(-(t - base_ms) // 3)


async def write_pipelined(w: Any, n: int, mode: str = "plain", first: int = 0,
                          base_ms: int = 0) -> float:
    """Write ``n`` records (indexes ``first`` ...) to writer ``w``: at most INFLIGHT
    unacknowledged, BURST per event-loop turn (one ledger entry each); ``mode``:
    plain, keyed (key and two headers) or timed (explicit times, :func:`ts_of`).
    Returns seconds from the first write to the last acknowledgement."""
    payload = os.urandom(RECORD_BYTES)
    ks, hs = make_extras()
    mask = KEYS - 1
    write = w.write_nowait
    bursts: collections.deque[tuple[asyncio.Future[Any], int]] = collections.deque()
    inflight = 0
    i, end = first, first + n
    t0 = time.perf_counter()
    while i < end:
        while inflight + BURST > INFLIGHT:
            fut, k = bursts.popleft()
            await fut
            inflight -= k
        stop = min(end, i + BURST)
        fut = None
        if mode == "plain":
            for _ in range(i, stop):
                fut = write(payload)
        elif mode == "keyed":
            for j in range(i, stop):
                fut = write(payload, key=ks[j & mask], headers=hs[j & mask])
        else:
            for j in range(i, stop):
                fut = write(payload, timestamp_ms=base_ms + 3 * (j >> 1))
        assert fut is not None
        bursts.append((fut, stop - i))
        inflight += stop - i
        i = stop
        await asyncio.sleep(0)  # the writer sends the turn's records as one entry
    for fut, _ in bursts:
        await fut
    return time.perf_counter() - t0


# ------------------------------------------------------------------ 1. consume


async def read_all_batch(ns: Any, stream: str, n: int) -> int:
    got = 0
    async with await ns.open_reader(stream, start=Position.EARLIEST) as r:
        while got < n:
            got += len(await r.read_batch(1000, wait_s=0.5))
    return got


async def read_all_next(ns: Any, stream: str, n: int) -> int:
    got = 0
    async with await ns.open_reader(stream, start=Position.EARLIEST) as r:
        read = r.read_next
        while got < n:
            await read()
            got += 1
    return got


async def consume_subscription(ns: Any, stream: str, name: str, n: int) -> int:
    got = 0
    sub = await ns.subscribe(stream, name, start=Position.EARLIEST)
    try:
        read, ack = sub.read_next, sub.ack
        while got < n:
            rec = await read()
            await ack(rec.position)
            got += 1
    finally:
        await sub.close()
    return got


async def consume_subscription_for(ns: Any, stream: str, name: str, n: int) -> int:
    """API.md's idiom: ``async for rec in sub`` and ``await sub.ack(rec.position)``."""
    got = 0
    sub = await ns.subscribe(stream, name, start=Position.EARLIEST)
    try:
        ack = sub.ack
        async for rec in sub:
            await ack(rec.position)
            got += 1
            if got == n:
                break
    finally:
        await sub.close()
    return got


async def consume_subscription_batch(ns: Any, stream: str, name: str, n: int) -> int:
    """``sub.read_batch(1000)``, then an ack of every record."""
    got = 0
    sub = await ns.subscribe(stream, name, start=Position.EARLIEST)
    try:
        ack = sub.ack
        while got < n:
            for rec in await sub.read_batch(1000, wait_s=0.5):
                await ack(rec.position)
                got += 1
    finally:
        await sub.close()
    return got


CONSUME_VARIANTS = ("reader read_batch", "reader read_next", "subscription read_next+ack",
                    "subscription async for+ack", "subscription read_batch+ack")
TARGET_CONSUME_VARIANT = "subscription async for+ack"


async def part_consume(bk: Any, cluster: LocalCluster, args: argparse.Namespace,
                       profile_to: Path | None) -> dict[str, Any]:
    n = args.consume_records
    ns = await bk.namespace("consume", create=True, rolling_entries=0, retention_s=0,
                            subscription_ack_interval_s=args.ack_interval, **QUORUM)
    await ns.create_stream("s")
    log(f"consume: writing {n:,} records of {RECORD_BYTES} B ...")
    async with await ns.open_writer("s") as w:
        write_s = await write_pipelined(w, n)
    info = await ns.stream_info("s")
    entries = sum(s.last_position.entry + 1 for s in info.segments if s.last_position)
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    for rnd in range(args.rounds):
        k = rnd % len(CONSUME_VARIANTS)
        order = CONSUME_VARIANTS[k:] + CONSUME_VARIANTS[:k]
        for variant in order:
            cpu = CpuWindow(cluster)
            cpu.start()
            t0 = time.perf_counter()
            if variant == "reader read_batch":
                got = await read_all_batch(ns, "s", n)
            elif variant == "reader read_next":
                got = await read_all_next(ns, "s", n)
            elif variant == "subscription async for+ack":
                got = await consume_subscription_for(ns, "s", f"consume-{rnd}", n)
            elif variant == "subscription read_batch+ack":
                got = await consume_subscription_batch(ns, "s", f"consume-{rnd}", n)
            else:
                got = await consume_subscription(ns, "s", f"consume-{rnd}", n)
            elapsed = time.perf_counter() - t0
            row = {"round": rnd, "variant": variant, "records": got, "seconds": elapsed,
                   "records_per_s": got / elapsed, "cpu_percent": cpu.percent()}
            if variant.startswith("subscription"):
                sub_infos = {s.name: s for s in await ns.subscriptions("s")}
                si = sub_infos[f"consume-{rnd}"]
                row["persisted_position"] = str(si.position)
                row["lag_records_after_close"] = si.lag_records
                if si.lag_records != 0:
                    bad.append(f"round {rnd}: {si.lag_records} records not acknowledged "
                               "after close")
                await ns.delete_subscription("s", f"consume-{rnd}")
            if got != n:
                bad.append(f"round {rnd} {variant}: {got} records, not {n}")
            rows.append(row)
            log(f"consume round {rnd + 1}/{args.rounds} {variant:>27}: "
                f"{row['records_per_s']:>9,.0f} records/s, client CPU "
                f"{row['cpu_percent']['client']:.0f}%")
    profile_text = None
    if profile_to is not None:
        profile_text = await profile_round(
            profile_to, lambda: consume_subscription(ns, "s", "consume-profiled", n))
        await ns.delete_subscription("s", "consume-profiled")
    per = {v: [r for r in rows if r["variant"] == v] for v in CONSUME_VARIANTS}
    figures = {v: {"records_per_s": median([r["records_per_s"] for r in rs]),
                   "client_cpu_percent": median([r["cpu_percent"]["client"] for r in rs]),
                   "client_cpu_us_per_record": median(
                       [r["cpu_percent"]["client"] / 100 * r["seconds"] / r["records"] * 1e6
                        for r in rs])}
               for v, rs in per.items()}
    base = per["reader read_batch"]
    ratios = {v: median([r["records_per_s"] / b["records_per_s"]
                         for r, b in zip(rs, base, strict=True)])
              for v, rs in per.items() if v != "reader read_batch"}
    sub = figures[TARGET_CONSUME_VARIANT]["records_per_s"]
    return {"records": n, "record_bytes": RECORD_BYTES, "entries": entries,
            "segments": len(info.segments), "write_records_per_s": n / write_s,
            "rounds": rows, "figures": figures, "ratio_to_read_batch": ratios,
            "target": {"what": f"subscription (async for + ack) >= {TARGET_CONSUME_RPS:,} "
                               "records/s",
                       "measured": sub, "met": sub >= TARGET_CONSUME_RPS},
            "failures": bad, "profile": profile_text}


# ------------------------------------------------------------------ profiling


def _frame(text: str) -> str:
    """``name (path/file.py:123)`` -> ``name (path/file.py)``."""
    name, _, where = text.partition(" (")
    return f"{name} ({where.rstrip(')').rsplit(':', 1)[0]})" if where else name


def summarize_profile(raw: Path, err: bytes = b"") -> str:
    if not raw.exists():
        return f"(py-spy wrote nothing: {err.decode(errors='replace')[-500:]})"
    inclusive: collections.Counter[str] = collections.Counter()
    on_top: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";")]
        for i, f in enumerate(frames):  # a dataclass's generated __init__: say whose
            if f.startswith("__create_fn__") and i:
                frames[i] = f"generated __init__, called by {frames[i - 1].split(' (')[0]}"
        if any("(threading.py)" in f for f in frames):
            continue  # another thread than the event loop's
        samples = int(count)
        total += samples
        for f in set(frames):
            inclusive[f] += samples
        on_top[frames[-1]] += samples
    if not total:
        return "(py-spy recorded no samples)"
    lines = [f"event-loop thread samples: {total} (py-spy slows the process: compare shares, "
             "not rates)", "", "| function | on stack | on top |", "|---|---|---|"]
    shown = [f for f, _ in inclusive.most_common() if inclusive[f] < 0.95 * total][:25]
    for f in shown:
        lines.append(f"| `{f}` | {100 * inclusive[f] / total:.0f}% "
                     f"| {100 * on_top[f] / total:.0f}% |")
    lines += ["", "| on top (self) | share |", "|---|---|"]
    for f, k in on_top.most_common(20):
        lines.append(f"| `{f}` | {100 * k / total:.1f}% |")
    return "\n".join(lines)


async def profile_round(out: Path, work: Callable[[], Awaitable[Any]]) -> str:
    """Run ``work`` with py-spy attached to this process; where its time went."""
    cmd = ["py-spy", "record", "--pid", str(os.getpid()), "--rate", "250", "--format", "raw",
           "-o", str(out)]
    log(f"profile: {' '.join(cmd)}")
    proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    try:
        try:
            async with asyncio.timeout(15):  # py-spy says so once it is attached
                while b"Sampling" not in (line := await proc.stdout.readline()):
                    if not line:
                        raise RuntimeError("py-spy ended before sampling (ptrace rights?)")
        except TimeoutError:
            raise RuntimeError("py-spy did not start sampling within 15 s") from None
        t0 = time.perf_counter()
        await work()
        log(f"profile: the profiled round took {time.perf_counter() - t0:.1f} s")
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        err = await proc.stdout.read()
        await proc.wait()
    return summarize_profile(out, err)


# ------------------------------------------------------------------ 2. keyed writes


async def part_keyed(bk: Any, cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    n = args.keyed_records
    warmup = min(20_000, n // 10)
    ns = await bk.namespace("keyed", create=True, rolling_entries=0, retention_s=0, **QUORUM)
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    for rnd in range(args.rounds):
        order = ("plain", "keyed") if rnd % 2 == 0 else ("keyed", "plain")
        for kind in order:
            stream = f"{kind}-{rnd}"
            await ns.create_stream(stream)
            async with await ns.open_writer(stream) as w:
                await write_pipelined(w, warmup, kind)  # not measured
                cpu = CpuWindow(cluster)
                cpu.start()
                seconds = await write_pipelined(w, n, kind, first=warmup)
                cpu_pct = cpu.percent()
            row = {"round": rnd, "kind": kind, "records": n, "seconds": seconds,
                   "records_per_s": n / seconds, "cpu_percent": cpu_pct,
                   "client_cpu_us_per_record": cpu_pct["client"] / 100 * seconds / n * 1e6}
            rows.append(row)
            log(f"keyed round {rnd + 1}/{args.rounds} {kind:>5}: {row['records_per_s']:>9,.0f} "
                f"records/s, client CPU {cpu_pct['client']:.0f}% "
                f"({row['client_cpu_us_per_record']:.2f} us/record)")
            if kind == "keyed" and rnd == 0:
                bad += await check_keyed(ns, stream, warmup + n)
            await ns.delete_stream(stream)
    per = {k: [r for r in rows if r["kind"] == k] for k in ("plain", "keyed")}
    ratio = median([k["records_per_s"] / p["records_per_s"]
                    for p, k in zip(per["plain"], per["keyed"], strict=True)])
    cpu_ratio = median([k["client_cpu_us_per_record"] / p["client_cpu_us_per_record"]
                        for p, k in zip(per["plain"], per["keyed"], strict=True)])
    figures = {k: {"records_per_s": median([r["records_per_s"] for r in rs]),
                   "client_cpu_percent": median([r["cpu_percent"]["client"] for r in rs]),
                   "client_cpu_us_per_record": median([r["client_cpu_us_per_record"]
                                                       for r in rs])}
               for k, rs in per.items()}
    return {"records": n, "warmup_records": warmup, "record_bytes": RECORD_BYTES,
            "key_bytes": 8, "headers": 2, "header_value_bytes": 8, "inflight": INFLIGHT,
            "burst": BURST, "rounds": rows, "figures": figures, "ratio_keyed_to_plain": ratio,
            "ratio_cpu_per_record_keyed_to_plain": cpu_ratio,
            "target": {"what": f"keyed/plain >= {TARGET_KEYED_RATIO}", "measured": ratio,
                       "met": ratio >= TARGET_KEYED_RATIO},
            "failures": bad}


async def check_keyed(ns: Any, stream: str, n: int) -> list[str]:
    """Read a keyed stream back: every record has the key and headers written."""
    ks, hs = make_extras()
    bad: list[str] = []
    got = 0
    async with await ns.open_reader(stream, start=Position.EARLIEST) as r:
        while got < n:
            for rec in await r.read_batch(10_000, wait_s=2.0):
                j = rec.txid & (KEYS - 1)
                if (rec.key != ks[j] or rec.headers != hs[j]) and len(bad) < 5:
                    bad.append(f"{stream} txid {rec.txid}: key {rec.key!r} headers "
                                   f"{rec.headers!r}")
                got += 1
    return bad


# ------------------------------------------------------------------ 3. time seek


async def timed_open_read(open_reader: Callable[[], Awaitable[Any]]) -> tuple[Any, float, float]:
    """Open a reader, read its first record, close it: (record, open s, total s)."""
    t0 = time.perf_counter()
    r = await open_reader()
    t1 = time.perf_counter()
    try:
        rec = await r.read_next()
    finally:
        await r.close()
    return rec, t1 - t0, time.perf_counter() - t0


async def part_seek(bk: Any, args: argparse.Namespace) -> dict[str, Any]:
    n = args.seek_records
    per_segment = n // 10
    ns = await bk.namespace("seek", create=True, rolling_entries=per_segment, retention_s=0,
                            **QUORUM)
    await ns.create_stream("s")
    base = int(time.time() * 1000) - 3 * n - 3_600_000  # event times, an hour back
    log(f"seek: writing {n:,} records in segments of {per_segment:,} ...")
    async with await ns.open_writer("s") as w:
        write_s = await write_pipelined(w, n, "timed", base_ms=base)
    info = await ns.stream_info("s")
    segs = [s for s in info.segments if s.records]
    last_t = ts_of(base, n - 1)
    rng = random.Random(args.seed)
    edges = [base, last_t]
    for s in segs[1:]:
        t = ts_of(base, s.first_txid)
        edges += [t, t - 1]
    times = edges + [rng.randint(base, last_t) for _ in range(max(0, args.seeks - len(edges)))]
    rng.shuffle(times)
    seek_s: list[float] = []
    seek_open_s: list[float] = []
    base_s: list[float] = []
    base_open_s: list[float] = []
    bad: list[str] = []
    for k, t in enumerate(times):
        seg = rng.choice(segs)
        assert seg.last_position is not None
        pos = Position(seg.seq, rng.randint(0, seg.last_position.entry), 0)

        async def seek(t: int = t) -> None:
            rec, opened, total = await timed_open_read(
                lambda: ns.open_reader("s", timestamp_ms=t))
            seek_open_s.append(opened)
            seek_s.append(total)
            want = first_index_at(base, t)
            if rec.txid != want or rec.timestamp_ms != ts_of(base, want) \
                    or rec.timestamp_ms < t:
                bad.append(f"t={t}: got txid {rec.txid} at {rec.timestamp_ms} "
                           f"({rec.position}), want txid {want} at {ts_of(base, want)}")

        async def direct(pos: Position = pos) -> None:
            rec, opened, total = await timed_open_read(lambda: ns.open_reader("s", start=pos))
            base_open_s.append(opened)
            base_s.append(total)
            if rec.position != pos:
                bad.append(f"baseline {pos}: got {rec.position}")

        if k % 2 == 0:
            await seek()
            await direct()
        else:
            await direct()
            await seek()
    seek_lat, base_lat = latency_ms(seek_s), latency_ms(base_s)
    return {"records": n, "rolling_entries": per_segment, "segments_with_records": len(segs),
            "segments": len(info.segments),
            "entries": sum(s.last_position.entry + 1 for s in segs if s.last_position),
            "write_records_per_s": n / write_s, "seeks": len(times), "edge_seeks": len(edges),
            "time_seek_ms": seek_lat, "time_seek_open_ms": latency_ms(seek_open_s),
            "position_open_ms": base_lat, "position_open_open_ms": latency_ms(base_open_s),
            "ratio_p50": seek_lat["p50"] / base_lat["p50"],
            "target": {"what": f"time seek p50 < {TARGET_SEEK_P50_MS:g} ms",
                       "measured": seek_lat["p50"], "met": seek_lat["p50"] < TARGET_SEEK_P50_MS},
            "failures": bad[:20], "failure_count": len(bad)}


# ------------------------------------------------------------------ 4. many subscriptions


class TxnMeter:
    """Wraps the metadata store's ``kv_txn`` (an instance attribute shadowing the
    method, removed by :meth:`restore`): counts the keys under ``prefix`` written (the
    subscriptions' persistences: the consumers of a process share transactions, up
    to 64 keys each) and counts and times those transactions while ``on``, and how
    many of them are in flight at any time."""

    def __init__(self, meta: Any, prefix: str) -> None:
        self.meta = meta
        self.prefix = prefix
        self.inner = meta.kv_txn
        self.on = False
        self.inflight = 0
        self.count = 0
        self.txns = 0
        self.other = 0
        self.failed: collections.Counter[str] = collections.Counter()
        self.failed_total: collections.Counter[str] = collections.Counter()
        self.first_failure = ""
        self.latencies: list[float] = []
        meta.kv_txn = self.kv_txn

    async def kv_txn(self, compare: Any, put: Any = (), delete: Any = (),
                     delete_prefix: Any = ()) -> int:
        keys = sum(1 for k, _ in put if k.startswith(self.prefix))
        ours = keys > 0
        t0 = time.perf_counter()
        self.inflight += ours
        try:
            result = await self.inner(compare, put, delete, delete_prefix)
        except BaseException as exc:
            if ours:
                what = type(exc).__name__
                self.failed_total[what] += 1
                self.first_failure = self.first_failure or f"{what}: {exc}"
                if self.on:
                    self.failed[what] += 1
            raise
        finally:
            self.inflight -= ours
        if self.on:
            if ours:
                self.count += keys
                self.txns += 1
                self.latencies.append(time.perf_counter() - t0)
            else:
                self.other += 1
        return int(result)

    def start(self) -> None:
        self.count = self.txns = self.other = 0
        self.failed.clear()
        self.latencies = []
        self.on = True

    def stop(self) -> None:
        self.on = False

    def restore(self) -> None:
        del self.meta.kv_txn


class EtcdProbe:
    """etcd's own view, over its HTTP endpoints: the revision (every write moves it)
    and the WAL fsync and backend commit counters."""

    def __init__(self, url: str) -> None:
        import aiohttp

        self.url = url
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def snapshot(self) -> dict[str, float]:
        key = base64.b64encode(b"\0").decode()
        async with self.session.post(f"{self.url}/v3/kv/range",
                                     json={"key": key, "count_only": True}) as r:
            body = await r.json(content_type=None)
        out = {"revision": float(body["header"]["revision"])}
        async with self.session.get(f"{self.url}/metrics") as r:
            text = await r.text()
        for line in text.splitlines():
            for name in ("etcd_disk_wal_fsync_duration_seconds_count",
                         "etcd_disk_backend_commit_duration_seconds_count",
                         "etcd_mvcc_put_total"):
                if line.startswith(name + " "):
                    out[name] = float(line.split()[1])
        return out

    async def close(self) -> None:
        await self.session.close()


async def part_many(bk: Any, cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    count, duration = args.subscriptions, args.duration
    interval = args.ack_interval
    warmup_s = max(3.0, 2 * interval)
    ns = await bk.namespace("many", create=True, rolling_entries=0, retention_s=0,
                            subscription_ack_interval_s=interval, **QUORUM)
    await ns.create_stream("s")
    assert ns.md.meta is bk.meta, "the stream layer uses another metadata store object"
    assert cluster.etcd is not None
    probe = EtcdProbe(cluster.etcd.client_url)
    meter = TxnMeter(bk.meta, keys.subscriptions_prefix(ns.md.root, ns.name, "s"))
    writer = await ns.open_writer("s")
    subs: list[Any] = []
    stop = asyncio.Event()
    tasks: list[asyncio.Task[Any]] = []
    try:
        # a backlog of a few entries, each with more records than a consumer takes in the
        # whole run: every consumer stays within its first entry, its reader idle
        per_entry = int(2 * warmup_s + duration + FEW_WINDOW_S_MAX + 30)
        payload = os.urandom(RECORD_BYTES)
        for _ in range(6):
            for _ in range(per_entry):
                writer.write_nowait(payload)
            await writer.flush()
        # one after another: creating one also rewrites the stream record (a
        # compare-and-swap), so concurrent creations would mostly retry
        log(f"many: creating {count:,} subscriptions ...")
        create_s: list[float] = []
        t_create = time.perf_counter()
        for i in range(count):
            t0 = time.perf_counter()
            subs.append(await ns.subscribe("s", f"sub-{i:05d}", start=Position.EARLIEST,
                                           readahead_entries=1))
            create_s.append(time.perf_counter() - t0)
            if (i + 1) % 250 == 0:
                log(f"many: {i + 1:,} subscriptions ({time.perf_counter() - t_create:.1f} s)")
        create_total_s = time.perf_counter() - t_create
        last: list[Position | None] = [None] * count

        async def consumers(n: int, done: asyncio.Event) -> None:
            """The first ``n`` consumers each take one more record and acknowledge it,
            every second, until ``done``."""
            loop = asyncio.get_running_loop()
            due = loop.time()
            while not done.is_set():
                for i, sub in enumerate(subs[:n]):
                    rec = await sub.read_next()
                    await sub.ack(rec.position)
                    last[i] = rec.position
                due += 1.0
                await asyncio.sleep(max(0.0, due - loop.time()))

        async def trickle() -> None:
            while not stop.is_set():
                for _ in range(TRICKLE_RECORDS_PER_S):
                    writer.write_nowait(payload)
                await asyncio.sleep(1.0)

        async def acking(n: int, seconds: float) -> dict[str, Any]:
            done = asyncio.Event()
            task = asyncio.create_task(consumers(n, done))
            tasks.append(task)
            await asyncio.sleep(warmup_s)
            log(f"many: measuring {seconds:g} s with {n:,} of the {count:,} consumers acking "
                "every second ...")
            window = await steady_window(cluster, meter, probe, seconds)
            done.set()
            await task
            tasks.remove(task)
            window["acking_subscriptions"] = n
            window["writes_per_s_per_subscription"] = window["subscription_writes_per_s"] / n
            log(f"many: {window['subscription_writes_per_s']:,.0f} subscription writes/s "
                f"({window['writes_per_s_per_subscription']:.3f} per acking subscription), "
                f"persist p50 {window['persist_ms']['p50']:.1f} ms p99 "
                f"{window['persist_ms']['p99']:.1f} ms, failed "
                f"{sum(window['subscription_write_failures'].values())}, client CPU "
                f"{window['cpu_percent']['client']:.0f}%")
            return window

        # baselines: every consumer open and idle (nothing to persist), then only a few
        # acking (the persistence unloaded); then all of them
        await asyncio.sleep(interval + 0.5)  # the persist loops of the last created settle
        tasks.append(asyncio.create_task(trickle()))
        idle = await steady_window(cluster, meter, probe, IDLE_WINDOW_S)
        idle["acking_subscriptions"] = 0
        log(f"many: idle window: {idle['subscription_writes_per_s']:.1f} subscription "
            f"writes/s, client CPU {idle['cpu_percent']['client']:.0f}%")
        few = await acking(min(FEW_SUBSCRIPTIONS, count), min(duration, FEW_WINDOW_S_MAX))
        busy = await acking(count, duration)
        stop.set()
        await asyncio.gather(*tasks)
        tasks.clear()
        # the persistences still queued drain (each subscription's last ack, once), then
        # every consumer closes (persisting what is left, if anything)
        t0 = time.perf_counter()
        quiet = 0
        while quiet < 3 and time.perf_counter() - t0 < DRAIN_S_MAX:
            await asyncio.sleep(0.5)
            quiet = quiet + 1 if meter.inflight == 0 else 0
        drain_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        close_errors: collections.Counter[str] = collections.Counter()
        for k in range(0, count, 50):
            for res in await asyncio.gather(*(s.close() for s in subs[k:k + 50]),
                                            return_exceptions=True):
                if isinstance(res, BaseException):
                    close_errors[type(res).__name__] += 1
        close_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        infos = {s.name: s for s in await ns.subscriptions("s")}
        lag_query_s = time.perf_counter() - t0
        bad = []
        for i in range(count):
            p = last[i]
            want = None if p is None else Position(p.segment, p.entry, p.slot + 1)
            got = infos[f"sub-{i:05d}"].position
            if got != want:
                bad.append(f"sub-{i:05d}: persisted {got}, last acknowledged {p}")
        await writer.close()
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in subs:
            await s.close()  # (idempotent)
        await writer.close()
        meter.restore()
        await probe.close()
    return {"subscriptions": count, "duration_s": duration, "warmup_s": warmup_s,
            "subscription_ack_interval_s": interval, "ack_every_s": 1.0,
            "trickle_records_per_s": TRICKLE_RECORDS_PER_S,
            "backlog": {"entries": 6, "records_per_entry": per_entry},
            "create": {"total_s": create_total_s, "per_s": count / create_total_s,
                       "latency_ms": latency_ms(create_s)},
            "idle": idle, "few_acking": few, "acking": busy,
            "drain_s": drain_s, "close_all_s": close_s, "close_errors": dict(close_errors),
            "persist_failures_in_all": dict(meter.failed_total),
            "first_persist_failure": meter.first_failure, "lag_query_s": lag_query_s,
            "target": {"what": f"about {1 / interval:g} etcd write/s per subscription "
                       f"(1 / subscription_ack_interval_s)",
                       "measured": busy["writes_per_s_per_subscription"],
                       "met": abs(busy["writes_per_s_per_subscription"] * interval - 1) < 0.1},
            "failures": bad[:20], "failure_count": len(bad)}


async def steady_window(cluster: LocalCluster, meter: TxnMeter, probe: EtcdProbe,
                        seconds: float) -> dict[str, Any]:
    cpu = CpuWindow(cluster)
    e0 = await probe.snapshot()
    cpu.start()
    meter.start()
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    meter.stop()
    wall = time.perf_counter() - t0
    cpu_pct = cpu.percent()
    e1 = await probe.snapshot()
    etcd = {k: (e1[k] - e0[k]) / wall for k in e0 if k in e1}
    return {"seconds": wall, "subscription_writes": meter.count,
            "subscription_writes_per_s": meter.count / wall,
            "subscription_txns_per_s": meter.txns / wall,
            "subscription_write_failures": dict(meter.failed), "other_txns": meter.other,
            "persist_ms": latency_ms(meter.latencies),
            "etcd_per_s": {("revisions" if k == "revision" else k): round(v, 1)
                           for k, v in etcd.items()},
            "cpu_percent": cpu_pct}


# ------------------------------------------------------------------ the run


async def run(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.monotonic()
    result: dict[str, Any] = {"benchmark": "subscriptions"}
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="asyncbk-bench-subs-")
    log(f"starting etcd and 3 bookies in {data_dir} ...")
    try:
        async with LocalCluster(bookies=3, data_dir=data_dir,
                                owner="benchmarks/subscriptions.py") as cluster:
            bk = await cluster.client()
            profile_to = Path(args.profile_out) if args.profile else None
            parts: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
                "consume": lambda: part_consume(bk, cluster, args, profile_to),
                "keyed": lambda: part_keyed(bk, cluster, args),
                "seek": lambda: part_seek(bk, args),
                "many": lambda: part_many(bk, cluster, args),
            }
            try:
                for name, part in parts.items():
                    if name not in args.parts:
                        continue
                    t0 = time.monotonic()
                    try:
                        result[name] = await part()
                    except Exception as exc:  # the other parts still run and report
                        log(f"{name}: failed: {exc!r}")
                        result.setdefault("errors", {})[name] = repr(exc)
                    else:
                        result[name]["elapsed_s"] = round(time.monotonic() - t0, 1)
            finally:
                await bk.close()
    finally:
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    result["config"] = {
        "parts": list(args.parts), "rounds": args.rounds, "quick": args.quick,
        "consume_records": args.consume_records, "keyed_records": args.keyed_records,
        "seek_records": args.seek_records, "seeks": args.seeks,
        "subscriptions": args.subscriptions, "duration_s": args.duration,
        "subscription_ack_interval_s": args.ack_interval, "seed": args.seed,
        "record_bytes": RECORD_BYTES, "inflight": INFLIGHT, "burst": BURST, **QUORUM,
        "bookies": 3, "machine_cpus": os.cpu_count()}
    result["versions"] = versions()
    result["elapsed_s"] = round(time.monotonic() - t_start, 1)
    return result


# ------------------------------------------------------------------ the tables


def _ms(v: float) -> str:
    return "-" if v != v else f"{v:.1f}"  # (nan: no sample)


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{v:,} {k}" for k, v in c.items()) if c else "none"


def tables(r: dict[str, Any]) -> str:
    out: list[str] = []
    targets = ["| target | measured | met? |", "|---|---|---|"]

    def yes(met: bool) -> str:
        return "yes" if met else "**no**"

    if "consume" in r:
        c = r["consume"]
        out += [f"## consume: {c['records']:,} records of {c['record_bytes']} B in "
                f"{c['entries']:,} entries (written at {c['write_records_per_s']:,.0f}/s)", "",
                "| variant | records/s (median) | × read_batch | client CPU % | client CPU "
                "µs/record |", "|---|---|---|---|---|"]
        for v, f in c["figures"].items():
            ratio = c["ratio_to_read_batch"].get(v)
            out.append(f"| {v} | {f['records_per_s']:,.0f} | "
                       f"{'1 (baseline)' if ratio is None else f'{ratio:.2f}'} | "
                       f"{f['client_cpu_percent']:.0f} | {f['client_cpu_us_per_record']:.2f} |")
        out.append("")
        t = c["target"]
        targets.append(f"| consume: {t['what']} | {t['measured']:,.0f} "
                       f"({100 * t['measured'] / TARGET_CONSUME_RPS:.0f}% of it) "
                       f"| {yes(t['met'])} |")
    if "keyed" in r:
        k = r["keyed"]
        out += [f"## keyed writes: {k['records']:,} pipelined records of {k['record_bytes']} B "
                f"({k['inflight']:,} in flight), key {k['key_bytes']} B + {k['headers']} headers "
                f"of {k['header_value_bytes']} B", "",
                "| records | records/s (median) | client CPU % | client CPU µs/record |",
                "|---|---|---|---|"]
        for kind, f in k["figures"].items():
            out.append(f"| {kind} | {f['records_per_s']:,.0f} | {f['client_cpu_percent']:.0f} "
                       f"| {f['client_cpu_us_per_record']:.2f} |")
        out += ["", f"keyed/plain records/s: {k['ratio_keyed_to_plain']:.2f} (median of the "
                f"rounds' ratios); client CPU per record keyed/plain: "
                f"{k['ratio_cpu_per_record_keyed_to_plain']:.2f}", ""]
        t = k["target"]
        targets.append(f"| keyed writes: {t['what']} | {t['measured']:.2f} | {yes(t['met'])} |")
    if "seek" in r:
        s = r["seek"]
        out += [f"## time seek: {s['records']:,} records in {s['segments_with_records']} "
                f"segments ({s['entries']:,} entries), {s['seeks']} seeks "
                f"({s['edge_seeks']} at the edges)", "",
                "| open + read_next + close | p50 ms | p99 ms | max ms | open alone p50 ms |",
                "|---|---|---|---|---|"]
        for name, lat, opened in (("open_reader(timestamp_ms=t)", s["time_seek_ms"],
                                   s["time_seek_open_ms"]),
                                  ("open_reader(start=Position(seg, entry, 0)) (baseline)",
                                   s["position_open_ms"], s["position_open_open_ms"])):
            out.append(f"| {name} | {lat['p50']:.2f} | {lat['p99']:.2f} | {lat['max']:.2f} | "
                       f"{opened['p50']:.2f} |")
        out += ["", f"time seek p50 ÷ baseline p50: {s['ratio_p50']:.2f}; wrong results: "
                f"{s['failure_count']} of {s['seeks']}", ""]
        t = s["target"]
        targets.append(f"| time seek: {t['what']} | {t['measured']:.2f} ms | {yes(t['met'])} |")
        targets.append(f"| time seek: every result the first record at or after t | "
                       f"{s['failure_count']} wrong | {yes(s['failure_count'] == 0)} |")
    if "many" in r:
        m = r["many"]
        b, i = m["acking"], m["idle"]
        out += [f"## many subscriptions: {m['subscriptions']:,} on one stream, each acking a "
                f"new record every second for {m['duration_s']:g} s "
                f"(subscription_ack_interval_s {m['subscription_ack_interval_s']:g})", "",
                "| window | subscription writes/s | per acking subscription | persist p50 ms "
                "| persist p99 ms | etcd revisions/s | etcd WAL fsyncs/s | CPU % client / "
                "etcd / bookies |", "|---|---|---|---|---|---|---|---|"]
        f_ = m["few_acking"]
        for name, w in (("all idle (baseline)", i),
                        (f"{f_['acking_subscriptions']} acking (baseline)", f_),
                        (f"all {m['subscriptions']:,} acking", b)):
            cpu = w["cpu_percent"]
            bookies = "/".join(f"{v:.0f}" for k_, v in cpu.items() if k_.startswith("bookie"))
            e = w["etcd_per_s"]
            p = w["persist_ms"]
            out.append(
                f"| {name} | {w['subscription_writes_per_s']:,.1f} | "
                f"{w.get('writes_per_s_per_subscription', 0):.3f} | "
                f"{_ms(p['p50'])} | {_ms(p['p99'])} | {e.get('revisions', 0):,.0f} | "
                f"{e.get('etcd_disk_wal_fsync_duration_seconds_count', 0):,.0f} | "
                f"{cpu['client']:.0f} / {cpu['etcd']:.0f} / {bookies} |")
        cl = m["create"]
        cpu_us = b["cpu_percent"]["client"] / max(1e-9, b["subscription_writes_per_s"]) * 1e4
        out += ["", f"etcd write load per subscription: {b['writes_per_s_per_subscription']:.3f} "
                f"writes/s (expected about {1 / m['subscription_ack_interval_s']:g}); in all "
                f"{b['subscription_writes_per_s']:,.0f} cursor writes/s in "
                f"{b.get('subscription_txns_per_s', 0):,.1f} etcd transactions/s; client CPU "
                f"{b['cpu_percent']['client']:.0f}% of a core ({cpu_us:.0f}"
                f" µs per persistence, idle consumers included); failed persistences in "
                f"the window: {_counts(b['subscription_write_failures'])}, in all: "
                f"{_counts(m['persist_failures_in_all'])}"
                + (f" (first: {m['first_persist_failure'][:160]})"
                   if m["first_persist_failure"] else ""),
                f"creating them (one after another): {cl['total_s']:.1f} s ({cl['per_s']:,.0f}/s, "
                f"p50 {cl['latency_ms']['p50']:.1f} ms, p99 {cl['latency_ms']['p99']:.1f} ms); "
                f"after the window, persistences still queued took {m['drain_s']:.1f} s to "
                f"drain; closing them all: {m['close_all_s']:.1f} s (errors: "
                f"{_counts(m['close_errors'])}); ns.subscriptions() (lag of all): "
                f"{m['lag_query_s']:.1f} s; persisted position != last ack after close: "
                f"{m['failure_count']}", ""]
        t = m["target"]
        targets.append(f"| many subscriptions: {t['what']} | {t['measured']:.3f} "
                       f"| {yes(t['met'])} |")
        targets.append(f"| many subscriptions: every last ack persisted at close | "
                       f"{m['failure_count']} not | {yes(m['failure_count'] == 0)} |")
    text = "\n".join(out) + "\n" + "\n".join(targets) + "\n"
    for part, error in r.get("errors", {}).items():
        text += f"\n{part}: FAILED, not measured: {error}\n"
    for part in ("consume", "keyed"):
        if part in r and r[part]["failures"]:
            text += f"\n{part} failures: " + "; ".join(r[part]["failures"]) + "\n"
    for part in ("seek", "many"):
        if part in r and r[part]["failures"]:
            text += f"\n{part} failures (first {len(r[part]['failures'])}): " + \
                "; ".join(r[part]["failures"]) + "\n"
    if r.get("consume", {}).get("profile"):
        text += "\n## where a subscription consume round's time goes (py-spy)\n\n" + \
            r["consume"]["profile"] + "\n"
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n", 1)[0].split()),
                                epilog="See the module docstring for what each part measures.")
    p.add_argument("--quick", action="store_true",
                   help="a short run (under 3 minutes): "
                   + ", ".join(f"{k.replace('_', '-')} {v:,}" for k, v in QUICK.items()))
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"comma-separated parts to run (default: {','.join(PARTS)})")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds of consume and keyed (default 3)")
    p.add_argument("--consume-records", type=int, default=None,
                   help=f"records to consume (default {DEFAULTS['consume_records']:,}; "
                   f"{QUICK['consume_records']:,} with --quick)")
    p.add_argument("--keyed-records", type=int, default=None,
                   help=f"records per keyed/plain write run (default "
                   f"{DEFAULTS['keyed_records']:,}; {QUICK['keyed_records']:,} with --quick)")
    p.add_argument("--seek-records", type=int, default=None,
                   help=f"records of the time-seek stream, in 10 segments (default "
                   f"{DEFAULTS['seek_records']:,}; {QUICK['seek_records']:,} with --quick)")
    p.add_argument("--seeks", type=int, default=200, help="time seeks (default 200)")
    p.add_argument("--subscriptions", type=int, default=None,
                   help=f"subscriptions of the many-subscriptions part (default "
                   f"{DEFAULTS['subscriptions']:,}; {QUICK['subscriptions']:,} with --quick)")
    p.add_argument("--duration", type=float, default=None,
                   help=f"seconds of the many-subscriptions window (default "
                   f"{DEFAULTS['duration']:g}; {QUICK['duration']:g} with --quick)")
    p.add_argument("--ack-interval", type=float, default=1.0,
                   help="subscription_ack_interval_s of the namespaces (default 1.0)")
    p.add_argument("--profile", action="store_true",
                   help="also run one subscription consume round under py-spy and print "
                   "where its time goes (needs py-spy)")
    p.add_argument("--profile-out", default="bench-results/subscriptions-consume.pyspy.txt",
                   help="py-spy's raw output (default: %(default)s)")
    p.add_argument("--data-dir", default=None,
                   help="the cluster's data directory (default: a temporary one, removed)")
    p.add_argument("--seed", type=int, default=1, help="seed of the seek times (default 1)")
    p.add_argument("--timeout", type=float, default=1800,
                   help="give up (and stop everything) after this many seconds (default 1800)")
    p.add_argument("--log-level", default="error",
                   help="asyncbk's log level (default error: the subscriptions' failed "
                   "persistences, which it logs as warnings, are counted in the results)")
    p.add_argument("--json", default=None, help="write the results here (default: none)")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        p.error(f"unknown parts: {', '.join(sorted(unknown))} (of {', '.join(PARTS)})")
    for key in ("rounds", "consume_records", "keyed_records", "seeks", "subscriptions"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1")
    if args.seek_records < 20:
        p.error("--seek-records must be >= 20")
    if args.duration <= 0 or args.ack_interval <= 0:
        p.error("--duration and --ack-interval must be > 0")
    if args.profile and shutil.which("py-spy") is None:
        p.error("--profile needs py-spy: pip install py-spy")
    if args.profile:
        Path(args.profile_out).parent.mkdir(parents=True, exist_ok=True)
    return args


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)  # stop the cluster on SIGTERM too
    try:
        async with asyncio.timeout(args.timeout) as deadline:
            try:
                return await run(args)
            except TimeoutError as exc:  # not --timeout's: say what it was
                if deadline.expired():
                    raise
                raise RuntimeError(f"an operation timed out: {exc!r}") from exc
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from asyncbk.log import configure

    configure(args.log_level)
    try:
        import uvloop
    except ImportError:
        runner: Any = asyncio.run
    else:
        runner = uvloop.run
    try:
        result = runner(amain(args))
    except (asyncio.CancelledError, KeyboardInterrupt):
        print("subscriptions benchmark interrupted; what it started is stopped",
              file=sys.stderr)
        return 130
    except TimeoutError:
        print(f"subscriptions benchmark: not done after --timeout {args.timeout:g} s; what it "
              "started is stopped", file=sys.stderr)
        return 1
    print()
    print(tables(result))
    print(f"(medians over {args.rounds} interleaved rounds; ratios: median of the ratios "
          f"within each round; took {result['elapsed_s']:.0f} s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        log(f"results: {args.json}")
    failed = "errors" in result or any(result.get(p, {}).get("failures") for p in PARTS)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
