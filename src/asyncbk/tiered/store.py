"""The object store as tiered storage uses it: :class:`ObjectStore` (put, ranged
gets, head, list, delete, each bounded in time and failing with a typed error
that names the object), its S3 implementation on obstore, an in-memory one for
unit tests and the simulator, and :class:`ObjectStores`, a client's open stores
by URI.

Why obstore: it is asyncio-native (its requests run on its own Rust runtime, never
on the event loop), maintained, and fast where tiered storage needs speed:
ranged GETs, several ranges of one object in one call, and multipart uploads
streamed from an async iterator with parts in flight in parallel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from ..errors import (
    ConfigError,
    ObjectNotFoundError,
    ObjectStoreAuthError,
    ObjectStoreError,
    ObjectStoreUnavailableError,
)
from .location import Credentials, ObjectStoreUri, object_name

REQUEST_TIMEOUT_S = 30.0
"""One request (a ranged GET, a part of an upload, a HEAD) fails after this long."""
CONNECT_TIMEOUT_S = 5.0
UPLOAD_PART_BYTES = 8 * 1024 * 1024
"""Multipart uploads send parts of this size (S3's minimum is 5 MiB)."""
UPLOAD_PARTS_INFLIGHT = 4
STREAM_CHUNK_BYTES = 1024 * 1024
"""A streamed read hands over pieces of at least this many bytes."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """An object's key (relative to the store's prefix), size and time of writing."""

    key: str
    size: int
    mtime_s: float


class ObjectStore(Protocol):
    """An S3-compatible bucket under a prefix; keys are relative to the prefix."""

    @property
    def uri(self) -> ObjectStoreUri: ...

    async def put(self, key: str, data: bytes | AsyncIterable[bytes]) -> None:
        """Write the object whole (an async iterable: a multipart upload, whose object
        appears only when every part is in: never half)."""

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object."""

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Several ranges of one object (requests coalesced where close)."""

    def stream_range(self, key: str, start: int, end: int,
                     chunk_bytes: int = STREAM_CHUNK_BYTES) -> AsyncIterator[bytes | memoryview]:
        """Bytes ``[start, end)`` of the object as they arrive, in pieces of about
        ``chunk_bytes``: one request for a sequential read (each piece within the
        request timeout)."""

    async def head(self, key: str) -> ObjectInfo | None:
        """The object's size and time, None if there is none."""

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """The objects whose key starts with ``prefix``."""

    async def delete(self, key: str) -> None:
        """Remove the object (one that is not there is fine)."""

    async def check(self) -> None:
        """Reach the bucket and sign in, or fail with one clear error."""


def _translate(exc: BaseException, what: str, where: str,
               timeout_s: float = REQUEST_TIMEOUT_S) -> ObjectStoreError:
    """An obstore failure as our typed error, naming ``what`` at ``where``."""
    from obstore import exceptions as ox

    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, TimeoutError):
        return ObjectStoreUnavailableError(f"{what} at {where}: no answer within "
                                           f"{timeout_s:g} s")
    if isinstance(exc, (ox.PermissionDeniedError, ox.UnauthenticatedError)) or any(
            s in text for s in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied",
                                "403 Forbidden", "401 Unauthorized")):
        return ObjectStoreAuthError(
            f"{what} at {where}: the store refused the credentials ({text[:200]}); check "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the credentials file")
    if "NoSuchBucket" in text:
        return ObjectNotFoundError(f"{what} at {where}: no such bucket; create it first")
    if isinstance(exc, ox.NotFoundError):
        return ObjectNotFoundError(f"{what} at {where}: no such object")
    return ObjectStoreUnavailableError(f"{what} at {where}: {text[:300]}")


class S3ObjectStore:
    """An S3-compatible store through obstore (see the module docstring)."""

    def __init__(self, uri: ObjectStoreUri, credentials: Credentials | None, *,
                 request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        from obstore.store import S3Store

        self._uri = uri
        self._timeout_s = request_timeout_s
        config: dict[str, Any] = {"region": uri.region}
        if uri.endpoint is not None:
            config["endpoint"] = uri.endpoint
        if credentials is not None:
            config["access_key_id"] = credentials.access_key_id
            config["secret_access_key"] = credentials.secret_access_key
            if credentials.session_token:
                config["session_token"] = credentials.session_token
        client = {"timeout": timedelta(seconds=request_timeout_s),
                  "connect_timeout": timedelta(seconds=CONNECT_TIMEOUT_S),
                  "allow_http": uri.endpoint is not None and uri.endpoint.startswith("http://")}
        # Retries are ours (with the caller's bounds), so obstore tries each request once
        # more at most.
        retry = {"max_retries": 1, "retry_timeout": timedelta(seconds=request_timeout_s),
                 "backoff": {"init_backoff": timedelta(milliseconds=100),
                             "max_backoff": timedelta(seconds=1), "base": 2}}
        try:
            self._store = S3Store(uri.bucket, prefix=uri.prefix or None,
                                  config=config, client_options=client,  # type: ignore[arg-type]
                                  retry_config=retry)  # type: ignore[arg-type]
        except Exception as exc:
            raise ConfigError(f"object store {uri}: {str(exc).splitlines()[0]}") from None

    @property
    def uri(self) -> ObjectStoreUri:
        return self._uri

    def _where(self, key: str) -> str:
        return object_name(str(self._uri), key) if key else str(self._uri)

    async def _call(self, what: str, key: str, fn: Callable[[], Any], timeout_s: float | None = None) -> Any:
        try:
            async with asyncio.timeout(timeout_s or self._timeout_s):
                return await fn()
        except (ObjectStoreError, StopAsyncIteration):
            raise
        except Exception as exc:
            raise _translate(exc, what, self._where(key), timeout_s or self._timeout_s) from None

    async def put(self, key: str, data: bytes | AsyncIterable[bytes]) -> None:
        import obstore

        if isinstance(data, (bytes, bytearray, memoryview)):
            await self._call("upload", key, lambda: obstore.put_async(
                self._store, key, bytes(data), use_multipart=len(data) > UPLOAD_PART_BYTES,
                chunk_size=UPLOAD_PART_BYTES, max_concurrency=UPLOAD_PARTS_INFLIGHT))
            return
        # A multipart upload: bounded by the caller (it can be long), each part by the
        # client's request timeout.
        try:
            await obstore.put_async(self._store, key, data, use_multipart=True,
                                    chunk_size=UPLOAD_PART_BYTES,
                                    max_concurrency=UPLOAD_PARTS_INFLIGHT)
        except ObjectStoreError:
            raise
        except Exception as exc:
            raise _translate(exc, "upload", self._where(key)) from None

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        import obstore

        if end <= start:
            return b""
        got = await self._call("ranged read", key, lambda: obstore.get_range_async(
            self._store, key, start=start, end=end))
        return bytes(got)

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        import obstore

        if not ranges:
            return []
        got = await self._call("ranged read", key, lambda: obstore.get_ranges_async(
            self._store, key, starts=[r[0] for r in ranges], ends=[r[1] for r in ranges]))
        return [bytes(b) for b in got]

    async def stream_range(self, key: str, start: int, end: int,
                           chunk_bytes: int = STREAM_CHUNK_BYTES
                           ) -> AsyncIterator[bytes | memoryview]:
        import obstore

        if end <= start:
            return
        result = await self._call("streamed read", key, lambda: obstore.get_async(
            self._store, key, options={"range": (start, end)}))
        it = result.stream(min_chunk_size=chunk_bytes).__aiter__()
        while True:
            try:
                chunk = await self._call("streamed read", key, it.__anext__)
            except StopAsyncIteration:
                return
            yield memoryview(chunk)  # (the client's buffer, not a copy)

    async def head(self, key: str) -> ObjectInfo | None:
        import obstore

        try:
            meta = await self._call("head", key, lambda: obstore.head_async(self._store, key))
        except ObjectNotFoundError:
            return None
        return ObjectInfo(key, int(meta["size"]), meta["last_modified"].timestamp())

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        import obstore

        stream = obstore.list(self._store, prefix or None, chunk_size=1000)
        it = stream.__aiter__()
        while True:
            try:
                chunk = await self._call("list", prefix, it.__anext__)
            except StopAsyncIteration:
                return
            for meta in chunk:
                yield ObjectInfo(meta["path"], int(meta["size"]),
                                 meta["last_modified"].timestamp())

    async def delete(self, key: str) -> None:
        import obstore

        try:
            await self._call("delete", key, lambda: obstore.delete_async(self._store, key))
        except ObjectNotFoundError:
            pass

    async def check(self) -> None:
        import obstore

        # A listing of at most one key: reaches the bucket and signs in, reads nothing.
        stream = obstore.list(self._store, None, chunk_size=1)
        try:
            await self._call("list", "", stream.__aiter__().__anext__)
        except StopAsyncIteration:
            pass  # an empty bucket


class MemoryObjectStore:
    """An object store in memory, for unit tests and the simulator: the same contract,
    with ``fail_next`` to make requests fail (ObjectStoreUnavailableError) and a clock
    for the objects' times."""

    def __init__(self, uri: ObjectStoreUri | None = None,
                 wall_s: Callable[[], float] = time.time) -> None:
        self._uri = uri or ObjectStoreUri("memory", "")
        self.objects: dict[str, tuple[bytes, float]] = {}
        self.fail_next = 0
        """Requests still to fail (each failure counts one down)."""
        self.requests = 0
        self.stream_chunk_bytes: int | None = None
        """Pieces of streamed reads (None: as asked)."""
        self._wall_s = wall_s

    @property
    def uri(self) -> ObjectStoreUri:
        return self._uri

    def _request(self, what: str, key: str) -> None:
        self.requests += 1
        if self.fail_next > 0:
            self.fail_next -= 1
            raise ObjectStoreUnavailableError(f"{what} at {self._uri}/{key}: injected failure")

    async def put(self, key: str, data: bytes | AsyncIterable[bytes]) -> None:
        self._request("upload", key)
        if isinstance(data, (bytes, bytearray, memoryview)):
            body = bytes(data)
        else:
            body = b"".join([bytes(c) async for c in data])
            self._request("upload", key)  # the completion of the multipart upload
        self.objects[key] = (body, self._wall_s())

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        self._request("ranged read", key)
        if key not in self.objects:
            raise ObjectNotFoundError(f"ranged read at {self._uri}/{key}: no such object")
        return self.objects[key][0][start:end]

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [await self.get_range(key, s, e) for s, e in ranges]

    async def stream_range(self, key: str, start: int, end: int,
                           chunk_bytes: int = STREAM_CHUNK_BYTES
                           ) -> AsyncIterator[bytes | memoryview]:
        body = await self.get_range(key, start, end)
        chunk_bytes = self.stream_chunk_bytes or chunk_bytes
        for at in range(0, len(body), chunk_bytes):
            await asyncio.sleep(0)
            if self.fail_next > 0:  # a connection lost mid-stream
                self.fail_next -= 1
                raise ObjectStoreUnavailableError(
                    f"streamed read at {self._uri}/{key}: injected failure")
            yield body[at:at + chunk_bytes]

    async def head(self, key: str) -> ObjectInfo | None:
        self._request("head", key)
        if key not in self.objects:
            return None
        body, mtime = self.objects[key]
        return ObjectInfo(key, len(body), mtime)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        self._request("list", prefix)
        for key in sorted(self.objects):
            if key.startswith(prefix):
                body, mtime = self.objects[key]
                yield ObjectInfo(key, len(body), mtime)

    async def delete(self, key: str) -> None:
        self._request("delete", key)
        self.objects.pop(key, None)

    async def check(self) -> None:
        self._request("list", "")


class ObjectStores:
    """A client's object stores, opened on first use by URI (the one a segment's
    metadata names), all signed in with the same credentials: ``credentials``, else
    those of ``credentials_file``, else the ``AWS_*`` variables, else none (a public
    bucket).  ``factory`` makes a store (tests give in-memory ones)."""

    def __init__(self, credentials: Credentials | None = None, *,
                 credentials_file: str | None = None,
                 factory: Callable[[ObjectStoreUri, Credentials | None], ObjectStore] | None = None
                 ) -> None:
        self._credentials = credentials
        self._credentials_file = credentials_file
        self._factory = factory or S3ObjectStore
        self._stores: dict[ObjectStoreUri, ObjectStore] = {}
        self._lock = asyncio.Lock()

    def add(self, store: ObjectStore) -> ObjectStore:
        """Use ``store`` for its URI (the offloader's own, or a test's)."""
        self._stores[store.uri] = store
        return store

    async def get(self, uri: ObjectStoreUri | str) -> ObjectStore:
        """The store at ``uri`` (opened once)."""
        if isinstance(uri, str):
            uri = ObjectStoreUri.parse(uri)
        store = self._stores.get(uri)
        if store is not None:
            return store
        async with self._lock:
            if uri not in self._stores:
                creds = self._credentials
                if creds is None and self._credentials_file is not None:
                    creds = self._credentials = await asyncio.to_thread(
                        Credentials.from_file, self._credentials_file)
                if creds is None:
                    creds = Credentials.from_env()
                self._stores[uri] = self._factory(uri, creds)
            return self._stores[uri]
