"""Several ledger and journal directories per bookie, with real bookie processes:
ledgers spread over them and kept through SIGKILL; a directory added to a running
fleet by a rolling restart; one directory's disk filling up (a real, small tmpfs)
while the bookie stays writable for its other directory."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from asyncbk.bookie.storage import ENTRYLOG_DIR
from asyncbk.client.client import BookKeeper
from asyncbk.client.ledger import LedgerHandle
from asyncbk.testing.cluster import LocalBookie, LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]


async def info(bookie: LocalBookie) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, \
            s.get(f"{bookie.http_url}/api/v1/bookie/info",
                  timeout=aiohttp.ClientTimeout(total=5)) as r:
        assert r.status == 200
        return dict(await r.json())


def has_entry_logs(ledger_dir: Path) -> bool:
    d = ledger_dir / ENTRYLOG_DIR
    return d.is_dir() and any(f.stat().st_size > 0 for f in d.iterdir())


async def read_all(bk: BookKeeper, ledger_id: int, recovery: bool = False) -> list[bytes]:
    rh = await bk.open_ledger(ledger_id, password=b"pw", recovery=recovery)
    if rh.last_add_confirmed < 0:
        return []
    return [e.data for e in await rh.read(0, rh.last_add_confirmed)]


async def test_ledgers_spread_over_directories_and_survive_sigkill(tmp_path: Path) -> None:
    async with LocalCluster(bookies=3, data_dir=tmp_path / "c", ledger_dirs=2,
                            journal_dirs=2) as cluster:
        bk = await cluster.client()
        written: dict[int, list[bytes]] = {}
        for n in range(6):  # one after another: each bookie places them 0, 1, 0, 1, ...
            lh = await bk.create_ledger(3, 3, 2, password=b"pw")
            written[lh.id] = [b"%d-%d" % (n, i) for i in range(40)]
            await asyncio.gather(*(lh.append(p) for p in written[lh.id]))
        for b in cluster.bookies:
            doc = await info(b)
            assert [d["ledgers"] for d in doc["directories"]] == [3, 3], doc
            for d in b.ledger_dirs:
                assert has_entry_logs(d), d
            assert (b.dir / "journal-1").is_dir() and any((b.dir / "journal-1").glob("*.jnl"))
        for b in cluster.bookies:
            b.kill()
        for b in cluster.bookies:
            await b.wait()
        await asyncio.gather(*(b.start() for b in cluster.bookies))
        reader = await cluster.client()
        for ledger_id, payloads in written.items():
            assert await read_all(reader, ledger_id, recovery=True) == payloads


async def test_a_ledger_directory_added_to_a_running_fleet(tmp_path: Path) -> None:
    """Each bookie in turn is stopped, given a second ledger directory and started
    again, while a writer appends; the writer loses nothing, and new ledgers land in
    the new directories."""
    async with LocalCluster(bookies=4, data_dir=tmp_path / "c") as cluster:
        bk = await cluster.client()
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        acked: list[int] = []
        stop = asyncio.Event()

        async def writer() -> None:
            n = 0
            while not stop.is_set():
                acked.append(await lh.append(b"w%d" % n))
                n += 1
                await asyncio.sleep(0.002)

        task = asyncio.create_task(writer())
        try:
            for b in cluster.bookies:
                before = len(acked)
                await b.stop()
                b.add_ledger_dir()
                await b.start()
                async with asyncio.timeout(30):
                    while len(acked) < before + 50:  # noqa: ASYNC110 - the writer goes on
                        await asyncio.sleep(0.05)
                assert not task.done()
        finally:
            stop.set()
            await task
        assert acked == list(range(len(acked)))
        await lh.close()
        assert await read_all(bk, lh.id) == [b"w%d" % n for n in range(len(acked))]
        new = await bk.create_ledger(4, 4, 4, password=b"pw")
        await asyncio.gather(*(new.append(b"n%d" % i) for i in range(20)))
        for b in cluster.bookies:
            doc = await info(b)
            assert len(doc["directories"]) == 2
            assert doc["directories"][1]["ledgers"] >= 1, doc  # the new ledger went there
            assert has_entry_logs(b.ledger_dirs[1])
        await new.close()
        # the cookie records the new directory: a restart needs no option any more
        b = cluster.bookies[0]
        b.allow_storage_expansion = False
        await b.stop()
        await b.start()
        assert await read_all(await cluster.client(), new.id) == [b"n%d" % i for i in range(20)]


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        err = getattr(exc, "stderr", b"") or b""
        pytest.skip(f"not run: cannot mount a tmpfs here (needs root): {exc} "
                    f"{err.decode(errors='replace').strip()}")


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True, timeout=30)


async def test_one_full_directory_moves_its_ledgers_away_and_the_bookie_stays_writable(
        tmp_path: Path) -> None:
    data = tmp_path / "c"
    small = data / "bookie-0" / "ledgers-1"  # bookie 0's second ledger directory
    # The whole cluster on a tmpfs of its own: a directory's fullness also counts its
    # journal's disk, which must not be the host's (its usage is not this test's).
    _mount_tmpfs(data, "1g")
    try:
        _mount_tmpfs(small, "24m")
    except BaseException:
        _umount(data)
        raise
    try:
        async with LocalCluster(bookies=5, data_dir=data, ledger_dirs=2, bookie_config={
                "disk_check_interval_s": 0.1, "disk_usage_threshold": 0.9,
                "disk_usage_lwm_threshold": 0.8}) as cluster:
            b0 = cluster.bookies[0]
            assert b0.ledger_dirs[1] == small
            bk = await cluster.client()
            # the first two ledgers bookie 0 is in: the first in its directory 0, the
            # second in its directory 1 (fewest ledgers, first on a tie)
            mine: list[LedgerHandle] = []
            while len(mine) < 2:
                lh = await bk.create_ledger(4, 4, 2, password=b"pw")
                if b0.id in lh.metadata.ensembles[-1][1]:
                    await lh.append(b"first")
                    mine.append(lh)
                else:
                    await lh.close()
            in_0, in_1 = mine
            assert [d["ledgers"] for d in (await info(b0))["directories"]] == [1, 1]

            st = os.statvfs(small)
            filler = small / "filler"
            fill = int(st.f_blocks * st.f_frsize * 0.95) - (st.f_blocks - st.f_bfree) * st.f_frsize
            await asyncio.to_thread(filler.write_bytes, b"\0" * fill)
            async with asyncio.timeout(10):
                while not (await info(b0))["directories"][1]["full"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            doc = await info(b0)
            assert doc["state"] == "writable" and not doc["directories"][0]["full"]

            for lh in (in_0, in_1):
                await asyncio.gather(*(lh.append(b"more-%d" % i) for i in range(30)))
            assert b0.id in in_0.metadata.ensembles[-1][1]  # its directory has room
            # b0 refuses in_1's adds; with Qa 2 of 4 the others may acknowledge them
            # all before that refusal is handled, so the change may still be under way
            async with asyncio.timeout(10):
                while b0.id in in_1.metadata.ensembles[-1][1]:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            assert b0.id not in in_1.metadata.ensembles[-1][1]  # replaced for the rest
            fresh = await bk.create_ledger(5, 5, 2, password=b"pw")  # a new ledger: dir 0
            await fresh.append(b"fresh")
            assert [d["ledgers"] for d in (await info(b0))["directories"]] == [2, 1]

            await asyncio.to_thread(filler.unlink)
            async with asyncio.timeout(10):
                while (await info(b0))["directories"][1]["full"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            for lh in (in_0, in_1):
                await lh.close()
                assert await read_all(bk, lh.id) == [b"first"] + [b"more-%d" % i
                                                                 for i in range(30)]
    finally:
        await asyncio.to_thread(_umount, small)
        await asyncio.to_thread(_umount, data)
