"""The public ledger API against a real cluster (etcd + bookie processes)."""

from __future__ import annotations

import asyncio

import pytest

import asyncbk
from asyncbk.errors import (
    LedgerClosedError,
    LedgerFencedError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    ReadBeyondLastAddConfirmedError,
    TooManyRequestsError,
    UnauthorizedAccessError,
)
from asyncbk.testing.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]


async def test_create_append_close_read(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw",
                                metadata={"app": b"demo"})
    assert lh.last_add_confirmed == -1
    ids = [await lh.append(f"e{i}".encode()) for i in range(10)]
    assert ids == list(range(10))
    assert lh.last_add_confirmed == 9
    await lh.close()
    await lh.close()  # idempotent
    with pytest.raises(LedgerClosedError):
        lh.append(b"late")

    md = await bk.ledger_metadata(lh.id)
    assert md.state is asyncbk.LedgerState.CLOSED
    assert md.last_entry_id == 9
    assert md.length == sum(len(f"e{i}") for i in range(10))
    assert md.custom == {"app": b"demo"}
    assert (md.ensemble_size, md.write_quorum, md.ack_quorum) == (3, 2, 2)
    assert md.ensembles[0][0] == 0 and len(md.ensembles[0][1]) == 3
    assert set(md.ensembles[0][1]) <= {b.id for b in cluster.bookies}
    assert md.digest == "xxh3" and md.ctime > 0

    rh = await bk.open_ledger(lh.id, password=b"pw")
    assert rh.last_add_confirmed == 9
    entries = await rh.read(0, 9)
    assert [e.data for e in entries] == [f"e{i}".encode() for i in range(10)]
    assert [e.entry_id for e in entries] == list(range(10))
    assert all(e.ledger_id == lh.id for e in entries)
    assert [e.data for e in await rh.read(3, 5)] == [b"e3", b"e4", b"e5"]
    with pytest.raises(ReadBeyondLastAddConfirmedError):
        await rh.read(5, 10)


@pytest.mark.parametrize("digest", ["xxh3", "hmac-sha256", "none"])
async def test_digests(cluster: LocalCluster, digest: str) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 3, 2, digest=digest, password=b"secret")
    for i in range(5):
        await lh.append(bytes([i]) * 100)
    await lh.close()
    rh = await bk.open_ledger(lh.id, password=b"secret")
    assert [e.data for e in await rh.read(0, 4)] == [bytes([i]) * 100 for i in range(5)]
    assert (await bk.ledger_metadata(lh.id)).digest == digest


async def test_5000_pipelined_appends_resolve_in_order(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 2, 2)
    order: list[int] = []
    futures = []
    for i in range(5000):
        fut = lh.append(i.to_bytes(4, "big") * 64)
        fut.add_done_callback(lambda f: order.append(f.result()))
        futures.append(fut)
    results = await asyncio.gather(*futures)
    assert results == list(range(5000))
    assert order == list(range(5000)), "futures must resolve in entry-id order"
    assert lh.last_add_confirmed == 4999
    await lh.close()
    rh = await bk.open_ledger(lh.id)
    entries = await rh.read(0, 4999)
    assert all(e.data == e.entry_id.to_bytes(4, "big") * 64 for e in entries)


async def test_validation_and_not_enough_bookies(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    for e, w, a in [(2, 3, 1), (3, 2, 3), (3, 3, 0), (0, 0, 0)]:
        with pytest.raises(ValueError):
            await bk.create_ledger(e, w, a)
    with pytest.raises(NotEnoughBookiesError):
        await bk.create_ledger(4, 2, 2)
    with pytest.raises(ValueError, match="digest"):
        await bk.create_ledger(3, 2, 2, digest="crc32")


async def test_wrong_password(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 2, 2, password=b"right")
    await lh.append(b"x")
    with pytest.raises(UnauthorizedAccessError):
        await bk.open_ledger(lh.id, password=b"wrong", recovery=False)
    with pytest.raises(UnauthorizedAccessError):
        await bk.open_ledger(lh.id, password=b"wrong", recovery=True)
    # The failed recovery attempt did not fence: the writer goes on.
    assert await lh.append(b"y") == 1
    await lh.close()


async def test_list_delete_and_unknown_ledger(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    created = []
    for _ in range(3):
        lh = await bk.create_ledger(3, 2, 2)
        await lh.close()
        created.append(lh.id)
    listed = [lid async for lid in bk.list_ledgers()]
    assert listed == sorted(listed)
    assert set(created) <= set(listed)
    await bk.delete_ledger(created[1])
    assert created[1] not in [lid async for lid in bk.list_ledgers()]
    for call in (bk.ledger_metadata(created[1]), bk.open_ledger(created[1]),
                 bk.delete_ledger(created[1]), bk.open_ledger(10**15, recovery=False)):
        with pytest.raises(NoSuchLedgerError):
            await call


async def test_reader_of_open_ledger_and_unconfirmed_reads(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 3, 2)
    for i in range(20):
        await lh.append(b"%d" % i)
    reader_bk = await cluster.client()
    rh = await reader_bk.open_ledger(lh.id, recovery=False)
    # Bookies learn the LAC from the piggyback of later adds: at least up to 18 is known.
    assert rh.last_add_confirmed >= 18
    await lh.append(b"20")
    assert await rh.read_last_add_confirmed() >= 19
    got = await rh.read_unconfirmed(0, 20)
    assert [e.data for e in got] == [b"%d" % i for i in range(21)]
    # recovery=False does not fence: the writer keeps going.
    assert await lh.append(b"21") == 21
    await lh.close()
    assert (await reader_bk.ledger_metadata(lh.id)).last_entry_id == 21


async def test_recovery_open_fences_the_writer(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 2, 2, password=b"pw")
    acked = [await lh.append(b"a%d" % i) for i in range(50)]
    other = await cluster.client()
    rh = await other.open_ledger(lh.id, password=b"pw", recovery=True)
    md = await other.ledger_metadata(lh.id)
    assert md.state is asyncbk.LedgerState.CLOSED
    assert md.last_entry_id == acked[-1] == rh.last_add_confirmed
    assert md.length == sum(len(b"a%d" % i) for i in range(50))
    with pytest.raises(LedgerFencedError):
        await lh.append(b"after fence")
    with pytest.raises((LedgerFencedError, LedgerClosedError)):
        await lh.close()
    assert [e.data for e in await rh.read(0, 49)] == [b"a%d" % i for i in range(50)]


async def test_recovery_of_an_abandoned_writer_keeps_every_acked_entry(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 2, 2)
    futures = [lh.append(b"p%d" % i) for i in range(300)]
    await asyncio.gather(*futures)
    # The writer vanishes without closing (its client just stops).
    await bk.close()
    reader = await cluster.client()
    rh = await reader.open_ledger(lh.id)
    assert rh.last_add_confirmed == 299
    assert [e.data for e in await rh.read(0, 299)] == [b"p%d" % i for i in range(300)]
    # Recovery is idempotent and every reader agrees.
    again = await (await cluster.client()).open_ledger(lh.id)
    assert again.last_add_confirmed == 299


async def test_tailing_reader(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 2, 2)
    rh = await (await cluster.client()).open_ledger(lh.id, recovery=False)
    seen: list[bytes] = []

    async def tail() -> None:
        async for entry in rh.tail(0, poll_s=0.2):
            seen.append(entry.data)

    async with asyncio.timeout(60):
        task = asyncio.create_task(tail())
        for i in range(30):
            await lh.append(b"t%d" % i)
            if i % 10 == 0:
                await asyncio.sleep(0.05)
        await lh.close()
        await task
    assert seen == [b"t%d" % i for i in range(30)]


async def test_wait_for_lac_long_poll(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 3, 3)
    await lh.append(b"0")
    rh = await (await cluster.client()).open_ledger(lh.id, recovery=False)
    start = rh.last_add_confirmed
    # Nothing new: returns after the timeout with the same LAC.
    assert await rh.wait_for_lac(start + 5, timeout=0.3) == start
    waiter = asyncio.create_task(rh.wait_for_lac(start, timeout=10))
    await asyncio.sleep(0.1)
    await lh.append(b"1")
    await lh.append(b"2")  # piggybacks LAC 1
    async with asyncio.timeout(10):
        assert await waiter > start


async def test_in_flight_bound_gives_typed_error_and_capacity_wait(cluster: LocalCluster) -> None:
    bk = await cluster.client(pending_adds_max=10)
    lh = await bk.create_ledger(3, 2, 2)
    futures = [lh.append(b"x") for _ in range(10)]
    with pytest.raises(TooManyRequestsError):
        lh.append(b"one too many")
    async with asyncio.timeout(10):
        await lh.wait_for_capacity()
    futures.append(lh.append(b"fits now"))
    assert await asyncio.gather(*futures) == list(range(11))
    # Full again after the capacity came back: refused again, and appends take up again.
    futures = [lh.append(b"y") for _ in range(10)]
    with pytest.raises(TooManyRequestsError):
        lh.append(b"one too many, again")
    assert await asyncio.gather(*futures) == list(range(11, 21))
    assert await lh.append(b"after") == 21
    await lh.close()


async def test_hung_bookie_ack_quorum_and_timeouts(cluster: LocalCluster) -> None:
    bk = await cluster.client(add_timeout_s=1.0, ensemble_change_timeout_s=2.0)
    tolerant = await bk.create_ledger(3, 3, 2)
    strict = await bk.create_ledger(3, 3, 3)
    slow_bk = await cluster.client(add_timeout_s=60.0, add_quorum_timeout_s=1.0)
    patient = await slow_bk.create_ledger(3, 3, 3)
    hung = next(b for b in cluster.bookies if b.id == tolerant.metadata.ensembles[0][1][0])
    hung.pause()
    try:
        # Qa=2 of Qw=3: one hung bookie does not stop acknowledgements.
        assert await asyncio.gather(*(tolerant.append(b"t") for _ in range(20))) == list(range(20))
        # Qa=3: the bookie times out, an ensemble change is tried, and with no spare
        # bookie (and the hung one not answering its probe) the add fails with
        # NotEnoughBookiesError after ensemble_change_timeout_s (and so do later appends).
        async with asyncio.timeout(10):
            with pytest.raises(NotEnoughBookiesError):
                await strict.append(b"s")
        with pytest.raises(NotEnoughBookiesError):
            strict.append(b"refused: the handle has failed")
        # A per-bookie timeout longer than the add quorum timeout: the latter fires.
        async with asyncio.timeout(10):
            with pytest.raises(asyncbk.errors.TimeoutError):
                await patient.append(b"p")
    finally:
        hung.resume()
    assert (await bk.ledger_metadata(strict.id)).ensembles == strict.metadata.ensembles


async def test_oversized_entry_is_refused_before_sending(cluster: LocalCluster) -> None:
    bk = await cluster.client(frame_bytes_max=64 * 1024)
    lh = await bk.create_ledger(3, 2, 2)
    other = await bk.create_ledger(3, 2, 2)
    pending = [other.append(b"o%d" % i) for i in range(50)]
    with pytest.raises(asyncbk.errors.EntryTooLargeError, match="exceeds"):
        lh.append(b"x" * 64 * 1024)
    assert await lh.append(b"x" * 60 * 1024) == 0  # under the limit is fine
    assert await asyncio.gather(*pending) == list(range(50))  # nobody else was hurt
    assert (await bk.ledger_metadata(lh.id)).ensembles == lh.metadata.ensembles


async def test_batch_reads_match_single_reads_and_survive_bookie_failures(
        cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 3, 2, password=b"pw")
    payloads = [bytes([i % 251]) * (1 + (i * 37) % 3000) for i in range(3000)]
    for lo in range(0, 3000, 500):
        await asyncio.gather(*(lh.append(p) for p in payloads[lo:lo + 500]))
    await lh.close()
    batched = await (await cluster.client(speculative_read_timeout_s=0.3)).open_ledger(
        lh.id, password=b"pw")
    single = await (await cluster.client(read_batch=False)).open_ledger(lh.id, password=b"pw")
    got = await batched.read(0, 2999)
    assert [e.data for e in got] == payloads
    assert [e.entry_id for e in got] == list(range(3000))
    assert [e.data for e in await batched.read(1234, 1300)] == payloads[1234:1301]
    assert [e.data for e in await single.read(0, 2999)] == payloads

    cluster.bookies[0].pause()  # hangs: batches sent to it time out and move on
    try:
        async with asyncio.timeout(60):
            assert [e.data for e in await batched.read(0, 2999)] == payloads
        cluster.bookies[1].kill()  # and one dead: everything from the last one
        async with asyncio.timeout(60):
            assert [e.data for e in await batched.read(0, 2999)] == payloads
    finally:
        cluster.bookies[0].resume()


async def test_a_large_entry_beside_small_ones_stays_within_the_frame_limit(
        cluster: LocalCluster) -> None:
    """Adds of one loop turn are batched; a batch must never pass the bookies' frame
    limit, even when an entry near the limit comes after small ones."""
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 3, 2)
    big = b"B" * (8 * 1024 * 1024 - 512)  # the largest entry append accepts
    small = b"s" * 200
    futures = [lh.append(small) for _ in range(20)]  # all in one loop turn: one batch...
    futures.append(lh.append(big))  # ...which must not take this one too
    futures.append(lh.append(small))
    assert await asyncio.gather(*futures) == list(range(22))
    assert lh.ensemble_changes == 0  # no bookie closed the connection on an oversized frame
    await lh.close()
    rh = await bk.open_ledger(lh.id)
    assert [len(e.data) for e in await rh.read(0, 21)] == [200] * 20 + [len(big), 200]
