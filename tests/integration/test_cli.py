"""The command line: help everywhere, one-line errors, standalone, shell, bench."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from asyncbk.cli.main import build_parser
from asyncbk.errors import NoSuchLedgerError
from asyncbk.testing.cluster import LocalCluster, free_port

from .clitools import cli_env, run_with_terminal

pytestmark = pytest.mark.integration



def run_cli(*args: str, timeout: float = 60, env: dict[str, str] | None = None,
            stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "asyncbk", *args], capture_output=True,
                          text=True, timeout=timeout, env=env or cli_env(), stdin=stdin)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command (asserts there is exactly one)."""
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize("command", [
    [], ["standalone"], ["bookie"], ["bench"], ["bench", "write"], ["bench", "read"], ["shell"],
    ["shell", "listbookies"], ["shell", "listledgers"], ["shell", "ledgermetadata"],
    ["shell", "readledger"], ["shell", "simpletest"], ["shell", "bookieformat"],
    ["shell", "listunderreplicated"], ["shell", "whoisauditor"], ["shell", "recover"],
    ["shell", "decommission"], ["shell", "bookiesanity"], ["shell", "lastmark"],
    ["shell", "deleteledger"], ["shell", "placementcheck"], ["autorecovery"],
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
    (["bench", "write", "--index-backend", "disk"], "invalid choice"),
    (["bench", "write", "--metadata-uri", "etcd://127.0.0.1:1/x", "--index-backend", "lmdb"],
     "not with --metadata-uri"),
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
    (["bookie", "--metadata-uri", "etcd://127.0.0.1:1/x", "--port", "4000", "--journal-dir",
      "j", "--ledger-dir", "l", "--etcd-ca", "/nonexistent/ca.pem"], "write it etcds://"),
    (["bookie", "--metadata-uri", "etcd://127.0.0.1:1/x", "--port", "4000", "--journal-dir",
      "j", "--ledger-dir", "l", "--etcd-password-file", "/nonexistent/pw"],
     "needs etcd_user (--etcd-user)"),
    (["bookie", "--metadata-uri", "etcds://127.0.0.1:1/x", "--port", "4000", "--journal-dir",
      "j", "--ledger-dir", "l", "--etcd-user", "u", "--etcd-password-file", "/nonexistent/pw"],
     "etcd password file '/nonexistent/pw': no such file"),
    (["autorecovery", "--metadata-uri", "etcd://127.0.0.1:1/x", "--http-port", "4001",
      "--http-tls-cert", "c.pem"], "needs both --http-tls-cert and --http-tls-key"),
    (["autorecovery", "--metadata-uri", "etcd://127.0.0.1:1/x", "--http-tls-cert", "c.pem",
      "--http-tls-key", "k.pem"], "give --http-port too"),
    (["shell", "listbookies", "--metadata-uri", "etcd://127.0.0.1:1/x", "--etcd-user", "u"],
     "needs a password"),
    (["stream", "list", "--metadata-uri", "etcds://127.0.0.1:1/x", "n",
      "--etcd-cert", "c.pem"], "needs both its file and its key file"),
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
        "--data-dir", str(tmp_path / "data"), "--etcd-port", str(free_port()),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env())
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


async def test_shell_commands_against_a_cluster(cluster: LocalCluster, tmp_path: Path) -> None:
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
    password_file = tmp_path / "password"
    password_file.write_text("pw\n")
    r = await asyncio.to_thread(run_cli, "shell", "readledger", "--metadata-uri", uri,
                                str(lh.id), "--password-file", str(password_file))
    assert r.stdout.splitlines() == ["0\tline 0", "1\tline 1", "2\tline 2"]
    r = await asyncio.to_thread(run_cli, "shell", "readledger", "--metadata-uri", uri,
                                str(lh.id), env={**cli_env(), "ASYNCBK_LEDGER_PASSWORD": "pw"})
    assert r.stdout.splitlines() == ["0\tline 0", "1\tline 1", "2\tline 2"]
    r = await asyncio.to_thread(run_cli, "shell", "readledger", "--metadata-uri", uri,
                                str(lh.id))  # no password: refused, in one line
    assert "pw" not in one_line_error(r)
    r = await asyncio.to_thread(run_cli, "shell", "readledger", "--metadata-uri", uri,
                                str(lh.id), "--password-file", str(tmp_path / "missing"))
    assert "cannot read the password file" in one_line_error(r)
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


# ------------------------------------------------------------------ autorecovery --grace-s


def test_autorecovery_grace_s_is_the_lost_bookie_delay() -> None:
    base = ["autorecovery", "--metadata-uri", "etcd://127.0.0.1:1/x"]
    assert build_parser().parse_args([*base, "--grace-s", "7"]).lost_bookie_delay == 7
    assert build_parser().parse_args([*base, "--lost-bookie-delay", "9"]).lost_bookie_delay == 9
    assert build_parser().parse_args(base).lost_bookie_delay == 30
    r = run_cli("autorecovery", "--help")
    assert "--grace-s" in r.stdout and "--lost-bookie-delay" in r.stdout
    r = run_cli(*base, "--grace-s", "-1")
    assert r.returncode == 2 and "must be >= 0" in r.stderr


async def test_autorecovery_process_runs_with_grace_s(cluster: LocalCluster) -> None:
    ar = await cluster.start_autorecovery(grace_s=2)
    assert ar.running and "--grace-s" in ar.argv


# ------------------------------------------------------------------ bookie start-up checks


def _bookie_args(cluster: LocalCluster, port: int, where: Path) -> list[str]:
    return ["bookie", "--metadata-uri", cluster.metadata_uri, "--port", str(port),
            "--journal-dir", str(where / "journal"), "--ledger-dir", str(where / "ledgers")]


async def test_bookie_on_the_port_of_a_live_bookie_is_told_so(cluster: LocalCluster,
                                                              tmp_path: Path) -> None:
    live = cluster.bookies[0]
    r = await asyncio.to_thread(run_cli, *_bookie_args(cluster, live.port, tmp_path / "new"))
    line = one_line_error(r)
    assert f"a bookie with id {live.id} is already registered and running" in line
    assert "--delete-cookie" not in line and "wiped" not in line
    bk = await cluster.client()
    assert await bk.meta.read_cookie(live.id) is not None  # nothing touched
    assert live.running and live.id in await bk.meta.list_bookies()
    assert not (tmp_path / "new").exists()


async def test_bookie_on_a_port_another_process_uses_is_told_so(cluster: LocalCluster,
                                                                tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        r = await asyncio.to_thread(run_cli, *_bookie_args(cluster, port, tmp_path / "b"))
    line = one_line_error(r)
    assert f"port {port} is in use (by pid {os.getpid()}" in line
    assert "choose another --port" in line
    assert "cookie" not in line


async def test_wiped_bookie_advice_comes_only_when_it_is_not_live(cluster: LocalCluster,
                                                                  tmp_path: Path) -> None:
    b = cluster.bookies[0]
    await b.stop()  # gracefully: its registration is gone at once
    r = await asyncio.to_thread(run_cli, *_bookie_args(cluster, b.port, tmp_path / "empty"))
    line = one_line_error(r)
    assert "disk was wiped or replaced" in line
    assert "--delete-cookie" in line and "really gone" in line
    await b.start()  # its own directories: fine


async def test_a_crashed_bookie_restarts_while_its_registration_lingers(
        cluster: LocalCluster) -> None:
    """SIGKILL leaves the registration until the lease expires; nothing answers at the
    address, so a restart is not mistaken for a second live process."""
    b = cluster.bookies[1]
    b.kill()
    await b.wait()
    bk = await cluster.client()
    assert b.id in await bk.meta.list_bookies()  # the lease (4 s) has not expired yet
    await b.start()
    assert b.running


# ------------------------------------------------------------------ shell


async def test_shell_on_a_wrong_root_says_there_is_no_cluster(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 2, 2)
    await lh.close()
    wrong = cluster.metadata_uri.rsplit("/", 1)[0] + "/wrongroot"
    for command in ("listbookies", "listledgers", "listunderreplicated", "simpletest"):
        r = await asyncio.to_thread(run_cli, "shell", command, "--metadata-uri", wrong)
        line = one_line_error(r)
        assert f"no asyncbk cluster at {wrong}" in line
        assert "no bookie ever started" in line
    r = await asyncio.to_thread(run_cli, "shell", "listledgers", "--metadata-uri", wrong)
    assert r.stdout == ""
    for uri in (cluster.metadata_uri, cluster.metadata_uri + "/"):  # the right root works
        r = await asyncio.to_thread(run_cli, "shell", "listledgers", "--metadata-uri", uri)
        assert r.returncode == 0 and r.stdout.split() == [str(lh.id)], r.stderr


async def test_shell_custom_metadata_and_deleteledger(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 2, 2, metadata={"app": b"demo", "blob": b"\xff\x00"})
    await lh.append(b"x")
    await lh.close()
    uri = cluster.metadata_uri
    r = await asyncio.to_thread(run_cli, "shell", "ledgermetadata", "--metadata-uri", uri,
                                str(lh.id))
    assert json.loads(r.stdout)["custom"] == {"app": "demo", "blob": {"hex": "ff00"}}

    delete = ["shell", "deleteledger", "--metadata-uri", uri, str(lh.id)]
    line = one_line_error(await asyncio.to_thread(run_cli, *delete))  # stdin not a terminal
    assert "not deleting ledger" in line and "--force" in line
    r = await asyncio.to_thread(run_with_terminal, delete, "no\n")
    assert r.returncode == 1 and f"ledger {lh.id} not deleted" in r.stderr, r.stderr
    assert "Type yes" in r.stdout and '"app": "demo"' in r.stdout
    assert (await bk.ledger_metadata(lh.id)).ledger_id == lh.id  # still there
    r = await asyncio.to_thread(run_with_terminal, delete, "yes\n")
    assert r.returncode == 0 and f"deleted ledger {lh.id}" in r.stdout, r.stderr
    with pytest.raises(NoSuchLedgerError):
        await bk.ledger_metadata(lh.id)

    lh2 = await bk.create_ledger(3, 2, 2)
    r = await asyncio.to_thread(run_cli, "shell", "deleteledger", "--metadata-uri", uri,
                                str(lh2.id), "--force")
    assert r.returncode == 0 and f"deleted ledger {lh2.id}" in r.stdout, r.stderr
    with pytest.raises(NoSuchLedgerError):
        await bk.ledger_metadata(lh2.id)
    line = one_line_error(await asyncio.to_thread(
        run_cli, "shell", "deleteledger", "--metadata-uri", uri, "999999999", "--force"))
    assert "ledger 999999999 does not exist" in line


async def test_bookieformat_refuses_a_live_bookie(cluster: LocalCluster) -> None:
    live = cluster.bookies[0]
    line = one_line_error(await asyncio.to_thread(
        run_cli, "shell", "bookieformat", "--metadata-uri", cluster.metadata_uri,
        "--bookie-id", live.id, "--delete-cookie", "--force"))
    assert f"bookie {live.id} is registered" in line and "decommission" in line
    bk = await cluster.client()
    assert await bk.meta.read_cookie(live.id) is not None


# ------------------------------------------------------------------ bench


def _without(tmp_path: Path, *packages: str) -> dict[str, str]:
    """An environment in which importing ``packages`` fails (as when not installed)."""
    shadow = tmp_path / "shadow"
    for name in packages:
        (shadow / name).mkdir(parents=True)
        (shadow / name / "__init__.py").write_text(f"raise ImportError('no {name} here')\n")
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(shadow), env["PYTHONPATH"]])
    return env


@pytest.mark.parametrize(("missing", "extra", "expect"), [
    ("hdrh", [], "asyncbk bench needs hdrhistogram"),
    ("matplotlib", ["--plot", "x.png"], "--plot needs matplotlib"),
])
def test_bench_checks_its_extra_before_starting_a_cluster(
        tmp_path: Path, missing: str, extra: list[str], expect: str) -> None:
    r = run_cli("bench", "write", "--entries", "10", *extra, timeout=30,
                env=_without(tmp_path, missing))
    line = one_line_error(r)
    assert expect in line and 'pip install "asyncbk[bench]"' in line
    assert "starting a local cluster" not in r.stderr


@pytest.mark.parametrize("workload", ["write", "read"])
def test_bench_help_shows_every_default(workload: str) -> None:
    r = subprocess.run([sys.executable, "-m", "asyncbk", "bench", workload, "--help"],
                       capture_output=True, text=True, timeout=60,
                       env={**cli_env(), "COLUMNS": "400"})
    assert r.returncode == 0
    options = r.stdout.split("\noptions:\n", 1)[1]
    entries: list[str] = []
    for line in options.splitlines():
        if line.startswith("  -"):
            entries.append(line)
        elif entries:
            entries[-1] += " " + line.strip()
    assert len(entries) > 15
    for entry in entries:
        if entry.split()[0] == "-h,":
            continue
        assert "default" in entry, f"no help or default: {entry}"
