"""Fixtures for integration tests: one real etcd per test session.

Tests share the etcd but never each other's keys: each takes its own ``root``
prefix (a fresh uuid), the way separate asyncbk clusters share one etcd.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from asyncbk.testing.cluster import LocalCluster
from asyncbk.testing.etcd import EtcdServer


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EtcdServer]:
    """A running etcd on free loopback ports, stopped (never leaked) at the end
    of the session.  Talk to it over the network only (``.endpoint``,
    ``.uri(root)``): the process itself belongs to the session's event loop,
    so stop/start it only from session-scoped code; a test that needs to
    restart etcd should run its own :class:`EtcdServer`."""
    workdir: Path = tmp_path_factory.mktemp("etcd")
    async with EtcdServer(workdir) as server:
        yield server


@pytest.fixture
def root() -> str:
    """A key prefix no other test uses."""
    return f"/test-{uuid.uuid4().hex[:12]}"


@pytest_asyncio.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    """A fresh cluster per test: its own etcd and three bookie processes."""
    async with LocalCluster(bookies=3, data_dir=tmp_path / "cluster") as c:
        yield c


MOUNT_TIMEOUT_S = 30.0


async def _run(*argv: str) -> tuple[int, str]:
    """Run a command (not on the event loop's thread); its exit code and stderr."""
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(MOUNT_TIMEOUT_S):
            _, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"{argv[0]} did not finish within {MOUNT_TIMEOUT_S}s"
    return int(proc.returncode or 0), err.decode(errors="replace").strip()


@pytest_asyncio.fixture
async def tmpfs() -> AsyncIterator[Callable[[Path, str], Awaitable[Path]]]:
    """``await tmpfs(path, "16m")``: a real, small file system (a tmpfs of that size)
    mounted on ``path`` (made if missing), so a disk fills up for real: what the bookie's
    ``statvfs`` sees is the truth, nothing faked.  Unmounted after the test, the last
    mounted first.  Mounting needs root: where it is not permitted the test is skipped
    with the reason, which the summary lists as not run (``-rs``)."""
    mounted: list[Path] = []

    async def mount(path: Path, size: str) -> Path:
        await asyncio.to_thread(path.mkdir, parents=True, exist_ok=True)
        try:
            code, err = await _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                   str(path))
        except OSError as exc:
            code, err = -1, str(exc)
        if code != 0:
            pytest.skip(f"not run: cannot mount a tmpfs here (needs root): {err}")
        mounted.append(path)
        return path

    try:
        yield mount
    finally:
        for path in reversed(mounted):
            code, _ = await _run("umount", str(path))
            if code != 0:  # still busy (a process of a failed test): detach it
                await _run("umount", "-l", str(path))
