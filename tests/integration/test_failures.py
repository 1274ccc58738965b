"""Durability and robustness with real processes: SIGKILL, restarts, bad frames,
leases, cookies."""

from __future__ import annotations

import asyncio
import shutil
import socket
import struct

import msgpack
import pytest

from asyncbk.errors import BKError
from asyncbk.meta.uri import open_metadata_store
from asyncbk.testing.cluster import LocalBookie, LocalCluster, free_port

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]


async def _registered(cluster: LocalCluster) -> set[str]:
    meta = await open_metadata_store(cluster.metadata_uri)
    try:
        return set(await meta.list_bookies())
    finally:
        await meta.close()


async def _wait_registered(cluster: LocalCluster, want: set[str], timeout_s: float) -> float:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with asyncio.timeout(timeout_s):
        while await _registered(cluster) != want:  # noqa: ASYNC110 - polling etcd
            await asyncio.sleep(0.1)
    return loop.time() - t0


async def test_acked_entries_survive_sigkill_of_every_bookie(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 2, 2, password=b"pw")
    payloads = [b"durable-%d" % i for i in range(500)]
    ids = await asyncio.gather(*(lh.append(p) for p in payloads))
    assert ids == list(range(500))
    for b in cluster.bookies:
        b.kill()
    for b in cluster.bookies:
        await b.wait()
    await asyncio.gather(*(b.start() for b in cluster.bookies))
    reader = await cluster.client()
    rh = await reader.open_ledger(lh.id, password=b"pw", recovery=True)
    assert rh.last_add_confirmed == 499
    assert [e.data for e in await rh.read(0, 499)] == payloads


async def test_bookie_restart_after_graceful_stop_keeps_data(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 3, 3)
    for i in range(100):
        await lh.append(b"g%d" % i)
    await lh.close()
    for b in cluster.bookies:
        await b.stop()
    for b in cluster.bookies:
        await b.start()
    rh = await (await cluster.client()).open_ledger(lh.id)
    assert [e.data for e in await rh.read(0, 99)] == [b"g%d" % i for i in range(100)]


async def test_malformed_frames_do_not_disturb_a_concurrent_writer(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 3, 3)
    stop = asyncio.Event()
    written: list[int] = []

    async def writer() -> None:
        i = 0
        while not stop.is_set():
            written.append(await lh.append(b"w%d" % i))
            i += 1

    garbage = [
        b"\x00\x00\x00\x05hello",                              # not msgpack
        struct.pack(">I", 0xFFFFFFF0),                          # oversized length
        b"\x00\x00\x00\x00",                                    # empty frame
        struct.pack(">I", 3) + msgpack.packb([1, 99, 1]),       # unknown op
        struct.pack(">I", 4) + msgpack.packb([1, 1, 1]),        # wrong arity
    ]
    task = asyncio.create_task(writer())
    try:
        for b in cluster.bookies:
            host, port = b.id.split(":")
            for blob in garbage:
                reader, wr = await asyncio.open_connection(host, int(port))
                wr.write(blob)
                await wr.drain()
                async with asyncio.timeout(10):
                    rest = await reader.read()  # the bookie closes this connection
                assert rest == b""
                wr.close()
                await wr.wait_closed()
        before = len(written)
        await asyncio.sleep(0.3)
        assert len(written) > before, "the writer kept getting acks"
    finally:
        stop.set()
        await task
    await lh.close()
    rh = await (await cluster.client()).open_ledger(lh.id)
    assert rh.last_add_confirmed == written[-1]
    assert [e.data for e in await rh.read(0, written[-1])] == [b"w%d" % i for i in written]


async def test_half_frame_then_disconnect_is_harmless(cluster: LocalCluster) -> None:
    b = cluster.bookies[0]
    host, port = b.id.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(struct.pack(">I", 1000) + b"x" * 10)
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 3, 3)
    assert await lh.append(b"ok") == 0


async def test_lease_expires_when_a_bookie_dies(cluster: LocalCluster) -> None:
    """The registration is kept alive well past its TTL while the bookie lives, and
    vanishes within about one TTL after SIGKILL (etcd lease expiry, no goodbye)."""
    ttl_s = cluster.bookie_config["lease_ttl_s"]
    everyone = {b.id for b in cluster.bookies}
    assert await _registered(cluster) == everyone
    await asyncio.sleep(ttl_s * 2)  # keep-alives must have renewed the lease
    assert await _registered(cluster) == everyone
    victim = cluster.bookies[1]
    victim.kill()
    gone_after_s = await _wait_registered(cluster, everyone - {victim.id}, timeout_s=ttl_s * 4)
    assert gone_after_s <= ttl_s + 3
    await victim.start()
    await _wait_registered(cluster, everyone, timeout_s=10)


async def test_graceful_stop_revokes_the_lease_at_once(cluster: LocalCluster) -> None:
    everyone = {b.id for b in cluster.bookies}
    victim = cluster.bookies[0]
    await victim.stop()
    # Revoked on the way out: gone at once, not after a TTL.
    assert await _registered(cluster) == everyone - {victim.id}


async def test_wiped_or_swapped_directories_refuse_to_start(cluster: LocalCluster) -> None:
    a, b = cluster.bookies[0], cluster.bookies[1]
    await a.stop()
    await b.stop()
    # Swap the ledger directories of a and b: both must refuse.
    tmp = a.ledger_dir.with_name("swap")
    a.ledger_dir.rename(tmp)
    b.ledger_dir.rename(a.ledger_dir)
    tmp.rename(b.ledger_dir)
    with pytest.raises(BKError, match="does not match"):
        await a.start()
    # Put them back and wipe a's journal: refuses (disk wiped).
    tmp = a.ledger_dir.with_name("swap")
    a.ledger_dir.rename(tmp)
    b.ledger_dir.rename(a.ledger_dir)
    tmp.rename(b.ledger_dir)
    shutil.rmtree(a.journal_dir)
    with pytest.raises(BKError, match="disk was wiped or replaced"):
        await a.start()
    await b.start()  # b's directories are its own again


async def test_second_process_on_the_same_directories_refuses(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 3, 3)
    for i in range(20):
        await lh.append(b"l%d" % i)
    running = cluster.bookies[0]
    twin = LocalBookie(cluster, running.index, free_port())  # same directories, new port
    twin.id = running.id  # same identity too: only the lock can stop it
    with pytest.raises(BKError, match="in use by another running bookie"):
        await twin.start()
    # The running bookie was not disturbed: it keeps serving and survives a restart.
    await lh.append(b"after")
    await running.stop()
    await running.start()
    await lh.close()
    rh = await (await cluster.client()).open_ledger(lh.id)
    assert [e.data for e in await rh.read(0, 20)] == [b"l%d" % i for i in range(20)] + [b"after"]
