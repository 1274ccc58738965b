"""Running asyncbk's coroutines from Spark's synchronous calls.

Spark calls a data source from plain threads of its Python workers, and reuses a
worker process for task after task (``spark.python.worker.reuse``, on by default).
So each process keeps **one event loop** (uvloop) in a daemon thread of its own
(:class:`WorkerLoop`), started on first use (again after a fork), and on it **one
connected client per cluster** (per metadata URI and credentials), which the
process's tasks share:

* :func:`run_once`: one call (planning a batch read, a commit) on that loop.
* :class:`TaskLoop`: a task's read or write.  A read's batches are produced on the
  loop ahead of Spark (a bounded queue of :data:`READ_AHEAD_BATCHES`), so the
  bookies are read and entries decoded while Spark consumes the previous batch.
* :class:`LoopThread`: the driver side of a streaming query, which Spark asks for
  offsets at every trigger.

A client idle for :data:`CLIENT_IDLE_S` is closed, and one whose call failed
because the cluster could not be reached is dropped, so the next call connects
again.  Every call is bounded by the ``operationTimeoutS`` option; an unreachable
metadata store fails the call with a message that says so.  Nothing here is
pickled: Spark's objects hold options only.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

import uvloop

from ..client.client import BookKeeper
from ..errors import BKError, BookieUnavailableError, MetadataError, NoSuchNamespaceError
from ..net.etcd_security import etcd_security
from ..net.security import client_context, read_token
from ..stream.context import StreamContext, open_context
from ..tracing import configure_from_env as configure_tracing_from_env
from .errors import SparkOptionError
from .options import ReadOptions, WriteOptions

T = TypeVar("T")

CONNECT_TIMEOUT_S = 30.0


Access = ReadOptions | WriteOptions
"""Where the cluster is and how to reach it (read and write options both say)."""


def _security(access: Access) -> dict[str, Any]:
    """``BookKeeper.connect``'s TLS and credentials from the options (reads files)."""
    security: dict[str, Any] = {}
    if access.tls_ca_file or access.tls_cert_file:
        security["ssl"] = client_context(access.tls_ca_file, access.tls_cert_file,
                                         access.tls_key_file)
    if access.auth_token_file:
        security["token"] = read_token(access.auth_token_file)
    security.update(etcd_security(
        access.metadata_uri, ca=access.etcd_tls_ca_file, cert=access.etcd_tls_cert_file,
        key=access.etcd_tls_key_file, user=access.etcd_user,
        password_file=access.etcd_password_file, fallback_ca=access.tls_ca_file,
        fallback_cert=access.tls_cert_file, fallback_key=access.tls_key_file).connect_options())
    if access.object_store_credentials_file:
        security["object_store_credentials_file"] = access.object_store_credentials_file
    if access.tracing:
        security["tracing"] = True
    return security


async def connect(access: Access) -> BookKeeper:
    """A client of the cluster, or an error that says it is unreachable."""
    metadata_uri, timeout_s = access.metadata_uri, access.timeout_s
    security = await asyncio.to_thread(_security, access)
    if access.tracing:  # spans exported as ASYNCBK_OTEL_EXPORTER says (a worker's own)
        await asyncio.to_thread(configure_tracing_from_env, "asyncbk-spark")
    try:
        async with asyncio.timeout(min(timeout_s, CONNECT_TIMEOUT_S)):
            return await BookKeeper.connect(metadata_uri, **security)
    except (TimeoutError, OSError, MetadataError) as exc:
        raise MetadataError(
            f"cannot reach the metadata store at {metadata_uri} ({exc or type(exc).__name__}): "
            "check the metadataUri option and that etcd and the bookies are running") from None


READ_AHEAD_BATCHES = 2
"""Record batches a read task keeps ready ahead of Spark."""
CLIENTS_MAX = 4
"""Clients one worker process keeps (one per cluster and credentials)."""
CLIENT_IDLE_S = 300.0


def _file_stamp(path: str) -> tuple[str, int]:
    try:
        return path, os.stat(path).st_mtime_ns
    except OSError:
        return path, -1


def _client_key(access: Access) -> tuple[Any, ...]:
    """What makes two accesses share a client: the cluster and every credential (a
    file's modification time too, so that a rotated token or key takes effect)."""
    files = (access.tls_ca_file, access.tls_cert_file, access.tls_key_file,
             access.auth_token_file, access.etcd_password_file, access.etcd_tls_ca_file,
             access.etcd_tls_cert_file, access.etcd_tls_key_file,
             access.object_store_credentials_file)
    return (access.metadata_uri, access.etcd_user, access.tracing,
            *(_file_stamp(f) for f in files if f))


class WorkerLoop:
    """This process's event loop thread and the clients kept on it."""

    _current: WorkerLoop | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="asyncbk-spark",
                                       daemon=True)
        self.thread.start()
        self._clients: OrderedDict[tuple[Any, ...], tuple[BookKeeper, float]] = OrderedDict()
        self._connecting: dict[tuple[Any, ...], asyncio.Future[BookKeeper]] = {}
        atexit.register(self.shutdown)

    @classmethod
    def close_current(cls) -> None:
        """Close the kept clients of this process's loop, if it has one."""
        with cls._lock:
            current = cls._current
        if current is not None:
            current.shutdown()

    def shutdown(self) -> None:
        """Close the kept clients (at the process's exit; bounded)."""
        if self.pid != os.getpid() or not self.thread.is_alive():
            return

        async def close_all() -> None:
            while self._clients:
                _, (bk, _) = self._clients.popitem()
                await _close_quietly(bk)

        try:
            asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(15)
        except Exception:  # the process is going away: best effort
            pass

    @classmethod
    def get(cls) -> WorkerLoop:
        with cls._lock:
            current = cls._current
            if current is None or current.pid != os.getpid() or not current.thread.is_alive():
                current = cls._current = WorkerLoop()
            return current

    # -- on the loop

    async def client(self, access: Access) -> BookKeeper:
        """The kept client for ``access``, connected on first use."""
        key = _client_key(access)
        now = time.monotonic()
        for k, (bk, used) in list(self._clients.items()):
            if k != key and now - used > CLIENT_IDLE_S:
                del self._clients[k]
                await _close_quietly(bk)
        got = self._clients.get(key)
        if got is not None:
            self._clients[key] = (got[0], now)
            self._clients.move_to_end(key)
            return got[0]
        pending = self._connecting.get(key)
        if pending is None:
            pending = self._connecting[key] = asyncio.ensure_future(self._connect(key, access))
        # Shielded: a caller that gives up does not lose the client to the others (it
        # is kept, and closed when idle or evicted).
        return await asyncio.shield(pending)

    async def _connect(self, key: tuple[Any, ...], access: Access) -> BookKeeper:
        try:
            bk = await connect(access)
        finally:
            self._connecting.pop(key, None)
        self._clients[key] = (bk, time.monotonic())
        while len(self._clients) > CLIENTS_MAX:
            _, (old, _) = self._clients.popitem(last=False)
            await _close_quietly(old)
        return bk

    async def forget(self, access: Access) -> None:
        """Drop (and close) the client of ``access``: the next call connects again."""
        got = self._clients.pop(_client_key(access), None)
        if got is not None:
            await _close_quietly(got[0])

    # -- from Spark's threads

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coro`` on the loop and wait for it (at most ``timeout_s``, beyond the
        coroutine's own bound)."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("asyncbk.spark: a blocking call from the worker loop itself")
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout_s)
        except TimeoutError:
            fut.cancel()
            raise BKError(f"asyncbk operation took longer than {timeout_s:g} s") from None
        except BaseException:
            fut.cancel()
            raise


def close_clients() -> None:
    """Close the clients this process keeps (a test harness does so before it stops
    the cluster they talk to; Spark's workers close theirs at exit)."""
    WorkerLoop.close_current()


async def _close_quietly(bk: BookKeeper) -> None:
    try:
        async with asyncio.timeout(10):
            await bk.close()
    except Exception:  # closing is best effort: the cluster may be gone
        pass


_UNREACHABLE = (MetadataError, BookieUnavailableError, OSError)


async def _with_client(wl: WorkerLoop, access: Access,
                       work: Callable[[BookKeeper], Awaitable[T]]) -> T:
    """``work(client)`` bounded by the operation timeout; a client that could not
    reach the cluster is dropped."""
    bk = await wl.client(access)
    try:
        async with asyncio.timeout(access.timeout_s):
            return await work(bk)
    except TimeoutError:
        await wl.forget(access)
        raise BKError(f"asyncbk operation took longer than operationTimeoutS "
                      f"({access.timeout_s:g} s)") from None
    except _UNREACHABLE:
        await wl.forget(access)
        raise


def run_once(access: Access, work: Callable[[BookKeeper], Awaitable[T]]) -> T:
    """``work(client)`` on this process's loop with its kept client."""
    wl = WorkerLoop.get()
    return wl.call(_with_client(wl, access, work),
                   access.timeout_s + CONNECT_TIMEOUT_S + 5)


class LoopThread:
    """The driver side of a streaming query: calls on this process's loop, with its kept
    client (the name says what it was; the loop is shared now)."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self.timeout_s = access.timeout_s
        self._closed = False

    def run(self, work: Callable[[BookKeeper], Coroutine[Any, Any, T]]) -> T:
        """``work(client)``; waits at most the operation timeout."""
        if self._closed:
            raise BKError("the asyncbk source was stopped")
        return run_once(self.access, work)

    def close(self) -> None:
        self._closed = True


class TaskLoop:
    """One task's calls, on this process's loop with its kept client."""

    def __init__(self, access: Access) -> None:
        self.timeout_s = access.timeout_s
        self.access = access
        self.wl = WorkerLoop.get()
        self.bk: BookKeeper | None = None

    def __enter__(self) -> TaskLoop:
        self.bk = self.wl.call(self.wl.client(self.access), CONNECT_TIMEOUT_S + 5)
        return self

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        async def bounded() -> T:
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await coro
            except TimeoutError:
                raise BKError(f"asyncbk operation took longer than operationTimeoutS "
                              f"({self.timeout_s:g} s)") from None
            except _UNREACHABLE:
                await self.wl.forget(self.access)
                raise
        return self.wl.call(bounded(), self.timeout_s + 5)

    def iterate(self, agen: AsyncGenerator[T, None],
                ahead: int = READ_AHEAD_BATCHES) -> Iterator[T]:
        """The items of ``agen``, produced on the loop up to ``ahead`` items before
        they are taken."""
        queue: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue(ahead)

        async def produce() -> None:
            try:
                async for item in agen:
                    await queue.put((True, item))
                await queue.put((False, None))
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # handed to the consumer, which raises it
                await queue.put((False, exc))

        async def start() -> asyncio.Task[None]:
            return asyncio.ensure_future(produce())

        async def stop(task: asyncio.Task[None]) -> None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await agen.aclose()

        producer = self.wl.call(start(), 10)
        try:
            while True:
                more, value = self.run(queue.get())
                if not more:
                    if value is not None:
                        raise value
                    return
                yield value
        finally:
            self.wl.call(stop(producer), 30)

    def __exit__(self, *exc: Any) -> None:
        pass


async def context_of(bk: BookKeeper, name: str | None) -> StreamContext:
    """What the planner, the tasks and the sink work with for the namespace ``name``
    (no :class:`~asyncbk.stream.namespace.Namespace` is needed for that)."""
    assert name is not None
    try:
        return await open_context(bk, name)
    except NoSuchNamespaceError:
        raise SparkOptionError(f"option namespace: no namespace {name!r} in this cluster "
                               f"(create it with `asyncbk stream create-namespace {name}`)") from None
