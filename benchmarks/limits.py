"""The two physical limits asyncbk runs into on a machine, measured in one run:

1. the group-commit append rate of this disk: one thread appends batches of
   1 KiB records to a file and fdatasyncs after each batch (what a bookie's
   journal does), for several batch sizes;
2. the round trip of a bare Python msgpack echo over loopback (asyncio +
   uvloop, one connection, one request in flight), the floor under any
   request/response latency.

    python benchmarks/limits.py [--seconds 3] [--json limits.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import tempfile
import time

import msgpack
import uvloop


def fsync_rate(directory: str, batch_records: int, record_bytes: int, seconds: float) -> dict:
    path = os.path.join(directory, f"limits-{batch_records}.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    batch = os.urandom(record_bytes) * batch_records
    syncs = 0
    t0 = time.perf_counter()
    sync_s: list[float] = []
    try:
        while time.perf_counter() - t0 < seconds:
            os.write(fd, batch)
            s0 = time.perf_counter()
            os.fdatasync(fd)
            sync_s.append(time.perf_counter() - s0)
            syncs += 1
    finally:
        os.close(fd)
        os.unlink(path)
    elapsed = time.perf_counter() - t0
    return {"batch_records": batch_records, "fsyncs_per_s": syncs / elapsed,
            "records_per_s": syncs * batch_records / elapsed,
            "fdatasync_us_p50": statistics.median(sync_s) * 1e6}


async def echo_rtt(requests: int) -> dict:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readexactly(4)
            except asyncio.IncompleteReadError:
                return
            body = await reader.readexactly(struct.unpack(">I", head)[0])
            reply = msgpack.packb(msgpack.unpackb(body))
            writer.write(struct.pack(">I", len(reply)) + reply)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    msg = msgpack.packb([1, 1, 0, 1, 2, b"k" * 32, 0, -1, b"x" * 1024])
    frame = struct.pack(">I", len(msg)) + msg
    rtts = []
    for _ in range(requests):
        t = time.perf_counter()
        writer.write(frame)
        head = await reader.readexactly(4)
        await reader.readexactly(struct.unpack(">I", head)[0])
        rtts.append((time.perf_counter() - t) * 1e6)
    writer.close()
    server.close()
    rtts.sort()
    return {"requests": requests, "rtt_us_p50": rtts[len(rtts) // 2],
            "rtt_us_p99": rtts[int(len(rtts) * 0.99)],
            "round_trips_per_s": 1e6 / statistics.mean(rtts)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0, help="per fsync measurement")
    p.add_argument("--dir", default=None, help="directory on the disk to measure (default: temp)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        fsync = [fsync_rate(d, n, 1024, args.seconds) for n in (1, 16, 256)]
    echo = uvloop.run(echo_rtt(5000))
    result = {"fsync": fsync, "echo": echo}
    for r in fsync:
        print(f"fdatasync, {r['batch_records']:>3} x 1 KiB per batch: {r['fsyncs_per_s']:,.0f} "
              f"fsyncs/s = {r['records_per_s']:,.0f} records/s (fdatasync p50 "
              f"{r['fdatasync_us_p50']:.0f} us)")
    print(f"msgpack echo over loopback: rtt p50 {echo['rtt_us_p50']:.0f} us, p99 "
          f"{echo['rtt_us_p99']:.0f} us ({echo['round_trips_per_s']:,.0f} round trips/s)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
