"""``asyncbk bench stream``: stream write throughput and tailing latency.

One stream (in a namespace made for the run, deleted afterwards unless
``--keep``), written by one writer with ``write_nowait``:

* **closed loop** (default): at most ``--inflight`` records written and not yet
  durable; records go out in bursts of up to ``--burst`` per event-loop turn,
  which the writer sends as one ledger entry (its transmit batching).  The
  records of a burst share their start time, and all of them are counted
  durable when the burst's last one is (futures resolve in write order), so
  each record's latency is that of its burst: an upper bound.
* **open loop** (``--rate R``): record *i* is due at ``t0 + i / R``; every
  millisecond the records due are written, and latency counts from each one's
  due time, whatever the answers (no coordinated omission).

``--mode write`` measures latency from the write call to durable (an ack
quorum of bookies fsynced the entry).  ``--mode tail`` adds a reader (its own
client connection, in the same process) that follows the stream from where
the measured records start; latency is from the write call (or due time) to
the record coming out of the reader, and the writer's own acknowledgement
latency is reported beside it.  Records carry txids 0, 1, 2, ...: the reader
finds each record's start time by its txid.  After the measured records the
writer goes on at the same pace, unmeasured, until the reader has them all, so
the last ones do not wait for an idle writer's explicit LAC.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import time
from typing import Any

from ..errors import BKError
from .bench import bench_cluster, save, validate
from .bench_record import Progress, Recorder, latency_json, measured, self_cpu_s
from .common import CliError

OPEN_LOOP_TICK_S = 0.001
"""How often an open-loop run writes the records that have come due."""

READER_BATCH_RECORDS = 10_000
TAIL_DRAIN_TIMEOUT_S = 60.0
"""How long the reader may take to catch up after the writer is done."""


class _Load:
    """Writes ``records`` records to ``writer``, closed or open loop (see the module
    docstring), recording each record's latency to durable in ``rec`` and, when
    ``sent_at`` is given, each record's start time there (index: txid - ``txid0``)."""

    def __init__(self, writer: Any, args: argparse.Namespace, records: int,
                 rec: Recorder | None, sent_at: list[float] | None = None,
                 closed_loop: bool = False) -> None:
        self.writer = writer
        self.args = args
        self.rate = None if closed_loop else args.rate
        self.records = records
        self.rec = rec
        self.sent_at = sent_at
        self.payload = os.urandom(args.record_size)
        self.inflight = 0
        self.sent = 0
        self.space = asyncio.Event()
        self.space.set()
        self.error: BaseException | None = None
        self.idle = asyncio.Event()
        self.idle.set()

    def _done(self, first_due: float, step: float, n: int, fut: asyncio.Future[Any]) -> None:
        self.inflight -= n
        if self.inflight < self.args.inflight:
            self.space.set()
        if self.inflight == 0:
            self.idle.set()
        exc = None if fut.cancelled() else fut.exception()
        if fut.cancelled() or exc is not None:
            if self.error is None:
                self.error = exc or BKError("a write was cancelled")
            if self.rec is not None:
                self.rec.error(self.error)
            self.space.set()
            return
        rec = self.rec
        if rec is None:
            return
        now = time.perf_counter()
        if step == 0.0:  # a burst sharing one start time
            rec.record(now - first_due, n, samples=n)
        else:
            for k in range(n):
                rec.record(now - (first_due + k * step))

    def _send(self, n: int, first_due: float, step: float) -> None:
        write = self.writer.write_nowait
        payload = self.payload
        fut = None
        for _ in range(n):
            fut = write(payload)
        assert fut is not None
        if self.sent_at is not None:
            if step == 0.0:
                self.sent_at.extend([first_due] * n)
            else:
                self.sent_at.extend(first_due + k * step for k in range(n))
        self.inflight += n
        self.sent += n
        self.idle.clear()
        fut.add_done_callback(functools.partial(self._done, first_due, step, n))

    async def run(self, deadline: float | None, stop: asyncio.Event | None = None) -> None:
        """Write, until ``records`` are written, ``deadline`` or ``stop``; then wait for
        what is in flight."""
        args = self.args
        rate = self.rate
        t0 = time.perf_counter()
        while self.sent < self.records and self.error is None:
            now = time.perf_counter()
            if deadline is not None and now >= deadline or stop is not None and stop.is_set():
                break
            if rate:
                due = min(self.records, int((now - t0) * rate) + 1)
                while self.sent < due and self.inflight < args.inflight:
                    n = min(due - self.sent, args.burst, args.inflight - self.inflight)
                    self._send(n, t0 + self.sent / rate, 1.0 / rate)
                await asyncio.sleep(OPEN_LOOP_TICK_S)
            else:
                while self.inflight >= args.inflight and self.error is None:
                    self.space.clear()
                    await self.space.wait()
                if self.error is not None:
                    break
                n = min(self.records - self.sent, args.burst, args.inflight - self.inflight)
                self._send(n, time.perf_counter(), 0.0)
                await asyncio.sleep(0)  # let the writer send the burst as one entry
        await self.idle.wait()
        if self.error is not None:
            raise self.error


async def _follow(reader: Any, sent_at: list[float], txid0: int, total: asyncio.Future[int],
                  rec: Recorder) -> None:
    """Read until the record with the last measured txid; record latencies from each
    record's start time (runs of records sharing one start time at once)."""
    got = 0
    while not (total.done() and got >= total.result()):
        batch = await reader.read_batch(READER_BATCH_RECORDS, 0.5)
        if not batch:
            continue
        now = time.perf_counter()
        run_start, run_n = -1.0, 0
        for r in batch:
            i = r.txid - txid0
            if i < 0 or i >= len(sent_at):
                continue  # a warm-up record
            got += 1
            started = sent_at[i]
            if started == run_start:
                run_n += 1
                continue
            if run_n:
                rec.record(now - run_start, run_n, samples=run_n)
            run_start, run_n = started, 1
        if run_n:
            rec.record(now - run_start, run_n, samples=run_n)


async def _workload(bk: Any, reader_bk: Any, args: argparse.Namespace, rec: Recorder,
                    ack: Recorder) -> dict[str, Any]:
    """Set up the stream, warm up, run the measured load; returns facts about the
    stream afterwards (segments, entries)."""
    from ..stream.position import Position

    ns_name = f"bench-{os.getpid()}-{int(time.time())}"
    ns = await bk.namespace(ns_name, create=True, ensemble_size=args.ensemble,
                            write_quorum=args.write_quorum, ack_quorum=args.ack_quorum,
                            digest=args.digest, rolling_bytes=args.rolling_mb << 20,
                            rolling_s=0, retention_s=0)
    try:
        await ns.create_stream("s")
        bound = args.inflight + args.burst
        writer = await ns.open_writer(
            "s", pending_records_max=max(200_000, bound),
            pending_bytes_max=max(128 << 20, bound * args.record_size))
        try:
            if args.warmup > 0:
                await _Load(writer, args, args.warmup, None, closed_loop=True).run(None)
                await writer.flush()
            deadline = time.perf_counter() + args.duration if args.duration else None
            txid0 = writer.last_txid + 1
            if args.mode == "write":
                rec.start()
                with Progress(args.records, "written", lambda: rec.count, args.duration):
                    await _Load(writer, args, args.records, rec).run(deadline)
            else:
                reader_ns = await reader_bk.namespace(ns_name)
                reader = await reader_ns.open_reader("s", Position.LATEST)
                sent_at: list[float] = []
                total: asyncio.Future[int] = asyncio.get_running_loop().create_future()
                rec.start()
                ack.start()
                follow = asyncio.create_task(_follow(reader, sent_at, txid0, total, rec))
                # After the measured records the writer goes on (unmeasured) until the
                # reader has them all: an idle writer's last entry would reach readers
                # only with its explicit LAC, a second later.
                stop = asyncio.Event()
                more = _Load(writer, args, 1 << 62, None)
                try:
                    with Progress(args.records, "tailed", lambda: rec.count, args.duration):
                        load = _Load(writer, args, args.records, ack, sent_at)
                        await load.run(deadline)
                        total.set_result(load.sent)
                        keep_going = asyncio.create_task(more.run(None, stop))
                        try:
                            async with asyncio.timeout(TAIL_DRAIN_TIMEOUT_S):
                                await asyncio.shield(follow)
                        finally:
                            stop.set()
                            await keep_going
                finally:
                    follow.cancel()
                    await asyncio.gather(follow, return_exceptions=True)
                    await reader.close()
            await writer.close()
        except BaseException:
            await writer.abort()
            raise
        info = await ns.stream_info("s")
        entries = sum(s.last_position.entry + 1 for s in info.segments
                      if s.last_position is not None)
        records = sum(s.records for s in info.segments)
        return {"segments": len(info.segments), "entries_written": entries,
                "records_written": records, "records_per_entry": records / max(1, entries)}
    finally:
        if not args.keep:
            await ns.delete(force=True)


async def run_stream_bench(args: argparse.Namespace) -> int:
    """``asyncbk bench stream``: see the module docstring."""
    validate(args)
    from ..stream.client import BookKeeper

    async with bench_cluster(args) as (metadata_uri, monitor):
        bk = await BookKeeper.connect(metadata_uri)
        reader_bk = await BookKeeper.connect(metadata_uri) if args.mode == "tail" else bk
        rec, ack = Recorder(args.record_size), Recorder(args.record_size)
        try:
            monitor.start()
            facts = await _workload(bk, reader_bk, args, rec, ack)
            cpu_percent = {"client": 100 * (self_cpu_s() - rec.cpu0) / rec.elapsed,
                           **monitor.cpu_percent(rec.wall_t0, rec.wall_t0 + rec.elapsed)}
        finally:
            if reader_bk is not bk:
                await reader_bk.close()
            await bk.close()
    if rec.errors or ack.errors:
        first = rec.first_error or ack.first_error
        raise CliError(f"{rec.errors + ack.errors} writes failed; first: {first}")
    result = _result(args, rec, ack, cpu_percent, monitor.rss_mb(), facts)
    _print_summary(args, result)
    await save(args, result)
    return 0


def _result(args: argparse.Namespace, rec: Recorder, ack: Recorder,
            cpu_percent: dict[str, float], rss_mb: dict[str, Any],
            facts: dict[str, Any]) -> dict[str, Any]:
    rps = rec.count / rec.elapsed
    config_keys = ["mode", "records", "record_size", "inflight", "rate", "burst", "ensemble",
                   "write_quorum", "ack_quorum", "digest", "rolling_mb", "bookies", "warmup",
                   "duration"]
    result: dict[str, Any] = {
        "workload": f"stream-{args.mode}",
        "records_done": rec.count,
        "throughput_rps": rps,
        "throughput_mbps": rps * args.record_size / 1e6,
        **facts,
        **measured(args, rec, cpu_percent, rss_mb, config_keys),
    }
    if args.mode == "tail":
        result["ack_latency_us"] = latency_json(ack.histogram)
    return result


def _print_summary(args: argparse.Namespace, result: dict[str, Any]) -> None:
    lat = result["latency_us"]
    loop = f"offered {args.rate:,.0f}/s" if args.rate else f"{args.inflight:,} in flight"
    what = "write call to durable" if args.mode == "write" else "write call to reader"
    print(f"{result['workload']}: {result['records_done']:,} x {args.record_size} B, {loop}, "
          f"E={args.ensemble} Qw={args.write_quorum} Qa={args.ack_quorum}: "
          f"{result['throughput_rps']:,.0f} records/s ({result['throughput_mbps']:.1f} MB/s), "
          f"{result['records_per_entry']:,.0f} records per entry, {result['segments']} "
          f"segment(s); latency us ({what}) p50 {lat['p50']:,}  p99 {lat['p99']:,}  "
          f"p999 {lat['p999']:,}  max {lat['max']:,}")
    if "ack_latency_us" in result:
        a = result["ack_latency_us"]
        print(f"  writer acknowledgement latency us: p50 {a['p50']:,}  p99 {a['p99']:,}  "
              f"p999 {a['p999']:,}  max {a['max']:,}")
    print("cpu %: " + "  ".join(f"{k} {v:.0f}" for k, v in result["cpu_percent"].items()))


__all__ = ["run_stream_bench"]
