"""Every hop of a sequential append, timed: from ``append`` to the awaiting code.

Copies ``src/`` to a temporary directory, puts a timestamp mark at each hop
(``time.perf_counter_ns``: CLOCK_MONOTONIC, one clock for every process on the
machine) into the copy only, and runs a local cluster from it (etcd + 3 bookie
processes, E=3 Qw=3 Qa=2, journals fdatasync'd before every acknowledgement)
with one append in flight at a time. Each process writes its marks at exit; the
script lines them up per entry and prints the median and mean of every hop of
the bookie whose answer completed the ack quorum (the second of three), and of
the client around it. The package itself carries no marks.

    python benchmarks/hops.py [--entries 2000]
    python benchmarks/hops.py --inflight 256 --entries 60000   # the steps of a window
"""

from __future__ import annotations

import argparse
import bisect
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (file under src/asyncbk, a unique anchor, mark name, "before" or "after" the anchor)
MARKS: list[tuple[str, str, str, str]] = [
    ("client/ledger.py", 'if self._recovery:\n            raise LedgerClosedError(f"ledger {self.id} '
     'is being recovered")', "c_append", "before"),
    ("net/channel.py", "        self._unsent_bytes = 0\n        if len(unsent) == 1:",
     "c_write", "inside"),
    ("net/channel.py", "    def data_received(self, data: bytes) -> None:\n        self._answered = True",
     "c_recv", "after"),
    ("client/ledger.py", "future.set_result(entry_id)", "c_resolve", "before"),
    ("net/server.py", "    def data_received(self, data: bytes) -> None:\n        try:\n"
     "            bodies = self._decoder.feed(data)", "b_recv", "inside"),
    ("bookie/journal.py", "        was_empty = not self._queued_records", "b_enq", "before"),
    ("bookie/journal.py", "self._worker.submit(self._write_batch, (records, items), "
     "self._batch_done)", "b_flush", "before"),
    ("bookie/journal.py", 'buf = records[0] if len(records) == 1 else b"".join(records)',
     "b_thread", "before"),
    ("bookie/journal_writer.py", "        t1 = time.perf_counter()\n        result = None",
     "b_written", "inside"),
    ("bookie/journal_writer.py", "            result = meanwhile()", "b_applied", "after"),
    ("bookie/journal_writer.py", "        if self._sync:\n            self.io.fdatasync(self._fd)",
     "b_synced", "after"),
    ("bookie/fileio.py", "        loop.call_soon_threadsafe(setter, first, second)",
     "b_handback", "before"),
    ("bookie/journal.py", '        """The writer thread\'s answer for the batch in flight (on the '
     'loop)."""', "b_back", "after"),
    ("net/server.py", "        self.inflight -= 1\n        if self._reading_paused_by and "
     "self.inflight <= self._server.requests_resume_at", "b_respond", "before"),
    ("net/server.py", "        self._out.clear()\n        self._transport.write(data)", "b_send",
     "inside"),
]

# the hops, in order, with what each one is
HOPS = [
    ("c_append", "c_write", "client: append, envelope, frame, up to the socket write"),
    ("c_write", "b_recv", "socket write, loopback, the bookie process waking up"),
    ("b_recv", "b_enq", "bookie: decode, checks, storage, journal record queued"),
    ("b_enq", "b_flush", "bookie: the journal's kick (one loop turn)"),
    ("b_flush", "b_thread", "hand-off to the journal thread (thread wake-up)"),
    ("b_thread", "b_written", "journal write(2)"),
    ("b_written", "b_applied", "entry log append (the disk writing the journal meanwhile)"),
    ("b_applied", "b_synced", "journal fdatasync(2) (what is left of the disk's write)"),
    ("b_synced", "b_handback", "journal thread: batch result"),
    ("b_handback", "b_back", "hand-back to the event loop (loop wake-up)"),
    ("b_back", "b_respond", "bookie: index update, the add's callback, answer encoded"),
    ("b_respond", "b_send", "bookie: the answers' socket write (same loop turn)"),
    ("b_send", "c_recv2", "socket write, loopback, the client process waking up"),
    ("c_recv2", "c_resolve", "client: decode, ack quorum, ledger bookkeeping"),
    ("c_resolve", "c_resumed", "client: the awaiting coroutine resumes (one loop turn)"),
]

TRACE_MODULE = '''
import atexit, os, time
EVENTS = []
_ns = time.perf_counter_ns
def mark(name):
    EVENTS.append((name, _ns()))
def _dump():
    out = os.environ.get("ASYNCBK_HOPS_DIR")
    if out and EVENTS:
        with open(os.path.join(out, f"marks-{os.getpid()}.txt"), "w") as f:
            f.writelines(f"{n} {t}\\n" for n, t in EVENTS)
atexit.register(_dump)
'''

WORKLOAD = '''
import asyncio, gc, sys, tempfile
from pathlib import Path
import uvloop
from asyncbk import _hops
from asyncbk.testing import LocalCluster

async def main(n, window):
    with tempfile.TemporaryDirectory() as d:
        async with LocalCluster(data_dir=Path(d) / "c", bookies=3) as c:
            bk = await c.client()
            lh = await bk.create_ledger(3, 3, 2)
            data = b"x" * 1024

            async def load(total):  # as `asyncbk bench write`: what the window allows, at once
                inflight, sent, space = 0, 0, asyncio.Event()

                def done(_):
                    nonlocal inflight
                    inflight -= 1
                    space.set()

                while sent < total or inflight:
                    if sent < total and inflight < window:
                        lh.append(data).add_done_callback(done)
                        inflight += 1
                        sent += 1
                        continue
                    space.clear()
                    await space.wait()

            if window == 1:
                for _ in range(300):
                    await lh.append(data)
            else:
                await load(20 * window)
                gc.freeze()
            _hops.EVENTS.clear()
            _hops.mark("c_begin")
            if window == 1:  # each append awaited: its hops, up to the code resumed
                for _ in range(n):
                    await lh.append(data)
                    _hops.mark("c_resumed")
            else:
                await load(n)
            _hops.mark("c_end")
            await lh.close()

uvloop.run(main(int(sys.argv[1]), int(sys.argv[2])))
'''

# One pipelined window, in order: the client's writes to the bookies start it, the
# quorum bookie's hops (as in HOPS) follow, the client's next writes end it.
_BOOKIE_HOPS = [hop for hop in HOPS if hop[0].startswith("b_") and hop[1].startswith("b_")
                and hop[0] != "b_recv"]
WINDOW_STEPS = [
    ("c_write", "b_enq", "client writes, the quorum bookie has read, decoded and queued it"),
    *_BOOKIE_HOPS,
    ("b_send", "c_recv", "the answer reaching the client"),
    ("c_recv", "c_next", "client: appends completed, the next window issued, up to its writes"),
]


def analyse_windows(client: list[tuple[str, int]], bookies: list[list[tuple[str, int]]]
                    ) -> None:
    """Per window (a client write to each bookie, up to the next ones), the p50 and mean
    of each step of the bookie whose answer completed the quorum (the second)."""
    begin = next(t for n, t in client if n == "c_begin")
    end = next(t for n, t in client if n == "c_end")
    writes = [t for n, t in client if n == "c_write" and begin <= t <= end]
    recvs = [t for n, t in client if n == "c_recv" and begin <= t <= end]
    names = [_BOOKIE_HOPS[0][0]] + [b for _, b, _ in _BOOKIE_HOPS]
    bt = [[t for _, t in ev] for ev in bookies]
    steps: dict[str, list[int]] = collections.defaultdict(list)
    totals: list[int] = []
    for k in range(0, len(writes) - 3, 3):  # (one write per bookie)
        start, stop = writes[k], writes[k + 3]
        rows = [row for ev, times in zip(bookies, bt, strict=True)
                if (row := chain(ev, times, names, {}, start, stop)) is not None]
        if len(rows) < 2:
            continue
        at = {"c_write": start, "c_next": stop} | sorted(rows, key=lambda r: r["b_send"])[1]
        i = bisect.bisect_left(recvs, at["b_send"])
        if i == len(recvs) or recvs[i] > stop:
            continue
        at["c_recv"] = recvs[i]
        for a, b, what in WINDOW_STEPS:
            steps[what].append(at[b] - at[a])
        totals.append(stop - start)
    if not totals:
        sys.exit("hops.py: no window lined up")
    print(f"{len(totals)} windows lined up")
    print(f"{'step of a window':70s} {'p50 us':>8s} {'mean us':>8s}")
    for _, _, what in WINDOW_STEPS:
        print(p50_mean_row(what, steps[what], 70))
    print(p50_mean_row("the window", totals, 70))


def instrumented_copy(dest: Path) -> Path:
    src = dest / "src"
    shutil.copytree(REPO / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    pkg = src / "asyncbk"
    (pkg / "_hops.py").write_text(TRACE_MODULE)
    texts: dict[str, str] = {}
    for rel, anchor, name, where in MARKS:
        text = texts.get(rel) or (pkg / rel).read_text()
        if text.count(anchor) != 1:
            sys.exit(f"hops.py: the anchor for {name} is not exactly once in src/asyncbk/{rel} "
                     "(the code changed): update MARKS")
        start = text.index(anchor)
        if where == "before":  # a line of its own before the anchor's first line
            at = text.rfind("\n", 0, start) + 1
            indent_of = at
        elif where == "after":  # ... after its last line
            at = text.index("\n", start + len(anchor) - 1) + 1
            indent_of = text.rfind("\n", 0, start + len(anchor) - 1) + 1
        else:  # inside: after its first line, indented as its second
            at = text.index("\n", start) + 1
            indent_of = at
        line = text[indent_of:text.index("\n", indent_of)]
        indent = line[: len(line) - len(line.lstrip())]
        text = f"{text[:at]}{indent}_hops_mark({name!r})\n{text[at:]}"
        texts[rel] = text
    for rel, text in texts.items():
        text = text.replace("from __future__ import annotations\n",
                            "from __future__ import annotations\n\n"
                            "from asyncbk._hops import mark as _hops_mark\n", 1)
        (pkg / rel).write_text(text)
    return src


def load(out: Path) -> tuple[list[tuple[str, int]], list[list[tuple[str, int]]]]:
    client, bookies = None, []
    for f in sorted(out.glob("marks-*.txt")):
        events = [(line.split()[0], int(line.split()[1])) for line in f.read_text().splitlines()]
        if any(n == "c_begin" for n, _ in events):
            client = events
        else:
            bookies.append(events)
    if client is None or len(bookies) != 3:
        sys.exit("hops.py: the marks of the client and the 3 bookies were not all written")
    return client, bookies


def first(events: list[tuple[str, int]], times: list[int], name: str, after: int,
          before: int | None = None) -> int | None:
    for n, t in events[bisect.bisect_left(times, after):]:
        if before is not None and t >= before:
            return None
        if n == name:
            return t
    return None


def chain(events: list[tuple[str, int]], times: list[int], names: list[str],
          marks: dict[str, int], after: int, before: int | None = None
          ) -> dict[str, int] | None:
    """``marks`` with each of ``names`` added in order, each the first after the one
    before it (and before ``before``); None if one is missing."""
    prev = after
    for name in names:
        t = first(events, times, name, prev, before)
        if t is None:
            return None
        marks[name] = prev = t
    return marks


def p50_mean_row(label: str, values_ns: list[int], width: int) -> str:
    v = sorted(values_ns)
    return f"{label:{width}s} {v[len(v) // 2] / 1e3:8.1f} {sum(v) / len(v) / 1e3:8.1f}"


def analyse(client: list[tuple[str, int]], bookies: list[list[tuple[str, int]]]) -> None:
    begin = next(t for n, t in client if n == "c_begin")
    end = next(t for n, t in client if n == "c_end")
    client = [(n, t) for n, t in client if begin <= t <= end]
    ctimes = [t for _, t in client]
    starts = [t for n, t in client if n == "c_append"]
    bt = [[t for _, t in ev] for ev in bookies]
    brecv = [[t for n, t in ev if n == "b_recv"] for ev in bookies]
    bookie_names = [b for _, b, _ in HOPS if b.startswith("b_")]  # b_recv first
    per_hop: dict[str, list[int]] = collections.defaultdict(list)
    totals: list[int] = []
    skipped = 0
    for k, t0 in enumerate(starts):
        t_next = starts[k + 1] if k + 1 < len(starts) else end
        at = {"c_append": t0}
        for name in ("c_write", "c_resolve", "c_resumed"):
            at[name] = first(client, ctimes, name, t0, t_next) or 0
        if not all(at.values()):
            skipped += 1
            continue
        answers = []
        for ev, times, recvs in zip(bookies, bt, brecv, strict=True):
            i = bisect.bisect_left(recvs, at["c_write"])
            if i == len(recvs):
                break
            seq = chain(ev, times, bookie_names[1:], {"b_recv": recvs[i]}, recvs[i])
            if seq is not None:
                answers.append(seq)
        if len(answers) < 2:
            skipped += 1
            continue
        answers.sort(key=lambda s: s["b_send"])
        quorum = answers[1]  # the answer that completed the ack quorum (Qa 2)
        recv2 = first(client, ctimes, "c_recv", quorum["b_send"], at["c_resolve"] + 1)
        if recv2 is None:
            skipped += 1
            continue
        at |= quorum
        at["c_recv2"] = recv2
        for a, b, what in HOPS:
            per_hop[what].append(at[b] - at[a])
        totals.append(at["c_resumed"] - t0)
    print(f"{len(totals)} appends lined up ({skipped} left out: a mark missing or out of order)")
    print(f"{'hop':60s} {'p50 us':>8s} {'mean us':>8s}")
    for _, _, what in HOPS:
        print(p50_mean_row(what, per_hop[what], 60))
    print(p50_mean_row("append to the awaiting code resumed", totals, 60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=2000,
                        help="appends measured (default: 2000)")
    parser.add_argument("--inflight", type=int, default=1,
                        help="appends in flight (default: 1, each hop of one append; more: "
                             "the steps of a pipelined window, issued as `asyncbk bench "
                             "write` does)")
    args = parser.parse_args()
    if args.entries < 10:
        parser.error("--entries must be at least 10")
    if args.inflight < 1:
        parser.error("--inflight must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src = instrumented_copy(work)
        out = work / "marks"
        out.mkdir()
        script = work / "workload.py"
        pipelined = args.inflight > 1
        script.write_text(textwrap.dedent(WORKLOAD))
        env = {**os.environ, "PYTHONPATH": str(src), "ASYNCBK_HOPS_DIR": str(out)}
        subprocess.run([sys.executable, str(script), str(args.entries), str(args.inflight)],
                       env=env, check=True, timeout=600)
        (analyse_windows if pipelined else analyse)(*load(out))


if __name__ == "__main__":
    main()
