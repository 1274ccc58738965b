"""A read-only bookie, with real bookie processes: its disk fills up for real (a small
tmpfs filled with a plain file), it refuses adds with READ_ONLY and its writers move
away, it still serves the entries it holds, it stays read-only between the marks and
turns writable again below the low mark; a bookie read-only for maintenance serves
its entries too."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from asyncbk.client.ledger import LedgerHandle
from asyncbk.errors import NotEnoughBookiesError
from asyncbk.proto import Status
from asyncbk.testing import LocalBookie, LocalCluster

from .bookie_calls import CALL_TIMEOUT_S, add_status, bookie_state

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]

THRESHOLD, LOW_MARK = 0.9, 0.8
DISK_CONFIG = {"disk_check_interval_s": 0.1, "disk_usage_threshold": THRESHOLD,
               "disk_usage_lwm_threshold": LOW_MARK}
SETTLE_S = 2.5
"""Long enough for a bookie to see a disk change: its ledger disk's usage is refreshed
every second and checked every ``disk_check_interval_s``."""
UNREACHABLE = "127.0.0.1:1"


def payload(tag: str, i: int) -> bytes:
    return f"{tag}-{i}-".encode() + b"p" * 1000


def disk_used(path: Path) -> tuple[float, int, int]:
    """(used fraction, used bytes, total bytes) of the file system holding ``path``."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    used = total - st.f_bavail * st.f_frsize
    return used / total, used, total


def fill_to(path: Path, filler: Path, fraction: float) -> float:
    """Grow or shrink ``filler`` (a plain file on ``path``'s file system) until the file
    system is ``fraction`` used; returns the usage reached."""
    _, used, total = disk_used(path)
    have = filler.stat().st_size if filler.exists() else 0
    want = max(0, have + int(total * fraction) - used)
    if want > have:
        with open(filler, "ab") as fh:
            fh.write(b"\0" * (want - have))
            fh.flush()
            os.fsync(fh.fileno())
    else:
        os.truncate(filler, want)
    return disk_used(path)[0]


async def wait_until(check: Callable[[], Awaitable[bool]], what: str,
                     timeout_s: float = 15.0) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while not await check():  # noqa: ASYNC110 - polling the bookie and etcd
                await asyncio.sleep(0.1)
    except TimeoutError:
        pytest.fail(f"not within {timeout_s}s: {what}")


async def registered_read_only(bk: Any, bookie: LocalBookie) -> bool | None:
    reg = (await bk.meta.list_bookies()).get(bookie.id)
    return None if reg is None else bool(reg.readonly)


async def only_from(cluster: LocalCluster, bookie: LocalBookie) -> Any:
    """A client that can reach ``bookie`` and no other bookie."""
    return await cluster.client(bookie_addresses={
        b.id: UNREACHABLE for b in cluster.bookies if b is not bookie})


async def ledger_on(bk: Any, bookie: LocalBookie, e: int) -> LedgerHandle:
    """A new ledger E=Qw=Qa=``e`` whose ensemble includes ``bookie``."""
    for _ in range(50):
        lh: LedgerHandle = await bk.create_ledger(e, e, e, password=b"pw")
        if bookie.id in lh.metadata.ensembles[0][1]:
            return lh
        await lh.close()
    pytest.fail(f"no ledger placed on {bookie.id} in 50")


async def test_a_full_disk_turns_the_bookie_read_only_and_back(
        tmp_path: Path, tmpfs: Callable[[Path, str], Awaitable[Path]], finding: Any) -> None:
    data = tmp_path / "c"
    # The cluster on a tmpfs of its own (a directory's fullness counts its journal's
    # disk too, which must not be the host's), bookie 0's ledger directory on a small one.
    await tmpfs(data, "512m")
    small = await tmpfs(data / "bookie-0" / "ledgers", "16m")
    filler = small / "filler"
    async with LocalCluster(bookies=4, data_dir=data, bookie_config=DISK_CONFIG) as cluster:
        b0 = cluster.bookies[0]
        assert b0.ledger_dir == small
        bk = await cluster.client()
        # every entry on each of its three bookies, bookie 0 one of them
        lh = await ledger_on(bk, b0, 3)
        before = [payload("before", i) for i in range(50)]
        assert await asyncio.gather(*(lh.append(p) for p in before)) == list(range(50))
        assert (await bookie_state(b0))["state"] == "writable"

        # the disk fills up: read-only, registered as such, adds refused
        reached = await asyncio.to_thread(fill_to, small, filler, 0.95)
        assert reached >= THRESHOLD, reached

        async def read_only() -> bool:
            return (await bookie_state(b0))["state"] == "readonly" and \
                await registered_read_only(bk, b0) is True
        await wait_until(read_only, f"{b0.id} read-only with its disk {reached:.0%} used")
        assert (await bookie_state(b0))["reasons"] == ["disk_full"]
        assert await add_status(bk, b0.id, lh.id, 50) is Status.READ_ONLY

        # its writer moves away: the next entries need a replacement (Qa 3)
        after = [payload("after", i) for i in range(30)]
        async with asyncio.timeout(30):
            assert await asyncio.gather(*(lh.append(p) for p in after)) == list(range(50, 80))
        ensembles = lh.metadata.ensembles
        assert len(ensembles) == 2 and ensembles[1][0] == 50, ensembles
        assert b0.id in ensembles[0][1] and b0.id not in ensembles[1][1], ensembles
        assert lh.ensemble_changes == 1
        # no new ledger is placed on it: three writable bookies are left
        with pytest.raises(NotEnoughBookiesError):
            await bk.create_ledger(4, 4, 4, password=b"pw")
        await lh.close()

        # it still serves what it holds: a reader that reaches no other bookie
        reader = await only_from(cluster, b0)
        rh = await reader.open_ledger(lh.id, password=b"pw")
        async with asyncio.timeout(30):
            assert [e.data for e in await rh.read(0, 49)] == before

        # between the marks it stays read-only
        between = await asyncio.to_thread(fill_to, small, filler, (THRESHOLD + LOW_MARK) / 2)
        assert LOW_MARK <= between < THRESHOLD, between
        await asyncio.sleep(SETTLE_S)
        assert await read_only(), f"writable again at {between:.0%} used, above the low mark"
        assert await add_status(bk, b0.id, lh.id, 80) is Status.READ_ONLY

        # below the low mark it is writable again and takes adds
        await asyncio.to_thread(filler.unlink)
        below = (await asyncio.to_thread(disk_used, small))[0]
        assert below < LOW_MARK, below

        async def writable() -> bool:
            return (await bookie_state(b0))["state"] == "writable" and \
                await registered_read_only(bk, b0) is False
        await wait_until(writable, f"{b0.id} writable again with its disk {below:.0%} used")
        fresh_client = await cluster.client()
        fresh = await fresh_client.create_ledger(4, 4, 4, password=b"pw")  # needs bookie 0
        assert b0.id in fresh.metadata.ensembles[0][1]
        again = [payload("again", i) for i in range(20)]
        async with asyncio.timeout(30):
            assert await asyncio.gather(*(fresh.append(p) for p in again)) == list(range(20))
        await fresh.close()
        rh = await reader.open_ledger(fresh.id, password=b"pw")
        assert [e.data for e in await rh.read(0, 19)] == again
        finding(f"read-only at {reached:.0%} used, still at {between:.0%}, writable at "
                f"{below:.0%} (marks {THRESHOLD:.0%} / {LOW_MARK:.0%})")


async def test_a_bookie_read_only_for_maintenance_serves_its_entries(tmp_path: Path) -> None:
    """Put read-only through its admin endpoint, a bookie refuses adds with READ_ONLY
    and serves every entry it holds to a reader that can reach no other bookie."""
    async with LocalCluster(bookies=3, data_dir=tmp_path / "c") as cluster:
        bk = await cluster.client()
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        written = [payload("m", i) for i in range(40)]
        assert await asyncio.gather(*(lh.append(p) for p in written)) == list(range(40))
        await lh.close()
        ro = cluster.bookies[1]
        async with aiohttp.ClientSession() as s, s.put(
                f"{ro.http_url}/api/v1/bookie/state", json={"read_only": True},
                timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)) as r:
            assert r.status == 200, await r.text()
        assert await bookie_state(ro) == {"state": "readonly", "read_only": True,
                                          "reasons": ["maintenance"]}
        assert await add_status(bk, ro.id, lh.id, 40) is Status.READ_ONLY
        reader = await only_from(cluster, ro)
        rh = await reader.open_ledger(lh.id, password=b"pw")
        async with asyncio.timeout(30):
            assert [e.data for e in await rh.read(0, 39)] == written
