"""Fixtures of the Spark tests: one SparkSession (``local[2]``) and one LocalCluster
for the whole session, both stopped at its end.

The tests are plain functions (Spark's calls block); the cluster lives on an event
loop in a thread of its own, and ``spark_cluster.run(coro)`` runs a coroutine
there (to write records, read them back, kill a bookie).  Each test works in a
namespace of its own (the ``ns`` fixture).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import uuid
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed: pip install -e '.[test]'")

import uvloop
from pyspark.sql import SparkSession

from asyncbk.spark import local_session
from asyncbk.spark.runtime import close_clients
from asyncbk.stream.client import BookKeeper
from asyncbk.testing import LocalCluster

T = TypeVar("T")
RUN_TIMEOUT_S = 120.0

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this directory is a Spark test (``-m "not spark"`` leaves them out)."""
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.spark)


class ClusterThread:
    """A LocalCluster (3 bookies) on an event loop in its own thread."""

    def __init__(self, data_dir: Path, **cluster_options: Any) -> None:
        self.data_dir = data_dir
        self.cluster_options = cluster_options
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="spark-cluster",
                                       daemon=True)
        self.cluster: LocalCluster | None = None
        self.bk: BookKeeper | None = None

    def start(self) -> None:
        self.thread.start()
        self.cluster = LocalCluster(bookies=3, data_dir=self.data_dir, **self.cluster_options)
        self.run(self.cluster.start())
        self.bk = self.run(self.cluster.client())

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = RUN_TIMEOUT_S) -> T:
        """Run ``coro`` on the cluster's loop and return its result."""
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout_s)

    @property
    def metadata_uri(self) -> str:
        assert self.cluster is not None
        return self.cluster.metadata_uri

    def stop(self) -> None:
        # The tests that drive the source and sink in this process left clients to this
        # cluster in the process's Spark worker loop: close them before the cluster goes.
        close_clients()
        if self.cluster is not None:
            self.run(self.cluster.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


def _java() -> str | None:
    """The ``java`` Spark will run: ``$JAVA_HOME/bin/java`` if set, else from PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Without Java, stop with one line, and only if a Spark test is to run
    (``-m "not spark"`` runs the rest)."""
    if _java() is None and any(item.get_closest_marker("spark") for item in session.items):
        pytest.exit("the Spark tests need Java 17 or newer (`java` on PATH or JAVA_HOME); "
                    "install it, or leave them out with -m \"not spark\"", returncode=3)


@pytest.fixture(autouse=True)
def _active_session(request: pytest.FixtureRequest) -> None:
    """Tests that use the SparkSession find it active in this thread's JVM peer.

    A subprocess started from the cluster's uvloop thread (a bookie started or
    restarted) replaces this thread's py4j connection with one served by a JVM thread
    without an active session, and ``writeStream.format(<Python source>)`` looks the
    source up through it (DATA_SOURCE_NOT_FOUND otherwise)."""
    if "spark" in request.fixturenames:
        session = request.getfixturevalue("spark")
        jvm = session._jvm
        assert jvm is not None
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(session._jsparkSession)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterThread]:
    # (with the object store: tiered reads are read by Spark too)
    ct = ClusterThread(tmp_path_factory.mktemp("spark-cluster"), object_store=True)
    try:
        ct.start()
        yield ct
    finally:
        ct.stop()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One SparkSession for every Spark test: local[2], 1 GiB driver, no UI, loopback."""
    local_dir = tmp_path_factory.mktemp("spark-local")
    session = local_session("asyncbk-tests", "local[2]",
                            conf={"spark.local.dir": str(local_dir)})
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def ns(spark_cluster: ClusterThread) -> str:
    """A namespace of this test's own (created; E3 Qw2 Qa2)."""
    name = f"t{uuid.uuid4().hex[:10]}"
    bk = spark_cluster.bk
    assert bk is not None
    spark_cluster.run(bk.namespace(name, create=True, ensemble_size=3, write_quorum=2,
                                   ack_quorum=2))
    return name
