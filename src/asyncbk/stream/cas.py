"""Compare-and-swap writes of single keys, coalesced into shared transactions
(:class:`BatchedCas`): how a process's subscription consumers persist their
cursors without one metadata transaction each."""

from __future__ import annotations

import asyncio

from ..errors import MetadataVersionError
from ..meta.api import KeyValueStore

_CasWrite = tuple[KeyValueStore, str, int, bytes, "asyncio.Future[int]"]
"""A write waiting to be sent: store, key, version compared, value, its future."""

CAS_BATCH_KEYS_MAX = 64
"""Keys one coalesced compare-and-swap transaction writes at most (etcd refuses
transactions of more than 128 operations by default)."""


class BatchedCas:
    """Compare-and-swap writes of single keys (subscription cursors), coalesced: the
    writes asked for in one event-loop turn go to the store in transactions of up to
    CAS_BATCH_KEYS_MAX keys, each key compared with the version its writer holds.  A
    transaction is all or nothing, so one refused as a whole is tried again key by
    key, and each writer learns its own outcome (the new version, or
    MetadataVersionError).  A thousand consumers persisting once a second make about
    sixteen transactions a second, not a thousand."""

    def __init__(self) -> None:
        self._pending: list[_CasWrite] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def write(self, meta: KeyValueStore, key: str, version: int,
              value: bytes) -> asyncio.Future[int]:
        """A future of the key's new version once ``value`` is written, if ``key`` is
        still at ``version`` (else it fails with MetadataVersionError)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((meta, key, version, value, fut))
        return fut

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        by_store: dict[int, list[_CasWrite]] = {}
        for item in pending:
            by_store.setdefault(id(item[0]), []).append(item)
        for items in by_store.values():
            for i in range(0, len(items), CAS_BATCH_KEYS_MAX):
                task = asyncio.get_running_loop().create_task(
                    self._send(items[i:i + CAS_BATCH_KEYS_MAX]))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _send(batch: list[_CasWrite]) -> None:
        meta = batch[0][0]
        try:
            try:
                version = await meta.kv_txn([(key, ver) for _, key, ver, _, _ in batch],
                                            put=[(key, value) for _, key, _, value, _ in batch])
            except MetadataVersionError:
                if len(batch) == 1:
                    raise
            else:
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_result(version)
                return
            for _, key, ver, value, fut in batch:  # one by one, to tell each its outcome
                try:
                    got = await meta.kv_txn([(key, ver)], put=[(key, value)])
                except MetadataVersionError as exc:
                    if not fut.done():
                        fut.set_exception(exc)
                else:
                    if not fut.done():
                        fut.set_result(got)
        except BaseException as exc:
            for *_, fut in batch:
                if not fut.done():
                    if isinstance(exc, Exception):
                        fut.set_exception(exc)
                    else:
                        fut.cancel()
            if not isinstance(exc, Exception):
                raise
