"""Placement check and repair with real processes: ``asyncbk shell placementcheck``,
``listbookies``' locations, ``--bookie-racks-file`` and ``asyncbk autorecovery
--fix-placement``, against etcd and bookies that declare racks.

What violates is computed here, from the ledgers' metadata and the bookies' racks
(never with the code under test): a write set (a cyclic window of ``Qw`` ensemble
positions) must span ``min(2, Qw, racks available)`` racks."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from asyncbk.client.client import BookKeeper
from asyncbk.meta.model import LedgerMetadata
from asyncbk.testing.cluster import LocalCluster, free_port

from .clitools import cli_env
from .test_autorecovery import stored_everywhere

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors"),
              pytest.mark.timeout(90)]

RACKS = ["/r1", "/r1", "/r2", "/r2"]
R1, R2 = "/default-region/r1", "/default-region/r2"
PW = b"pw"


# ------------------------------------------------------------------ helpers


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "asyncbk", *args], capture_output=True,
                          text=True, timeout=timeout, env=cli_env(), stdin=subprocess.DEVNULL)


async def shell(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``asyncbk shell ARGS --metadata-uri <cluster>`` in a child process."""
    return await asyncio.to_thread(run_cli, "shell", *args, "--metadata-uri",
                                   cluster.metadata_uri)


def as_json(r: subprocess.CompletedProcess[str]) -> dict:  # type: ignore[type-arg]
    assert "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def registered_racks(cluster: LocalCluster, racks: list[str]) -> dict[str, str]:
    """Bookie id -> normalized location, as the bookies declared them."""
    return {b.id: f"/default-region{rack}" for b, rack in zip(cluster.bookies, racks,
                                                              strict=True)}


def fewest_racks(ensemble: tuple[str, ...] | list[str], write_quorum: int,
                 racks: dict[str, str]) -> int:
    """The fewest racks any write set (cyclic window of ``write_quorum``) spans."""
    size = len(ensemble)
    return min(len({racks[ensemble[(start + i) % size]] for i in range(write_quorum)})
               for start in range(size))


def violating_fragments(md: LedgerMetadata, racks: dict[str, str]) -> list[int]:
    """The fragments of ``md`` (indexes) a rack-aware check must report: those with
    entries (or the open tail of an open ledger) whose write sets span fewer than
    ``min(2, Qw, racks available)`` racks."""
    need = min(2, md.write_quorum, len(set(racks.values())))
    out = []
    for index, (first, ensemble) in enumerate(md.ensembles):
        open_tail = index == len(md.ensembles) - 1 and not md.is_closed
        if not open_tail and md.fragment_bounds(index)[1] < first:
            continue  # no entries: nothing to check
        if fewest_racks(ensemble, md.write_quorum, racks) < need:
            out.append(index)
    return out


def payload(lid: int, n: int) -> list[bytes]:
    """Entries of distinct content and size, binary included."""
    return [b"ledger %d entry %d " % (lid, i) + os.urandom(i % 37) + b"\x00\xff" * (i % 5)
            for i in range(n)]


async def write_ledgers(bk: BookKeeper, racks: dict[str, str], *, violating: int,
                        compliant: int, empty_violating: bool = False,
                        tries: int = 80) -> tuple[dict[int, list[bytes]], set[int], int | None]:
    """Closed E2/Qw2/Qa2 ledgers from a random-placement client, created until at
    least ``violating`` of them (with entries) have their write set in one rack and
    ``compliant`` span two (bounded: a random pair of 2+2 bookies is within one
    rack with probability 1/3).  With ``empty_violating``, also one violating ledger
    closed without entries (nothing to check).  Returns the entries of the ledgers
    with entries, the violating ones and the empty one."""
    data: dict[int, list[bytes]] = {}
    bad: set[int] = set()
    empty: int | None = None
    for _ in range(tries):
        if len(bad) >= violating and len(data) - len(bad) >= compliant and \
                (empty is not None or not empty_violating):
            break
        lh = await bk.create_ledger(2, 2, 2, password=PW)
        in_one_rack = fewest_racks(lh.metadata.ensembles[0][1], 2, racks) == 1
        if in_one_rack and empty_violating and empty is None:
            await lh.close()
            empty = lh.id
            continue
        if not in_one_rack and len(data) - len(bad) >= compliant:
            await lh.close()
            await bk.delete_ledger(lh.id)  # enough compliant ones already
            continue
        entries = payload(lh.id, 20 + 7 * len(data))
        await asyncio.gather(*(lh.append(e) for e in entries))
        await lh.close()
        data[lh.id] = entries
        if in_one_rack:
            bad.add(lh.id)
    assert len(bad) >= violating and len(data) - len(bad) >= compliant, \
        f"{tries} random ensembles did not give the ledgers asked for"
    assert empty is not None or not empty_violating
    return data, bad, empty


async def reads_back(cluster: LocalCluster, data: dict[int, list[bytes]]) -> None:
    """Every entry reads back byte-equal through a fresh client."""
    reader = await cluster.client()
    for lid, entries in data.items():
        rh = await reader.open_ledger(lid, password=PW)
        got = await rh.read(0, len(entries) - 1)
        assert [e.data for e in got] == entries, f"ledger {lid} reads back different"


async def snapshot(bk: BookKeeper, ids: list[int] | set[int]) -> dict[int, LedgerMetadata]:
    return {lid: await bk.meta.read_ledger(lid) for lid in ids}


# ------------------------------------------------------------------ 1: closed ledgers


async def test_placementcheck_lists_and_fixes_closed_ledgers(tmp_path: Path) -> None:
    async with LocalCluster(bookies=4, data_dir=tmp_path / "cluster", racks=RACKS) as cluster:
        racks = registered_racks(cluster, RACKS)
        bk = await cluster.client()  # random placement
        data, bad, empty = await write_ledgers(bk, racks, violating=2, compliant=2,
                                               empty_violating=True)
        control = await bk.create_ledger(3, 3, 2, password=PW)  # E3/Qw3: always 2 racks
        data[control.id] = payload(control.id, 15)
        await asyncio.gather(*(control.append(e) for e in data[control.id]))
        await control.close()
        everything = [*data, empty]
        before = await snapshot(bk, everything)
        assert {lid for lid, md in before.items() if violating_fragments(md, racks)} == bad
        assert fewest_racks(before[empty].ensembles[0][1], 2, racks) == 1  # yet not reported

        # the client's own policy is random: nothing can violate it
        r = await shell(cluster, "placementcheck")
        assert r.returncode == 0 and "random placement accepts every ensemble" in r.stdout, r

        r = await shell(cluster, "placementcheck", "--policy", "rack-aware", "--json")
        assert r.returncode == 1, (r.stdout, r.stderr)
        report = as_json(r)
        assert report["policy"] == "rack-aware" and report["min_racks_per_write_quorum"] == 2
        assert report["racks"] == {R1: 2, R2: 2}
        assert report["ledgers_checked"] == len(everything)
        assert report["violating_ledgers"] == len(bad) == report["left_fragments"]
        assert {f["ledger_id"] for f in report["fragments"]} == bad
        for f in report["fragments"]:
            md = before[f["ledger_id"]]
            assert (f["fragment"], f["first_entry"], f["last_entry"]) == (0, 0,
                                                                          md.last_entry_id)
            assert f["ensemble"] == list(md.ensembles[0][1])
            assert f["write_quorum"] == 2 and not f["open"] and f["fixable"]
            assert f["unregistered"] == [] and f["reasons"]

        r = await shell(cluster, "placementcheck", "--policy", "rack-aware")
        assert r.returncode == 1, (r.stdout, r.stderr)
        for lid in everything:
            assert (f"ledger {lid} fragment 0" in r.stdout) == (lid in bad), (lid, r.stdout)
        assert f"{len(bad)} of {len(everything)} ledger(s) violate" in r.stdout
        assert "--fix" in r.stdout

        # --dry-run: says what it would move, moves nothing
        r = await shell(cluster, "placementcheck", "--policy", "rack-aware", "--fix",
                        "--dry-run")
        assert r.returncode == 1, (r.stdout, r.stderr)
        for lid in bad:
            assert f"would move ledger {lid} fragment 0" in r.stdout, r.stdout
        assert f"dry run: {len(bad)} of {len(bad)} violating fragment(s) would be moved" \
            in r.stdout
        after_dry = await snapshot(bk, everything)
        assert {lid: (md.version, md.ensembles) for lid, md in after_dry.items()} == \
            {lid: (md.version, md.ensembles) for lid, md in before.items()}

        r = await shell(cluster, "placementcheck", "--policy", "rack-aware", "--fix", "--json")
        assert r.returncode == 0, (r.stdout, r.stderr)
        report = as_json(r)
        assert len(report["fixed"]) == len(bad) and report["left"] == []
        assert report["left_fragments"] == 0 and report["dry_run"] is False
        # one position of two replaced per ledger: each of its entries copied once
        assert report["copied_entries"] == sum(len(data[lid]) for lid in bad)

        after = await snapshot(bk, everything)
        for lid, md in after.items():
            assert violating_fragments(md, racks) == [], (lid, md.ensembles)
            old = before[lid]
            assert md.is_closed and md.last_entry_id == old.last_entry_id
            assert len(md.ensembles) == len(old.ensembles) == 1
            if lid in bad:
                new_ens, old_ens = md.ensembles[0][1], old.ensembles[0][1]
                assert fewest_racks(new_ens, 2, racks) == 2
                assert len(set(new_ens) & set(old_ens)) == 1  # fewest positions moved
            else:  # compliant or empty: untouched
                assert (md.version, md.ensembles) == (old.version, old.ensembles)
        for lid in bad:
            assert await stored_everywhere(bk, after[lid]), f"ledger {lid} misses copies"
        await reads_back(cluster, data)

        r = await shell(cluster, "placementcheck", "--policy", "rack-aware")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert f"placement OK: none of {len(everything)} ledger(s) violates" in r.stdout


# ------------------------------------------------------------------ 2: an open ledger


async def test_open_ledger_is_reported_not_moved_until_closed(tmp_path: Path) -> None:
    async with LocalCluster(bookies=4, data_dir=tmp_path / "cluster", racks=RACKS) as cluster:
        racks = registered_racks(cluster, RACKS)
        bk = await cluster.client()
        lh = None
        for _ in range(40):  # random pairs: within one rack with probability 1/3
            candidate = await bk.create_ledger(2, 2, 2, password=PW)
            if fewest_racks(candidate.metadata.ensembles[0][1], 2, racks) == 1:
                lh = candidate
                break
            await candidate.close()  # empty and compliant: never reported
        assert lh is not None, "no ensemble within one rack in 40 tries"
        entries = payload(lh.id, 30)
        await asyncio.gather(*(lh.append(e) for e in entries[:20]))
        before = await bk.meta.read_ledger(lh.id)
        assert not before.is_closed and violating_fragments(before, racks) == [0]

        r = await shell(cluster, "placementcheck", "--policy", "rack-aware", "--json")
        assert r.returncode == 1, (r.stdout, r.stderr)
        [f] = as_json(r)["fragments"]
        assert f["ledger_id"] == lh.id and f["open"] is True and f["fixable"] is False
        assert f["last_entry"] is None and f["ensemble"] == list(before.ensembles[0][1])

        r = await shell(cluster, "placementcheck", "--policy", "rack-aware", "--fix")
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert f"ledger {lh.id} fragment 0" in r.stdout and "open" in r.stdout
        assert "not movable now" in r.stdout and "moved 0 of 1" in r.stdout, r.stdout
        after = await bk.meta.read_ledger(lh.id)
        assert (after.version, after.ensembles, after.state) == (
            before.version, before.ensembles, before.state)

        # the writer was left alone (not fenced): it goes on, then closes
        await asyncio.gather(*(lh.append(e) for e in entries[20:]))
        await lh.close()
        r = await shell(cluster, "placementcheck", "--policy", "rack-aware", "--fix")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert f"moved ledger {lh.id} fragment 0" in r.stdout and "0 left" in r.stdout
        md = await bk.meta.read_ledger(lh.id)
        assert md.is_closed and md.last_entry_id == 29
        assert violating_fragments(md, racks) == []
        assert await stored_everywhere(bk, md)
        await reads_back(cluster, {lh.id: entries})


# ------------------------------------------------------------------ 3: a rack file


async def test_rack_file_wins_over_registered_racks(tmp_path: Path) -> None:
    one_rack = ["/r1"] * 4
    async with LocalCluster(bookies=4, data_dir=tmp_path / "cluster",
                            racks=one_rack) as cluster:
        b0, b1, b2, b3 = cluster.bookies
        host = b0.id.rsplit(":", 1)[0]
        rack_file = tmp_path / "racks.txt"
        # a host line (any port) and two bookie-id lines, which win over it
        rack_file.write_text(f"# where the bookies really are\n{host} /r1\n\n"
                             f"{b2.id} /r2  # moved\n{b3.id} /default-region/r2\n")
        by_file = {b0.id: R1, b1.id: R1, b2.id: R2, b3.id: R2}

        r = await shell(cluster, "listbookies", "--json")
        assert r.returncode == 0, r.stderr
        assert {row["id"]: row["rack"] for row in as_json(r)} == \
            registered_racks(cluster, one_rack)
        r = await shell(cluster, "listbookies", "--json", "--bookie-racks-file", str(rack_file))
        assert r.returncode == 0, r.stderr
        assert {row["id"]: row["rack"] for row in as_json(r)} == by_file
        r = await shell(cluster, "listbookies", "--bookie-racks-file", str(rack_file))
        assert r.returncode == 0, r.stderr
        rows = [line.split("\t") for line in r.stdout.splitlines()]
        assert {row[0]: row[2] for row in rows} == by_file
        assert all(row[1] == "writable" for row in rows)

        bk = await cluster.client()  # sees one rack: places at random
        data, bad, _ = await write_ledgers(bk, by_file, violating=1, compliant=1)

        # by the registered racks there is one rack: nothing can violate
        r = await shell(cluster, "placementcheck", "--policy", "rack-aware")
        assert r.returncode == 0 and "placement OK" in r.stdout, (r.stdout, r.stderr)

        with_file = ("--policy", "rack-aware", "--bookie-racks-file", str(rack_file))
        r = await shell(cluster, "placementcheck", *with_file, "--json")
        assert r.returncode == 1, (r.stdout, r.stderr)
        report = as_json(r)
        assert report["racks"] == {R1: 2, R2: 2}
        assert {f["ledger_id"] for f in report["fragments"]} == bad
        assert report["violating_ledgers"] == len(bad)

        r = await shell(cluster, "placementcheck", *with_file, "--fix")
        assert r.returncode == 0, (r.stdout, r.stderr)
        for lid in bad:
            assert f"moved ledger {lid} fragment 0" in r.stdout
        for lid, md in (await snapshot(bk, data)).items():
            assert violating_fragments(md, by_file) == [], (lid, md.ensembles)
        await reads_back(cluster, data)
        r = await shell(cluster, "placementcheck", *with_file)
        assert r.returncode == 0 and "placement OK" in r.stdout, (r.stdout, r.stderr)


# ------------------------------------------------------------------ 4: auto-recovery


async def test_autorecovery_fixes_placement(tmp_path: Path, finding) -> None:  # type: ignore[no-untyped-def]
    async with LocalCluster(bookies=4, data_dir=tmp_path / "cluster", racks=RACKS) as cluster:
        racks = registered_racks(cluster, RACKS)
        bk = await cluster.client()
        data, bad, _ = await write_ledgers(bk, racks, violating=2, compliant=1)
        before = await snapshot(bk, data)
        port = free_port()
        name = "ar-placement"
        log = tmp_path / "autorecovery.log"
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "asyncbk", "autorecovery", "--metadata-uri",
                cluster.metadata_uri, "--id", name, "--http-port", str(port),
                "--placement-policy", "rack-aware", "--fix-placement", "--audit-interval", "1",
                "--rate", "0", stdout=asyncio.subprocess.PIPE, stderr=err,
                stdin=asyncio.subprocess.DEVNULL, env=cli_env())
        url = f"http://127.0.0.1:{port}"
        try:
            assert proc.stdout is not None
            async with asyncio.timeout(30):
                while (line := (await proc.stdout.readline()).decode()) != \
                        f"ready autorecovery {name}\n":
                    assert line, f"autorecovery exited: {log.read_text()[-2000:]}"

            loop = asyncio.get_running_loop()
            t0 = loop.time()
            async with asyncio.timeout(30):
                while True:
                    mds = await snapshot(bk, data)
                    if not any(violating_fragments(md, racks) for md in mds.values()):
                        break
                    await asyncio.sleep(0.3)
            finding(f"{len(bad)} of {len(data)} ledgers moved to comply "
                    f"{loop.time() - t0:.1f} s after the auditor was ready")
            for lid, md in mds.items():
                assert md.is_closed and md.last_entry_id == before[lid].last_entry_id
                if lid in bad:
                    assert await stored_everywhere(bk, md), f"ledger {lid} misses copies"
                else:
                    assert md.version == before[lid].version  # compliant: untouched
            await reads_back(cluster, data)

            async with aiohttp.ClientSession() as s:
                async with s.get(f"{url}/api/v1/autorecovery/status") as resp:
                    checks = (await resp.json())["placement_checks"]
                async with asyncio.timeout(20):  # a check that starts after the fix
                    while True:
                        async with s.get(f"{url}/api/v1/autorecovery/status") as resp:
                            status = await resp.json()
                        if status["placement_checks"] >= checks + 2:
                            break
                        await asyncio.sleep(0.3)
                async with s.get(f"{url}/metrics") as resp:
                    metrics = await resp.text()
            assert status["is_auditor"]
            assert status["placement_fixed_fragments"] == len(bad)
            assert status["placement_violating_ledgers"] == 0
            assert status["placement_left_fragments"] == 0
            values = {m["name"]: float(m["value"]) for m in re.finditer(
                r'^asyncbk_autorecovery_(?P<name>placement_\w+)\{id="' + name
                + r'"\} (?P<value>\S+)$', metrics, re.MULTILINE)}
            assert values.get("placement_fixed_fragments_total") == len(bad), metrics
            assert values.get("placement_violating_ledgers") == 0, metrics
            assert values.get("placement_checks_total", 0) >= checks + 2, metrics
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(15):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, log.read_text()[-2000:]


# ------------------------------------------------------------------ 5: bad input


PLACEMENTCHECK = ["shell", "placementcheck", "--policy", "rack-aware"]


@pytest.mark.parametrize(("command", "text", "line", "expect"), [
    (PLACEMENTCHECK, "127.0.0.1:3181 /r1\n127.0.0.1:3182 /r1 extra\n", 2,
     "expected two fields"),
    (PLACEMENTCHECK, "# racks\n\n127.0.0.1:3181 r1\n", 3, "network location"),
    (PLACEMENTCHECK, "127.0.0.1:3181 /r1\n127.0.0.1:3181 /r2\n", 2,
     "another location on line 1"),
    (["shell", "listbookies"], "127.0.0.1 /r1 /r2\n", 1, "expected two fields"),
    (["autorecovery", "--placement-policy", "rack-aware", "--fix-placement"],
     "127.0.0.1:3181 /a/b/c\n", 1, "network location"),
])
def test_malformed_rack_file_is_one_line_before_connecting(
        tmp_path: Path, command: list[str], text: str, line: int, expect: str) -> None:
    rack_file = tmp_path / "racks.txt"
    rack_file.write_text(text)
    # nothing listens on port 1: connecting first would say "cannot reach etcd"
    r = run_cli(*command, "--metadata-uri", "etcd://127.0.0.1:1/x",
                "--bookie-racks-file", str(rack_file), timeout=30)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{rack_file}:{line}:" in lines[0] and expect in lines[0], lines[0]
    assert "cannot reach" not in lines[0] and r.stdout == ""


def test_missing_rack_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.txt"
    r = run_cli("shell", "placementcheck", "--metadata-uri", "etcd://127.0.0.1:1/x",
                "--bookie-racks-file", str(missing), timeout=30)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{missing} does not exist" in lines[0], r.stderr
