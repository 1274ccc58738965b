"""``format("asyncbk")`` on a real Spark standalone cluster: a master and two workers.

The local[2] tests run the data source's Python code in worker processes of one
machine-local executor.  Here the reads and the sink's writes run in two
executors, each started by its own standalone worker (one core, 512 MiB), as on
a cluster: the source and the sink must pickle, be importable by the executors'
Python, and connect to the cluster themselves.

The master and the workers are the JVMs of the pyspark installation
(``bin/spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``),
each in a process group of its own, on free loopback ports, with their files under
``tmp_path``.  The driver runs in a subprocess (``standalone_job.py``): this
process may already hold the ``spark`` fixture's SparkContext, and a process has
one.  Every process started here is killed in ``finally`` (SIGTERM to its process
group, then SIGKILL), executors and Python workers with their worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest

from asyncbk.local.ports import free_port
from asyncbk.stream import Position

from .conftest import ClusterThread

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

WORKERS = 2
REGISTER_TIMEOUT_S = 60.0
"""Longest wait for the master to be up, and then for it to list both workers alive."""
JOB_TIMEOUT_S = 180.0
"""Longest run of the driver subprocess."""
STOP_GRACE_S = 10.0
RECORDS = 200
PER_PARTITION = 40
JOB = Path(__file__).with_name("standalone_job.py")
JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""For every JVM here, driver and executors too: short-lived, on few cores, so the
quick compiler and one GC thread (less CPU at start-up)."""


class Daemons:
    """The JVMs this test starts, each in its own process group, with its log file."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.spark_home = Path(pyspark.__file__).resolve().parent
        conf_dir = base / "conf"  # empty: no spark-defaults or spark-env from elsewhere
        conf_dir.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "SPARK_HOME": str(self.spark_home),
                    "SPARK_CONF_DIR": str(conf_dir), "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_DAEMON_MEMORY": "256m", "SPARK_DAEMON_JAVA_OPTS": JVM_OPTS,
                    # no REST submission server (it would take port 6066)
                    "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
                    "SPARK_LOG_DIR": str(base / "logs"), "PYSPARK_PYTHON": sys.executable}

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        log = self.base / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([str(self.spark_home / "bin" / "spark-class"), *args],
                                    stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env={**self.env, **(env or {})},
                                    cwd=self.base, start_new_session=True)
        self.procs.append((name, proc, log))

    def check_alive(self) -> None:
        for name, proc, _ in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with status {proc.returncode}\n"
                                     f"{self.logs()}")

    def logs(self, tail_lines: int = 30) -> str:
        out = []
        for name, _, log in self.procs:
            lines = log.read_text(errors="replace").splitlines() if log.exists() else []
            out.append(f"--- {name} ({log}), last {tail_lines} lines:\n"
                       + "\n".join(lines[-tail_lines:]))
        return "\n".join(out)

    def stop(self) -> None:
        """SIGTERM to every group, then SIGKILL to what is left after the grace period."""
        for _, proc, _ in self.procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for _, proc, _ in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        for _, proc, _ in self.procs:
            # the group too: executors and Python workers outlive a worker JVM's exit
            _signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def _signal_group(proc: subprocess.Popen[Any], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


@contextlib.contextmanager
def standalone_cluster(base: Path) -> Iterator[tuple[str, Daemons]]:
    """A master and two workers; yields the master URL once both workers are alive."""
    daemons = Daemons(base)
    port, web = free_port(), free_port()
    try:
        daemons.start("master", ["org.apache.spark.deploy.master.Master", "--host",
                                 "127.0.0.1", "--port", str(port), "--webui-port", str(web)])
        # workers that register before the master is ALIVE are ignored and retry only
        # after 10 s: start them once it is
        state = poll_master(daemons, web, lambda st: st.get("status") == "ALIVE", "ALIVE")
        url = str(state["url"])  # spark://127.0.0.1:PORT (Spark moves on if PORT was taken)
        for i in range(WORKERS):
            work = base / f"worker{i}"
            (work / "local").mkdir(parents=True)
            daemons.start(f"worker{i}", [
                "org.apache.spark.deploy.worker.Worker", url, "--cores", "1",
                "--memory", "512m", "--host", "127.0.0.1", "--port", str(free_port()),
                "--webui-port", str(free_port()), "--work-dir", str(work)],
                env={"SPARK_WORKER_DIR": str(work), "SPARK_LOCAL_DIRS": str(work / "local")})
        poll_master(daemons, web, lambda st: st.get("aliveworkers") == WORKERS,
                    f"listing {WORKERS} alive workers")
        yield url, daemons
    finally:
        daemons.stop()


def poll_master(daemons: Daemons, web_port: int, done: Callable[[dict[str, Any]], bool],
                what: str) -> dict[str, Any]:
    """Poll the master's JSON page until ``done(state)`` (bounded); that state."""
    deadline = time.monotonic() + REGISTER_TIMEOUT_S
    state: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        daemons.check_alive()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json/", timeout=5) as r:
                state = json.load(r)
        except (OSError, ValueError):  # not up yet
            state = None
        if state is not None and done(state):
            return state
        time.sleep(0.25)
    raise AssertionError(f"the master was not {what} within {REGISTER_TIMEOUT_S:g} s "
                         f"(last state: {state})\n{daemons.logs()}")


def run_job(args: dict[str, Any], cwd: Path) -> dict[str, Any]:
    """Run standalone_job.py (bounded, its process group killed on timeout); its result."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("SPARK_HOME", None)  # the driver finds its own: the installed pyspark
    proc = subprocess.Popen([sys.executable, str(JOB), json.dumps(args)], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"the driver did not finish within {JOB_TIMEOUT_S:g} s\n"
                             f"{err.decode(errors='replace')[-5000:]}") from None
    finally:
        _signal_group(proc, signal.SIGKILL)  # its JVM and Python workers, if any are left
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"the driver exited with status {proc.returncode}\n"
        f"stdout: {out.decode(errors='replace')[-2000:]}\n"
        f"stderr: {err.decode(errors='replace')[-8000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    return result


def write_source(sc: ClusterThread, ns: str, stream: str) -> list[list[Any]]:
    """``RECORDS`` records in two segments (two writer sessions); returns them as the
    job reports rows: [stream, position, txid, data hex]."""

    async def go() -> list[list[Any]]:
        assert sc.bk is not None
        nsobj = await sc.bk.namespace(ns)
        await nsobj.create_stream(stream)
        out: list[list[Any]] = []
        for lo, hi in ((0, RECORDS // 2), (RECORDS // 2, RECORDS)):
            async with await nsobj.open_writer(stream) as w:
                datas = [f"{stream}-{i}".encode() * (1 + i % 7) for i in range(lo, hi)]
                futures = [w.write_nowait(d) for d in datas]
                positions: list[Position] = list(await asyncio.gather(*futures))
                out += [[stream, str(p), lo + k, d.hex()]
                        for k, (p, d) in enumerate(zip(positions, datas, strict=True))]
        return out

    return sc.run(go())


async def _subscriptions(sc: ClusterThread, ns: str, stream: str) -> list[Any]:
    assert sc.bk is not None
    return await (await sc.bk.namespace(ns)).subscriptions(stream)


def test_batch_and_streaming_on_a_standalone_cluster(spark_cluster: ClusterThread, ns: str,
                                                     tmp_path: Path) -> None:
    started = time.monotonic()
    written = write_source(spark_cluster, ns, "source")
    assert [r[2] for r in written] == list(range(RECORDS))  # txids 0..N-1, one per record
    with standalone_cluster(tmp_path / "spark") as (master, daemons):
        result = run_job({
            "master": master, "metadata_uri": spark_cluster.metadata_uri, "namespace": ns,
            "source": "source", "sink": "sink", "per_partition": PER_PARTITION,
            "checkpoint": str(tmp_path / "checkpoint"), "local_dir": str(tmp_path / "driver"),
            "driver_port": free_port(), "block_manager_port": free_port(),
            "jvm_opts": JVM_OPTS,
        }, tmp_path)
        daemons.check_alive()

    # the driver and one executor per worker
    assert len(result["executors"]) == 1 + WORKERS, result["executors"]
    # the batch read: every record once, in position order, as written, from partitions
    # of at most PER_PARTITION records
    assert result["batch_partitions"] >= RECORDS // PER_PARTITION
    assert result["batch"] == written
    # the availableNow query read all of it, and its sink wrote each record exactly once,
    # in order (task ledgers are adopted in partition order); the txid column of the
    # rows it was given is kept
    assert sum(p["numInputRows"] for p in result["progress"]) == RECORDS, result["progress"]
    # routed by the stream column: even txids to sink-even, odd to sink-odd, each in
    # order, and the whole of each batch committed in both at once
    sink = result["written"]
    for name, parity in (("sink-even", 0), ("sink-odd", 1)):
        got = sorted((r for r in sink if r[0] == name), key=lambda r: Position.parse(r[1]))
        assert [(r[2], r[3]) for r in got] == \
            [(r[2], r[3]) for r in written if r[2] % 2 == parity], name
    assert len(sink) == RECORDS
    # the query's progress is published as the subscription etl of the source: at its
    # end, where the query stopped
    infos = spark_cluster.run(_subscriptions(spark_cluster, ns, "source"))
    end = max(Position.parse(r[1]) for r in written)
    assert [(i.name, i.lag_records) for i in infos] == [("etl", 0)] and infos[0].position > end
    elapsed = time.monotonic() - started
    print(f"standalone cluster test: {elapsed:.1f} s; driver: {result['seconds']}")  # noqa: T201
