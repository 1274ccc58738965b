"""The shell commands after BookKeeper's: ``bookieinfo``, ``clusterinfo``,
``whatisinstanceid``, ``triggeraudit``, ``cookie_get`` and ``cookie_update`` against a
real cluster; the offline ones (``listfilesondisc``, ``readjournal``, ``readlog``,
``readlogmetadata``, ``localconsistencycheck``) on the directories of a bookie stopped
first, refused while it runs, and on damaged copies of them."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asyncbk.cli.main import main
from asyncbk.testing.cluster import LocalCluster

from .clitools import cli_env

pytestmark = pytest.mark.integration

NEW_COMMANDS = ["bookieinfo", "clusterinfo", "whatisinstanceid", "triggeraudit", "cookie_get",
                "cookie_update", "listfilesondisc", "readjournal", "readlog",
                "readlogmetadata", "localconsistencycheck"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "asyncbk", "shell", *args],
                          capture_output=True, text=True, timeout=120, env=cli_env())


async def shell(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(_cli, *args)


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    return r.stdout


def one_line_error(r: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize("command", NEW_COMMANDS)
def test_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["shell", command, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: asyncbk shell " + command)
    if command in ("listfilesondisc", "readjournal", "readlog", "readlogmetadata",
                   "localconsistencycheck"):
        words = " ".join(out.split())
        assert "stopped bookie" in words and "changes nothing" in words


async def _ledger(cluster: LocalCluster, ensemble: int, entries: int) -> int:
    bk = await cluster.client()
    try:
        lh = await bk.create_ledger(ensemble, ensemble, ensemble, password=b"pw")
        for f in [lh.append(b"entry-%d" % i) for i in range(entries)]:
            await f
        await lh.close()
        return int(lh.id)
    finally:
        await bk.close()


# ------------------------------------------------------------------ online


async def test_cluster_commands(tmp_path: Path) -> None:
    async with LocalCluster(bookies=2, data_dir=tmp_path / "c") as cluster:
        uri = ["--metadata-uri", cluster.metadata_uri]
        lid = await _ledger(cluster, 2, 10)
        a, b = cluster.bookies

        out = ok(await shell("bookieinfo", *uri))
        assert a.id in out and b.id in out and "cluster: 2 bookie(s) answered" in out
        info = json.loads(ok(await shell("bookieinfo", "--json", *uri)))
        assert {r["id"] for r in info["bookies"]} == {a.id, b.id}
        assert info["total_bytes"] >= info["free_bytes"] > 0

        info = json.loads(ok(await shell("clusterinfo", "--json", *uri)))
        assert sorted(info["writable_bookies"]) == sorted([a.id, b.id])
        assert info["unregistered_bookies"] == [] and info["ledgers"] == 1
        assert info["auditor"] is None and info["underreplicated_ledgers"] == 0
        assert ok(await shell("whatisinstanceid", *uri)).strip() == info["instance_id"]

        out = ok(await shell("cookie_get", b.id, "--journal-dir", str(b.journal_dir),
                             "--ledger-dir", str(b.ledger_dir), *uri))
        assert f"bookie id: {b.id}" in out and f"instance id: {info['instance_id']}" in out
        assert f"{b.ledger_dir}/COOKIE: same" in out
        r = await shell("cookie_get", b.id, "--ledger-dir", str(a.ledger_dir), *uri)
        assert r.returncode == 1 and "differs in bookie_id" in r.stdout
        assert "no cookie for bookie 127.0.0.1:1 " in one_line_error(
            await shell("cookie_get", "127.0.0.1:1", *uri))
        assert "expected a bookie id host:port" in one_line_error(
            await shell("cookie_get", "not-a-bookie", *uri), code=2)

        out = ok(await shell("triggeraudit", "--dry-run", *uri))
        assert "would mark 0 ledger(s)" in out
        assert "registered (running)" in one_line_error(
            await shell("triggeraudit", "--bookie", a.id, *uri))
        assert "is registered" in one_line_error(await shell(
            "cookie_update", b.id, "--journal-dir", str(b.journal_dir), "--ledger-dir",
            str(b.ledger_dir), *uri))

        await b.stop()  # graceful: unregistered at once
        info = json.loads(ok(await shell("clusterinfo", "--json", *uri)))
        assert info["unregistered_bookies"] == [b.id] and info["writable_bookies"] == [a.id]
        r = await shell("bookieinfo", *uri)
        assert r.returncode == 0 and b.id not in r.stdout

        out = ok(await shell("triggeraudit", "--dry-run", *uri))
        assert f"ledger {lid}: would be marked under-replicated (lost {b.id})" in out
        assert "no under-replicated ledgers" in ok(await shell("listunderreplicated", *uri))
        out = ok(await shell("triggeraudit", *uri))
        assert f"ledger {lid}: marked under-replicated (lost {b.id})" in out
        assert "no auto-recovery process is running" in out
        out = ok(await shell("listunderreplicated", *uri))
        assert out.startswith(f"{lid}\tlost {b.id}")


# ------------------------------------------------------------------ cookie_update


async def test_cookie_update_records_moved_directories(tmp_path: Path) -> None:
    async with LocalCluster(bookies=2, data_dir=tmp_path / "c") as cluster:
        uri = ["--metadata-uri", cluster.metadata_uri]
        lid = await _ledger(cluster, 2, 20)
        a, b = cluster.bookies
        await b.stop()
        new_j, new_l = tmp_path / "moved" / "journal", tmp_path / "moved" / "ledgers"
        new_l.parent.mkdir()
        os.rename(b.journal_dir, new_j)
        os.rename(b.ledger_dir, new_l)
        moved = ["--journal-dir", str(new_j), "--ledger-dir", str(new_l)]

        # refusals: a live bookie's directory, an empty one, a different number
        empty = tmp_path / "empty"
        empty.mkdir()
        assert "in use by a running bookie" in one_line_error(await shell(
            "cookie_update", b.id, "--journal-dir", str(new_j), "--ledger-dir",
            str(a.ledger_dir), *uri))
        assert "holds no cookie" in one_line_error(await shell(
            "cookie_update", b.id, "--journal-dir", str(new_j), "--ledger-dir", str(empty),
            *uri))
        assert "2 ledger directories given, 1 recorded" in one_line_error(await shell(
            "cookie_update", b.id, *moved, "--ledger-dir", str(empty), *uri))
        assert "is not a directory" in one_line_error(await shell(
            "cookie_update", b.id, "--journal-dir", str(tmp_path / "nope"), "--ledger-dir",
            str(new_l), *uri))

        out = ok(await shell("cookie_update", b.id, *moved, "--dry-run", *uri))
        assert f"ledger directories: {b.ledger_dir} -> {new_l.resolve()}" in out
        assert "dry run" in out
        out = ok(await shell("cookie_get", b.id, "--ledger-dir", str(new_l), *uri))
        assert f"ledger directories: {b.ledger_dir}\n" in out  # nothing changed
        assert f"{new_l}/COOKIE: same" in out  # (the old paths, in both copies)

        out = ok(await shell("cookie_update", b.id, *moved, *uri))
        assert "updated the cookie" in out
        out = ok(await shell("cookie_get", b.id, *moved, *uri))
        assert f"ledger directories: {new_l.resolve()}" in out and "differs" not in out
        assert "nothing to do" in ok(await shell("cookie_update", b.id, *moved, *uri))

        # the bookie starts on the moved directories and serves what it held
        b.journal_dir, b.ledger_dir = new_j, new_l
        b.journal_dirs, b.ledger_dirs = [new_j], [new_l]
        await b.start()
        await a.stop()
        bk = await cluster.client()
        try:
            rh = await bk.open_ledger(lid, password=b"pw", recovery=False)
            entries = await rh.read(0, 19)
            assert [e.data for e in entries] == [b"entry-%d" % i for i in range(20)]
        finally:
            await bk.close()


# ------------------------------------------------------------------ offline


async def test_offline_commands_on_a_stopped_bookie(tmp_path: Path) -> None:
    async with LocalCluster(bookies=1, data_dir=tmp_path / "c") as cluster:
        lid = await _ledger(cluster, 1, 25)
        b = cluster.bookies[0]
        j, led = ["--journal-dir", str(b.journal_dir)], ["--ledger-dir", str(b.ledger_dir)]

        # refused while the bookie runs
        for args in (["readjournal", *j], ["readlog", "0", *led], ["listfilesondisc", *led],
                     ["readlogmetadata", "0", *led], ["localconsistencycheck", *j, *led]):
            assert "in use by a running bookie: stop the bookie first" in one_line_error(
                await shell(*args))

        await b.stop()
        out = ok(await shell("listfilesondisc", *j, *led))
        assert "0000000000000001.jnl" in out and "entrylog/00000000.log" in out
        assert "index.log" in out and "checkpoint" in out and "COOKIE" in out
        assert "entrylog 0" in ok(await shell("listfilesondisc", "--entrylog", *led))

        out = ok(await shell("readjournal", *j, "--ledger-id", str(lid)))
        adds = [line for line in out.splitlines() if "\tADD\t" in line]
        assert len(adds) == 25 and f"ledger_id={lid}\tentry_id=24" in adds[-1]
        assert "LEDGER_KEY" in out and "key_bytes=" in out  # the key itself never shown
        rows = [json.loads(line) for line in ok(await shell(
            "readjournal", "0000000000000001.jnl", *j, "--ledger-id", str(lid), "--entry-id",
            "7", "--msg", "--format", "json")).splitlines()]
        assert len(rows) == 1 and bytes.fromhex(rows[0]["data_hex"]).endswith(b"entry-7")

        out = ok(await shell("readlog", "0", *led, "--ledger-id", str(lid), "--msg"))
        assert out.count("\tADD\t") == 25 and "entry-24" in out
        meta = json.loads(ok(await shell("readlogmetadata", "00000000.log", *led, "--json")))
        assert meta["ledgers"] == [{"ledger_id": lid, "entries": 25,
                                    "bytes": meta["payload_bytes"]}]
        assert meta["undecodable_bytes"] == 0
        out = ok(await shell("localconsistencycheck", *j, *led))
        assert "checked 25 indexed entries in 1 ledger directory: consistent" in out

        # bad input: one line each
        assert "is not an entry log id" in one_line_error(await shell("readlog", "x1", *led))
        assert "no entry log 00000009.log" in one_line_error(await shell("readlog", "9", *led))
        assert "no journal file 0000000000000007.jnl" in one_line_error(
            await shell("readjournal", "7", *j))
        assert "is not a directory" in one_line_error(
            await shell("readjournal", "--journal-dir", str(tmp_path / "nope")))
        assert "must be >= 0" in one_line_error(
            await shell("readlog", "0", *led, "--ledger-id", "-1"), code=2)
        assert "give at least one" in one_line_error(await shell("listfilesondisc"))

        # damaged copies (the bookie's own files stay as they were)
        copy = tmp_path / "copy"
        shutil.copytree(b.dir, copy)
        cj, cl = copy / "journal", copy / "ledgers"
        with (cj / "0000000000000001.jnl").open("ab") as f:
            f.write(b"\x07\x00\x00\x00torn")  # a crash in the middle of a write
        out = ok(await shell("readjournal", "--journal-dir", str(cj)))
        assert "do not decode (torn or damaged)" in out and "tail of a crash" in out
        # the zeros a crashed bookie's last journal file ends in (allocated ahead of its
        # writes, journal_preallocate_bytes) are no damage
        zeroed = tmp_path / "zeroed"
        shutil.copytree(b.dir, zeroed)
        with (zeroed / "journal" / "0000000000000001.jnl").open("ab") as f:
            f.write(bytes(1 << 20))
        out = ok(await shell("readjournal", "--journal-dir", str(zeroed / "journal")))
        assert "ADD" in out and "do not decode" not in out
        assert "consistent" in ok(await shell("localconsistencycheck", "--journal-dir",
                                              str(zeroed / "journal"), "--ledger-dir",
                                              str(zeroed / "ledgers")))
        log = cl / "entrylog" / "00000000.log"
        data = bytearray(log.read_bytes())
        spot = len(data) // 2
        data[spot] ^= 0xFF
        log.write_bytes(bytes(data))
        r = await shell("localconsistencycheck", "--journal-dir", str(cj), "--ledger-dir",
                        str(cl))
        assert r.returncode == 1, r.stdout + r.stderr
        assert "PROBLEM:" in r.stdout and "fails its checksum" in r.stdout
        assert "1 problem(s)" in r.stdout
        r = await shell("readlog", "0", "--ledger-dir", str(cl))
        assert r.returncode == 1 and "do not decode (torn or damaged)" in r.stdout
        assert r.stdout.count("\tADD\t") < 25
        # the bookie's own directory is untouched by all of it
        assert "consistent" in ok(await shell("localconsistencycheck", *j, *led))


async def test_consistency_check_reads_the_lmdb_index(tmp_path: Path) -> None:
    """With ``index_backend = "lmdb"`` the check reads the LMDB index (read-only, no lock
    file made) and finds a damaged entry the same way."""
    pytest.importorskip("lmdb")
    async with LocalCluster(bookies=1, data_dir=tmp_path / "c",
                            bookie_config={"index_backend": "lmdb"}) as cluster:
        await _ledger(cluster, 1, 30)
        b = cluster.bookies[0]
        await b.stop()
        copy = tmp_path / "copy"
        shutil.copytree(b.dir, copy)
    before = sorted(p.name for p in (copy / "ledgers" / "index.lmdb").iterdir())
    dirs = ["--journal-dir", str(copy / "journal"), "--ledger-dir", str(copy / "ledgers")]
    out = ok(await shell("localconsistencycheck", *dirs))
    assert "checked 30 indexed entries in 1 ledger directory: consistent" in out
    assert sorted(p.name for p in (copy / "ledgers" / "index.lmdb").iterdir()) == before
    log = copy / "ledgers" / "entrylog" / "00000000.log"
    data = bytearray(log.read_bytes())
    data[len(data) // 3] ^= 0x55
    log.write_bytes(bytes(data))
    r = await shell("localconsistencycheck", *dirs)
    assert r.returncode == 1 and "fails its checksum" in r.stdout, r.stdout + r.stderr
    shutil.rmtree(copy / "ledgers" / "index.lmdb")
    r = await shell("localconsistencycheck", *dirs)
    assert r.returncode == 1 and "index.lmdb, which is missing" in r.stdout, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
