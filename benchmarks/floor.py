"""What this machine allows a replicated append in Python: the floor under asyncbk's
figures, measured with the least program that does the same work.

Three server processes (uvloop, one per "bookie") each append what they receive to
their own preallocated file on the same disk as asyncbk's journals, make it durable,
and answer; one client process (uvloop) sends every append to all three and counts it
done at the second answer (E3 Qw3 Qa2, 1 KiB).  There is no protocol beyond a 4-byte
length, no digest, no index, no entry log, no metadata: whatever asyncbk measures above
these figures is its own; what these figures cost, no design of a Python bookie on this
machine avoids.

Where the server makes a batch durable (``--modes``):

* ``loop``: ``fdatasync`` on the event loop (blocking it: the least wake-ups possible);
* ``thread``: ``fdatasync`` on a writer thread, the answer handed back to the loop
  (asyncbk's shape: the loop never blocks on the disk);
* ``uring``: the write and its ``fdatasync`` submitted from the loop through io_uring
  (linked), their completion read from the ring's eventfd by the loop (the loop never
  blocks, and no thread of the program's own takes the GIL);
* ``none``: no sync (the network, the processes and Python only).

Two loads, as ``asyncbk bench write``: sequential (one append in flight) and pipelined
(``--inflight`` in flight; each server syncs what one read brought, as a group commit).

    python benchmarks/floor.py [--modes loop,thread,uring,none] [--rounds 2]
        [--sequential-entries 3000] [--entries 100000] [--inflight 256] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import uvloop

HEADER = struct.Struct(">I")
FILE_BYTES = 512 << 20


class Server(asyncio.Protocol):
    """Appends each read's whole frames to the file, syncs them (``mode``), answers each
    frame with its 4-byte count."""

    def __init__(self, fd: int, mode: str, writer: queue.SimpleQueue[Any] | None) -> None:
        self.fd, self.mode, self.writer = fd, mode, writer
        self.buf = bytearray()
        self.offset = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, frames, end = 0, 0, len(buf)
        while end - pos >= 4:
            (n,) = HEADER.unpack_from(buf, pos)
            if end - pos - 4 < n:
                break
            pos += 4 + n
            frames += 1
        if not frames:
            return
        chunk = bytes(buf[:pos])
        del buf[:pos]
        offset, self.offset = self.offset, self.offset + len(chunk)
        answer = HEADER.pack(frames)
        if self.mode == "thread":
            assert self.writer is not None
            self.writer.put((chunk, offset, answer, self.transport))
            return
        if self.mode == "uring":
            assert self.writer is not None and self.transport is not None
            self.writer.submit(chunk, offset, answer, self.transport)
            return
        os.pwrite(self.fd, chunk, offset)
        if self.mode == "loop":
            os.fdatasync(self.fd)
        assert self.transport is not None
        self.transport.write(answer)


def answer_to(transport: asyncio.Transport, answer: bytes) -> None:
    if not transport.is_closing():  # (the client may be gone: the run is over)
        transport.write(answer)


class UringWriter:
    """``uring``: each read's frames written and fdatasynced through io_uring (a write
    linked to an fdatasync), submitted from the loop; the ring's eventfd, read by the
    loop, says when they completed.  No thread of the program's own, no GIL hand-off."""

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        import liburing  # (the bench extra; only this mode needs it)

        self.L = liburing
        self.fd = fd
        self.ring = liburing.Ring()
        liburing.io_uring_queue_init(4096, self.ring, 0)
        self.cqe = liburing.Cqe()
        self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        liburing.io_uring_register_eventfd(self.ring, self.efd)
        self.jobs: dict[int, tuple[bytes, bytes, asyncio.Transport]] = {}
        self.next_id = 1
        loop.add_reader(self.efd, self.completed)

    def submit(self, chunk: bytes, offset: int, answer: bytes,
               transport: asyncio.Transport) -> None:
        L, ring = self.L, self.ring
        job = self.next_id
        self.next_id += 1
        self.jobs[job] = (chunk, answer, transport)
        sqe = L.io_uring_get_sqe(ring)
        L.io_uring_prep_write(sqe, self.fd, chunk, offset)
        L.io_uring_sqe_set_flags(sqe, L.IOSQE_IO_LINK)
        L.io_uring_sqe_set_data64(sqe, 0)
        sqe = L.io_uring_get_sqe(ring)
        L.io_uring_prep_fsync(sqe, self.fd, L.IORING_FSYNC_DATASYNC)
        L.io_uring_sqe_set_data64(sqe, job)
        L.io_uring_submit(ring)

    def completed(self) -> None:
        try:
            os.read(self.efd, 8)
        except BlockingIOError:
            pass
        L, ring, cqe = self.L, self.ring, self.cqe
        while True:
            ready = L.io_uring_cq_ready(ring)
            if not ready:
                return
            L.io_uring_peek_cqe(ring, cqe)
            for k in range(ready):
                c = cqe[k]
                if c.res < 0:
                    raise OSError(-c.res, "io_uring write or fdatasync failed")
                job = c.user_data
                if job:
                    _chunk, answer, transport = self.jobs.pop(job)
                    answer_to(transport, answer)
            L.io_uring_cq_advance(ring, ready)


def serve(port_file: Path, path: Path, mode: str) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.posix_fallocate(fd, 0, FILE_BYTES)
    os.fsync(fd)
    loop = uvloop.new_event_loop()
    writer: queue.SimpleQueue[Any] | None = None
    if mode == "thread":
        writer = queue.SimpleQueue()
        jobs = writer

        def write_then_answer() -> None:
            while True:
                chunk, offset, answer, transport = jobs.get()
                os.pwrite(fd, chunk, offset)
                os.fdatasync(fd)
                loop.call_soon_threadsafe(answer_to, transport, answer)

        threading.Thread(target=write_then_answer, daemon=True).start()

    elif mode == "uring":
        writer = UringWriter(fd, loop)  # type: ignore[assignment]

    server = loop.run_until_complete(
        loop.create_server(lambda: Server(fd, mode, writer), "127.0.0.1", 0))
    port_file.write_text(str(server.sockets[0].getsockname()[1]))
    loop.run_forever()


class Replica(asyncio.Protocol):
    """The client's side of one server: each answer acknowledges that many frames."""

    def __init__(self, on_acks: Any) -> None:
        self.on_acks = on_acks
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        acked = 0
        while len(buf) >= 4:
            acked += HEADER.unpack_from(buf, 0)[0]
            del buf[:4]
        if acked:
            self.on_acks(self, acked)


async def client(ports: list[int], sequential: int, entries: int, inflight: int,
                 size: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    frame = HEADER.pack(size) + os.urandom(size)
    acked: dict[Any, int] = {}
    done = 0
    waiter: asyncio.Future[None] | None = None
    want = 0

    def on_acks(replica: Any, n: int) -> None:
        nonlocal done, waiter
        acked[replica] += n
        quorum = sorted(acked.values())[-2]  # the second answer completes an append
        if quorum > done:
            done = quorum
            if waiter is not None and done >= want and not waiter.done():
                waiter.set_result(None)

    transports = []
    for port in ports:
        transport, replica = await loop.create_connection(lambda: Replica(on_acks),
                                                          "127.0.0.1", port)
        acked[replica] = 0
        transports.append(transport)

    async def until(n: int) -> None:
        nonlocal waiter, want
        if done >= n:
            return
        want, waiter = n, loop.create_future()
        await waiter

    latencies = []
    for i in range(sequential):
        t0 = time.perf_counter_ns()
        for transport in transports:
            transport.write(frame)
        await until(i + 1)
        latencies.append(time.perf_counter_ns() - t0)
    latencies.sort()
    base = sequential
    t0 = time.perf_counter()
    sent = 0
    while done < base + entries:
        room = min(base + entries, done + inflight) - (base + sent)
        if room > 0:
            data = frame * room
            for transport in transports:
                transport.write(data)
            sent += room
        await until(min(base + sent, done + 1))
    elapsed = time.perf_counter() - t0
    for transport in transports:
        transport.close()
    return {"sequential_p50_us": latencies[len(latencies) // 2] / 1000,
            "sequential_p99_us": latencies[int(len(latencies) * 0.99)] / 1000,
            "pipelined_eps": entries / elapsed}


def run_mode(mode: str, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    procs, ports = [], []
    try:
        for i in range(3):
            port_file = workdir / f"port{i}"
            port_file.unlink(missing_ok=True)
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--serve", str(port_file),
                 str(workdir / f"server{i}.dat"), mode]))
            for _ in range(500):
                if port_file.exists() and port_file.read_text():
                    break
                time.sleep(0.02)
            ports.append(int(port_file.read_text()))
        return uvloop.run(client(ports, args.sequential_entries, args.entries, args.inflight,
                                 args.entry_size))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        for i in range(3):
            (workdir / f"server{i}.dat").unlink(missing_ok=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="loop,thread,none",
                   help="where a server syncs: loop, thread, uring, none (comma-separated)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every mode")
    p.add_argument("--sequential-entries", type=int, default=3000)
    p.add_argument("--entries", type=int, default=100_000, help="pipelined appends")
    p.add_argument("--inflight", type=int, default=256)
    p.add_argument("--entry-size", type=int, default=1024)
    p.add_argument("--dir", default=None,
                   help="where the servers' files go (default: a temporary directory "
                        "beside asyncbk's own: the same disk)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--serve", nargs=3, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), Path(args.serve[1]), args.serve[2])
        return
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= {"loop", "thread", "uring", "none"}:
        p.error(f"--modes takes loop, thread, uring and none, not {args.modes!r}")
    if "uring" in modes:
        try:
            import liburing  # noqa: F401
        except ImportError:
            p.error("--modes uring needs liburing (pip install -e '.[bench]'; Linux only)")
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="asyncbk-floor-", dir=args.dir) as tmp:
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for mode in order:
                res = run_mode(mode, Path(tmp), args)
                results[mode].append(res)
                print(f"round {r + 1} {mode:7} sequential p50 {res['sequential_p50_us']:6.0f} us"
                      f"  p99 {res['sequential_p99_us']:6.0f} us"
                      f"  pipelined {res['pipelined_eps']:8.0f}/s", flush=True)
    print(f"\nmedians of {args.rounds} rounds")
    summary = {}
    for mode, runs in results.items():
        med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        summary[mode] = {"median": med, "runs": runs}
        print(f"{mode:7} sequential p50 {med['sequential_p50_us']:6.0f} us"
              f"  p99 {med['sequential_p99_us']:6.0f} us  pipelined {med['pipelined_eps']:8.0f}/s")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
