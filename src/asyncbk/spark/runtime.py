"""Running asyncbk's coroutines from Spark's synchronous calls.

Spark calls a data source from plain threads of its Python workers, which it
reuses from job to job.  Two ways to run a coroutine there:

* :func:`run_once`: a fresh event loop (uvloop) for one call, with a client
  connected for it and closed after, for a task's ``read()``/``write()`` and a
  batch query's planning.  Nothing outlives the call.
  :class:`TaskLoop` is the same for a task that yields as it goes (a read).
* :class:`LoopThread`: an event loop in a daemon thread with one client kept
  connected, for the driver side of a streaming query, which Spark asks for
  offsets at every trigger.  It is never pickled (``__getstate__`` drops it) and
  is closed by ``stop()``.

Every call is bounded by the ``operationTimeoutS`` option; an unreachable
metadata store fails the call with a message that says so.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

import uvloop

from ..client.client import BookKeeper
from ..errors import BKError, MetadataError, NoSuchNamespaceError
from ..net.etcd_security import etcd_security
from ..net.security import client_context, read_token
from ..stream.context import StreamContext, open_context
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
    return security


async def connect(access: Access) -> BookKeeper:
    """A client of the cluster, or an error that says it is unreachable."""
    metadata_uri, timeout_s = access.metadata_uri, access.timeout_s
    security = await asyncio.to_thread(_security, access)
    try:
        async with asyncio.timeout(min(timeout_s, CONNECT_TIMEOUT_S)):
            return await BookKeeper.connect(metadata_uri, **security)
    except (TimeoutError, OSError, MetadataError) as exc:
        raise MetadataError(
            f"cannot reach the metadata store at {metadata_uri} ({exc or type(exc).__name__}): "
            "check the metadataUri option and that etcd and the bookies are running") from None


def run_once(access: Access, work: Callable[[BookKeeper], Awaitable[T]]) -> T:
    """``work(client)`` on a fresh event loop with a fresh client; both closed after."""
    timeout_s = access.timeout_s

    async def main() -> T:
        bk = await connect(access)
        try:
            async with asyncio.timeout(timeout_s):
                return await work(bk)
        except TimeoutError:
            raise BKError(f"asyncbk operation took longer than operationTimeoutS "
                          f"({timeout_s:g} s)") from None
        finally:
            await bk.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


class LoopThread:
    """An event loop in a thread of its own, with one client kept connected."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self.timeout_s = access.timeout_s
        self._loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="asyncbk-spark", daemon=True)
        self._thread.start()
        self._bk: BookKeeper | None = None
        self._closed = False

    def run(self, work: Callable[[BookKeeper], Coroutine[Any, Any, T]]) -> T:
        """``work(client)`` on the thread's loop; waits at most the operation timeout."""
        if self._closed:
            raise BKError("the asyncbk source was stopped")

        async def main() -> T:
            if self._bk is None:
                self._bk = await connect(self.access)
            async with asyncio.timeout(self.timeout_s):
                return await work(self._bk)

        fut: Future[T] = asyncio.run_coroutine_threadsafe(main(), self._loop)
        try:
            return fut.result(self.timeout_s + CONNECT_TIMEOUT_S + 5)
        except TimeoutError:
            fut.cancel()
            raise BKError(f"asyncbk operation took longer than operationTimeoutS "
                          f"({self.timeout_s:g} s)") from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            if self._bk is not None:
                await self._bk.close()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(30)
        except Exception:  # closing is best effort: the process may be going away
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()


class TaskLoop:
    """A fresh event loop and client for one task, driven from Spark's thread."""

    def __init__(self, access: Access) -> None:
        self.timeout_s = access.timeout_s
        self.access = access
        self.runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        self.bk: BookKeeper | None = None

    def __enter__(self) -> TaskLoop:
        self.runner.__enter__()
        try:
            self.bk = self.runner.run(connect(self.access))
        except BaseException:
            self.runner.__exit__(None, None, None)
            raise
        return self

    def run(self, coro: Any) -> Any:
        async def bounded() -> Any:
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await coro
            except TimeoutError:
                raise BKError(f"asyncbk operation took longer than operationTimeoutS "
                              f"({self.timeout_s:g} s)") from None
        return self.runner.run(bounded())

    def iterate(self, agen: AsyncGenerator[Any, None]) -> Iterator[Any]:
        try:
            while True:
                try:
                    yield self.run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self.run(agen.aclose())

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.bk is not None:
                self.runner.run(self.bk.close())
        finally:
            self.runner.__exit__(None, None, None)


async def context_of(bk: BookKeeper, name: str | None) -> StreamContext:
    """What the planner, the tasks and the sink work with for the namespace ``name``
    (no :class:`~asyncbk.stream.namespace.Namespace` is needed for that)."""
    assert name is not None
    try:
        return await open_context(bk, name)
    except NoSuchNamespaceError:
        raise SparkOptionError(f"option namespace: no namespace {name!r} in this cluster "
                               f"(create it with `asyncbk stream create-namespace {name}`)") from None
