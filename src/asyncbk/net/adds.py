"""What a sender hands a bookie's channel, and how the answers come back.

A ledger handle queues its adds for each bookie during a loop turn; at the
turn's flush the channel asks it (:class:`AddSource`) for them as one
:class:`AddGroup` per ledger, frames each as ADD_BATCH requests, and hands the
answers to the group's :class:`AddTarget`: one call for a batch answered OK
throughout, one per entry otherwise.  One object per group, none per entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, Protocol

from ..errors import BKError
from ..proto import Response
from ..types import BookieId


class AddTarget(Protocol):
    """Where a channel hands the answers to a group of adds (:class:`AddGroup`)."""

    def acked(self, entry_ids: list[int]) -> None:
        """The bookie made every entry of ``entry_ids`` durable (one call for a batch
        answered OK throughout)."""

    def answered(self, entry_id: int, result: Response | BKError) -> None:
        """``entry_id``'s own answer: an AddResponse (OK or not) or the error that
        replaced it (a refusal, a timeout, a lost connection)."""


class AddGroup(NamedTuple):
    """Adds of one ledger to one bookie, handed to a channel together
    (:meth:`~asyncbk.net.channel.BookieChannel.send_adds`, :meth:`AddSource.take`) and
    framed at its flush as ADD_BATCH requests (a lone entry as an ADD).  One per
    ledger, bookie and loop turn, not per entry."""

    ledger_id: int
    master_key: bytes
    flags: int
    lac: int
    """The LAC piggybacked on every add of the group."""
    entry_ids: list[int]
    bodies: list[bytes]
    """The sealed entries, in the order of ``entry_ids``."""
    target: AddTarget
    timeout_s: float
    """Each add fails with TimeoutError if not answered this long after it was queued."""
    traces: list[bytes] | None = None
    """Tracing: each entry's span context (or b""), in the order of ``entry_ids``;
    None when the sender does not trace (the frames are then the hot path's)."""


class AddSource(Protocol):
    """A sender with adds for a bookie, asked for them at the channel's flush
    (:meth:`~asyncbk.net.channel.BookieChannel.add_source`)."""

    def take(self, bookie_id: BookieId) -> Iterable[AddGroup]:
        """The groups of adds for ``bookie_id`` queued since the last call (each handed
        over once)."""


__all__ = ["AddGroup", "AddSource", "AddTarget"]
