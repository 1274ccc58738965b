"""What the bookie's admin endpoint shows and can do: the :class:`BookieAdmin` protocol.

The HTTP admin endpoint (:mod:`.http`) and its Prometheus collector depend on this
small protocol, not on the server's parts: the state and its read-only reasons,
the figures of the listener, the request processor, the storage and the journals,
garbage collection, and the one switch an operator has (read-only for
maintenance).  :class:`~.server.BookieServer` implements it; a test double need
implement no more.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from ..stats import LatencyHistogram
from .diskwatch import DiskCheck
from .state import BookieState


class StateView(NamedTuple):
    """The bookie's state and why it is read-only (empty: it is not, or would not be)."""

    state: BookieState
    reasons: tuple[str, ...]

    @property
    def read_only(self) -> bool:
        return self.state is BookieState.READ_ONLY

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.value, "read_only": self.read_only,
                "reasons": list(self.reasons)}


class ListenerFigures(NamedTuple):
    connections: int
    """Open client connections."""
    protocol_errors: int
    """Connections closed for a malformed frame."""


class ProcessorFigures(NamedTuple):
    counters: Mapping[str, int]
    """adds, rejected, add_errors, add_bytes, reads, read_entries, read_bytes,
    read_errors, fences."""
    add_latency: LatencyHistogram
    read_latency: LatencyHistogram


class JournalFigures(NamedTuple):
    """Every journal's histograms merged (one journal per ledger directory)."""

    fsync_latency: LatencyHistogram
    batch_records: LatencyHistogram


class BookieAdmin(Protocol):
    """What the admin endpoint uses of a bookie (module docstring).  A part not
    running yet (the bookie is starting) is None."""

    @property
    def bookie_id(self) -> str: ...

    def state_view(self) -> StateView: ...

    def directories(self) -> tuple[str, str]:
        """The journal and ledger directories, as configured."""
        ...

    def listener_figures(self) -> ListenerFigures | None: ...

    def processor_figures(self) -> ProcessorFigures | None: ...

    def storage_statistics(self) -> dict[str, Any] | None:
        """Ledgers, entries, disk usage, checkpoints, compaction, the journal's counters
        (``"journal"``) and, with several ledger directories, each one's
        (``"directories"``)."""
        ...

    def journal_figures(self) -> JournalFigures | None: ...

    def disk_check(self) -> DiskCheck | None:
        """The disk watch's last check: each directory's disk, journals' included, and
        the marks (None before the first)."""
        ...

    async def set_maintenance(self, read_only: bool) -> StateView:
        """Read-only for maintenance, or back (other reasons still hold); the
        registration moves with it.  BKError when the registry cannot be updated
        (the bookie's own state has switched; the registry is retried)."""
        ...

    def gc_statistics(self) -> dict[str, Any] | None:
        """Garbage collection's figures; None while it does not run yet."""
        ...

    async def run_gc(self) -> dict[str, Any] | None:
        """A garbage collection round now, compacting every entry log below the major
        threshold; what it did and the figures (None while it does not run yet)."""
        ...


__all__ = ["BookieAdmin", "JournalFigures", "ListenerFigures", "ProcessorFigures",
           "StateView"]
