"""The command line: help everywhere, one-line errors, standalone, shell, bench."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from asyncbk.testing.cluster import LocalCluster

pytestmark = pytest.mark.integration

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    return env


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "asyncbk", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env())


@pytest.mark.parametrize("command", [
    [], ["standalone"], ["bookie"], ["bench"], ["bench", "write"], ["bench", "read"], ["shell"],
    ["shell", "listbookies"], ["shell", "listledgers"], ["shell", "ledgermetadata"],
    ["shell", "readledger"], ["shell", "simpletest"], ["shell", "bookieformat"],
    ["shell", "listunderreplicated"], ["shell", "whoisauditor"], ["shell", "recover"],
    ["shell", "decommission"], ["shell", "bookiesanity"], ["shell", "lastmark"],
    ["autorecovery"],
])
def test_help_everywhere(command: list[str]) -> None:
    r = run_cli(*command, "--help")
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout


@pytest.mark.parametrize(("args", "expect"), [
    (["bookie", "--port", "notaport"], "expected a port number"),
    (["bookie", "--port", "99999"], "port must be in 1..65535"),
    (["bookie", "--port", "4000"], "--metadata-uri is required"),
    (["bookie", "--metadata-uri", "http://x", "--port", "4000", "--journal-dir", "j",
      "--ledger-dir", "l"], "etcd://"),
    (["bookie", "--config", "/nonexistent/bookie.toml"], "does not exist"),
    (["standalone", "--bookies", "0"], "must be >= 1"),
    (["bench", "write", "--entries", "-5"], "must be >= 1"),
    (["bench", "write", "--rate", "0"], "must be > 0"),
    (["bench", "read", "--mode", "sideways"], "invalid choice"),
    (["bench", "write", "--ensemble", "5"], "needs at least that many --bookies"),
    (["bench", "write", "--write-quorum", "3", "--ack-quorum", "4"], "--ensemble >= --write"),
    (["nosuchcommand"], "invalid choice"),
    (["autorecovery"], "--metadata-uri"),
    (["autorecovery", "--metadata-uri", "etcd://127.0.0.1:1/x", "--rate", "-1"],
     "must be >= 0"),
    (["shell", "recover", "--metadata-uri", "etcd://127.0.0.1:1/x"], "BOOKIE"),
    (["shell", "lastmark", "--ledger-dir", "/nonexistent", "--journal-dir", "/nonexistent"],
     "is not a directory"),
    (["shell", "ledgermetadata", "--metadata-uri", "etcd://127.0.0.1:1/x", "12"],
     "cannot reach etcd"),
    (["bookie", "--metadata-uri", "etcd://127.0.0.1:1/x", "--port", "4000", "--journal-dir",
      "j", "--ledger-dir", "l"], "cannot reach etcd"),
])
def test_bad_input_is_one_line(args: list[str], expect: str, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # relative directories in the arguments land here
    r = run_cli(*args)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert expect in lines[0]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "j").exists(), "bad input must not create directories"


def test_bad_config_value_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "b.toml"
    cfg.write_text("[bookie]\nlease_ttl_s = 'soon'\n")
    r = run_cli("bookie", "--config", str(cfg), "--metadata-uri", "etcd://127.0.0.1:1/x",
                "--port", "4000", "--journal-dir", str(tmp_path / "j"),
                "--ledger-dir", str(tmp_path / "l"))
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0
    assert "lease_ttl_s" in r.stderr and "must be int" in r.stderr


async def test_standalone_runs_and_stops_cleanly(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncbk", "standalone", "--bookies", "2",
        "--data-dir", str(tmp_path / "data"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env())
    assert proc.stdout is not None
    uri = None
    try:
        async with asyncio.timeout(60):
            while True:
                line = (await proc.stdout.readline()).decode()
                assert line, "standalone exited early"
                if line.startswith("metadata URI:"):
                    uri = line.split(":", 1)[1].strip()
                if line.startswith("ready"):
                    break
        assert uri and uri.startswith("etcd://127.0.0.1:")
        r = await asyncio.to_thread(run_cli, "shell", "simpletest", "--metadata-uri", uri,
                                    "--ensemble", "2", "--write-quorum", "2", "--ack-quorum",
                                    "2", "--entries", "50")
        assert r.returncode == 0, r.stderr
        assert "OK" in r.stdout
        r = await asyncio.to_thread(run_cli, "shell", "listbookies", "--metadata-uri", uri)
        assert r.stdout.count("writable") == 2
    finally:
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(60):
            out, _ = await proc.communicate()
    assert proc.returncode == 0
    assert "stopped" in out.decode()
    layout = json.loads((tmp_path / "data" / "cluster.json").read_text())
    for port in layout["bookie_ports"] + [layout["etcd_port"]]:
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)


async def test_shell_commands_against_a_cluster(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 2, 2, password=b"pw")
    for i in range(3):
        await lh.append(b"line %d" % i)
    await lh.close()
    uri = cluster.metadata_uri
    r = await asyncio.to_thread(run_cli, "shell", "listledgers", "--metadata-uri", uri)
    assert str(lh.id) in r.stdout.split()
    r = await asyncio.to_thread(run_cli, "shell", "ledgermetadata", "--metadata-uri", uri,
                                str(lh.id))
    md = json.loads(r.stdout)
    assert md["state"] == "CLOSED" and md["last_entry_id"] == 2
    r = await asyncio.to_thread(run_cli, "shell", "readledger", "--metadata-uri", uri,
                                str(lh.id), "--password", "pw")
    assert r.stdout.splitlines() == ["0\tline 0", "1\tline 1", "2\tline 2"]
    r = await asyncio.to_thread(run_cli, "shell", "ledgermetadata", "--metadata-uri", uri,
                                "999999999")
    assert r.returncode == 1 and "999999999" in r.stderr


async def test_bench_write_json(cluster: LocalCluster, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    r = await asyncio.to_thread(
        run_cli, "bench", "write", "--entries", "2000", "--inflight", "64", "--entry-size",
        "256", "--ensemble", "3", "--write-quorum", "2", "--ack-quorum", "2", "--warmup", "100",
        "--metadata-uri", cluster.metadata_uri, "--json", str(out), timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["throughput_eps"] > 0 and data["throughput_mbps"] > 0
    lat = data["latency_us"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["p999"] <= lat["max"]


async def test_bench_read_catchup_in_two_client_processes(cluster: LocalCluster,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "read.json"
    r = await asyncio.to_thread(
        run_cli, "bench", "read", "--entries", "3000", "--ledgers", "3", "--clients", "2",
        "--batch", "200", "--entry-size", "100", "--metadata-uri", cluster.metadata_uri,
        "--json", str(out), timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["workload"] == "read-catchup"
    assert data["entries_done"] == 3000  # every entry written was read back
    assert sum(data["timeline"]["completed"]) == 3000
    assert data["latency_us"]["samples"] == 15  # 3 ledgers x 1000 entries / 200 per call
    assert data["config"]["clients"] == 2


async def test_bench_open_loop_tail_with_plot(cluster: LocalCluster, tmp_path: Path) -> None:
    out, png = tmp_path / "tail.json", tmp_path / "tail.png"
    r = await asyncio.to_thread(
        run_cli, "bench", "read", "--mode", "tail", "--entries", "1500", "--rate", "1000",
        "--ledgers", "2", "--metadata-uri", cluster.metadata_uri, "--json", str(out),
        "--plot", str(png), timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert (data["workload"], data["loop"]) == ("read-tail", "open")
    assert data["entries_done"] == 1500
    assert 0.8 < data["elapsed_s"] / 1.5 < 3  # offered at 1000/s: about 1.5 s
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_bench_duration_bounds_the_run(cluster: LocalCluster, tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    r = await asyncio.to_thread(
        run_cli, "bench", "write", "--entries", "1000000", "--rate", "500", "--duration", "1",
        "--warmup", "0", "--metadata-uri", cluster.metadata_uri, "--json", str(out),
        timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert 300 <= data["entries_done"] <= 700  # about 1 s at 500/s, not a million


async def test_shell_admin_commands(tmp_path: Path) -> None:
    async with LocalCluster(bookies=5, data_dir=tmp_path / "c") as cluster:
        bk = await cluster.client()
        uri = cluster.metadata_uri

        async def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return await asyncio.to_thread(run_cli, "shell", *args, "--metadata-uri", uri,
                                           timeout=120)

        r = await cli("listbookies")
        lines = r.stdout.splitlines()
        assert len(lines) == 5 and all("writable" in ln and "free" in ln for ln in lines)
        r = await cli("whoisauditor")
        assert r.returncode == 1 and "no auditor" in r.stdout
        assert "no under-replicated" in (await cli("listunderreplicated")).stdout
        r = await cli("bookiesanity", cluster.bookies[0].id)
        assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr

        data = [b"e%d" % i for i in range(300)]
        ledgers = []
        for _ in range(3):
            lh = await bk.create_ledger(3, 2, 2)
            await asyncio.gather(*(lh.append(d) for d in data))
            await lh.close()
            ledgers.append(lh.id)
        first_ensemble = (await bk.ledger_metadata(ledgers[0])).ensembles[0][1]
        by_id = {b.id: b for b in cluster.bookies}
        dead, leaving = by_id[first_ensemble[0]], by_id[first_ensemble[1]]  # both hold data
        dead.kill()
        await dead.wait()
        r = await cli("recover", dead.id, "--dry-run")
        assert r.returncode == 0 and "would copy" in r.stdout, r.stdout + r.stderr
        on_dead = [lid for lid in ledgers
                   if dead.id in (await bk.ledger_metadata(lid)).all_bookies()]
        assert on_dead and f"{len(on_dead)} of {len(ledgers)} ledgers" in r.stdout
        for lid in on_dead:  # a dry run changes nothing
            assert dead.id in (await bk.ledger_metadata(lid)).all_bookies()
        r = await cli("recover", dead.id)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "0 ledger(s) failed" in r.stdout
        for lid in ledgers:
            assert dead.id not in (await bk.ledger_metadata(lid)).all_bookies()

        r = await cli("decommission", leaving.id)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "is read-only" in r.stdout and "deleted the cookie" in r.stdout
        assert await bk.meta.read_cookie(leaving.id) is None
        for lid in ledgers:
            md = await bk.ledger_metadata(lid)
            assert not md.all_bookies() & {dead.id, leaving.id}
        await leaving.stop()
        reader = await cluster.client()
        for lid in ledgers:  # two of five bookies gone: everything still readable
            rh = await reader.open_ledger(lid)
            assert [e.data for e in await rh.read(0, 299)] == data

        r = await asyncio.to_thread(run_cli, "shell", "lastmark", "--ledger-dir",
                                    str(leaving.ledger_dir), "--journal-dir",
                                    str(leaving.journal_dir))
        assert r.returncode == 0 and "checkpoint mark: journal file" in r.stdout
        r = await cli("decommission", dead.id)  # not running: one clear line
        assert r.returncode == 1
        # registered until its lease expires (4 s), unreachable all along
        assert "not registered" in r.stderr or "cannot reach the admin endpoint" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
