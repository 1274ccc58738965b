"""Several ledger directories: one :class:`~.ledger_storage.LedgerStorage` per directory.

A bookie given several ledger directories (``ledger_dir = "/d1,/d2,..."``, like
BookKeeper's ``ledgerDirectories``) runs one complete storage per directory: its
own journal, entry logs, index and checkpoint.  Each ledger lives wholly in one
directory, so every invariant of a single storage (journal before ack, checkpoint
marks, recovery, compaction) holds per directory unchanged, and a directory
never waits for another's fsync.

* **Journals.**  Ledger directory *i* journals into ``journal_dirs[i]``, or, when
  there are fewer journal directories than ledger directories, into
  ``journal_dirs[i % J]/ledgers-<i>`` (see :func:`journal_dir_of`).  The mapping
  depends only on *i* and the number of journal directories, which therefore may
  not change; ledger directories may be appended (``allow_storage_expansion``).
* **Placement.**  A ledger goes where it already is (stored or tombstoned); a new
  one to the usable directory (not full, journal not failed) holding fewest
  ledgers, the first on a tie.  So a directory added to a running bookie takes the
  new ledgers until it has caught up.  The map is rebuilt at start from what each
  directory holds.
* **A full disk.**  The bookie's disk watch sets each directory's ``full`` flag
  (its ledger disk or its journal's disk past ``disk_usage_threshold``): plain adds
  to its ledgers are refused as on a read-only bookie (writers replace this bookie
  in those ledgers' ensembles), new ledgers go elsewhere, reads go on.  The bookie
  turns read-only only when every directory is full.  A directory whose journal
  failed is passed over the same way.
* **Garbage collection** sees one storage: entry-log ids are
  ``directory << 32 | log id`` (entry-log ids are 32-bit), split again for compaction.

Every directory's storage runs on the same seams (:mod:`..fileio`: ``io``,
``offload``; ``kv_open`` for the on-disk index), and the devices of the ledger
directories come from ``device_of`` (``st_dev``), so the simulator opens several
directories on its simulated disks as the bookie does on real ones.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...clock import Clock
from ...config import BookieConfig
from ...log import get_logger
from ..fileio import OS_FILE_IO, THREAD_OFFLOAD, FileIO, Offload
from ..journal_sync import JournalSync
from .api import LedgerInfo
from .ledger_storage import LedgerStorage
from .recovery import KVOpener


def _device(path: Path) -> int:
    return os.stat(path).st_dev

LOG_ID_BITS = 32
"""Entry-log ids are below 2**32: the directory index sits above them (GC's view)."""


def journal_dir_of(journal_dirs: Sequence[Path], index: int) -> Path:
    """The journal directory of ledger directory ``index``: ``journal_dirs[index]``
    while there are enough, else a sub-directory of ``journal_dirs[index % J]``."""
    if index < len(journal_dirs):
        return journal_dirs[index]
    return journal_dirs[index % len(journal_dirs)] / f"ledgers-{index}"


async def open_storage(config: BookieConfig, *, log: Any = None, clock: Clock | None = None,
                       io: FileIO = OS_FILE_IO, offload: Offload = THREAD_OFFLOAD,
                       kv_open: KVOpener | None = None,
                       device_of: Callable[[Path], int] = _device,
                       ) -> LedgerStorage | MultiDirStorage:
    """The bookie's storage: a :class:`LedgerStorage` for one ledger directory, a
    :class:`MultiDirStorage` over several, on the given seams."""
    journals = [Path(d) for d in config.journal_dirs]
    ledgers = [Path(d) for d in config.ledger_dirs]
    if len(ledgers) == 1:
        return await LedgerStorage.open(journals[0], ledgers[0], config, log=log, clock=clock,
                                        io=io, offload=offload, kv_open=kv_open)
    return await MultiDirStorage.open(journals, ledgers, config, log=log, clock=clock, io=io,
                                      offload=offload, kv_open=kv_open, device_of=device_of)


class MultiDirStorage:
    """The :class:`~.api.Storage` of a bookie with several ledger directories (see
    the module docstring).  Create with :meth:`open`."""

    def __init__(self, parts: Sequence[LedgerStorage], devices: Sequence[int],
                 log: Any) -> None:
        self._parts = tuple(parts)
        self._devices = tuple(devices)
        self._log = log
        self._where: dict[int, LedgerStorage] = {}
        """Which directory holds each ledger (stored or tombstoned)."""
        for part in self._parts:
            for ledger_id in part.ledger_ids() + part.deleted_ids():
                held = self._where.get(ledger_id)
                if held is not None and held.ledger(ledger_id) is not None:
                    if part.ledger(ledger_id) is not None:  # cannot happen: say so
                        log.warning("ledger found in two ledger directories; serving "
                                    "the first", ledger_id=ledger_id,
                                    first=str(held.ledger_dir), second=str(part.ledger_dir))
                    continue
                self._where[ledger_id] = part

    @classmethod
    async def open(cls, journal_dirs: Sequence[Path], ledger_dirs: Sequence[Path],
                   config: BookieConfig, *, log: Any = None,
                   clock: Clock | None = None, io: FileIO = OS_FILE_IO,
                   offload: Offload = THREAD_OFFLOAD, kv_open: KVOpener | None = None,
                   device_of: Callable[[Path], int] = _device) -> MultiDirStorage:
        """Open (recover) each directory's storage in turn."""
        log = log if log is not None else get_logger(component="storage")
        parts: list[LedgerStorage] = []
        try:
            for i, ledger_dir in enumerate(ledger_dirs):
                parts.append(await LedgerStorage.open(
                    journal_dir_of(journal_dirs, i), ledger_dir, config,
                    log=log.bind(ledger_dir=str(ledger_dir)), clock=clock, io=io,
                    offload=offload, kv_open=kv_open))
            devices = await offload.run(lambda: [device_of(d) for d in ledger_dirs])
        except BaseException:
            await asyncio.gather(*(p.abort() for p in parts), return_exceptions=True)
            raise
        self = cls(parts, devices, log)
        log.info("ledger directories opened", directories=len(parts),
                 ledgers=[p.ledger_count for p in parts])
        return self

    # --- routing --------------------------------------------------------------

    def _holder(self, ledger_id: int) -> LedgerStorage:
        """The directory holding ``ledger_id``; the first for an unknown one (which
        answers as a storage that does not have it)."""
        return self._where.get(ledger_id) or self._parts[0]

    def _place(self, ledger_id: int) -> LedgerStorage:
        part = self._where.get(ledger_id)
        if part is None:
            usable = [p for p in self._parts if not p.full and not p.journal_failed]
            part = min(usable or self._parts, key=lambda p: p.ledger_count)
            self._where[ledger_id] = part
        return part

    def directory_of(self, ledger_id: int) -> Path | None:
        """The ledger directory holding ``ledger_id`` (None: not here)."""
        part = self._where.get(ledger_id)
        return part.ledger_dir if part is not None else None

    # --- the request processor's part ---------------------------------------------

    def ledger(self, ledger_id: int) -> LedgerInfo | None:
        part = self._where.get(ledger_id)
        return part.ledger(ledger_id) if part is not None else None

    def is_deleted(self, ledger_id: int) -> bool:
        part = self._where.get(ledger_id)
        return part is not None and part.is_deleted(ledger_id)

    def is_full(self, ledger_id: int) -> bool:
        part = self._where.get(ledger_id)
        if part is not None:
            return part.full
        return all(p.full for p in self._parts)

    def add_entry(self, ledger_id: int, entry_id: int, master_key: bytes,
                  body: bytes) -> asyncio.Future[JournalSync]:
        return self._place(ledger_id).add_entry(ledger_id, entry_id, master_key, body)

    def add_entries(self, ledger_id: int, entry_ids: list[int], master_key: bytes,
                    bodies: list[bytes]) -> asyncio.Future[JournalSync]:
        return self._place(ledger_id).add_entries(ledger_id, entry_ids, master_key, bodies)

    def add_entries_then(self, ledger_id: int, entry_ids: list[int], master_key: bytes,
                         bodies: list[bytes],
                         then: Callable[[JournalSync | BaseException], None]) -> None:
        self._place(ledger_id).add_entries_then(ledger_id, entry_ids, master_key, bodies, then)

    def fence(self, ledger_id: int, master_key: bytes) -> asyncio.Future[JournalSync]:
        return self._place(ledger_id).fence(ledger_id, master_key)

    def update_lac(self, ledger_id: int, lac: int) -> bool:
        return self._holder(ledger_id).update_lac(ledger_id, lac)

    def write_explicit_lac(self, ledger_id: int, lac: int) -> asyncio.Future[JournalSync]:
        return self._holder(ledger_id).write_explicit_lac(ledger_id, lac)

    async def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        return await self._holder(ledger_id).read_entry(ledger_id, entry_id)

    async def read_entries(self, ledger_id: int, first: int, count_max: int,
                           bytes_max: int) -> list[bytes]:
        return await self._holder(ledger_id).read_entries(ledger_id, first, count_max,
                                                          bytes_max)

    def entry_ids(self, ledger_id: int) -> list[int]:
        return self._holder(ledger_id).entry_ids(ledger_id)

    @property
    def journal_queue_entries(self) -> int:
        """The fullest journal's queue (backpressure holds while any is full)."""
        return max(p.journal_queue_entries for p in self._parts)

    async def wait_for_queue_space(self) -> None:
        for part in self._parts:
            await part.wait_for_queue_space()

    def disk_usage(self) -> tuple[int, int]:
        """(free, total) bytes over the ledger directories' file systems (each counted once)."""
        seen: dict[int, tuple[int, int]] = {}
        for device, part in zip(self._devices, self._parts, strict=True):
            seen.setdefault(device, part.disk_usage())
        return sum(f for f, _ in seen.values()), sum(t for _, t in seen.values())

    # --- the rest of the bookie's part ------------------------------------------

    @property
    def config(self) -> BookieConfig:
        return self._parts[0].config

    @property
    def clock(self) -> Clock:
        return self._parts[0].clock

    @property
    def journal_failed(self) -> bool:
        """Every journal failed (one failed journal only takes its directory out)."""
        return all(p.journal_failed for p in self._parts)

    @property
    def per_directory(self) -> tuple[LedgerStorage, ...]:
        return self._parts

    def ledger_ids(self) -> list[int]:
        return [lid for p in self._parts for lid in p.ledger_ids()]

    def delete_ledger(self, ledger_id: int) -> asyncio.Future[None]:
        return self._holder(ledger_id).delete_ledger(ledger_id)

    async def entry_log_usage(self) -> dict[int, tuple[int, int]]:
        out: dict[int, tuple[int, int]] = {}
        for i, part in enumerate(self._parts):
            for log_id, usage in (await part.entry_log_usage()).items():
                out[i << LOG_ID_BITS | log_id] = usage
        return out

    async def compact_entry_logs(self, log_ids: Sequence[int],
                                 rate_bytes_per_s: float = 0.0) -> int:
        by_part: dict[int, list[int]] = {}
        for log_id in log_ids:
            by_part.setdefault(log_id >> LOG_ID_BITS, []).append(
                log_id & ((1 << LOG_ID_BITS) - 1))
        freed = 0
        for i, ids in sorted(by_part.items()):
            freed += await self._parts[i].compact_entry_logs(ids, rate_bytes_per_s)
        return freed

    async def checkpoint(self) -> None:
        await self._each(lambda p: p.checkpoint())

    async def close(self) -> None:
        await self._each(lambda p: p.close())

    async def abort(self) -> None:
        await self._each(lambda p: p.abort())

    async def _each(self, step: Any) -> None:
        """Run ``step`` on every directory together; every one runs even if another
        fails, then the first failure is raised."""
        results = await asyncio.gather(*(step(p) for p in self._parts), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    def statistics(self) -> dict[str, Any]:
        """The directories' statistics merged (counts summed, maxima and flags kept),
        with each directory's own under ``"directories"``."""
        each = [p.statistics() for p in self._parts]
        merged = _merge(each)
        free, total = self.disk_usage()
        merged.update(disk_free_bytes=free, disk_total_bytes=total, directories=[
            {"ledger_dir": str(p.ledger_dir), "journal_dir": str(p.journal_dir),
             "full": p.full, "journal_failed": p.journal_failed, "ledgers": s["ledgers"],
             "entries": s["entries"], "disk_free_bytes": s["disk_free_bytes"],
             "disk_total_bytes": s["disk_total_bytes"]}
            for p, s in zip(self._parts, each, strict=True)])
        return merged


_KEPT_MAX = ("_max", "_peak", "_last")


def _merge(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge statistics dicts: flags any-of, maxima and last values max, means
    averaged, other numbers summed, nested dicts merged, anything else listed."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for s in stats for k in s):
        values = [s[key] for s in stats if key in s]
        first = values[0]
        if isinstance(first, bool):
            out[key] = any(values)
        elif isinstance(first, dict):
            out[key] = _merge(values) if all(isinstance(v, dict) for v in values) else values
        elif isinstance(first, int | float) and not key.endswith("_id"):
            if key.endswith(_KEPT_MAX):
                out[key] = max(values)
            elif key.endswith("_mean"):
                out[key] = sum(values) / len(values)
            else:
                out[key] = sum(values)
        else:
            out[key] = values
    return out


__all__ = ["MultiDirStorage", "journal_dir_of", "open_storage"]
