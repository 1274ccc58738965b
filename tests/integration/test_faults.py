"""Faults between client and bookies (a TCP proxy), on disk, and of the writer process."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from asyncbk.bookie.journal_format import AddRecord, encode_add, scan_records
from asyncbk.client.quorum import write_set
from asyncbk.errors import BookieUnavailableError, DigestMismatchError
from asyncbk.testing.cluster import LocalBookie, LocalCluster
from asyncbk.testing.proxy import FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]


@pytest_asyncio.fixture
async def cluster4(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(bookies=4, data_dir=tmp_path / "cluster") as c:
        yield c


async def _proxied_client(cluster: LocalCluster, bookie: LocalBookie, **options: object):  # type: ignore[no-untyped-def]
    host, port = bookie.id.split(":")
    proxy = FaultProxy(host, int(port))
    await proxy.start()
    bk = await cluster.client(bookie_addresses={bookie.id: proxy.address}, **options)
    return proxy, bk


async def test_blackholed_replica_speculative_reads(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 3, 3)
    for i in range(30):
        await lh.append(b"s%d" % i)
    await lh.close()
    first = cluster.bookies[0]
    proxy, reader = await _proxied_client(cluster, first, read_timeout_s=30.0,
                                          speculative_read_timeout_s=0.05)
    try:
        rh = await reader.open_ledger(lh.id)
        proxy.set_mode("blackhole")
        t0 = time.perf_counter()
        entries = await rh.read(0, 29)
        elapsed = time.perf_counter() - t0
        assert [e.data for e in entries] == [b"s%d" % i for i in range(30)]
        # Every entry whose first replica is the hung bookie was answered by the next one
        # after the speculative delay, long before the 30 s read timeout.
        assert elapsed < 5, elapsed
    finally:
        await proxy.stop()


READ_TIMEOUT_S = 0.5


async def test_blackholed_replica_without_speculation_times_out_then_fails_over(
        cluster: LocalCluster) -> None:
    """Without speculation, an entry whose first replica hangs waits ``read_timeout_s``
    for it, then is read from the next replica; an entry whose first replica answers
    is read at once."""
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 2, 2)
    for i in range(6):
        await lh.append(b"t%d" % i)
    await lh.close()
    hung = cluster.bookies[0]
    proxy, reader = await _proxied_client(cluster, hung, read_timeout_s=READ_TIMEOUT_S,
                                          speculative_read_timeout_s=0)
    try:
        rh = await reader.open_ledger(lh.id)
        ensemble = rh.metadata.ensembles[0][1]
        # entry e is asked of its write set in order: first the bookie at e mod 3
        first_on_hung = [e for e in range(6) if ensemble[write_set(e, 3, 2)[0]] == hung.id]
        assert len(first_on_hung) == 2, (ensemble, hung.id)
        proxy.set_mode("blackhole")
        took: dict[int, float] = {}
        for e in range(6):
            t0 = time.perf_counter()
            async with asyncio.timeout(30):
                entries = await rh.read(e, e)
            took[e] = time.perf_counter() - t0
            assert [x.data for x in entries] == [b"t%d" % e]
        waited = sorted(e for e, s in took.items() if s >= READ_TIMEOUT_S * 0.9)
        # the timeout happened exactly for the entries whose first replica hangs, and
        # each of those was then read from the next replica, well within another timeout
        assert waited == first_on_hung, took
        assert all(took[e] < READ_TIMEOUT_S * 3 for e in first_on_hung), took
        assert proxy.connections >= 1  # the hung bookie was asked
        t0 = time.perf_counter()
        async with asyncio.timeout(30):
            entries = await rh.read(0, 5)
        elapsed = time.perf_counter() - t0
        assert [e.data for e in entries] == [b"t%d" % i for i in range(6)]
        assert READ_TIMEOUT_S * 0.9 <= elapsed < READ_TIMEOUT_S * 3, elapsed
    finally:
        await proxy.stop()


async def test_delayed_and_reset_bookie_during_writes(cluster4: LocalCluster) -> None:
    plain = await cluster4.client()
    lh0 = await plain.create_ledger(3, 3, 2)
    target = next(b for b in cluster4.bookies if b.id in lh0.metadata.ensembles[0][1])
    await lh0.close()
    proxy, bk = await _proxied_client(cluster4, target, add_timeout_s=2.0)
    try:
        lh = await bk.create_ledger(3, 3, 2)
        # Force the proxied bookie into the ensemble by retrying placement.
        for _ in range(20):
            if target.id in lh.metadata.ensembles[0][1]:
                break
            await lh.close()
            lh = await bk.create_ledger(3, 3, 2)
        assert target.id in lh.metadata.ensembles[0][1]
        proxy.set_mode("delay", delay_s=0.05)
        ids = [await lh.append(b"d%d" % i) for i in range(10)]
        assert ids == list(range(10))
        proxy.set_mode("reset")
        ids = await asyncio.gather(*(lh.append(b"d%d" % i) for i in range(10, 200)))
        assert list(ids) == list(range(10, 200))
        md = await bk.ledger_metadata(lh.id)
        assert target.id not in md.ensembles[-1][1], "the reset bookie was replaced"
        await lh.close()
        rh = await plain.open_ledger(lh.id)
        assert [e.data for e in await rh.read(0, 199)] == [b"d%d" % i for i in range(200)]
    finally:
        await proxy.stop()


async def test_reads_with_one_replica_down(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 2, 2)
    for i in range(60):
        await lh.append(b"r%d" % i)
    await lh.close()
    cluster.bookies[1].kill()
    rh = await (await cluster.client(speculative_read_timeout_s=0.1)).open_ledger(lh.id)
    assert [e.data for e in await rh.read(0, 59)] == [b"r%d" % i for i in range(60)]


def _entry_log_records(bookie: LocalBookie, ledger_id: int) -> list[tuple[Path, int, AddRecord]]:
    out = []
    for path in sorted((bookie.ledger_dir / "entrylog").glob("*.log")):
        records, _ = scan_records(path.read_bytes())
        out.extend((path, off, r) for off, r in records
                   if isinstance(r, AddRecord) and r.ledger_id == ledger_id)
    return out


def _rewrite(path: Path, offset: int, record: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(record)


@pytest.mark.parametrize("forge_checksum", [False, True])
async def test_corrupted_copy_is_read_from_another_replica(cluster: LocalCluster,
                                                           forge_checksum: bool) -> None:
    """A flipped byte is caught by the bookie's own record checksum; a copy altered
    with a valid record checksum (a buggy or malicious disk path) is caught by the
    client's digest.  Either way the entry is read from another replica."""
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 3, 3)
    for i in range(10):
        await lh.append(b"payload-%d" % i)
    await lh.close()
    victim = cluster.bookies[0]
    await victim.stop()  # graceful: checkpointed, so the entry log is what gets read
    path, offset, rec = next(r for r in _entry_log_records(victim, lh.id) if r[2].entry_id == 4)
    body = bytearray(rec.body)
    body[-1] ^= 0xFF
    if forge_checksum:
        _rewrite(path, offset, encode_add(rec.ledger_id, rec.entry_id, bytes(body)))
    else:
        raw = bytearray(encode_add(rec.ledger_id, rec.entry_id, rec.body))
        raw[-1] ^= 0xFF
        _rewrite(path, offset, bytes(raw))
    await victim.start()
    # A reader that can reach only the corrupted bookie fails loudly, naming the cause
    # (unavailable, not a mismatch: the unreachable replicas may well be good)...
    only = await cluster.client(
        bookie_addresses={b.id: "127.0.0.1:1" for b in cluster.bookies if b is not victim})
    rh_only = await only.open_ledger(lh.id)
    with pytest.raises(BookieUnavailableError,
                       match="digest mismatch" if forge_checksum else "IO_ERROR"):
        await rh_only.read(4, 4)
    # ...and a normal reader gets the good copy from another replica.
    rh = await bk.open_ledger(lh.id)
    for _ in range(3):  # whichever replica is asked first
        assert [e.data for e in await rh.read(0, 9)] == [b"payload-%d" % i for i in range(10)]


async def test_every_copy_forged_is_a_digest_mismatch(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 3, 3)
    for i in range(5):
        await lh.append(b"p%d" % i)
    await lh.close()
    for b in cluster.bookies:
        await b.stop()
        path, offset, rec = next(r for r in _entry_log_records(b, lh.id) if r[2].entry_id == 2)
        body = bytearray(rec.body)
        body[-1] ^= 0x01
        _rewrite(path, offset, encode_add(rec.ledger_id, rec.entry_id, bytes(body)))
        await b.start()
    rh = await bk.open_ledger(lh.id)
    with pytest.raises(DigestMismatchError, match="no replica has a good copy"):
        await rh.read(2, 2)
    assert [e.data for e in await rh.read(3, 4)] == [b"p3", b"p4"]


WRITER = r"""
import asyncio, sys
import asyncbk

async def main(uri):
    bk = await asyncbk.BookKeeper.connect(uri)
    lh = await bk.create_ledger(3, 2, 2, password=b"pw")
    print("ledger", lh.id, flush=True)
    sem = asyncio.Semaphore(64)
    def done(fut):
        sem.release()
        print("acked", fut.result(), flush=True)
    i = 0
    while True:
        await sem.acquire()
        lh.append(b"w-%d" % i).add_done_callback(done)
        i += 1

asyncio.run(main(sys.argv[1]))
"""


async def test_writer_process_sigkilled_mid_stream(cluster: LocalCluster, tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), cluster.metadata_uri, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, env=cluster.child_env())
    assert proc.stdout is not None
    acked: list[int] = []
    ledger_id = -1
    try:
        async with asyncio.timeout(60):
            while len(acked) < 2000:
                line = (await proc.stdout.readline()).decode().split()
                assert line, "the writer died early"
                if line[0] == "ledger":
                    ledger_id = int(line[1])
                elif line[0] == "acked":
                    acked.append(int(line[1]))
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    complete_lines = rest.decode().split("\n")[:-1]  # the kill may tear the last line
    acked += [int(line.split()[1]) for line in complete_lines if line.startswith("acked ")]
    assert acked == list(range(len(acked))), "acks came in entry order"
    bk = await cluster.client()
    rh = await bk.open_ledger(ledger_id, password=b"pw", recovery=True)
    md = await bk.ledger_metadata(ledger_id)
    assert md.state.value == "CLOSED"
    assert md.last_entry_id >= acked[-1], "every acknowledged entry was kept"
    entries = await rh.read(0, md.last_entry_id)
    assert [e.data for e in entries] == [b"w-%d" % i for i in range(md.last_entry_id + 1)]
    # Every reader agrees on the end and the bytes.
    rh2 = await (await cluster.client()).open_ledger(ledger_id, password=b"pw")
    assert rh2.last_add_confirmed == md.last_entry_id
    assert [e.data for e in await rh2.read(0, md.last_entry_id)] == [e.data for e in entries]


async def test_explicit_lac_reaches_readers_and_survives_restart(cluster: LocalCluster) -> None:
    bk = await cluster.client(explicit_lac_interval_s=0.2)
    lh = await bk.create_ledger(3, 3, 3)
    for i in range(10):
        await lh.append(b"x%d" % i)
    reader = await cluster.client()
    rh = await reader.open_ledger(lh.id, recovery=False)
    # Piggybacking alone tells bookies LAC 8; the idle writer's explicit LAC gives 9.
    async with asyncio.timeout(10):
        while await rh.read_last_add_confirmed() < 9:  # noqa: ASYNC110 - polling bookies
            await asyncio.sleep(0.05)
    for b in cluster.bookies:
        await b.stop()
    for b in cluster.bookies:
        await b.start()
    rh2 = await (await cluster.client()).open_ledger(lh.id, recovery=False)
    assert await rh2.read_last_add_confirmed() == 9
