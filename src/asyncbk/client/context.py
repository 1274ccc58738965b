"""What a client shares with its ledger handles and recoveries: :class:`ClientContext`.

A handle is given the context, not the whole :class:`~asyncbk.client.client.BookKeeper`:
the metadata store, the bookie channels, the registry view, placement and
quarantine, the configuration, the clock, the counters and a logger factory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from ..clock import LOOP_CLOCK, Clock
from ..config import ClientConfig
from ..errors import BKError
from ..log import get_logger
from ..meta.api import MetadataStore
from ..net.pool import BookieClient
from ..proto import BookieInfoRequest, BookieInfoResponse, Status
from ..stats import LatencyHistogram
from ..tracing import Tracing
from ..types import BookieId
from .bookies import WRITABLE_STATE, BookieWatcher
from .placement import PlacementPolicy, Quarantine


class ClientStats:
    """What this client did (``BookKeeper.stats``; ``asyncbk.client.metrics`` exports
    it to Prometheus): append latency (call to acknowledgement), read latency (per
    read call), entries read, ensemble changes."""

    def __init__(self) -> None:
        self.add_latency = LatencyHistogram()
        self.read_latency = LatencyHistogram()
        self.read_entries = 0
        self.ensemble_changes = 0


@dataclass(frozen=True, slots=True)
class ClientContext:
    """The parts of a client that handles and recoveries use (BookKeeper's
    ``ClientContext``)."""

    meta: MetadataStore
    config: ClientConfig
    bookie_client: BookieClient
    """Channels to the bookies."""
    bookies: BookieWatcher
    """Which bookies are registered, and writable."""
    placement: PlacementPolicy
    quarantine: Quarantine
    stats: ClientStats
    clock: Clock = LOOP_CLOCK
    logger: Callable[..., Any] = get_logger
    """``logger(**context)``: a structlog logger with ``context`` bound."""
    tracing: Tracing | None = None
    """Spans of appends, reads and recoveries (``ClientConfig.tracing``), or None."""

    def current_trace(self) -> bytes:
        """The current span's context, for a request (b"": not tracing, or no span)."""
        return b"" if self.tracing is None else self.tracing.current_wire()

    def quarantine_bookie(self, bookie: BookieId) -> None:
        """Keep ``bookie``, which just failed, out of ensembles for a while."""
        self.quarantine.add(bookie, self.bookies.session(bookie))

    async def release_healthy(self, bookies: Collection[BookieId]) -> set[BookieId]:
        """Ask each quarantined bookie of ``bookies`` whether it is writable (one
        BOOKIE_INFO, answered within ``probe_timeout_s``); lift the quarantine of those
        that are and return them."""
        if not bookies:
            return set()
        timeout_s = self.config.probe_timeout_s
        futs = {}
        for bookie in sorted(bookies):
            ch = self.bookie_client.channel(bookie)
            futs[bookie] = ch.request(BookieInfoRequest(ch.next_request_id()), timeout_s)
        results = await asyncio.gather(*futs.values(), return_exceptions=True)
        healthy = set()
        for bookie, r in zip(futs, results, strict=True):
            if isinstance(r, BookieInfoResponse) and r.status == Status.OK \
                    and r.state == WRITABLE_STATE:
                healthy.add(bookie)
                self.quarantine.release(bookie)
            elif isinstance(r, BaseException) and not isinstance(r, BKError):
                raise r
        if healthy:
            self.logger().info("quarantined bookies answer as writable again",
                               bookies=sorted(healthy))
        return healthy
