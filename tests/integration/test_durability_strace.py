"""No durability shortcut, seen from the system calls: every acknowledged append was
written to, and fdatasync'd in, the journals of at least ``Qa`` bookies between the
call and its acknowledgement.  Both ways a journal can write (``journal_io``): with its
writer thread (``thread``: the calls, traced with ``strace``) and through io_uring
(``uring``: the ring's requests, traced with ``perf`` at the kernel's io_uring
tracepoints, since they are no system calls).

Three real bookie processes, each traced by ``strace`` (every thread, wall-clock
timestamps, each call's duration, file names of descriptors); a client appends one
entry at a time (E3 Qw3 Qa2) and notes, on the same wall clock, when each append was
called and when it was acknowledged.  For each append, count the bookies with a
``write`` to a journal file (``*.jnl``) and then an ``fdatasync`` of one that both
started after the call and returned before the acknowledgement; at least 2 must.
Through the ring: a write request submitted after the call, whose linked
``IORING_OP_FSYNC`` completed successfully before the acknowledgement.
Then the same with 64 appends in flight: the group commits there cover many entries
each, and still no acknowledgement may come before Qa journal fdatasyncs that started
after the append was called.  (The compiled build and the callback-driven journal are
what this guards: a batch's answers must never leave before its fsync returns.)
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from asyncbk.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ACK_QUORUM = 2
# 1700000000.123456 [pid] syscall(args) = ret <0.000123>   (the [pid ...] prefix with -f)
LINE = re.compile(r"^(?:\[pid\s+\d+\]\s+|\d+\s+)?(\d+\.\d+)\s+(write|pwrite64|fdatasync)"
                  r"\((\d+)<([^>]*)>.*\)\s+=\s+(-?\d+).*<(\d+\.\d+)>\s*$")


def _calls(path: Path) -> list[tuple[str, float, float]]:
    """(syscall, start, end) of each successful write/fdatasync of a journal file."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if m and m.group(4).endswith(".jnl") and int(m.group(5)) >= 0:
            start = float(m.group(1))
            out.append((m.group(2), start, start + float(m.group(6))))
    return out


def _durable_on(calls: list[tuple[str, float, float]], called: float, acked: float) -> bool:
    """A journal write, then a journal fdatasync, both after ``called``, the fdatasync
    returned before ``acked``."""
    writes = [s for name, s, _ in calls if name != "fdatasync" and s >= called]
    if not writes:
        return False
    first_write = min(writes)
    return any(name == "fdatasync" and s >= first_write and e <= acked
               for name, s, e in calls)


# (perf script -F pid,time,event,trace) 1234 76143.614958862: io_uring:io_uring_submit_req:
#   ring 0xffff..., req 0xffff..., user_data 0x2, opcode WRITE, ...
PERF_LINE = re.compile(r"^\s*(\d+)\s+(\d+\.\d+):\s+io_uring:io_uring_(submit_req|complete):"
                       r"\s+ring (0x[0-9a-f]+), req 0x[0-9a-f]+, user_data (0x[0-9a-f]+),"
                       r"\s+(?:opcode (\w+)|result (-?\d+))")


def _ring_calls(script: str, pids: list[int]) -> list[list[tuple[str, float, float]]]:
    """For each bookie (by pid), its ring's write-then-fdatasync jobs as calls of the
    strace form: ("write", submitted, completed), ("fdatasync", submitted, completed),
    the sync only if both it and its write succeeded (the journal links the write, with
    user_data 2j, to the sync, 2j + 1)."""
    submitted: dict[tuple[int, str, int], tuple[float, str]] = {}
    completed: dict[tuple[int, str, int], tuple[float, int]] = {}
    for line in script.splitlines():
        m = PERF_LINE.match(line)
        if not m or int(m.group(1)) not in pids:
            continue
        key = (int(m.group(1)), m.group(4), int(m.group(5), 16))
        if m.group(3) == "submit_req":
            submitted[key] = (float(m.group(2)), m.group(6))
        else:
            completed[key] = (float(m.group(2)), int(m.group(7)))
    out: dict[int, list[tuple[str, float, float]]] = defaultdict(list)
    for (pid, ring, data), (at, op) in submitted.items():
        if op != "FSYNC" or data % 2 != 1:
            continue
        write = submitted.get((pid, ring, data - 1))
        done_write = completed.get((pid, ring, data - 1))
        done_sync = completed.get((pid, ring, data))
        if write is None or write[1] != "WRITE" or done_write is None or done_sync is None:
            continue
        if done_write[1] <= 0 or done_sync[1] < 0:
            continue
        out[pid].append(("write", write[0], done_write[0]))
        out[pid].append(("fdatasync", at, done_sync[0]))
    return [out[pid] for pid in pids]


async def _perf(out: Path) -> asyncio.subprocess.Process:
    """Every io_uring request submitted and completed on the machine, on the monotonic
    clock (the bookies' are picked out by pid afterwards)."""
    tracer = await asyncio.create_subprocess_exec(
        "perf", "record", "-a", "-q", "-k", "monotonic", "-e", "io_uring:io_uring_submit_req",
        "-e", "io_uring:io_uring_complete", "-o", str(out / "rings.perf"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    await asyncio.sleep(1.5)
    return tracer


async def _info(port: int | None) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{port}/api/v1/bookie/info",
            timeout=aiohttp.ClientTimeout(total=10)) as resp:
        resp.raise_for_status()
        info: dict[str, Any] = await resp.json()
        return info


def _perf_available() -> bool:
    if shutil.which("perf") is None:
        return False
    listed = subprocess.run(["perf", "list", "io_uring:io_uring_complete"],
                            capture_output=True, text=True, timeout=60)
    return "io_uring_complete" in listed.stdout


async def _traced(cluster: LocalCluster, out: Path) -> list[asyncio.subprocess.Process]:
    tracers = []
    for i, bookie in enumerate(cluster.bookies):
        assert bookie.pid is not None
        tracers.append(await asyncio.create_subprocess_exec(
            "strace", "-f", "-ttt", "-T", "-y", "-e", "trace=write,pwrite64,fdatasync",
            "-o", str(out / f"bookie-{i}.trace"), "-p", str(bookie.pid),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    await asyncio.sleep(1.5)  # attached to every thread
    return tracers


async def _stop(tracers: list[asyncio.subprocess.Process]) -> None:
    for t in tracers:
        t.send_signal(signal.SIGINT)  # detaches; the bookie runs on
    for t in tracers:
        try:
            await asyncio.wait_for(t.wait(), 20)
        except TimeoutError:
            t.kill()
            await asyncio.wait_for(t.wait(), 10)


@pytest.mark.parametrize("journal_io", ["thread", "uring"])
async def test_every_ack_follows_qa_journal_fdatasyncs(tmp_path: Path, journal_io: str) -> None:
    if journal_io == "thread" and shutil.which("strace") is None:
        pytest.skip("strace is not installed: the writer thread's calls cannot be traced")
    if journal_io == "uring" and not await asyncio.to_thread(_perf_available):
        pytest.skip("perf with the kernel's io_uring tracepoints is not available: the "
                    "ring's requests cannot be traced")
    # strace stamps calls with the wall clock, perf (-k monotonic) with the monotonic one
    now = time.time if journal_io == "thread" else time.monotonic
    async with LocalCluster(bookies=3, data_dir=tmp_path / "data",
                            bookie_config={"journal_io": journal_io}) as cluster:
        bk = await cluster.client()
        lh = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=ACK_QUORUM,
                                    password=b"pw")
        await lh.append(b"warm-up")
        pids = [b.pid for b in cluster.bookies]
        tracers = (await _traced(cluster, tmp_path) if journal_io == "thread"
                   else [await _perf(tmp_path)])
        try:
            appends: list[tuple[float, float]] = []
            for i in range(40):  # one at a time
                called = now()
                await lh.append(b"sequential %d" % i)
                appends.append((called, now()))

            async def timed(i: int) -> tuple[float, float]:
                called = now()
                await lh.append(b"pipelined %d" % i + b"x" * 1000)
                return called, now()

            for burst in range(4):  # 64 in flight
                appends += await asyncio.gather(*(timed(burst * 64 + i) for i in range(64)))
        finally:
            await _stop(tracers)
        infos = [await _info(b.http_port) for b in cluster.bookies]
        await bk.close()
    if journal_io == "thread":
        traces = [_calls(tmp_path / f"bookie-{i}.trace") for i in range(3)]
    else:
        script = await asyncio.to_thread(
            subprocess.run, ["perf", "script", "-i", str(tmp_path / "rings.perf"), "-F",
                             "pid,time,event,trace", "--ns"],
            capture_output=True, text=True, timeout=120)
        traces = _ring_calls(script.stdout, [pid for pid in pids if pid is not None])
    for i, calls in enumerate(traces):
        assert any(name == "fdatasync" for name, _, _ in calls), \
            f"bookie {i}: no journal fdatasync traced (could the tracer not attach?)"
        assert infos[i]["journal_io"] == journal_io
    short = [(n, called, acked) for n, (called, acked) in enumerate(appends)
             if sum(_durable_on(calls, called, acked) for calls in traces) < ACK_QUORUM]
    assert not short, (f"{len(short)} of {len(appends)} appends acknowledged before "
                       f"{ACK_QUORUM} journal fdatasyncs; first: {short[:3]}")
    fsyncs = [sum(name == "fdatasync" for name, _, _ in calls) for calls in traces]
    # 40 sequential appends need at least 40 group commits on each bookie that took part
    assert sorted(fsyncs)[-ACK_QUORUM] >= 40, fsyncs
