"""No durability shortcut, seen from the system calls: every acknowledged append was
written to, and fdatasync'd in, the journals of at least ``Qa`` bookies between the
call and its acknowledgement.

Three real bookie processes, each traced by ``strace`` (every thread, wall-clock
timestamps, each call's duration, file names of descriptors); a client appends one
entry at a time (E3 Qw3 Qa2) and notes, on the same wall clock, when each append was
called and when it was acknowledged.  For each append, count the bookies with a
``write`` to a journal file (``*.jnl``) and then an ``fdatasync`` of one that both
started after the call and returned before the acknowledgement; at least 2 must.
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
from pathlib import Path

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


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
async def test_every_ack_follows_qa_journal_fdatasyncs(tmp_path: Path) -> None:
    async with LocalCluster(bookies=3, data_dir=tmp_path / "data") as cluster:
        bk = await cluster.client()
        lh = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=ACK_QUORUM,
                                    password=b"pw")
        await lh.append(b"warm-up")
        tracers = await _traced(cluster, tmp_path)
        try:
            appends: list[tuple[float, float]] = []
            for i in range(40):  # one at a time
                called = time.time()
                await lh.append(b"sequential %d" % i)
                appends.append((called, time.time()))

            async def timed(i: int) -> tuple[float, float]:
                called = time.time()
                await lh.append(b"pipelined %d" % i + b"x" * 1000)
                return called, time.time()

            for burst in range(4):  # 64 in flight
                appends += await asyncio.gather(*(timed(burst * 64 + i) for i in range(64)))
        finally:
            await _stop(tracers)
        await bk.close()
    traces = [_calls(tmp_path / f"bookie-{i}.trace") for i in range(3)]
    for i, calls in enumerate(traces):
        assert any(name == "fdatasync" for name, _, _ in calls), \
            f"bookie {i}: no journal fdatasync traced (strace could not attach?)"
    short = [(n, called, acked) for n, (called, acked) in enumerate(appends)
             if sum(_durable_on(calls, called, acked) for calls in traces) < ACK_QUORUM]
    assert not short, (f"{len(short)} of {len(appends)} appends acknowledged before "
                       f"{ACK_QUORUM} journal fdatasyncs; first: {short[:3]}")
    fsyncs = [sum(name == "fdatasync" for name, _, _ in calls) for calls in traces]
    # 40 sequential appends need at least 40 group commits on each bookie that took part
    assert sorted(fsyncs)[-ACK_QUORUM] >= 40, fsyncs
