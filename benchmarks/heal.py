"""Operations figures: time to heal after a bookie loss, and space reclaimed by GC.

1. **Heal.** A local cluster of ``--bookies`` bookies (etcd + bookie processes)
   and one ``asyncbk autorecovery`` process.  ``--ledgers`` closed ledgers of
   ``--entries`` 1 KiB entries each (E=3 Qw=2 Qa=2) are written; a foreground
   writer then appends at a fixed rate (open loop) to its own ledger the whole
   time.  One bookie is SIGKILLed; the script measures how long until no
   ledger's metadata names it any more (everything re-replicated, with the
   lost-bookie delay included), and the foreground append latency before the
   kill and while healing.
2. **Reclaim.** Most ledgers are deleted and every bookie is asked to garbage
   collect (``PUT /api/v1/bookie/gc``); the script reports the entry-log bytes
   before and after.

    python benchmarks/heal.py [--ledgers 50] [--entries 2000] [--rate 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from hdrh.histogram import HdrHistogram

from asyncbk.errors import BKError
from asyncbk.testing.cluster import LocalBookie, LocalCluster


def entrylog_bytes(b: LocalBookie) -> int:
    return sum(p.stat().st_size for p in (b.ledger_dir / "entrylog").iterdir())


class Foreground:
    """Appends at a fixed rate; latency per phase (from each append's due time)."""

    def __init__(self, lh: Any, rate: float) -> None:
        self.lh, self.rate = lh, rate
        self.phase = "before"
        self.hist: dict[str, Any] = {}
        self.errors = 0

    def _record(self, due: float, fut: asyncio.Future[int]) -> None:
        if fut.exception() is not None:
            self.errors += 1
            return
        h = self.hist.setdefault(self.phase, HdrHistogram(1, 60_000_000, 3))
        h.record_value(max(1, int((time.perf_counter() - due) * 1e6)))

    async def run(self, stop: asyncio.Event) -> None:
        payload = os.urandom(1024)
        t0 = time.perf_counter()
        sent = 0
        while not stop.is_set():
            due_count = int((time.perf_counter() - t0) * self.rate) + 1
            while sent < due_count:
                due = t0 + sent / self.rate
                try:
                    fut = self.lh.append(payload)
                except BKError:
                    self.errors += 1
                    return
                fut.add_done_callback(lambda f, d=due: self._record(d, f))
                sent += 1
            await asyncio.sleep(0.001)

    def summary(self, phase: str) -> dict[str, float]:
        h = self.hist.get(phase)
        if h is None:
            return {}
        return {"count": h.get_total_count(), "p50_us": h.get_value_at_percentile(50),
                "p99_us": h.get_value_at_percentile(99), "max_us": h.get_max_value()}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="asyncbk-heal-") as d:
        config = {"entry_log_bytes_max": 8 * 1024 * 1024, "gc_interval_s": 3600, "lease_ttl_s": 10}
        async with LocalCluster(bookies=args.bookies, data_dir=Path(d),
                                bookie_config=config) as c:
            bk = await c.client()
            print(f"writing {args.ledgers} ledgers x {args.entries} entries ...", flush=True)
            ids = []
            payload = os.urandom(1024)
            for _ in range(args.ledgers):
                lh = await bk.create_ledger(3, 2, 2)
                for lo in range(0, args.entries, 500):
                    await asyncio.gather(*(lh.append(payload)
                                           for _ in range(min(500, args.entries - lo))))
                await lh.close()
                ids.append(lh.id)
            ar = await c.start_autorecovery(lost_bookie_delay=args.delay, rate=args.copy_rate)
            fg_ledger = await bk.create_ledger(3, 2, 2)
            fg = Foreground(fg_ledger, args.rate)
            stop = asyncio.Event()
            fg_task = asyncio.create_task(fg.run(stop))
            await asyncio.sleep(args.before_s)
            first_bookies = (await bk.ledger_metadata(ids[0])).all_bookies()
            victim = next(b for b in c.bookies if b.id in first_bookies)
            holding = [lid for lid in ids
                       if victim.id in (await bk.ledger_metadata(lid)).all_bookies()]
            print(f"killing {victim.id} (in {len(holding)} ledgers) ...", flush=True)
            fg.phase = "healing"
            t0 = time.monotonic()
            victim.kill()
            while True:
                mds = [await bk.ledger_metadata(lid) for lid in holding]
                left = sum(1 for md in mds if victim.id in md.all_bookies())
                if not left:
                    break
                await asyncio.sleep(0.25)
            healed_s = time.monotonic() - t0
            fg.phase = "after"
            await asyncio.sleep(2)
            stop.set()
            await fg_task
            async with aiohttp.ClientSession() as s, \
                    s.get(f"{ar.http_url}/api/v1/autorecovery/status") as r:
                status = await r.json()
            await fg_ledger.close()

            print("deleting 90% of the ledgers and collecting garbage ...", flush=True)
            live = [b for b in c.bookies if b.running]
            before = {b.id: await asyncio.to_thread(entrylog_bytes, b) for b in live}
            for lid in ids[: len(ids) * 9 // 10]:
                await bk.delete_ledger(lid)
            t1 = time.monotonic()
            async with aiohttp.ClientSession() as s:
                for b in live:
                    async with s.put(f"{b.http_url}/api/v1/bookie/gc") as r:
                        if r.status != 200:
                            raise RuntimeError(f"GC on {b.id} failed: {await r.text()}")
            gc_s = time.monotonic() - t1
            after = {b.id: await asyncio.to_thread(entrylog_bytes, b) for b in live}
    return {
        "ledgers": args.ledgers, "entries_per_ledger": args.entries,
        "ledgers_on_victim": len(holding), "lost_bookie_delay_s": args.delay,
        "healed_s": healed_s, "copied_entries": status["copied_entries"],
        "copied_bytes": status["copied_bytes"], "copy_rate_limit": args.copy_rate,
        "foreground_rate": args.rate, "foreground_errors": fg.errors,
        "foreground_before": fg.summary("before"), "foreground_healing": fg.summary("healing"),
        "entrylog_bytes_before_gc": sum(before.values()),
        "entrylog_bytes_after_gc": sum(after.values()), "gc_s": gc_s,
    }


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bookies", type=int, default=4)
    p.add_argument("--ledgers", type=int, default=50)
    p.add_argument("--entries", type=int, default=2000, help="1 KiB entries per ledger")
    p.add_argument("--rate", type=float, default=1000, help="foreground appends/s")
    p.add_argument("--delay", type=float, default=5, help="lost-bookie delay (s)")
    p.add_argument("--copy-rate", type=float, default=5000, help="copy limit, entries/s")
    p.add_argument("--before-s", type=float, default=5, help="foreground time before the kill")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    result = uvloop.run(main(args))
    b, h = result["foreground_before"], result["foreground_healing"]
    print(f"\nhealed {result['ledgers_on_victim']} ledgers ({result['copied_entries']:,} "
          f"entries, {result['copied_bytes'] / 1e6:.1f} MB copied) in {result['healed_s']:.1f} s "
          f"after the kill, lost-bookie delay {result['lost_bookie_delay_s']:.0f} s included; "
          f"copy limit {result['copy_rate_limit']:,.0f} entries/s")
    print(f"foreground {result['foreground_rate']:,.0f} appends/s: p99 before {b['p99_us']:,} us, "
          f"while healing {h['p99_us']:,} us ({h['p99_us'] / b['p99_us']:.2f}x); p50 "
          f"{b['p50_us']:,} -> {h['p50_us']:,} us; errors {result['foreground_errors']}")
    print(f"garbage collection after deleting 90% of the ledgers: entry logs "
          f"{result['entrylog_bytes_before_gc'] / 1e6:.1f} MB -> "
          f"{result['entrylog_bytes_after_gc'] / 1e6:.1f} MB in {result['gc_s']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    cli()
