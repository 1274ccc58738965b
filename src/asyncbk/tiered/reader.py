"""Reading an offloaded segment from the object store, as if it were its ledger:
:class:`ObjectSegmentReader` has the read surface of a closed ledger's read handle
(``read``, ``read_unconfirmed``, ``tail``, ``metadata``, ``last_add_confirmed``),
so stream readers, subscriptions, time seeks and Spark's planner read either the
same way.

The object's index is read once (one ranged GET; a process keeps the last
INDEX_CACHE_MAX indexes), then each read fetches the blocks it needs, several at a
time, and keeps the last few decoded; ``tail`` reads ahead ``readahead_blocks``
blocks.  A request that fails for want of an answer is tried again with back-off
until ``timeout_s`` has passed, then fails with an error that names the object.
While the segment's ledger is still on the bookies (``fallback``), a failing
store or a damaged object makes the read go to the bookies instead.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..backoff import Backoff
from ..errors import (
    CorruptObjectError,
    ObjectStoreError,
    ObjectStoreUnavailableError,
)
from ..types import LedgerEntry
from .format import ObjectIndex, decode_block, decode_index
from .location import object_name
from .store import ObjectStore, ObjectStores


class ObjectRef(Protocol):
    """Where an offloaded segment's object is (a segment's offload record)."""

    @property
    def store(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def index_offset(self) -> int: ...

    @property
    def index_length(self) -> int: ...

    @property
    def digest(self) -> int: ...

    @property
    def last_entry(self) -> int: ...

    @property
    def ledger_deleted_ms(self) -> int: ...


class EntryReader(Protocol):
    """Reads a ledger's entries (the bookies' copy, the fallback)."""

    async def read(self, first_entry: int, last_entry: int) -> list[LedgerEntry]: ...

READ_TIMEOUT_S = 60.0
"""A read of an offloaded segment retries an unavailable store this long, then fails."""
BLOCKS_INFLIGHT = 4
"""Ranged GETs one read or one read-ahead keeps in flight."""
BLOCK_CACHE = 8
"""Decoded blocks one reader keeps (entry-by-entry reads hit them)."""
BOOKIE_WINDOW_ENTRIES = 64
"""Entries one read of the bookies' copy asks for, when reading falls back to it."""
INDEX_CACHE_MAX = 256
"""Indexes a process keeps (one per offloaded segment read lately)."""

_indexes: collections.OrderedDict[tuple[str, str, int], ObjectIndex] = collections.OrderedDict()


@dataclass(frozen=True, slots=True)
class ClosedLedgerView:
    """What the stream layer reads of a ledger's metadata, for an offloaded one."""

    ledger_id: int
    last_entry_id: int
    length: int
    is_closed: bool = True


class ObjectSegmentReader:
    """Reads the entries of one offloaded segment (see the module docstring)."""

    def __init__(self, store: ObjectStore, offload: ObjectRef, ledger_id: int, last_entry: int,
                 size_bytes: int, *, fallback: Callable[[], Awaitable[EntryReader]] | None = None,
                 timeout_s: float = READ_TIMEOUT_S, readahead_blocks: int = BLOCKS_INFLIGHT,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 log: Any = None) -> None:
        self._store = store
        self._offload = offload
        self._where = object_name(offload.store, offload.key)
        self._meta = ClosedLedgerView(ledger_id, last_entry, size_bytes)
        self._fallback = fallback
        self._bookies: EntryReader | None = None
        self._timeout_s = timeout_s
        self._readahead = max(1, readahead_blocks)
        self._sleep = sleep
        self._log = log
        self._blocks: collections.OrderedDict[int, list[bytes]] = collections.OrderedDict()
        self.gets = 0
        """Ranged GETs made (for tests and benchmarks)."""

    @property
    def id(self) -> int:
        return self._meta.ledger_id

    @property
    def metadata(self) -> ClosedLedgerView:
        return self._meta

    @property
    def last_add_confirmed(self) -> int:
        return self._meta.last_entry_id

    @property
    def object_name(self) -> str:
        return self._where

    async def _retrying(self, what: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        """``fn()``, tried again while the store is unavailable, for ``timeout_s``."""
        pause = Backoff(0.05, 2.0)
        try:
            async with asyncio.timeout(self._timeout_s):
                while True:
                    try:
                        self.gets += 1
                        return await fn()
                    except ObjectStoreUnavailableError:
                        await self._sleep(pause.next_s())
        except TimeoutError:
            raise ObjectStoreUnavailableError(
                f"{what} of {self._where}: the object store did not answer for "
                f"{self._timeout_s:g} s (is it up? the segment's ledger "
                f"{'is' if self._fallback else 'is no longer'} on the bookies)") from None

    async def index(self) -> ObjectIndex:
        """The object's index (read once per process while it stays cached)."""
        cache_key = (self._offload.store, self._offload.key, self._offload.digest)
        idx = _indexes.get(cache_key)
        if idx is not None:
            _indexes.move_to_end(cache_key)
            return idx
        off = self._offload
        data = await self._retrying("the index", lambda: self._store.get_range(
            off.key, off.index_offset, off.index_offset + off.index_length))
        idx = decode_index(data, f"{self._where} (index)")
        if idx.last_entry != self._meta.last_entry_id:
            raise CorruptObjectError(f"{self._where}: holds entries up to {idx.last_entry}, the "
                                     f"segment up to {self._meta.last_entry_id}")
        _indexes[cache_key] = idx
        while len(_indexes) > INDEX_CACHE_MAX:
            _indexes.popitem(last=False)
        return idx

    async def _fetch_block(self, idx: ObjectIndex, block: int) -> list[bytes]:
        cached = self._blocks.get(block)
        if cached is not None:
            self._blocks.move_to_end(block)
            return cached
        start, end = idx.block_range(block)
        data = await self._retrying(f"block {block}", lambda: self._store.get_range(
            self._offload.key, start, end))
        first, last = idx.block_entries(block)
        payloads = decode_block(data, f"{self._where} block {block}", first, last)
        self._blocks[block] = payloads
        while len(self._blocks) > BLOCK_CACHE:
            self._blocks.popitem(last=False)
        return payloads

    async def _object_read(self, first: int, last: int) -> list[LedgerEntry]:
        idx = await self.index()
        b0, b1 = idx.block_of(first), idx.block_of(last)
        out: list[LedgerEntry] = []
        for lo in range(b0, b1 + 1, BLOCKS_INFLIGHT):
            blocks = range(lo, min(b1 + 1, lo + BLOCKS_INFLIGHT))
            got = await asyncio.gather(*(self._fetch_block(idx, b) for b in blocks))
            for b, payloads in zip(blocks, got, strict=True):
                base = idx.block_firsts[b]
                lo_e, hi_e = max(first, base), min(last, base + len(payloads) - 1)
                out.extend(LedgerEntry(self.id, e, payloads[e - base])
                           for e in range(lo_e, hi_e + 1))
        return out

    async def _bookie_read(self, first: int, last: int, cause: ObjectStoreError) -> list[LedgerEntry]:
        assert self._fallback is not None
        if self._bookies is None:
            if self._log is not None:
                self._log.warning("object store read failed; reading the bookies' copy",
                                  object=self._where, error=str(cause))
            self._bookies = await self._fallback()
        return await self._bookies.read(first, last)

    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first`` to ``last`` (both in the segment)."""
        if first < 0 or last > self._meta.last_entry_id or first > last:
            raise ValueError(f"entries {first}..{last} are not in the segment of ledger "
                             f"{self.id} (0..{self._meta.last_entry_id})")
        if self._bookies is not None:
            return await self._bookies.read(first, last)
        try:
            return await self._object_read(first, last)
        except ObjectStoreError as exc:
            if self._fallback is None:
                raise
            return await self._bookie_read(first, last, exc)

    read_unconfirmed = read

    async def tail(self, start: int = 0, poll_s: float = 0.0,
                   last_entry: int | None = None) -> AsyncIterator[LedgerEntry]:
        """Entries from ``start`` to ``last_entry`` (default: the last): one streamed GET
        of their blocks, cut into blocks as the bytes arrive, up to
        ``readahead_blocks`` blocks decoded ahead of the caller.  If the stream
        breaks, the rest is read block by block (with retries, and the bookies as the
        fallback)."""
        del poll_s  # an offloaded segment is complete: nothing to wait for
        last = self._meta.last_entry_id if last_entry is None else min(
            last_entry, self._meta.last_entry_id)
        if start > last:
            return
        if self._bookies is None:
            try:
                idx = await self.index()
            except ObjectStoreError as exc:
                if self._fallback is None:
                    raise
                await self._bookie_read(start, start, exc)  # switches to the bookies
        if self._bookies is not None:
            for lo in range(start, last + 1, BOOKIE_WINDOW_ENTRIES):
                for e in await self._bookies.read(lo, min(last, lo + BOOKIE_WINDOW_ENTRIES - 1)):
                    yield e
            return
        queue: asyncio.Queue[tuple[int, list[bytes]] | BaseException | None] = \
            asyncio.Queue(self._readahead)
        b0, b1 = idx.block_of(start), idx.block_of(last)
        streaming = asyncio.get_running_loop().create_task(
            self._stream_blocks(idx, b0, b1, queue))
        next_entry = start
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    break  # the stream broke: read the rest block by block
                block, payloads = item
                base = idx.block_firsts[block]
                for eid in range(max(next_entry, base), min(last + 1, base + len(payloads))):
                    yield LedgerEntry(self.id, eid, payloads[eid - base])
                next_entry = base + len(payloads)
        finally:
            streaming.cancel()
            await asyncio.gather(streaming, return_exceptions=True)
        if self._log is not None:
            self._log.info("streamed read of an offloaded segment broke; reading on block "
                           "by block", object=self._where, error=str(item))
        async for e in self._rest(idx, next_entry, last):
            yield e

    async def _rest(self, idx: ObjectIndex, first: int, last: int) -> AsyncIterator[LedgerEntry]:
        """Entries ``first`` to ``last``, block by block, ``readahead_blocks`` ahead."""
        if first > last:
            return
        pending: collections.deque[asyncio.Future[list[LedgerEntry]]] = collections.deque()
        next_block = idx.block_of(first)
        try:
            while True:
                while next_block <= idx.block_of(last) and len(pending) < self._readahead:
                    lo, hi = idx.block_entries(next_block)
                    pending.append(asyncio.ensure_future(self.read(max(lo, first),
                                                                   min(hi, last))))
                    next_block += 1
                if not pending:
                    return
                for e in await pending.popleft():
                    yield e
        finally:
            for fut in pending:
                fut.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def _stream_blocks(self, idx: ObjectIndex, b0: int, b1: int,
                             queue: asyncio.Queue[tuple[int, list[bytes]] | BaseException | None]
                             ) -> None:
        """Blocks ``b0`` to ``b1`` of one streamed GET onto ``queue`` (then None; or the
        error)."""
        try:
            self.gets += 1
            async for block, data in stream_blocks(self._store, self._offload.key, idx, b0, b1,
                                                   self._where):
                first, last = idx.block_entries(block)
                payloads = decode_block(data, f"{self._where} block {block}", first, last)
                self._blocks[block] = payloads
                while len(self._blocks) > BLOCK_CACHE:
                    self._blocks.popitem(last=False)
                await queue.put((block, payloads))
            await queue.put(None)
        except ObjectStoreError as exc:
            await queue.put(exc)

    async def close(self) -> None:
        """Nothing to release (provided for symmetry with read handles)."""


async def stream_blocks(store: ObjectStore, key: str, idx: ObjectIndex, b0: int, b1: int,
                        where: str) -> AsyncIterator[tuple[int, memoryview]]:
    """Blocks ``b0`` to ``b1`` of object ``key`` (whose index is ``idx``), undecoded,
    from one streamed GET: each as soon as its last byte has come, a view of the
    piece that holds it when it is wholly in one (no copy).  CorruptObjectError if
    the object ends early."""
    block = b0
    start = idx.block_offsets[b0]
    end = idx.block_range(b1)[1]
    leftover = b""  # the start of a block whose end has not come yet
    at = start  # the object offset of leftover[0]
    async for chunk in store.stream_range(key, start, end):
        data = memoryview(leftover + bytes(chunk)) if leftover else memoryview(chunk)
        pos = 0
        while block <= b1:
            b_start, b_end = idx.block_range(block)
            if b_end - at > len(data):
                break
            yield block, data[b_start - at:b_end - at]
            pos = b_end - at
            block += 1
        leftover = bytes(data[pos:])
        at += pos
    if block <= b1:
        raise CorruptObjectError(f"{where}: the object ended before block {block}")


async def open_offloaded(objects: ObjectStores, offload: ObjectRef, ledger_id: int,
                         open_ledger: Callable[[], Awaitable[EntryReader]], *,
                         size_bytes: int = 0, timeout_s: float = READ_TIMEOUT_S,
                         sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                         log: Any = None) -> ObjectSegmentReader:
    """A reader of the offloaded segment of ``ledger_id`` from its store in
    ``objects``; ``open_ledger`` opens its ledger, the fallback while it is still on the
    bookies."""
    return ObjectSegmentReader(
        await objects.get(offload.store), offload, ledger_id, offload.last_entry, size_bytes,
        fallback=None if offload.ledger_deleted_ms else open_ledger, timeout_s=timeout_s,
        sleep=sleep, log=log)
