"""Restart time of a real bookie process against the number of entries it stores,
per entry index backend.

For each size and backend, a local cluster of one bookie (an etcd and one
``asyncbk bookie`` process, ``index_backend`` set in its configuration):

1. the bookie starts on empty directories and formats them (cookies on disk and in
   etcd), and is stopped; it is then started once more, still empty, and stopped
   (``restart_empty_s``: the start-up cost of the process itself);
2. its journal and ledger directories are filled with N entries through a real
   ``LedgerStorage`` with the same index backend, in a child process
   (``benchmarks/index_rss.py``'s writer: 100 ledgers of 100-byte entries, a
   checkpoint at the end, a clean close);
3. the bookie process is started again, ``--repeats`` times (stopped gracefully in
   between): each time is measured from the start call (process spawn) until it is
   registered in etcd and says it is ready (``ready_s``) and until it has served a
   read of a known entry (ledger 1, entry 0) over a new connection (``read_s``,
   counted from the spawn too).  The bookie's RSS (total and anonymous) is read
   right after that read.

The bookie's garbage collector runs far apart (``gc_interval_s``), since the
ledgers written directly have no metadata in etcd.  The data are in the page
cache when the bookie restarts (written just before; nothing drops the cache).

    python benchmarks/restart.py --entries 1000000 10000000 --backends lmdb memory
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

import asyncbk.local.cluster as local_cluster
from asyncbk.config import FRAME_BYTES_MAX_DEFAULT
from asyncbk.net.pool import BookieClient
from asyncbk.proto import ReadRequest, ReadResponse, Status
from asyncbk.testing.cluster import LocalBookie, LocalCluster

BODY = b"x" * 100
"""What ``index_rss.py``'s writer stores in every entry."""

READY_TIMEOUT_S = 900.0
"""How long a start may take here (a memory index of 10M entries takes tens of
seconds to rebuild; the local cluster's own limit is for tests)."""

STOP_TIMEOUT_S = 300.0
"""How long a graceful stop may take before SIGKILL (a kill would make the next start
replay the journal)."""


def rss_mib(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name = line.split(":", 1)[0]
            if name in ("VmRSS", "RssAnon"):
                out[name] = int(line.split()[1]) / 1024
    return out


def fill(root: Path, backend: str, entries: int) -> dict[str, float]:
    """N entries into ``root/journal`` and ``root/ledgers`` (a child process)."""
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("index_rss.py")),
                          "--child", "write", "--root", str(root), "--backends", backend,
                          "--entries", str(entries)],
                         check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def read_known_entry(bookie: LocalBookie) -> None:
    """Ledger 1, entry 0 from the bookie, over a new connection; checks the body."""
    client = BookieClient(frame_bytes_max=FRAME_BYTES_MAX_DEFAULT, requests_max=100,
                          connect_timeout_s=10.0, reconnect_backoff_s_max=0.5)
    try:
        ch = client.channel(bookie.id)
        resp = await ch.request(ReadRequest(ch.next_request_id(), 1, 0, 0, b""), 30.0)
        if not (isinstance(resp, ReadResponse) and resp.status == Status.OK
                and resp.body == BODY):
            raise RuntimeError(f"unexpected answer to the read: {resp!r}")
    finally:
        await client.close()


async def timed_start(bookie: LocalBookie, read: bool) -> dict[str, float]:
    t0 = time.perf_counter()
    await bookie.start()
    out = {"ready_s": time.perf_counter() - t0}
    if read:
        await read_known_entry(bookie)
        out["read_s"] = time.perf_counter() - t0
    assert bookie.pid is not None
    rss = rss_mib(bookie.pid)
    out["rss_mib"], out["anon_mib"] = rss.get("VmRSS", 0.0), rss.get("RssAnon", 0.0)
    return out


def dir_mib(path: Path, *, index_only: bool = False) -> float:
    files = (f for f in path.rglob("*") if f.is_file()
             and not (index_only and "entrylog" in f.relative_to(path).parts))
    return sum(f.stat().st_size for f in files) / 2**20


async def one(backend: str, entries: int, repeats: int, where: str | None) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix=f"restart-{backend}-", dir=where))
    config = {"index_backend": backend, "gc_interval_s": 10 * 86400.0}
    try:
        async with LocalCluster(bookies=1, data_dir=data / "cluster",
                                bookie_config=config, owner="benchmarks/restart.py") as c:
            bookie = c.bookies[0]
            await bookie.stop(STOP_TIMEOUT_S)  # formatted
            empty = await timed_start(bookie, read=False)
            await bookie.stop(STOP_TIMEOUT_S)
            t0 = time.perf_counter()
            written = await asyncio.to_thread(fill, bookie.dir, backend, entries)
            fill_s = time.perf_counter() - t0
            starts = []
            for _ in range(repeats):
                starts.append(await timed_start(bookie, read=True))
                await bookie.stop(STOP_TIMEOUT_S)
            ledgers_mib = await asyncio.to_thread(dir_mib, bookie.ledger_dir)
            index_mib = await asyncio.to_thread(dir_mib, bookie.ledger_dir, index_only=True)
        return {"backend": backend, "entries": entries, "fill_s": round(fill_s, 1),
                "fill_write_s": round(written["write_s"], 1),
                "restart_empty_s": round(empty["ready_s"], 3),
                "ready_s": [round(s["ready_s"], 3) for s in starts],
                "read_s": [round(s["read_s"], 3) for s in starts],
                "rss_mib": [round(s["rss_mib"], 1) for s in starts],
                "anon_mib": [round(s["anon_mib"], 1) for s in starts],
                "ledger_dir_mib": round(ledgers_mib, 1), "index_mib": round(index_mib, 1)}
    finally:
        shutil.rmtree(data, ignore_errors=True)


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    local_cluster.READY_TIMEOUT_S = READY_TIMEOUT_S
    results = []
    for entries in args.entries:
        for backend in args.backends:
            r = await one(backend, entries, args.repeats, args.dir)
            print(json.dumps(r), flush=True)
            results.append(r)
    return results


def print_table(results: list[dict[str, Any]]) -> None:
    print("\n| backend | entries | empty start s | ready s (each start) | read served s "
          "| RSS / anon MiB after | index MiB | fill s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['backend']} | {r['entries']:,} | {r['restart_empty_s']:.2f} "
              f"| {' / '.join(f'{s:.2f}' for s in r['ready_s'])} "
              f"| {' / '.join(f'{s:.2f}' for s in r['read_s'])} "
              f"| {max(r['rss_mib']):.0f} / {max(r['anon_mib']):.0f} | {r['index_mib']:.0f} "
              f"| {r['fill_s']:.0f} |")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entries", type=int, nargs="+", default=[1_000_000],
                   help="entries stored (one run per value; default: 1000000)")
    p.add_argument("--backends", nargs="+", default=["lmdb", "memory"],
                   choices=["memory", "lmdb"], help="index backends (default: lmdb memory)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed starts on the filled directories (default: 3)")
    p.add_argument("--dir", default=None,
                   help="where to put the cluster's data (default: a temporary directory)")
    p.add_argument("--json", default=None, help="also write the results here (default: none)")
    args = p.parse_args()
    results = uvloop.run(main(args))
    print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
