"""The client's per-entry state code alone, without sockets: what compiling it could save.

A pipelined window of appends (``--inflight`` entries, 1 KiB, E3 Qw3 Qa2) driven through
the real classes the ledger handle uses, in the order it uses them, with no bookie,
no socket and no event-loop turn between the steps:

* ``submit``: a future from the loop, the entry sealed (xxh3), kept in
  :class:`~asyncbk.client.pending.PendingAppends`, given to
  :class:`~asyncbk.client.write_path.WritePath` and queued in the
  :class:`~asyncbk.client.outbox.Outbox` (``LedgerHandle.append``);
* ``frame``: each bookie's part taken from the outbox and framed as ADD_BATCH
  (``frame_adds``; the bodies encoded once for all three);
* ``complete``: two bookies' acknowledgements (``ack_many``), the pending entries taken
  and their futures resolved (``LedgerHandle._on_acks`` and ``_complete``).

Each step's time per entry (µs, the median of ``--rounds`` rounds of ``--windows``
windows) is the most a compiled core of these classes could save per entry, were it
free.  Set it against the client's whole CPU per entry in a pipelined run
(``asyncbk bench write``: the client's CPU share times the elapsed time, over the
entries), printed last with ``--against-run``.

    python benchmarks/append_core.py [--windows 400] [--inflight 256] [--rounds 5]
        [--against-run]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import count
from pathlib import Path
from typing import Any

from asyncbk.client.digest import DigestManager
from asyncbk.client.outbox import Outbox
from asyncbk.client.pending import PendingAppends
from asyncbk.client.write_path import NOTHING, WritePath
from asyncbk.net.adds import frame_adds
from asyncbk.types import BookieId

BOOKIES = [BookieId(f"127.0.0.1:{3181 + i}") for i in range(3)]


class _Channel:
    """Stands for a bookie's channel: remembers that the outbox has adds for it."""

    def __init__(self, waiting: set[BookieId], bookie: BookieId) -> None:
        self._waiting = waiting
        self._bookie = bookie

    def add_source(self, source: Any) -> None:
        self._waiting.add(self._bookie)


class _Client:
    def __init__(self) -> None:
        self.waiting: set[BookieId] = set()
        self._channels = {b: _Channel(self.waiting, b) for b in BOOKIES}

    def channel(self, bookie: BookieId) -> _Channel:
        return self._channels[bookie]


def measure(windows: int, inflight: int, size: int) -> dict[str, float]:
    loop = asyncio.new_event_loop()
    try:
        return _measure(loop, windows, inflight, size)
    finally:
        loop.close()


def _measure(loop: asyncio.AbstractEventLoop, windows: int, inflight: int,
             size: int) -> dict[str, float]:
    client = _Client()
    digest = DigestManager(7, "xxh3", b"pw")
    writes = WritePath(BOOKIES, 3, 2)
    pending = PendingAppends(0, traced=False)
    acked: list[tuple[list[int], int, BookieId]] = []
    outbox = Outbox(client, 7, b"k" * 32, 0, 3, 10.0,  # type: ignore[arg-type]
                    on_acks=lambda ids, pos, b: acked.append((ids, pos, b)),
                    on_answer=lambda *a: None, traced=False)
    payload = b"x" * size
    request_ids = count()
    length = 0
    lac = -1
    times = {"submit": 0.0, "frame": 0.0, "complete": 0.0}
    clock = time.perf_counter
    for _ in range(windows):
        t0 = clock()
        futures = []
        for _ in range(inflight):  # LedgerHandle.append and _enqueue
            entry_id = writes.next_entry_id
            length += size
            fut = loop.create_future()
            body = digest.seal(entry_id, lac, length, payload)
            pending.push(fut, body, length, 0.0)
            positions, piggyback = writes.submit_to(entry_id)
            outbox.queue_entry(entry_id, positions, piggyback, writes.ensemble, body, b"")
            futures.append(fut)
        t1 = clock()
        frames: list[bytes] = []
        for bookie in sorted(client.waiting):  # each channel's flush
            for group in outbox.take(bookie):
                frame_adds(group, size * len(group.bodies), request_ids, 1 << 24, frames)
        client.waiting.clear()
        t2 = clock()
        ids = list(range(pending.first, pending.first + len(pending)))
        for position in (0, 1):  # two answers: the ack quorum
            effects = writes.ack_many(ids, position, BOOKIES[position])
            if effects is not NOTHING and effects.completed:
                done = pending.complete(len(effects.completed))
                for eid, future in enumerate(done.futures, effects.completed[0]):
                    if not future.done():
                        future.set_result(eid)
                lac = effects.completed[-1]
        t3 = clock()
        assert all(f.done() for f in futures) and not len(pending)
        times["submit"] += t1 - t0
        times["frame"] += t2 - t1
        times["complete"] += t3 - t2
    n = windows * inflight
    out = {k: v / n * 1e6 for k, v in times.items()}
    out["total"] = sum(out.values())
    return out


def client_cpu_per_entry(entries: int, inflight: int, size: int) -> dict[str, float]:
    """One ``asyncbk bench write`` run: the client's CPU per entry, in µs."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        subprocess.run([sys.executable, "-m", "asyncbk", "bench", "write", "--entries",
                        str(entries), "--inflight", str(inflight), "--entry-size", str(size),
                        "--ensemble", "3", "--write-quorum", "3", "--ack-quorum", "2",
                        "--json", str(out)], check=True, capture_output=True, timeout=900)
        r = json.loads(out.read_text())
    n, elapsed = r["entries_done"], r["elapsed_s"]
    return {"throughput": r["throughput_eps"],
            "client_us_per_entry": r["cpu_percent"]["client"] / 100 * elapsed / n * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=400, help="windows per round")
    ap.add_argument("--inflight", type=int, default=256, help="entries per window")
    ap.add_argument("--entry-size", type=int, default=1024, help="bytes per entry")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (the median is reported)")
    ap.add_argument("--against-run", action="store_true",
                    help="also run `asyncbk bench write` (100,000 entries) for the client's "
                         "whole CPU per entry")
    args = ap.parse_args()
    rounds = [measure(args.windows, args.inflight, args.entry_size) for _ in range(args.rounds)]
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(f"per entry, µs (median of {args.rounds} rounds of {args.windows} windows "
          f"of {args.inflight}):")
    for k, v in median.items():
        print(f"  {k:9} {v:6.2f}")
    if args.against_run:
        run = client_cpu_per_entry(100_000, args.inflight, args.entry_size)
        share = median["total"] / run["client_us_per_entry"]
        print(f"client CPU per entry in a pipelined run: {run['client_us_per_entry']:.2f} µs "
              f"({run['throughput']:,.0f} entries/s): these steps are {share:.0%} of it")


if __name__ == "__main__":
    main()
