"""Bookie memory and restart time against the number of entries stored, per entry
index backend: N entries written through a real LedgerStorage (in a child process per
backend and size, so RSS is that process's), then the RSS after writing, the reopen
time (recovery) and the RSS of a fresh process after reopening.

    python benchmarks/index_rss.py --entries 1000000 --backends memory lmdb

Also measures a point read of the lmdb index on the loop (the target: under 10 µs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LEDGERS = 100
BODY = b"x" * 100


def rss_mib(field: str = "VmRSS") -> float:
    """Resident MiB (``RssAnon``: anonymous only; LMDB's pages are file-backed)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


async def write(root: Path, backend: str, entries: int) -> dict[str, float]:
    from asyncbk.bookie.storage import LedgerStorage
    from asyncbk.config import BookieConfig

    config = BookieConfig(index_backend=backend, checkpoint_interval_s=3600.0,
                          journal_sync=False, journal_queue_entries_max=200_000)
    s = await LedgerStorage.open(root / "journal", root / "ledgers", config)
    t0 = time.perf_counter()
    per = entries // LEDGERS
    batch = 20_000
    for first in range(0, per, batch // LEDGERS):
        futs = [s.add_entry(ledger, e, b"k", BODY) for e in range(first, min(per, first + batch // LEDGERS))
                for ledger in range(1, LEDGERS + 1)]
        await asyncio.gather(*futs)
    write_s = time.perf_counter() - t0
    await s.checkpoint()
    rss, anon = rss_mib(), rss_mib("RssAnon")
    await s.close()
    return {"write_s": write_s, "rss_after_write_mib": rss, "anon_after_write_mib": anon}


async def reopen(root: Path, backend: str) -> dict[str, float]:
    from asyncbk.bookie.storage import LedgerStorage
    from asyncbk.config import BookieConfig

    config = BookieConfig(index_backend=backend, checkpoint_interval_s=3600.0)
    base = rss_mib()
    t0 = time.perf_counter()
    s = await LedgerStorage.open(root / "journal", root / "ledgers", config)
    open_s = time.perf_counter() - t0
    out = {"reopen_s": open_s, "rss_base_mib": base, "rss_after_reopen_mib": rss_mib(),
           "anon_after_reopen_mib": rss_mib("RssAnon"),
           "entries": s.statistics()["entries"]}
    index = s._index
    n = 20_000
    t0 = time.perf_counter()
    for i in range(n):
        index.get(1 + i % LEDGERS, (i * 7919) % max(1, out["entries"] // LEDGERS))
    out["point_get_us"] = (time.perf_counter() - t0) / n * 1e6
    assert await s.read_entry(1, 0) == BODY
    await s.close()
    out["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def child(args: argparse.Namespace) -> None:
    fn = write if args.child == "write" else reopen
    if args.child == "write":
        result = asyncio.run(write(Path(args.root), args.backend, args.entries))
    else:
        result = asyncio.run(fn(Path(args.root), args.backend))  # type: ignore[call-arg]
    print(json.dumps(result))


def run_child(kind: str, root: Path, backend: str, entries: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--root", str(root),
                          "--backends", backend, "--entries", str(entries)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entries", type=int, nargs="+", default=[1_000_000],
                   help="entries to store (one run per value); default 1000000")
    p.add_argument("--backends", nargs="+", default=["memory", "lmdb"],
                   choices=["memory", "lmdb"])
    p.add_argument("--dir", default=None, help="where to put the data (default: a temp dir)")
    p.add_argument("--child", choices=["write", "reopen"], help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.backend = args.backends[0]
        args.entries = args.entries[0]
        child(args)
        return
    for entries in args.entries:
        for backend in args.backends:
            root = Path(tempfile.mkdtemp(prefix=f"index-rss-{backend}-", dir=args.dir))
            try:
                w = run_child("write", root, backend, entries)
                r = run_child("reopen", root, backend, entries)
                index_mib = sum(f.stat().st_size for f in (root / "ledgers").rglob("*")
                                if f.is_file() and "entrylog" not in f.parts) / 2**20
                print(json.dumps({"backend": backend, "entries": entries, **w, **r,
                                  "index_files_mib": round(index_mib, 1)}), flush=True)
            finally:
                shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
