"""What a sender hands a bookie's channel, and how the answers come back.

A ledger handle queues its adds for each bookie during a loop turn; at the
turn's flush the channel asks it (:class:`AddSource`) for them as one
:class:`AddGroup` per ledger, frames each as ADD_BATCH requests, and hands the
answers to the group's :class:`AddTarget` through a :class:`GroupCallback`: one
call for a batch answered OK throughout, one per entry otherwise.  One object per
group, none per entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, Protocol

from ..errors import BKError, BookieUnavailableError
from ..proto import AddBatchResponse, AddResponse, Response, Status
from ..types import BookieId

ADD_OK = AddResponse(0, Status.OK, 0, 0)
"""What an add's callback gets for an OK entry of a batch answer (only its type and
status are read)."""


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


class AddSource(Protocol):
    """A sender with adds for a bookie, asked for them at the channel's flush
    (:meth:`~asyncbk.net.channel.BookieChannel.add_source`)."""

    def take(self, bookie_id: BookieId) -> Iterable[AddGroup]:
        """The groups of adds for ``bookie_id`` queued since the last call (each handed
        over once)."""


class GroupCallback:
    """A channel's callback for one ADD or ADD_BATCH request of a group: hands the
    answer to the group's target, ``target.acked(entry_ids)`` when every entry is OK
    (one call), else ``target.answered(entry_id, AddResponse or error)`` for each."""

    __slots__ = ("entry_ids", "ledger_id", "target")

    def __init__(self, target: AddTarget, ledger_id: int, entry_ids: list[int]) -> None:
        self.target = target
        self.ledger_id = ledger_id
        self.entry_ids = entry_ids

    def __call__(self, result: Response | BKError) -> None:
        target, entry_ids = self.target, self.entry_ids
        if isinstance(result, AddResponse) and len(entry_ids) == 1:  # a group of one: an ADD
            if result.status == Status.OK:
                target.acked(entry_ids)
            else:
                target.answered(entry_ids[0], result)
            return
        if isinstance(result, AddBatchResponse) and len(result.statuses) == len(entry_ids):
            if not any(result.statuses):
                target.acked(entry_ids)
                return
            ledger_id = self.ledger_id
            for entry_id, status in zip(entry_ids, result.statuses, strict=True):
                target.answered(entry_id, ADD_OK if status == 0
                                else AddResponse(0, status, ledger_id, entry_id))
            return
        error = result if isinstance(result, BKError) else BookieUnavailableError(
            f"malformed answer to a batch of adds: {type(result).__name__}")
        for entry_id in entry_ids:
            target.answered(entry_id, error)


__all__ = ["ADD_OK", "AddGroup", "AddSource", "AddTarget", "GroupCallback"]
