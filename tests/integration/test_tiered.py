"""Tiered storage against real parts: etcd, three bookie processes and a real
S3-compatible store (SeaweedFS, with credentials, so requests are signed).

A stream offloaded reads the same (bytes, positions, txids, keys, headers, times,
seeks) before offload, with both copies, and after the bookies' copy is deleted;
the offloader SIGKILLed at each step of its protocol loses nothing and leaves no
object behind once re-run; truncation and stream deletion racing an offload leave
no object named by nobody; a subscription holds retention across offload; a
paused store makes readers fall back to the bookies while they hold the segment,
and fail naming the object once they do not; bad credentials, a missing bucket and
an unreachable endpoint get one clear line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from asyncbk.errors import NoSuchLedgerError, ObjectStoreError
from asyncbk.offload.offloader import HOLD_ENV, STEPS, Offloader, OffloaderOptions
from asyncbk.stream import Namespace, Position, StreamRecord
from asyncbk.stream.client import BookKeeper
from asyncbk.testing import LocalCluster
from asyncbk.testing.proxy import FaultProxy
from asyncbk.tiered.location import Credentials, ObjectStoreUri
from asyncbk.tiered.store import S3ObjectStore

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]

SHAPE = {"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2}
RECORDS = 1200


@pytest_asyncio.fixture
async def tcluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    """Three bookies and the object store."""
    async with LocalCluster(bookies=3, data_dir=tmp_path / "cluster", object_store=True) as c:
        yield c


def store_of(cluster: LocalCluster, **kw: Any) -> S3ObjectStore:
    creds = cluster.object_store_credentials()
    assert creds is not None
    return S3ObjectStore(ObjectStoreUri.parse(cluster.object_store_uri), Credentials(*creds), **kw)


async def filled(cluster: LocalCluster, stream: str = "s", records: int = RECORDS,
                 **defaults: Any) -> tuple[BookKeeper, Namespace, list[StreamRecord]]:
    """A namespace whose stream ``stream`` holds ``records`` records with keys, headers
    and times over several completed segments (the writer closed)."""
    bk = await cluster.client()
    ns = await bk.namespace("t", create=True, **SHAPE, rolling_entries=150,
                            offload_after_s=0.001, **defaults)
    await ns.create_stream(stream)
    async with await ns.open_writer(stream) as w:
        for start in range(0, records, 100):
            futs = [w.write_nowait(b"v%06d" % i + bytes(i % 97),
                                   key=b"k%d" % (i % 7) if i % 3 else None,
                                   headers={"n": b"%d" % i} if i % 5 == 0 else None,
                                   timestamp_ms=1_700_000_000_000 + i * 10)
                    for i in range(start, min(records, start + 100))]
            for f in futs:
                await f
    return bk, ns, await read_all(ns, stream, records)


async def read_all(ns: Namespace, stream: str, n: int, **start: Any) -> list[StreamRecord]:
    out: list[StreamRecord] = []
    async with await ns.open_reader(stream, **start) as r:
        async with asyncio.timeout(60):
            while len(out) < n:
                out += await r.read_batch(n - len(out), wait_s=1.0)
    return out


async def referenced(ns: Namespace, stream: str) -> set[str]:
    return {s.offload.key for s in await ns.md.segments(ns.name, stream) if s.offload}


async def stored(store: S3ObjectStore) -> set[str]:
    return {o.key async for o in store.list()}


async def test_an_offloaded_stream_reads_the_same_before_and_after_its_ledgers_go(
        tcluster: LocalCluster, finding: Any) -> None:
    bk, ns, before = await filled(tcluster, offload_deletion_lag_s=0.0)
    store = store_of(tcluster)
    off = Offloader(bk, store)
    report = await off.run_pass()
    info = await ns.stream_info("s")
    completed = [s for s in info.segments if s.state == "completed" and s.records]
    assert len(completed) >= 4 and not report.failures, report
    assert len(report.offloaded) == len(completed)
    assert {s.storage for s in completed} == {"bookies+object"}
    assert all(s.object and s.object.startswith("s3://") for s in completed)
    with_both = await read_all(ns, "s", RECORDS)
    assert with_both == before
    report = await off.run_pass()  # the lag (0) has passed: the ledgers go
    assert len(report.ledgers_deleted) == len(completed), report
    info = await ns.stream_info("s")
    assert {s.storage for s in info.segments if s.records} == {"object"}
    for s in completed:
        with pytest.raises(NoSuchLedgerError):
            await bk.open_ledger(s.ledger_id, recovery=False)
    after = await read_all(ns, "s", RECORDS)
    assert after == before  # bytes, positions, txids, keys, headers, times
    # Seeks by txid and time, and a read from the middle, find the same records.
    for i in (0, 1, 149, 150, 777, RECORDS - 1):
        rec = before[i]
        assert (await read_all(ns, "s", 1, txid=rec.txid))[0] == rec
        assert (await read_all(ns, "s", 1, timestamp_ms=rec.timestamp_ms))[0] == rec
        assert (await read_all(ns, "s", RECORDS - i, start=rec.position)) == before[i:]
    # A subscription reads it all from the object store too.
    sub = await ns.subscribe("s", "c")
    got: list[StreamRecord] = []
    async with asyncio.timeout(60):
        while len(got) < RECORDS:
            got += await sub.read_batch(RECORDS - len(got), wait_s=1.0)
    await sub.close()
    assert got == before
    assert await stored(store) == await referenced(ns, "s")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncbk", "stream", "info", "t", "s", "--json",
        "--metadata-uri", tcluster.metadata_uri, env=tcluster.child_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    rows = json.loads(out)["segments"]
    assert {r["storage"] for r in rows if r["records"]} == {"object"}
    assert all(r["object"].startswith("s3://") and ".seg" in r["object"]
               for r in rows if r["records"])
    finding(f"{len(completed)} segments offloaded, {report.offloaded_bytes or 0} bytes; "
            "reads identical with both copies and from the object store alone")


async def _offload_process(cluster: LocalCluster, *extra: str, hold: str | None = None,
                           ) -> tuple[asyncio.subprocess.Process, list[str]]:
    env = cluster.child_env()
    if hold is not None:
        env[HOLD_ENV] = hold
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncbk", "offload", "--metadata-uri", cluster.metadata_uri,
        "--object-store", cluster.object_store_uri, "--once", *extra, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE), []


async def _wait_line(proc: asyncio.subprocess.Process, want: str, timeout_s: float = 60) -> list[str]:
    lines: list[str] = []
    assert proc.stdout is not None
    async with asyncio.timeout(timeout_s):
        while True:
            raw = await proc.stdout.readline()
            if not raw:
                err = await proc.stderr.read() if proc.stderr else b""
                raise AssertionError(f"offloader ended before {want!r}: {lines} {err.decode()}")
            lines.append(raw.decode().rstrip())
            if lines[-1].startswith(want):
                return lines


async def test_the_offloader_killed_at_each_step_loses_nothing(tcluster: LocalCluster) -> None:
    bk, ns, before = await filled(tcluster, records=500, offload_deletion_lag_s=0.0)
    store = store_of(tcluster)
    for step in STEPS:
        if step == "ledger-deleted":  # only reached in a pass after one that offloaded
            proc, _ = await _offload_process(tcluster, "--segments-per-pass", "1")
            async with asyncio.timeout(60):
                await proc.communicate()
        proc, _ = await _offload_process(tcluster, "--segments-per-pass", "1", hold=step)
        try:
            await _wait_line(proc, f"HOLD {step}")
            proc.send_signal(signal.SIGKILL)
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        assert await read_all(ns, "s", 500) == before, step
        # Whatever the kill left, no ledger is gone without its object recorded.
        for s in await ns.md.segments(ns.name, "s"):
            if s.offload is None and s.records:
                await bk.open_ledger(s.ledger_id, recovery=False)
    # Re-runs finish the work: every segment offloaded once, its ledger deleted, and the
    # objects no segment names swept.
    for _ in range(2):
        proc, _ = await _offload_process(tcluster, "--sweep-grace-s", "0")
        async with asyncio.timeout(120):
            out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
    segs = [s for s in await ns.md.segments(ns.name, "s") if s.records and s.state == "completed"]
    assert all(s.storage == "object" for s in segs), [s.storage for s in segs]
    assert await stored(store) == await referenced(ns, "s")
    assert await read_all(ns, "s", 500) == before


Hook = Callable[[str], Awaitable[None]]


def at_step(step: str, action: Callable[[], Awaitable[Any]]) -> Hook:
    async def hook(at: str) -> None:
        if at == step:
            await action()
    return hook


async def test_truncation_and_deletion_racing_an_offload_leave_no_object_behind(
        tcluster: LocalCluster) -> None:
    bk, ns, before = await filled(tcluster, records=800)
    store = store_of(tcluster)
    segs = await ns.md.segments(ns.name, "s")
    cut = segs[1].first_position  # drops the first segment, the one being offloaded
    # Truncated after the upload was verified, before it is recorded: the record fails.
    off = Offloader(bk, store, OffloaderOptions(segments_per_pass=1), step_hook=at_step(
        "verified", lambda: ns.truncate("s", cut)))
    report = await off.run_pass()
    assert report.offloaded == [] and not report.failures, report
    assert await stored(store) == set()
    # Truncated once recorded: the truncation deletes the object with the ledger.
    off = Offloader(bk, store, OffloaderOptions(segments_per_pass=1))
    assert len((await off.run_pass()).offloaded) == 1
    first = (await ns.md.segments(ns.name, "s"))[0]
    assert first.offload is not None
    await ns.truncate("s", (await ns.md.segments(ns.name, "s"))[1].first_position)
    assert await stored(store) == set()
    rest = await read_all(ns, "s", 1, start=Position.EARLIEST)
    assert rest[0] in before
    # The stream deleted while an upload is under way: nothing left.
    await ns.create_stream("d")
    async with await ns.open_writer("d") as w:
        for i in range(400):
            await w.write(b"%d" % i)
    off = Offloader(bk, store, step_hook=at_step("uploaded", lambda: ns.delete_stream("d")))
    await off.run_pass([ns.name])
    assert not any(k.startswith(f"{ns.name}/d/") for k in await stored(store))


async def test_a_subscription_holds_retention_across_offload(tcluster: LocalCluster) -> None:
    bk, ns, before = await filled(tcluster, records=600, retention_s=0.5,
                                  offload_deletion_lag_s=0.0)
    sub = await ns.subscribe("s", "slow")  # at the earliest record: holds every segment
    store = store_of(tcluster)
    off = Offloader(bk, store)
    await off.run_pass()
    await off.run_pass()
    await asyncio.sleep(0.6)
    assert await ns.apply_retention("s") == 0  # held by the subscription
    got: list[StreamRecord] = []
    async with asyncio.timeout(60):
        while len(got) < 600:
            got += await sub.read_batch(600 - len(got), wait_s=1.0)
    assert got == before  # read from the object store
    await sub.ack(got[-1].position)
    await sub.flush()
    await sub.close()
    assert await ns.apply_retention("s") >= 1
    assert await stored(store) == await referenced(ns, "s")


async def test_a_paused_store_falls_back_to_the_bookies_then_fails_naming_the_object(
        tcluster: LocalCluster) -> None:
    bk, ns, before = await filled(tcluster, records=300, offload_deletion_lag_s=3600.0)
    store = store_of(tcluster)
    assert (await Offloader(bk, store).run_pass()).offloaded
    seaweed = tcluster.object_store
    assert seaweed is not None
    reader = await tcluster.client(object_store_read_timeout_s=2.0)
    rns = await reader.namespace("t")
    await seaweed.pause()
    try:
        # The bookies still hold every segment: the reads go there.
        assert await read_all(rns, "s", 300) == before
        # An offload pass against a store that does not answer records nothing.
        slow = store_of(tcluster, request_timeout_s=1.0)
        report = await Offloader(bk, slow, OffloaderOptions(retries=1)).run_pass()
        assert report.offloaded == []
    finally:
        seaweed.resume()
    # Once the ledgers are gone, a store that does not answer is an error naming the
    # object, never a wrong or partial read.
    for s in await ns.md.segments(ns.name, "s"):
        if s.offload is not None:
            await Offloader(bk, store).delete_bookie_copy(ns.context, "s", s)
    await seaweed.pause()
    try:
        with pytest.raises(ObjectStoreError, match=r"s3://.*\.seg"):
            await read_all(rns, "s", 300)
    finally:
        seaweed.resume()
    assert await read_all(rns, "s", 300) == before


async def test_a_store_answering_503s_or_slowly_behind_a_fault_proxy(
        tcluster: LocalCluster, finding: Any) -> None:
    """The object store behind a fault proxy: 503s and slow answers while offloading
    and reading.  Nothing is recorded half; reads are right or fail naming the object."""
    seaweed = tcluster.object_store
    assert seaweed is not None
    bk, ns, before = await filled(tcluster, records=400, offload_deletion_lag_s=3600.0)
    async with FaultProxy("127.0.0.1", seaweed.port) as proxy:
        uri = ObjectStoreUri.parse(tcluster.object_store_uri)
        via = ObjectStoreUri(uri.bucket, uri.prefix, f"http://{proxy.address}", uri.region)
        creds = tcluster.object_store_credentials()
        assert creds is not None
        store = S3ObjectStore(via, Credentials(*creds), request_timeout_s=2.0)
        direct = store_of(tcluster)
        proxy.set_mode("http503")
        report = await Offloader(bk, store, OffloaderOptions(retries=2)).run_pass()
        assert report.offloaded == [] and report.failures, report
        assert all(s.offload is None for s in await ns.md.segments(ns.name, "s"))
        assert await stored(direct) == set()  # no object written half
        proxy.set_mode("delay", 0.05)
        report = await Offloader(bk, store).run_pass()
        assert report.offloaded and not report.failures, report
        reader = await tcluster.client(object_store_read_timeout_s=3.0)
        rns = await reader.namespace("t")
        assert await read_all(rns, "s", 400) == before  # slow, through the proxy
        proxy.set_mode("http503")
        assert await read_all(rns, "s", 400) == before  # the bookies' copy, still there
        proxy.set_mode("pass")
        for seg in await ns.md.segments(ns.name, "s"):
            if seg.offload is not None:
                await Offloader(bk, store).delete_bookie_copy(ns.context, "s", seg)
        proxy.set_mode("http503")
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(ObjectStoreError, match=r"s3://.*\.seg.*did not answer"):
            await read_all(rns, "s", 400)
        failed_s = asyncio.get_running_loop().time() - t0
        proxy.set_mode("pass")
        assert await read_all(rns, "s", 400) == before
        finding(f"503s: offload recorded nothing; a read with no bookie copy failed after "
                f"{failed_s:.1f} s naming the object, then read right once the store answered")


async def test_bad_credentials_bucket_or_endpoint_get_one_clear_line(
        tcluster: LocalCluster, tmp_path: Path) -> None:
    env = tcluster.child_env()
    uri = tcluster.object_store_uri

    async def run(store_uri: str, **overrides: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "asyncbk", "offload", "--metadata-uri",
            tcluster.metadata_uri, "--object-store", store_uri, "--once",
            env={**env, **overrides}, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        async with asyncio.timeout(60):
            _, err = await proc.communicate()
        return int(proc.returncode or 0), err.decode()

    code, err = await run(uri, AWS_SECRET_ACCESS_KEY="wrong-secret")
    assert code == 1 and "credentials" in err and len(err.strip().splitlines()) == 1, err
    assert "wrong-secret" not in err
    bucket = ObjectStoreUri.parse(uri).bucket
    code, err = await run(uri.replace(f"s3://{bucket}", "s3://no-such-bucket"))
    assert code == 1 and "bucket" in err and len(err.strip().splitlines()) == 1, err
    endpoint = ObjectStoreUri.parse(uri).endpoint
    assert endpoint is not None
    code, err = await run(uri.replace(endpoint.rsplit(":", 1)[1], "9"))
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    creds = tmp_path / "creds"
    creds.write_text("AWS_ACCESS_KEY_ID=x\nAWS_SECRET_ACCESS_KEY=y\n")
    os.chmod(creds, 0o644)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncbk", "offload", "--metadata-uri", tcluster.metadata_uri,
        "--object-store", uri, "--credentials-file", str(creds), "--once", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        _, raw = await proc.communicate()
    assert proc.returncode == 1 and "chmod 600" in raw.decode()
