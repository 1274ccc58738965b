"""The bookie's disk watch: which ledger directories are full.

Every ``disk_check_interval_s`` the server asks :meth:`DiskWatch.check`.  Per
ledger directory, the used fraction is the larger of its own disk's (the storage's
cached ``disk_usage``, refreshed every second off the loop) and its journal's
(the injected probe, ``statvfs`` by default, run through the offload seam).  A
directory turns *full* at ``disk_usage_threshold`` and not full again only below
``disk_usage_lwm_threshold`` (:func:`~.state.disk_read_only`); while full, plain
adds to its ledgers are refused and new ledgers go elsewhere
(:mod:`.storage.directories`).  The report says whether every directory is full
and whether every journal failed: the server turns those into read-only reasons
of its :class:`~.state.StateMachine`.

Each check also keeps its figures (:attr:`DiskWatch.last`), which the metrics
collector reads at scrape time through the bookie's admin interface: every
directory's free and total bytes, the journal disks' included (only this watch asks
those), whether it is full, and the two marks.  Scraping then asks no disk
anything.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from ..config import BookieConfig
from .fileio import Offload
from .state import disk_read_only
from .storage.api import Storage


class DirectoryUsage(NamedTuple):
    """One ledger directory at the last check, with its journal's disk."""

    ledger_dir: str
    journal_dir: str
    free_bytes: int
    total_bytes: int
    journal_free_bytes: int | None
    """None: the journal's disk could not be asked."""
    journal_total_bytes: int | None
    full: bool


class DiskCheck(NamedTuple):
    """The last check of one bookie's disks (for the metrics: :attr:`DiskWatch.last`)."""

    threshold: float
    """``disk_usage_threshold``: a directory turns full at this used fraction."""
    lwm_threshold: float
    """``disk_usage_lwm_threshold``: a full directory turns writable below it."""
    directories: tuple[DirectoryUsage, ...]


class DiskReport(NamedTuple):
    all_full: bool
    """Every ledger directory is full."""
    journal_failed: bool
    """Every journal failed."""
    used_max: float
    """The fullest disk's used fraction."""


class DiskWatch:
    """Checks a storage's ledger directories (module docstring)."""

    def __init__(self, storage: Storage, config: BookieConfig,
                 probe: Callable[[Path], tuple[int, int]], offload: Offload, log: Any) -> None:
        self._storage = storage
        self._config = config
        self._probe = probe
        self._offload = offload
        self._log = log
        self.last: DiskCheck | None = None
        """The figures of the last check (None before the first)."""

    async def check(self) -> DiskReport:
        cfg = self._config
        used_max = 0.0
        figures: list[DirectoryUsage] = []
        for part in self._storage.per_directory:
            free, total = part.disk_usage()  # cached by storage, refreshed off-loop
            used = 1 - free / total if total else 0.0
            journal: tuple[int, int] | None
            try:
                journal = await self._offload.run(self._probe, part.journal_dir)
            except OSError as exc:  # the journal's disk cannot be asked: keep its state
                self._log.warning("journal disk usage unknown", error=repr(exc),
                                  journal_dir=str(part.journal_dir))
                journal = None
            j_free, j_total = journal if journal is not None else (1, 1)
            used = max(used, 1 - j_free / j_total if j_total else 0.0)
            used_max = max(used_max, used)
            full = disk_read_only(part.full, used, cfg.disk_usage_threshold,
                                  cfg.disk_usage_lwm_threshold)
            if full != part.full:
                part.full = full
                self._log.warning("ledger directory full: its ledgers take no adds"
                                  if full else "ledger directory writable again",
                                  ledger_dir=str(part.ledger_dir),
                                  journal_dir=str(part.journal_dir),
                                  disk_used=round(used, 4))
            figures.append(DirectoryUsage(
                str(part.ledger_dir), str(part.journal_dir), free, total,
                None if journal is None else journal[0],
                None if journal is None else journal[1], part.full))
        self.last = DiskCheck(cfg.disk_usage_threshold, cfg.disk_usage_lwm_threshold,
                              tuple(figures))
        return DiskReport(all(part.full for part in self._storage.per_directory),
                          self._storage.journal_failed, used_max)


__all__ = ["DirectoryUsage", "DiskCheck", "DiskReport", "DiskWatch"]
