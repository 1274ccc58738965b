"""A ledger handle's sends of one loop turn, by bookie: :class:`Outbox`.

The write path decides which entries go to which positions (its ``Effects``); the
handle queues them here; each bookie's channel takes its group at its flush, at the
end of the loop turn (the outbox is the channel's
:class:`~asyncbk.net.adds.AddSource`), so a turn's entries to a bookie leave together
as one ADD_BATCH with one answer, instead of a call per entry and bookie.  The answers
come back through one :class:`~asyncbk.net.adds.AddTarget` per position, to the
callbacks the handle gave.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ..errors import BKError
from ..net.adds import AddGroup
from ..net.pool import BookieClient
from ..proto import Response
from ..types import BookieId

OnAcks = Callable[[list[int], int, BookieId], None]
"""``on_acks(entry_ids, position, bookie)``: the bookie made every entry durable."""
OnAnswer = Callable[[int, int, BookieId, "Response | BKError"], None]
"""``on_answer(entry_id, position, bookie, result)``: one entry's own answer."""


class Queued(Protocol):
    """What the outbox reads of a pending entry: its sealed body and trace context."""

    @property
    def body(self) -> bytes: ...

    @property
    def trace(self) -> bytes: ...


_Group = tuple[int, list[int], list[bytes], list[bytes] | None]
"""A turn's sends to one bookie: its position, entry ids, bodies, trace contexts."""


class Outbox:
    """The sends of one ledger handle queued this loop turn (module docstring)."""

    __slots__ = ("_box", "_client", "_flags", "_lac", "_ledger_id", "_master_key",
                 "_on_acks", "_on_answer", "_targets", "_timeout_s", "_traced")

    def __init__(self, client: BookieClient, ledger_id: int, master_key: bytes, flags: int,
                 ensemble_size: int, timeout_s: float, *, on_acks: OnAcks,
                 on_answer: OnAnswer, traced: bool) -> None:
        self._client = client
        self._ledger_id = ledger_id
        self._master_key = master_key
        self._flags = flags
        self._timeout_s = timeout_s
        self._on_acks = on_acks
        self._on_answer = on_answer
        self._traced = traced
        self._box: dict[BookieId, _Group] | None = None
        self._lac = -1
        """The highest LAC queued this turn, piggybacked on every group."""
        self._targets: list[_PositionTarget | None] = [None] * ensemble_size
        """Where each position's answers go (made again when its bookie changes)."""

    def queue(self, sends: Sequence[tuple[int, int]], lac: int, ensemble: Sequence[BookieId],
              ops: Sequence[Queued], first: int) -> None:
        """Queue ``sends`` (entry id, position) for the bookies now at those positions of
        ``ensemble``; ``ops[entry_id - first]`` is each entry.  The bodies are taken now
        (an entry may complete before the flush)."""
        box = self._box
        if box is None:
            box = self._box = {}
        new: list[BookieId] = []
        traced = self._traced
        for entry_id, pos in sends:
            bookie = ensemble[pos]
            group = box.get(bookie)
            if group is None:
                group = box[bookie] = (pos, [], [], [] if traced else None)
                new.append(bookie)
            op = ops[entry_id - first]
            group[1].append(entry_id)
            group[2].append(op.body)
            if traced:
                group[3].append(op.trace)  # type: ignore[union-attr]
        if lac > self._lac:
            self._lac = lac
        client = self._client
        for bookie in new:  # (a channel that cannot send takes and refuses at once)
            client.channel(bookie).add_source(self)

    def take(self, bookie_id: BookieId) -> list[AddGroup]:
        """What ``bookie_id``'s channel sends now (the AddSource's call): its queued
        group, if any."""
        box = self._box
        if box is None:
            return []
        group = box.pop(bookie_id, None)
        lac = self._lac
        if not box:
            self._box = None
            self._lac = -1
        if group is None:
            return []
        pos, entry_ids, bodies, traces = group
        target = self._targets[pos]
        if target is None or target.bookie != bookie_id:
            target = self._targets[pos] = _PositionTarget(self._on_acks, self._on_answer,
                                                          pos, bookie_id)
        if traces is not None and not any(traces):  # (none sampled: the hot path's frames)
            traces = None
        return [AddGroup(self._ledger_id, self._master_key, self._flags, lac, entry_ids,
                         bodies, target, self._timeout_s, traces)]

    def discard(self) -> None:
        """Forget what is queued (the handle failed: none of it is sent)."""
        self._box = None
        self._lac = -1


class _PositionTarget:
    """Where a channel hands the answers to a group of adds sent to ``bookie`` at
    ``position``: an :class:`~asyncbk.net.adds.AddTarget`."""

    __slots__ = ("bookie", "on_acks", "on_answer", "position")

    def __init__(self, on_acks: OnAcks, on_answer: OnAnswer, position: int,
                 bookie: BookieId) -> None:
        self.on_acks = on_acks
        self.on_answer = on_answer
        self.position = position
        self.bookie = bookie

    def acked(self, entry_ids: list[int]) -> None:
        self.on_acks(entry_ids, self.position, self.bookie)

    def answered(self, entry_id: int, result: Response | BKError) -> None:
        self.on_answer(entry_id, self.position, self.bookie, result)


__all__ = ["OnAcks", "OnAnswer", "Outbox", "Queued"]
