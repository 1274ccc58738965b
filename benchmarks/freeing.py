"""What deleting a large file does to a journal's fdatasync on the same disk, and what
deleting it in steps (``asyncbk.bookie.freeing``, as compaction and the checkpoint do)
changes.

A writer thread stands for a bookie's journal: it writes 64 KiB and fdatasyncs, over
and over, in a directory on the same file system as asyncbk's data (``--dir``, by
default the temporary directory).  Meanwhile a file of ``--size-mib`` (an entry log is
1 GiB), written and made durable beforehand, is deleted:

* ``unlink``: at once (what compaction did before);
* ``steps``: :func:`asyncbk.bookie.freeing.shrink_then_unlink` with its defaults
  (4 MB cut from the end every 10 ms, then the unlink).

Reported per mode (medians over ``--rounds``, modes interleaved): how long the deletion
took, and the writer's fdatasync latency from the deletion's start to one second after
its end: p50, p99 and the longest.  The longest is what an add waiting on that group
commit waits.

    python benchmarks/freeing.py [--rounds 3] [--size-mib 1024] [--dir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from asyncbk.bookie.fileio import OS_FILE_IO
from asyncbk.bookie.freeing import shrink_then_unlink

MODES = ("unlink", "steps")
CHUNK = 8 << 20


def make_file(path: Path, size: int) -> None:
    chunk = os.urandom(CHUNK)
    with path.open("wb") as f:
        for _ in range(size // CHUNK):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def one(mode: str, directory: Path, size: int) -> dict[str, float]:
    big = directory / "big.log"
    make_file(big, size)
    samples: list[tuple[float, float]] = []  # (start, seconds) of each fdatasync
    stop = threading.Event()

    def journal() -> None:
        fd = os.open(directory / "journal", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        block = os.urandom(64 << 10)
        try:
            while not stop.is_set():
                os.write(fd, block)
                t = time.perf_counter()
                os.fdatasync(fd)
                samples.append((t, time.perf_counter() - t))
        finally:
            os.close(fd)

    writer = threading.Thread(target=journal, name="journal")
    writer.start()
    try:
        time.sleep(1.0)
        start = time.perf_counter()
        if mode == "unlink":
            OS_FILE_IO.unlink(big)
        else:
            shrink_then_unlink(OS_FILE_IO, big)
        end = time.perf_counter()
        time.sleep(1.0)
    finally:
        stop.set()
        writer.join()
        (directory / "journal").unlink(missing_ok=True)
        big.unlink(missing_ok=True)
    during = sorted(s for t, s in samples if start <= t <= end + 1.0)
    return {"delete_ms": (end - start) * 1e3,
            "p50_ms": statistics.median(during) * 1e3,
            "p99_ms": during[min(len(during) - 1, int(len(during) * 0.99))] * 1e3,
            "max_ms": during[-1] * 1e3, "syncs": float(len(during))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size-mib", type=int, default=1024, help="the file deleted")
    p.add_argument("--dir", default=None, help="where to write (default: a temporary "
                   "directory; put it on the disk under test)")
    p.add_argument("--json", default=None, help="write the results to this file")
    args = p.parse_args()
    if args.rounds < 1 or args.size_mib < 8:
        p.error("--rounds must be >= 1 and --size-mib >= 8")
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="asyncbk-freeing-", dir=args.dir) as tmp:
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for mode in order:
                got = one(mode, Path(tmp), args.size_mib << 20)
                results[mode].append(got)
                print(f"round {r + 1}/{args.rounds} {mode:6}: deleted in "
                      f"{got['delete_ms']:,.0f} ms; fdatasync p50 {got['p50_ms']:.2f} "
                      f"p99 {got['p99_ms']:.2f} max {got['max_ms']:.2f} ms", flush=True)
    summary: dict[str, Any] = {}
    print(f"\n{args.size_mib} MiB deleted beside a journal's fdatasyncs, medians of "
          f"{args.rounds} round(s):\n")
    print("| deletion | took | fdatasync p50 | p99 | longest |")
    print("|---|---|---|---|---|")
    for mode in MODES:
        med = {k: statistics.median(r[k] for r in results[mode]) for k in results[mode][0]}
        summary[mode] = {"median": med, "rounds": results[mode]}
        print(f"| {mode} | {med['delete_ms']:,.0f} ms | {med['p50_ms']:.2f} ms | "
              f"{med['p99_ms']:.2f} ms | {med['max_ms']:.2f} ms |")
    if args.json:
        Path(args.json).write_text(json.dumps({"size_mib": args.size_mib, "modes": summary},
                                              indent=2))


if __name__ == "__main__":
    main()
