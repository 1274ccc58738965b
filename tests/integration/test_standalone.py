"""``asyncbk standalone`` and the local-cluster runner under it: one cluster per data
directory, no processes left behind when it is killed, etcd's port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from asyncbk.local import LocalCluster
from asyncbk.local.process import STATE_FILE, process_alive, process_start_time
from asyncbk.testing.cluster import free_port

pytestmark = pytest.mark.integration

SRC = str(Path(__file__).resolve().parents[2] / "src")
READY_TIMEOUT_S = 60
GONE_TIMEOUT_S = 5


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    return env


@dataclass
class Standalone:
    proc: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    uri: str = ""
    pids: dict[str, int] = field(default_factory=dict)


async def _start(data_dir: Path, *extra: str) -> Standalone:
    """``asyncbk standalone`` until its ready line (fails the test if it exits first)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncbk", "standalone", "--data-dir", str(data_dir), *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env())
    s = Standalone(proc)
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            while True:
                line = (await proc.stdout.readline()).decode().rstrip("\n")
                if not line:
                    assert proc.stderr is not None
                    err = (await proc.stderr.read()).decode()
                    raise AssertionError(f"standalone exited early: {s.lines} {err}")
                s.lines.append(line)
                if line.startswith("metadata URI:"):
                    s.uri = line.split(":", 1)[1].strip()
                words = line.split()
                if len(words) >= 4 and words[0] in ("etcd", "bookie") and words[2] == "pid":
                    s.pids[f"{words[0]} {words[1]}"] = int(words[3])
                if line.startswith("ready"):
                    return s
    except BaseException:
        await _stop(s)
        raise


async def _stop(s: Standalone) -> None:
    """SIGINT (clean stop), SIGKILL if that takes too long; always reaps."""
    if s.proc.returncode is None:
        s.proc.send_signal(signal.SIGINT)
        try:
            async with asyncio.timeout(60):
                await s.proc.communicate()
        except TimeoutError:
            s.proc.kill()
    await s.proc.wait()


@contextlib.asynccontextmanager
async def standalone(data_dir: Path, *extra: str) -> AsyncIterator[Standalone]:
    s = await _start(data_dir, *extra)
    try:
        yield s
    finally:
        await _stop(s)


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "asyncbk", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env())


async def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still running after ``timeout_s`` (zombies count as gone)."""
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        alive = [p for p in alive if process_alive(p)]
    return alive


async def test_second_standalone_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with standalone(data, "--bookies", "1", "--etcd-port", str(free_port())) as first:
        assert first.lines[0] == f"starting etcd and 1 bookie in {data} ..."
        r = await asyncio.to_thread(_cli, "standalone", "--data-dir", str(data),
                                    "--bookies", "1")
        assert r.returncode == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        assert (f"asyncbk standalone is already running on {data.resolve()} "
                f"(pid {first.proc.pid}), metadata URI {first.uri}") in lines[0]
        assert "Traceback" not in r.stderr and "address already in use" not in r.stderr
        # the first one was not disturbed
        r = await asyncio.to_thread(_cli, "shell", "simpletest", "--metadata-uri", first.uri,
                                    "--ensemble", "1", "--write-quorum", "1",
                                    "--ack-quorum", "1", "--entries", "20")
        assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    assert first.proc.returncode == 0


async def test_killed_standalone_takes_its_processes_with_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = await _start(data, "--bookies", "2", "--etcd-port", str(free_port()))
    children = list(first.pids.values())
    try:
        assert len(children) == 3, first.lines  # etcd and two bookies
        state = json.loads((data / STATE_FILE).read_text())
        assert sorted(c["pid"] for c in state["children"]) == sorted(children)
        first.proc.kill()  # no chance to stop anything itself
        await first.proc.wait()
        left = await _wait_gone(children, GONE_TIMEOUT_S)
        assert not left, f"still running after the parent's SIGKILL: {left}"
    finally:
        for pid in children:  # never leave them behind, even when the test fails
            with contextlib.suppress(ProcessLookupError):
                if process_alive(pid):
                    os.kill(pid, signal.SIGKILL)
    # a new start on the same directory works, with the same bookie ids and data
    async with standalone(data, "--bookies", "2") as second:
        assert second.uri == first.uri
        assert sorted(second.pids) == sorted(first.pids)
        r = await asyncio.to_thread(_cli, "shell", "simpletest", "--metadata-uri", second.uri,
                                    "--ensemble", "2", "--write-quorum", "2",
                                    "--ack-quorum", "2", "--entries", "20")
        assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


def _dead_pid() -> int:
    """The pid of a process that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _sleeper(*marker: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *marker])


async def test_a_new_start_cleans_up_what_a_dead_owner_left(tmp_path: Path) -> None:
    """Processes recorded by an owner that died (as if the kernel's parent-death signal
    had not been available) are killed by the next start, but only those that are
    provably the recorded processes: a pid whose command line differs is left alone."""
    data = tmp_path / "data"
    data.mkdir()
    dead_owner = _dead_pid()
    leftover = _sleeper(str(data), "leftover")
    stranger = _sleeper(str(data), "stranger")
    try:
        for p in (leftover, stranger):
            for _ in range(50):  # started and exec'd: its command line is final
                if process_start_time(p.pid) is not None:
                    break
                await asyncio.sleep(0.05)
        record = {
            "owner": "asyncbk standalone", "pid": dead_owner, "start_time": 1,
            "metadata_uri": "etcd://127.0.0.1:1/asyncbk",
            "children": [
                {"name": "bookie 127.0.0.1:1", "pid": leftover.pid,
                 "start_time": process_start_time(leftover.pid), "argv": leftover.args},
                {"name": "bookie 127.0.0.1:2", "pid": stranger.pid,  # not what was recorded
                 "start_time": process_start_time(stranger.pid),
                 "argv": [sys.executable, "-c", "something else"]},
            ],
        }
        (data / STATE_FILE).write_text(json.dumps(record))
        async with LocalCluster(bookies=1, data_dir=data) as cluster:
            assert leftover.poll() == -signal.SIGKILL
            assert stranger.poll() is None
            assert any("stopped 1 process(es) left running" in n and str(leftover.pid) in n
                       for n in cluster.notes), cluster.notes
            state = json.loads((data / STATE_FILE).read_text())
            assert state["pid"] == os.getpid()
            assert {c["pid"] for c in state["children"]} == {cluster.etcd.pid,  # type: ignore[union-attr]
                                                            cluster.bookies[0].pid}
        assert not (data / STATE_FILE).exists()  # a clean stop leaves nothing to clean
    finally:
        for p in (leftover, stranger):
            p.kill()
            p.wait()


async def test_standalone_etcd_port(tmp_path: Path) -> None:
    # an explicit --etcd-port is used as given
    port = free_port()
    async with standalone(tmp_path / "a", "--bookies", "1", "--etcd-port", str(port)) as s:
        assert s.uri == f"etcd://127.0.0.1:{port}/asyncbk"
        # ... and when it is taken: one clear line, nothing started
        r = await asyncio.to_thread(_cli, "standalone", "--data-dir", str(tmp_path / "b"),
                                    "--bookies", "1", "--etcd-port", str(port))
        assert r.returncode == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and f"port {port} is in use" in lines[0], r.stderr
        assert "choose another" in lines[0]


async def test_standalone_default_etcd_port_is_2379_else_a_free_one(tmp_path: Path) -> None:
    # Hold 2379 (if someone else already does, so much the better): standalone says it
    # is taken and runs on another port, with a URI that works.
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        with contextlib.suppress(OSError):
            blocker.bind(("127.0.0.1", 2379))
            blocker.listen()
        async with standalone(tmp_path / "data", "--bookies", "1") as s:
            assert any(line.startswith("note: port 2379 (the default) is in use")
                       for line in s.lines), s.lines
            assert s.uri.startswith("etcd://127.0.0.1:") and ":2379/" not in s.uri
            r = await asyncio.to_thread(_cli, "shell", "listbookies", "--metadata-uri", s.uri)
            assert r.returncode == 0 and r.stdout.count("writable") == 1, r.stderr
    finally:
        blocker.close()
    r = await asyncio.to_thread(_cli, "standalone", "--help")
    assert "2379" in r.stdout


async def test_local_cluster_takes_the_preferred_etcd_port_when_free(tmp_path: Path) -> None:
    """What makes the README's etcd://127.0.0.1:2379/asyncbk work as written: the
    preferred port is taken when free (2379 itself may be busy on a test machine, so
    the same logic is shown on another free port)."""
    port = free_port()
    async with LocalCluster(bookies=0, data_dir=tmp_path / "c",
                            etcd_port_preferred=port) as cluster:
        assert cluster.metadata_uri == f"etcd://127.0.0.1:{port}/asyncbk"
        assert cluster.notes == []


async def test_standalone_whose_bookie_port_is_taken_says_so(tmp_path: Path) -> None:
    """A bookie keeps its port across runs (its id is host:port): when another process
    has taken it meanwhile, one line says which port and what to do, and the etcd
    already started is stopped again."""
    data = tmp_path / "data"
    async with LocalCluster(bookies=1, data_dir=data) as cluster:
        port = cluster.bookies[0].port
    with socket.socket() as taker:
        taker.bind(("127.0.0.1", port))
        taker.listen()
        r = await asyncio.to_thread(_cli, "standalone", "--data-dir", str(data),
                                    "--bookies", "1")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"port {port} is in use (by pid {os.getpid()}" in lines[0]
    assert "keeps its port" in lines[0]
    assert not (data / STATE_FILE).exists()  # everything it started was stopped
    async with LocalCluster(bookies=1, data_dir=data) as cluster:  # and it runs again
        assert cluster.bookies[0].port == port
