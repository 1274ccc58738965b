"""Fixtures for integration tests: one real etcd per test session.

Tests share the etcd but never each other's keys: each takes its own ``root``
prefix (a fresh uuid), the way separate asyncbk clusters share one etcd.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
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
