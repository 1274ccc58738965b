"""What the rest of the bookie uses of its storage.

:class:`Storage` is what the request processor, the garbage collector and the
server use of :class:`~.ledger_storage.LedgerStorage`; :class:`RequestStorage`
is the part the request processor needs (a test double need implement no more).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ...clock import Clock
from ...config import BookieConfig

if TYPE_CHECKING:
    from ..journal import Journal
    from ..journal_sync import JournalSync


@dataclass(slots=True)
class LedgerInfo:
    """A ledger's state on this bookie (live view: do not mutate)."""

    master_key: bytes
    fenced: bool = False
    lac: int = -1
    """Highest LAC seen (piggybacked on adds or explicit)."""
    last_entry_id: int = -1
    """Highest entry id stored (and readable)."""
    explicit_lac: int = -1
    """Highest LAC written with :meth:`LedgerStorage.write_explicit_lac`."""


class RequestStorage(Protocol):
    """What the request processor uses: ledger state, adds, fences, LACs, reads and
    the journal queue's backpressure."""

    def ledger(self, ledger_id: int) -> LedgerInfo | None: ...

    def is_deleted(self, ledger_id: int) -> bool: ...

    def add_entry(self, ledger_id: int, entry_id: int, master_key: bytes,
                  body: bytes) -> asyncio.Future[JournalSync]: ...

    def add_entries(self, ledger_id: int, entry_ids: list[int], master_key: bytes,
                    bodies: list[bytes]) -> asyncio.Future[JournalSync]:
        """Many entries of one ledger, one future for all (queued all or none)."""
        ...

    def add_entries_then(self, ledger_id: int, entry_ids: list[int], master_key: bytes,
                         bodies: list[bytes],
                         then: Callable[[JournalSync | BaseException], None]) -> None:
        """``add_entries`` with ``then`` called (with the group commit or the exception)
        in the loop turn the journal completes them, instead of a future."""
        ...

    def fence(self, ledger_id: int, master_key: bytes) -> asyncio.Future[JournalSync]: ...

    def update_lac(self, ledger_id: int, lac: int) -> bool: ...

    def is_full(self, ledger_id: int) -> bool:
        """The disk that holds (or would take) ``ledger_id`` is full: plain adds to it
        are refused as on a read-only bookie (recovery adds still taken)."""
        ...

    def write_explicit_lac(self, ledger_id: int, lac: int) -> asyncio.Future[JournalSync]: ...

    async def read_entry(self, ledger_id: int, entry_id: int) -> bytes: ...

    async def read_entries(self, ledger_id: int, first: int, count_max: int,
                           bytes_max: int) -> list[bytes]: ...

    @property
    def journal_queue_entries(self) -> int: ...

    async def wait_for_queue_space(self) -> None: ...

    def disk_usage(self) -> tuple[int, int]: ...


class LedgerDirectory(Protocol):
    """One ledger directory's storage, as the bookie's disk watch and metrics see it."""

    full: bool

    @property
    def ledger_dir(self) -> Path: ...

    @property
    def journal_dir(self) -> Path: ...

    @property
    def journal_failed(self) -> bool: ...

    @property
    def journal(self) -> Journal: ...

    def disk_usage(self) -> tuple[int, int]: ...

    @property
    def ledger_count(self) -> int: ...


class Storage(RequestStorage, Protocol):
    """Everything the bookie uses: the request processor's part, garbage collection
    and compaction (:mod:`..gc`), checkpoints, shutdown and statistics (the server)."""

    @property
    def config(self) -> BookieConfig: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def journal_failed(self) -> bool: ...

    def ledger_ids(self) -> list[int]: ...

    @property
    def per_directory(self) -> Sequence[LedgerDirectory]:
        """One storage per ledger directory (its disk usage, its ``full`` flag, its
        journal), for the disk watch and the metrics."""
        ...

    def delete_ledger(self, ledger_id: int) -> asyncio.Future[None]: ...

    async def entry_log_usage(self) -> dict[int, tuple[int, int]]: ...

    async def compact_entry_logs(self, log_ids: Sequence[int],
                                 rate_bytes_per_s: float = 0.0) -> int: ...

    async def checkpoint(self) -> None: ...

    async def close(self) -> None: ...

    async def abort(self) -> None: ...

    def statistics(self) -> dict[str, Any]: ...
