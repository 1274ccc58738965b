"""Which of asyncbk's files one operation runs, found by tracing it (not by reading).

Two operations, each after a warm-up so that connections, ledgers and caches exist:

* ``append``: one ``LedgerHandle.append`` on the simulator (the real client, network
  code, bookie composition, processor, journal and storage, on virtual time in one
  thread), from the call until its future resolves.  Both sides are counted: the
  client's files and the bookie's.
* ``spark``: one streaming micro-batch of the Spark source, driven as Spark's driver
  and one task drive it (``latestOffset``, ``partitions``, ``read`` of each
  partition, ``commit``), against a LocalCluster: the driver's and the task's files
  (the bookies' are in other processes and are not counted).

For each, it prints the files whose functions ran, with how many distinct functions
of each, leaving out the simulator's own files (``testing/``) and, unless
``--all``, the bottom layer (errors, log, clock, config, types, stats, backoff).

    python benchmarks/path_files.py [append|spark|both] [--all] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

import asyncbk

PKG = Path(asyncbk.__file__).resolve().parent
BOTTOM = {"errors.py", "log.py", "clock.py", "config.py", "types.py", "stats.py", "backoff.py",
          "_version.py", "topology.py"}


class Tracer:
    """Records (file, function) of every asyncbk frame called while on, in any thread
    started after it is created too."""

    def __init__(self) -> None:
        self.calls: dict[str, set[str]] = defaultdict(set)
        self.on = False
        self._lock = threading.Lock()

    def _trace(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and self.on:
            path = frame.f_code.co_filename
            if path.startswith(str(PKG)):
                rel = str(Path(path).relative_to(PKG))
                with self._lock:
                    self.calls[rel].add(frame.f_code.co_qualname)
        return None

    def __enter__(self) -> Tracer:
        sys.setprofile(self._trace)
        threading.setprofile(self._trace)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def files(self, everything: bool) -> dict[str, list[str]]:
        out = {}
        for rel, funcs in sorted(self.calls.items()):
            if rel.startswith("testing/"):
                continue
            if not everything and rel in BOTTOM:
                continue
            out[rel] = sorted(funcs)
        return out


def trace_append(everything: bool) -> dict[str, list[str]]:
    from asyncbk.testing.sim import SimCluster, run_sim

    tracer = Tracer()

    async def go() -> None:
        cluster = SimCluster(seed=1, bookies=3)
        await cluster.start()
        bk = cluster.client("writer")
        lh = await bk.create_ledger(3, 3, 2)
        for i in range(50):  # warm-up: connections made, ledger known to the bookies
            await lh.append(b"w%d" % i)
        with tracer:
            tracer.on = True
            await lh.append(b"x" * 1024)
            tracer.on = False
        await lh.close()
        await cluster.stop()

    run_sim(go)
    return tracer.files(everything)


def trace_spark(everything: bool) -> dict[str, list[str]]:
    from asyncbk.spark import AsyncbkDataSource
    from asyncbk.testing import LocalCluster

    with tempfile.TemporaryDirectory(prefix="asyncbk-pathfiles-") as d:
        loop = asyncio.new_event_loop()
        cluster = LocalCluster(bookies=3, data_dir=Path(d))
        loop.run_until_complete(cluster.start())
        try:
            async def write(first: int, n: int) -> None:
                bk = await cluster.client()
                ns = await bk.namespace("paths", create=True)
                if not await ns.stream_exists("s"):
                    await ns.create_stream("s")
                async with await ns.open_writer("s") as w:
                    for i in range(first, first + n):
                        w.write_nowait(b"record-%d" % i)
                    await w.flush()
                await bk.close()

            loop.run_until_complete(write(0, 200))
            opts = {"metadataUri": cluster.metadata_uri, "namespace": "paths", "streams": "s",
                    "startingPositions": "earliest"}
            tracer = Tracer()
            tracer.__enter__()  # before the reader's threads start, so they are traced too
            reader = AsyncbkDataSource(opts).streamReader(None)  # type: ignore[arg-type]
            start = reader.initialOffset()
            end = reader.latestOffset()
            for p in reader.partitions(start, end):  # warm-up batch
                for _ in reader.read(p):
                    pass
            reader.commit(end)
            loop.run_until_complete(write(200, 200))
            tracer.on = True
            nxt = reader.latestOffset()
            rows = 0
            for p in reader.partitions(end, nxt):
                for batch in reader.read(p):
                    rows += batch.num_rows
            reader.commit(nxt)
            tracer.on = False
            tracer.__exit__()
            reader.stop()
            if rows != 200:
                raise SystemExit(f"the traced micro-batch read {rows} rows, not 200")
        finally:
            loop.run_until_complete(cluster.stop())
            loop.close()
    return tracer.files(everything)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", nargs="?", choices=["append", "spark", "both"], default="both")
    p.add_argument("--all", action="store_true", help="count the bottom layer's files too")
    p.add_argument("--json", default=None, help="also write the result here")
    args = p.parse_args()
    result: dict[str, Any] = {}
    if args.what in ("append", "both"):
        result["append"] = trace_append(args.all)
    if args.what in ("spark", "both"):
        result["spark"] = trace_spark(args.all)
    for name, files in result.items():
        print(f"\n{name}: {len(files)} files")
        for rel, funcs in files.items():
            print(f"  {rel:42} {len(funcs):3} functions")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
