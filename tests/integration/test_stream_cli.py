"""``asyncbk stream`` and ``asyncbk bench stream``, run as subprocesses against a real
cluster: namespaces and streams created, listed and deleted, stdin lines written as
records, tailed as text and JSON from positions and txids, info, truncation; bad input
is one line and a non-zero exit."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from asyncbk.errors import NoSuchStreamError
from asyncbk.stream import Position
from asyncbk.testing.cluster import LocalCluster

from .clitools import cli_env, run_with_terminal

pytestmark = pytest.mark.integration

COMMANDS = ["namespaces", "create-namespace", "delete-namespace", "namespace-info", "list",
            "create", "info",
            "retention", "delete", "truncate", "write", "tail", "subscriptions", "subscribe",
            "seek-subscription", "delete-subscription"]


def cli(*args: str, stdin: bytes | None = None, timeout: float = 60,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``asyncbk ARGS`` with ``stdin`` (nothing: /dev/null)."""
    r = subprocess.run([sys.executable, "-m", "asyncbk", *args], input=stdin,
                       stdin=None if stdin is not None else subprocess.DEVNULL,
                       capture_output=True, timeout=timeout, env=env or cli_env())
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(),
                                       r.stderr.decode())


def one_line_error(r: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


class Stream:
    """``asyncbk stream COMMAND ... --metadata-uri`` of one cluster, off the loop."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    async def __call__(self, *args: str, stdin: bytes | None = None,
                       ok: bool = True) -> subprocess.CompletedProcess[str]:
        r = await asyncio.to_thread(cli, "stream", *args, "--metadata-uri", self.uri,
                                    stdin=stdin)
        if ok:
            assert r.returncode == 0, (args, r.stdout, r.stderr)
            assert r.stderr == "", r.stderr
        return r


# ------------------------------------------------------------------ no cluster needed


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)], ids=lambda c: " ".join(c))
def test_help_everywhere_with_defaults(command: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "asyncbk", "stream", *command, "--help"],
                       capture_output=True, text=True, timeout=60,
                       env={**cli_env(), "COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: asyncbk stream " + " ".join(command))
    if not command:
        for c in COMMANDS:
            assert f"\n    {c} " in r.stdout or f"\n    {c}\n" in r.stdout, c
        return
    options = r.stdout.split("\noptions:\n", 1)[1]
    entries: list[str] = []
    for line in options.splitlines():
        if line.startswith("  -"):
            entries.append(line)
        elif entries:
            entries[-1] += " " + line.strip()
    for entry in entries:
        if entry.split()[0] == "-h,":
            continue
        assert "default" in entry or "required" in entry, f"no default shown: {entry}"


@pytest.mark.parametrize(("args", "code", "expect"), [
    (["tail", "bad name", "s"], 1, "bad namespace name 'bad name'"),
    (["tail", "ns", "a//b"], 1, "bad stream name 'a//b'"),
    (["write", "ns", "/"], 1, "bad stream name '/'"),
    (["tail", "ns", "s", "--from", "1:2"], 2, "bad stream position '1:2'"),
    (["tail", "ns", "s", "--from", "x:0:0"], 2, "expected SEGMENT:ENTRY:SLOT"),
    (["tail", "ns", "s", "--from", "1:0:0", "--txid", "4"], 2, "not allowed with"),
    (["tail", "ns", "s", "--count", "0"], 2, "must be >= 1"),
    (["truncate", "ns", "s"], 2, "--before"),
    (["truncate", "ns", "s", "--before", "earliest"], 1, "--before needs a position"),
    (["write", "ns", "s", "--txid", "-1"], 2, "must be >= 0"),
    (["write", "ns", "s", "--txid", "3", "--with-txid"], 1, "exclude each other"),
    (["create", "ns", "s", "--digest", "md5"], 2, "invalid choice"),
    (["create-namespace", "ns", "--rolling-bytes", "lots"], 2, "expected bytes"),
    (["create-namespace", "ns", "--retention-s", "-1"], 2, "must be >= 0"),
    (["namespaces"], 2, "--metadata-uri"),
    (["tail", "ns", "s", "--from-time", "yesterday"], 2, "expected a time"),
    (["tail", "ns", "s", "--from-time", "1", "--txid", "4"], 2, "not allowed with"),
    (["subscribe", "ns", "s", "bad\nname"], 2, "control characters"),
    (["subscribe", "ns", "s", " "], 2, "cannot be empty"),
    (["seek-subscription", "ns", "s", "a"], 2, "one of the arguments --position --time"),
    (["seek-subscription", "ns", "s", "a", "--time", "2026-13-01"], 2, "expected a time"),
    (["retention", "ns", "--metrics-port", "9"], 1, "--metrics-port needs --every"),
])
def test_bad_input_is_one_line(args: list[str], code: int, expect: str) -> None:
    uri = [] if args == ["namespaces"] else ["--metadata-uri", "etcd://127.0.0.1:1/x"]
    line = one_line_error(cli("stream", *args, *uri), code)
    assert expect in line, line
    assert line.startswith("asyncbk stream")


# each command with the arguments it needs
COMMAND_ARGS = {"namespaces": [], "create-namespace": ["ns"], "delete-namespace": ["ns"],
                "namespace-info": ["ns"], "list": ["ns"],
                # the namespace's placement options too: no clash with the client's
                "create": ["ns", "s", "--placement-policy", "rack-aware",
                           "--min-racks-per-write-quorum", "2", "--enforce-placement"],
                "info": ["ns", "s"], "retention": ["ns"], "delete": ["ns", "s"],
                "truncate": ["ns", "s", "--before", "1:0:0"], "write": ["ns", "s"],
                "tail": ["ns", "s"], "subscriptions": ["ns", "s"],
                "subscribe": ["ns", "s", "sub"],
                "seek-subscription": ["ns", "s", "sub", "--position", "earliest"],
                "delete-subscription": ["ns", "s", "sub", "--force"]}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_a_bad_rack_file_before_connecting(command: str,
                                                                  tmp_path: Path) -> None:
    assert set(COMMAND_ARGS) == set(COMMANDS)
    racks = tmp_path / "racks.txt"
    racks.write_text("# racks\n127.0.0.1:3181 /eu/r1\n127.0.0.1:0 /eu/r2\n")
    line = one_line_error(cli("stream", command, *COMMAND_ARGS[command],
                              "--bookie-racks-file", str(racks),
                              "--metadata-uri", "etcd://127.0.0.1:1/x"))
    assert line.startswith(f"asyncbk stream {command}: error: {racks}:3: 127.0.0.1:0 is not a "
                           "bookie id or a host: port '0' is not a number from 1 to 65535; "
                           "expected host:port"), line
    assert "etcd" not in line  # nothing was contacted


@pytest.mark.parametrize(("options", "expect"), [
    (["--bookie-racks-file", "{tmp}/missing.txt"],
     "bookie_racks_file {tmp}/missing.txt does not exist; create it or leave out "
     "--bookie-racks-file"),
    (["--bookie-racks-script", "topo.sh 'eu west"],
     "bookie_racks_script: No closing quotation; quote it as a shell would"),
    (["--bookie-racks-script", " "], "bookie_racks_script has no program to run"),
])
def test_bad_rack_options_are_one_line(options: list[str], expect: str,
                                       tmp_path: Path) -> None:
    options = [o.replace("{tmp}", str(tmp_path)) for o in options]
    line = one_line_error(cli("stream", "tail", "ns", "s", *options,
                              "--metadata-uri", "etcd://127.0.0.1:1/x"))
    assert line == f"asyncbk stream tail: error: {expect.replace('{tmp}', str(tmp_path))}"


def test_unreachable_etcd_is_one_line() -> None:
    line = one_line_error(cli("stream", "namespaces", "--metadata-uri", "etcd://127.0.0.1:1/x"))
    # short: the address once, the reason in a few words, nothing of TLS for etcd://
    assert line == ("asyncbk stream namespaces: error: cannot reach etcd at 127.0.0.1:1 "
                    "(connection refused) -- is etcd running?")


def test_bench_stream_help_shows_every_default() -> None:
    r = subprocess.run([sys.executable, "-m", "asyncbk", "bench", "stream", "--help"],
                       capture_output=True, text=True, timeout=60,
                       env={**cli_env(), "COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    options = r.stdout.split("\noptions:\n", 1)[1]
    entries: list[str] = []
    for line in options.splitlines():
        if line.startswith("  -"):
            entries.append(line)
        elif entries:
            entries[-1] += " " + line.strip()
    assert len(entries) > 15
    for entry in entries[1:]:  # after -h
        assert "default" in entry, f"no default shown: {entry}"


@pytest.mark.parametrize(("args", "code", "expect"), [
    (["--ensemble", "5"], 1, "needs at least that many --bookies"),
    (["--write-quorum", "3", "--ack-quorum", "4"], 1, "--ensemble >= --write-quorum"),
    (["--mode", "read"], 2, "invalid choice"),
    (["--records", "0"], 2, "must be >= 1"),
    (["--rate", "-3"], 2, "must be > 0"),
])
def test_bench_stream_bad_input_is_one_line(args: list[str], code: int, expect: str) -> None:
    r = cli("bench", "stream", *args)
    line = one_line_error(r, code)
    assert expect in line, line
    assert "starting a local cluster" not in r.stderr


# ------------------------------------------------------------------ against a cluster


async def test_namespaces_streams_write_tail_info_truncate_delete(cluster: LocalCluster) -> None:
    st = Stream(cluster.metadata_uri)
    r = await st("create-namespace", "orders", "--ensemble-size", "3", "--write-quorum", "2",
                 "--ack-quorum", "2", "--rolling-entries", "1000", "--retention-s", "0")
    assert r.stdout.strip() == "created namespace orders"
    await st("create-namespace", "other")
    assert (await st("namespaces")).stdout.split() == ["orders", "other"]
    await st("create", "orders", "eu/paris", "--rolling-entries", "0")
    await st("create", "orders", "eu/rome")
    await st("create", "orders", "us")
    assert (await st("list", "orders")).stdout.split() == ["eu/paris", "eu/rome", "us"]
    assert (await st("list", "orders", "--prefix", "eu/")).stdout.split() == \
        ["eu/paris", "eu/rome"]

    # write: one record per line, without the newline; a last line without one counts
    # (how records share entries depends on how stdin arrives: positions are checked
    # for order and segment, and against what tail prints)
    r = await st("write", "orders", "eu/paris", stdin=b"alpha\nbeta\n\ngamma delta")
    summary = r.stdout.strip()
    assert summary.startswith("wrote 4 records to orders/eu/paris: positions 1:0:0 .. 1:")
    assert summary.endswith(", txids 0 .. 3")
    r = await st("write", "orders", "eu/paris", "--txid", "100",
                 stdin=b"".join(b"line %d\n" % i for i in range(1, 11)))
    assert "wrote 10 records" in r.stdout and "txids 100 .. 109" in r.stdout
    # each line's own txid, and data that is not text
    r = await st("write", "orders", "eu/paris", "--with-txid",
                 stdin=b"200 caf\xc3\xa9\n201 \xff\xfe\n205 tab\there\n206 bell\x07\n")
    assert "txids 200 .. 206" in r.stdout

    r = await st("tail", "orders", "eu/paris", "--no-follow")
    lines = [ln.split(" ", 2) for ln in r.stdout.splitlines()]
    positions = [Position.parse(pos) for pos, _, _ in lines]
    assert positions == sorted(set(positions))
    assert [p.segment for p in positions] == [1] * 4 + [2] * 10 + [3] * 4
    assert positions[0] == Position(1, 0, 0) and str(positions[3]) in summary
    assert [(int(t), d) for _, t, d in lines] == [
        (0, "alpha"), (1, "beta"), (2, ""), (3, "gamma delta"),
        *((100 + i, f"line {i + 1}") for i in range(10)),
        (200, "café"), (201, "hex:fffe"), (205, "tab\there"),  # a tab is text
        (206, "hex:" + b"bell\x07".hex())]
    r = await st("tail", "orders", "eu/paris", "--no-follow", "--json")
    recs = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert [rec["position"] for rec in recs] == [str(p) for p in positions]
    stamps = [rec.pop("timestamp_ms") for rec in recs]  # the writer's clock, never lower
    assert stamps == sorted(stamps) and stamps[0] > 1_700_000_000_000
    assert recs[0] == {"position": "1:0:0", "txid": 0, "data": "alpha"}
    assert recs[14] == {"position": str(positions[14]), "txid": 200, "data": "café"}
    assert recs[15] == {"position": str(positions[15]), "txid": 201, "data": None,
                        "data_hex": "fffe"}
    assert recs[17] == {"position": str(positions[17]), "txid": 206, "data": "bell\x07"}

    # from a txid, from a position, a count
    r = await st("tail", "orders", "eu/paris", "--no-follow", "--txid", "105")
    assert [ln.split()[1] for ln in r.stdout.splitlines()] == \
        ["105", "106", "107", "108", "109", "200", "201", "205", "206"]
    r = await st("tail", "orders", "eu/paris", "--no-follow", "--txid", "202")
    assert r.stdout.splitlines() == [f"{positions[16]} 205 tab\there",
                                     f"{positions[17]} 206 hex:62656c6c07"]
    r = await st("tail", "orders", "eu/paris", "--no-follow", "--txid", "999")
    assert r.stdout == ""
    r = await st("tail", "orders", "eu/paris", "--from", str(positions[12]), "--count", "3")
    assert r.stdout.splitlines() == [f"{positions[12]} 108 line 9",
                                     f"{positions[13]} 109 line 10",
                                     f"{positions[14]} 200 café"]
    r = await st("tail", "orders", "eu/paris", "--from", "latest", "--no-follow")
    assert r.stdout == ""

    # info: the segments table and JSON
    r = await st("info", "orders", "eu/paris")
    out = r.stdout.splitlines()
    assert out[0] == (f"stream orders/eu/paris: 3 segment(s), 18 records, positions 1:0:0 .. "
                      f"{positions[17]}, txids 0 .. 206")
    assert "ensemble 3, write quorum 2, ack quorum 2" in out[1]
    assert out[2].split()[:8] == ["seq", "ledger", "state", "first", "last", "first_txid",
                                  "last_txid", "records"]
    assert [row.split()[2:8] for row in out[3:]] == [
        ["completed", "1:0:0", str(positions[3]), "0", "3", "4"],
        ["completed", "2:0:0", str(positions[13]), "100", "109", "10"],
        ["completed", "3:0:0", str(positions[17]), "200", "206", "4"]]
    info = json.loads((await st("info", "orders", "eu/paris", "--json")).stdout)
    assert info["config"]["rolling_entries"] == 0  # the stream's override
    assert info["config"]["write_quorum"] == 2 and info["config"]["retention_s"] == 0
    assert (info["first_position"], info["last_position"], info["records"]) == \
        ("1:0:0", str(positions[17]), 18)
    assert [(s["seq"], s["state"], s["records"], s["first_txid"], s["last_txid"])
            for s in info["segments"]] == [(1, "completed", 4, 0, 3),
                                           (2, "completed", 10, 100, 109),
                                           (3, "completed", 4, 200, 206)]

    # an open segment (a writer still at it) shows what is durable so far
    bk = await cluster.client()
    ns = await bk.namespace("orders")
    async with await ns.open_writer("eu/rome") as w:
        for i in range(5):
            await w.write(b"r%d" % i, txid=50 + i)
        await w.write(b"r5", txid=55)
        info = json.loads((await st("info", "orders", "eu/rome", "--json")).stdout)
        (seg,) = info["segments"]
        assert seg["state"] == "open" and seg["so_far"] is True
        # the last write's entry is acknowledged; its LAC may not have reached the
        # bookies yet (it rides on the next add or the explicit LAC a second later)
        assert seg["first_txid"] == 50 and seg["records"] in (5, 6)
        r = await st("tail", "orders", "eu/rome", "--no-follow")
        assert r.stdout.splitlines()[:5] == [f"1:{i}:0 {50 + i} r{i}" for i in range(5)]
        r = await st("info", "orders", "eu/rome")
        assert "open (so far)" in r.stdout

    # truncate: whole segments before the position go, reading them is an error
    r = await st("truncate", "orders", "eu/paris", "--before", "3:0:0")
    assert r.stdout.strip() == "dropped 2 segment(s) of orders/eu/paris; it now starts at 3:0:0"
    r = await st("tail", "orders", "eu/paris", "--no-follow")
    assert [ln.split()[1] for ln in r.stdout.splitlines()] == ["200", "201", "205", "206"]
    line = one_line_error(await st("tail", "orders", "eu/paris", "--from", "1:0:0", ok=False))
    assert "position 1:0:0 was truncated" in line and "3:0:0" in line
    assert "--from earliest" in line
    r = await st("truncate", "orders", "eu/paris", "--before", "3:0:0")
    assert "dropped 0 segment(s)" in r.stdout

    # delete: refused without a terminal unless --force
    line = one_line_error(await st("delete", "orders", "us", ok=False))
    assert "not deleting stream orders/us" in line and "--force" in line
    assert await ns.stream_exists("us")
    r = await st("delete", "orders", "us", "--force")
    assert r.stdout.strip() == "deleted stream orders/us"
    assert not await ns.stream_exists("us")
    line = one_line_error(await st("delete-namespace", "orders", ok=False))
    assert "not deleting namespace orders and its streams" in line and "--force" in line
    r = await st("delete-namespace", "other")  # empty: no question asked
    assert r.stdout.strip() == "deleted namespace other"
    r = await st("delete-namespace", "orders", "--force")
    assert r.stdout.strip() == "deleted namespace orders and its 2 stream(s)"
    assert (await st("namespaces")).stdout == ""


async def test_errors_say_what_to_do(cluster: LocalCluster) -> None:
    st = Stream(cluster.metadata_uri)
    for args in (["list", "nope"], ["tail", "nope", "s"], ["create", "nope", "s"],
                 ["write", "nope", "s"]):
        line = one_line_error(await st(*args, ok=False))
        assert "no namespace 'nope'" in line
        assert "asyncbk stream create-namespace nope" in line
    await st("create-namespace", "ns")
    for args in (["tail", "ns", "s"], ["info", "ns", "s"], ["write", "ns", "s"],
                 ["truncate", "ns", "s", "--before", "1:0:0"], ["delete", "ns", "s"]):
        line = one_line_error(await st(*args, ok=False, stdin=b"x\n"))
        assert "no stream 's' in namespace 'ns'" in line
        assert "asyncbk stream create ns s" in line
    line = one_line_error(await st("create-namespace", "ns", ok=False))
    assert "namespace 'ns' exists already" in line
    await st("create", "ns", "s")
    line = one_line_error(await st("create", "ns", "s", ok=False))
    assert "exists already" in line
    line = one_line_error(await st("create", "ns", "t", "--write-quorum", "4", ok=False))
    assert "ensemble_size >= write_quorum" in line
    line = one_line_error(await st("write", "ns", "s", "--with-txid", stdin=b"7 a\nb\n8 c\n",
                                   ok=False))
    assert "line 2: expected 'TXID DATA'" in line and "wrote 1 record to" in line
    line = one_line_error(await st("write", "ns", "s", "--txid", "3", stdin=b"x\n", ok=False))
    assert "line 1: stream ns/s: txid 3 is below the previous one (7)" in line
    assert "stopped there (wrote 0 records to ns/s)" in line
    # --create, --end: the stream ends, a follower stops there, no more writes
    r = await st("write", "ns", "new", "--create", "--end", stdin=b"one\ntwo\n")
    assert "wrote 2 records to ns/new" in r.stdout and "stream ended" in r.stdout
    r = await st("tail", "ns", "new")  # follows, and stops at the end of the stream
    assert r.stdout.splitlines() == ["1:0:0 0 one", "1:0:1 1 two"]
    line = one_line_error(await st("write", "ns", "new", stdin=b"three\n", ok=False))
    assert "was ended" in line
    assert "ENDED" in (await st("info", "ns", "new")).stdout
    # --create makes a missing namespace too (as bk.namespace(name, create=True) does)
    r = await st("write", "fresh", "s", "--create", stdin=b"first\n")
    assert "wrote 1 record to fresh/s" in r.stdout
    assert (await st("namespaces")).stdout.split() == ["fresh", "ns"]
    assert (await st("tail", "fresh", "s", "--no-follow")).stdout.split() == \
        ["1:0:0", "0", "first"]
    # a wrong root is not an empty cluster
    wrong = cluster.metadata_uri.rsplit("/", 1)[0] + "/wrongroot"
    line = one_line_error(await asyncio.to_thread(cli, "stream", "namespaces",
                                                  "--metadata-uri", wrong))
    assert "no asyncbk cluster at" in line


async def test_rack_file_and_script_locate_the_bookies_of_stream_commands(
        cluster: LocalCluster, tmp_path: Path) -> None:
    """The bookies register no rack: an enforced rack-aware namespace cannot place a
    segment, unless the command's --bookie-racks-file (or --bookie-racks-script) puts
    them in two racks."""
    st = Stream(cluster.metadata_uri)
    await st("create-namespace", "ns", "--ensemble-size", "2", "--write-quorum", "2",
             "--ack-quorum", "2", "--rolling-entries", "1", "--placement-policy",
             "rack-aware", "--enforce-placement")
    await st("create", "ns", "s")
    line = one_line_error(await st("write", "ns", "s", stdin=b"x\n", ok=False))
    assert "rack-aware placement" in line, line
    b0, b1, b2 = (b.id for b in cluster.bookies)
    racks = tmp_path / "racks.txt"
    racks.write_text(f"# two racks\n{b0} /eu/r1\n{b1} /eu/r2\n{b2} /eu/r2\n")
    r = await st("write", "ns", "s", "--bookie-racks-file", str(racks), stdin=b"one\ntwo\n")
    assert "wrote 2 records to ns/s" in r.stdout
    # a script that puts every host in one rack (the bookies share one host anyway):
    # not placeable
    script = tmp_path / "racks.sh"
    script.write_text("#!/bin/sh\nfor h in \"$@\"; do echo /eu/r1; done\n")
    script.chmod(0o755)
    line = one_line_error(await st("write", "ns", "s", "--bookie-racks-script", str(script),
                                   stdin=b"three\n", ok=False))
    assert "rack-aware placement" in line, line
    r = await st("tail", "ns", "s", "--no-follow", "--bookie-racks-file", str(racks),
                 "--bookie-racks-script", str(script))  # both: the file wins
    assert [ln.split(" ", 2)[2] for ln in r.stdout.splitlines()] == ["one", "two"]
    bk = await cluster.client()
    info = json.loads((await st("info", "ns", "s", "--json")).stdout)
    for seg in info["segments"]:
        md = await bk.ledger_metadata(seg["ledger_id"])
        assert b0 in md.ensembles[0][1]  # each write set spans /eu/r1 and /eu/r2


async def test_tail_follows_new_records_until_ctrl_c(cluster: LocalCluster) -> None:
    st = Stream(cluster.metadata_uri)
    await st("create-namespace", "ns")
    await st("write", "ns", "s", "--create", stdin=b"old\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncbk", "stream", "tail", "ns", "s", "--json", "--from",
        "latest", "--metadata-uri", cluster.metadata_uri, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, env=cli_env())
    assert proc.stdout is not None
    try:
        # write a record at a time until the tail (started at the end) shows one
        first = None
        for i in range(30):
            await st("write", "ns", "s", stdin=b"new %d\n" % i)
            try:
                first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 1.0))
                break
            except TimeoutError:
                continue
        assert first is not None, "the tail printed nothing"
        assert first["data"].startswith("new ") and first["txid"] >= 1  # not "old"
        n = int(first["data"].split()[1])
        assert first["txid"] == n + 1
        await st("write", "ns", "s", stdin=b"".join(b"more %d\n" % k for k in range(3)))
        # every record written after the first shown, in order, each once
        expect = [f"new {k}" for k in range(n + 1, i + 1)] + [f"more {k}" for k in range(3)]
        got = []
        async with asyncio.timeout(30):
            while len(got) < len(expect):
                got.append(json.loads(await proc.stdout.readline()))
        assert [(g["txid"], g["data"]) for g in got] == \
            [(first["txid"] + 1 + k, data) for k, data in enumerate(expect)]
        positions = [Position.parse(g["position"]) for g in [first, *got]]
        assert positions == sorted(positions) and positions[0].segment >= 2
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert err == b"" and out == b""


async def test_write_stops_cleanly_on_ctrl_c(cluster: LocalCluster) -> None:
    """Ctrl-C while stdin is still open: what was read is written, then the summary."""
    st = Stream(cluster.metadata_uri)
    await st("create-namespace", "ns")
    await st("create", "ns", "s")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncbk", "stream", "write", "ns", "s", "--metadata-uri",
        cluster.metadata_uri, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=cli_env())
    assert proc.stdin is not None
    try:
        proc.stdin.write(b"a\nb\n")
        await proc.stdin.drain()
        bk = await cluster.client()
        ns = await bk.namespace("ns")
        async with asyncio.timeout(30):  # the writer opened: a segment exists
            while not (await ns.stream_info("s")).segments:  # noqa: ASYNC110 - polling etcd
                await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130, err.decode()
    assert "Traceback" not in err.decode()
    assert out.decode().strip() == ("wrote 2 records to ns/s: positions 1:0:0 .. 1:0:1, "
                                    "txids 0 .. 1; interrupted")
    async with await ns.open_reader("s", Position.EARLIEST) as r:
        assert [rec.data for rec in await r.read_batch(10, 5)] == [b"a", b"b"]


async def test_delete_asks_on_a_terminal(cluster: LocalCluster) -> None:
    st = Stream(cluster.metadata_uri)
    await st("create-namespace", "ns")
    await st("write", "ns", "s", "--create", stdin=b"x\ny\n")
    delete = ["stream", "delete", "ns", "s", "--metadata-uri", cluster.metadata_uri]
    r = await asyncio.to_thread(run_with_terminal, delete, "no\n")
    assert r.returncode == 1 and "not deleting stream ns/s: not confirmed" in r.stderr
    assert "(1 segment(s), 2 records)" in r.stdout and "Type yes" in r.stdout
    r = await asyncio.to_thread(run_with_terminal, delete, "yes\n")
    assert r.returncode == 0 and "deleted stream ns/s" in r.stdout, r.stderr
    bk = await cluster.client()
    ns = await bk.namespace("ns")
    assert not await ns.stream_exists("s")
    with pytest.raises(NoSuchStreamError):
        await ns.stream_info("s")


# ------------------------------------------------------------------ bench stream


async def test_bench_stream_write_and_tail(cluster: LocalCluster, tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    r = await asyncio.to_thread(
        cli, "bench", "stream", "--records", "20000", "--record-size", "100", "--inflight",
        "2000", "--burst", "200", "--warmup", "1000", "--metadata-uri", cluster.metadata_uri,
        "--json", str(out), timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["workload"] == "stream-write" and data["loop"] == "closed"
    assert data["records_done"] == 20000 and data["records_written"] == 21000
    assert data["throughput_rps"] > 0 and data["throughput_mbps"] > 0
    assert data["records_per_entry"] > 10  # batched
    lat = data["latency_us"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["p999"] <= lat["max"]
    assert lat["samples"] == 20000  # one latency per record
    assert sum(data["timeline"]["completed"]) == 20000
    assert data["config"]["ensemble"] == 3 and data["config"]["write_quorum"] == 3

    out, png = tmp_path / "t.json", tmp_path / "t.png"
    r = await asyncio.to_thread(
        cli, "bench", "stream", "--mode", "tail", "--rate", "2000", "--records", "3000",
        "--record-size", "1024", "--rolling-mb", "1", "--metadata-uri", cluster.metadata_uri,
        "--json", str(out), "--plot", str(png), timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert (data["workload"], data["loop"]) == ("stream-tail", "open")
    assert data["records_done"] == 3000 and data["latency_us"]["samples"] == 3000
    assert data["segments"] >= 3  # 3 MB of records, rolling every 1 MiB: followed rolls
    assert 0.8 < data["elapsed_s"] / 1.5 < 3  # offered at 2000/s: about 1.5 s
    assert 0 < data["ack_latency_us"]["p50"] <= data["latency_us"]["p50"] * 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bk = await cluster.client()  # the benchmark's namespace is gone
    assert [n async for n in bk.list_namespaces()] == []


async def test_retention_command_drops_expired_segments_of_idle_streams(
        cluster: LocalCluster) -> None:
    """No writer writes the stream any more: `stream retention` drops what has expired
    (every completed segment but the last), for one stream or a whole namespace."""
    st = Stream(cluster.metadata_uri)
    # (long enough that the writers' own retention, at each open, drops nothing here)
    await st("create-namespace", "old", "--retention-s", "6")
    for name in ("a", "b"):
        await st("create", "old", name)
        for i in range(3):  # each run opens a new writer: a new segment each time
            await st("write", "old", name, stdin=b"r%d\n" % i)
    await asyncio.sleep(6.5)
    r = await st("retention", "old", "a")
    assert r.stdout.splitlines() == ["old/a: dropped 2 segment(s)"]
    r = await st("retention", "old")
    assert r.stdout.splitlines() == ["old/a: dropped 0 segment(s)",
                                     "old/b: dropped 2 segment(s)"]
    tail = await st("tail", "old", "a", "--no-follow")
    assert [line.split()[-1] for line in tail.stdout.splitlines()] == ["r2"]


async def test_subscriptions_and_time_from_the_command_line(cluster: LocalCluster) -> None:
    """subscribe prints and acknowledges; a second run resumes after the acks; lag
    shows in subscriptions (text and JSON); seek-subscription by time and position;
    delete-subscription; tail --from-time; unknown subscriptions are one line."""
    st = Stream(cluster.metadata_uri)
    await st("create-namespace", "subs", "--subscription-ack-interval-s", "0.2")
    await st("write", "subs", "s", "--create", stdin=b"".join(b"r%d\n" % i for i in range(10)))
    r = await st("subscribe", "subs", "s", "billing", "--count", "4")
    assert [line.split()[-1] for line in r.stdout.splitlines()] == ["r0", "r1", "r2", "r3"]
    r = await st("subscriptions", "subs", "s", "--json")
    [info] = json.loads(r.stdout)
    assert (info["name"], info["lag_records"], info["truncated"]) == ("billing", 6, False)
    assert info["lag_s"] >= 0 and info["lag_bytes"] > 0
    r = await st("subscriptions", "subs", "s")
    assert r.stdout.splitlines()[0].split()[:2] == ["NAME", "POSITION"]
    assert r.stdout.splitlines()[1].split()[0] == "billing"
    r = await st("subscribe", "subs", "s", "billing", "--no-follow", "--json")
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["data"] for x in lines] == [f"r{i}" for i in range(4, 10)]
    assert all(x["timestamp_ms"] > 0 for x in lines)
    r = await st("subscriptions", "subs", "s", "--json")
    assert json.loads(r.stdout)[0]["lag_records"] == 0
    # By time: the first record at or after the 6th record's time.
    t = lines[2]["timestamp_ms"]
    tail = await st("tail", "subs", "s", "--from-time", str(t), "--no-follow", "--json")
    got = [json.loads(line) for line in tail.stdout.splitlines()]
    assert got[0]["timestamp_ms"] >= t and all(x["timestamp_ms"] >= t for x in got)
    iso = "1970-01-01T00:00:00Z"
    tail = await st("tail", "subs", "s", "--from-time", iso, "--no-follow")
    assert len(tail.stdout.splitlines()) == 10
    r = await st("seek-subscription", "subs", "s", "billing", "--time", iso)
    assert r.stdout.strip().endswith("now resumes at 1:0:0")
    r = await st("seek-subscription", "subs", "s", "billing", "--position", "latest")
    r = await st("subscriptions", "subs", "s", "--json")
    assert json.loads(r.stdout)[0]["lag_records"] == 0
    r = await st("delete-subscription", "subs", "s", "billing", "--force")
    assert "deleted subscription billing" in r.stdout
    r = await st("subscriptions", "subs", "s")
    assert r.stdout.strip() == "subs/s: no subscriptions"
    for args in (["seek-subscription", "subs", "s", "nobody", "--position", "earliest"],
                 ["delete-subscription", "subs", "s", "nobody", "--force"]):
        line = one_line_error(await st(*args, ok=False))
        assert "no subscription 'nobody'" in line, line
    line = one_line_error(await st("delete-subscription", "subs", "s", "x", ok=False))
    assert "--force" in line, line


async def test_retention_service_serves_the_subscription_lag(cluster: LocalCluster) -> None:
    """`stream retention --every S --metrics-port P` measures each subscription's lag
    and serves it on /metrics."""
    import aiohttp

    st = Stream(cluster.metadata_uri)
    await st("create-namespace", "mon")
    await st("write", "mon", "s", "--create", stdin=b"a\nb\nc\n")
    await st("subscribe", "mon", "s", "slow", "--count", "1")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncbk", "stream", "retention", "mon", "--every", "0.5",
        "--metrics-port", "0", "--metadata-uri", cluster.metadata_uri,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env())
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            first = (await proc.stdout.readline()).decode()
        assert first.startswith("serving /metrics on 127.0.0.1:"), first
        port = int(first.rsplit(":", 1)[1])
        async with aiohttp.ClientSession() as http:
            for _ in range(40):
                async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    text = await resp.text()
                if "asyncbk_subscription_lag_records{" in text:
                    break
                await asyncio.sleep(0.25)
        want = ('asyncbk_subscription_lag_records{client="retention",namespace="mon",'
                'stream="s",subscription="slow"} 2.0')
        assert want in text, text
        assert "asyncbk_subscription_lag_seconds{" in text
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            await proc.wait()
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
