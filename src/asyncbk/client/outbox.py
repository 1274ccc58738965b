"""A ledger handle's sends of one loop turn, by bookie: :class:`Outbox`.

The write path decides which entries go to which positions; the handle queues them
here; each bookie's channel takes its part at its flush, at the end of the loop turn
(the outbox is the channel's :class:`~asyncbk.net.adds.AddSource`), so a turn's entries
to a bookie leave together as one ADD_BATCH with one answer, instead of a call per
entry and bookie.  A new entry is kept once, not once per bookie: the turn's entries
are lists (ids, bodies, write sets), and each bookie's part is taken from them at its
flush (with E == Qw, the lists themselves, shared by every bookie's group).  The
answers come back through one :class:`~asyncbk.net.adds.AddTarget` per position, to
the callbacks the handle gave.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ..errors import BKError
from ..net.adds import AddGroup, PackedBodies
from ..net.pool import BookieClient
from ..proto import Response
from ..types import BookieId

OnAcks = Callable[[list[int], int, BookieId], None]
"""``on_acks(entry_ids, position, bookie)``: the bookie made every entry durable."""
OnAnswer = Callable[[int, int, BookieId, "Response | BKError"], None]
"""``on_answer(entry_id, position, bookie, result)``: one entry's own answer."""


class Queued(Protocol):
    """What the outbox reads of the pending entries it re-sends: each one's sealed body
    and trace context, by entry id (:class:`~.pending.PendingAppends`)."""

    def body(self, entry_id: int) -> bytes: ...

    def trace(self, entry_id: int) -> bytes: ...


_Group = tuple[int, list[int], list[bytes], list[bytes] | None]
"""A turn's re-sends to one bookie: its position, entry ids, bodies, trace contexts."""


class Outbox:
    """The sends of one ledger handle queued this loop turn (module docstring).

    New entries (:meth:`queue_entry`) are kept once each, not once per bookie: the
    turn's ids, bodies and write sets in lists, from which each bookie's channel takes
    its part at its flush (with every position storing every entry, E == Qw, the lists
    themselves).  Re-sends after an ensemble change (:meth:`queue`) are kept by bookie.
    """

    __slots__ = ("_bodies", "_box", "_client", "_ensemble", "_flags", "_ids", "_lac",
                 "_ledger_id", "_master_key", "_on_acks", "_on_answer", "_partial",
                 "_positions", "_shared", "_size", "_targets", "_timeout_s", "_traced",
                 "_traces", "_waiting")

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
        self._size = ensemble_size
        self._box: dict[BookieId, _Group] | None = None
        self._lac = -1
        """The highest LAC queued this turn, piggybacked on every group."""
        self._targets: list[_PositionTarget | None] = [None] * ensemble_size
        """Where each position's answers go (made again when its bookie changes)."""
        self._ids: list[int] = []
        """The new entries queued since every bookie took its part (with ``_bodies``,
        ``_traces`` and ``_positions``, one slot per entry)."""
        self._bodies: list[bytes] = []
        self._traces: list[bytes] | None = [] if traced else None
        self._positions: list[tuple[int, ...]] = []
        self._partial = False
        """Some entry of the lists does not go to every position."""
        self._ensemble: Sequence[BookieId] = ()
        """The ensemble the lists' positions belong to."""
        self._waiting: dict[BookieId, tuple[int, int]] = {}
        """Bookies with a part of the lists not taken yet: their position and the slot
        their part starts at."""
        self._shared: PackedBodies | None = None
        """The lists' bodies as the groups that take all of them share them (encoded for
        the wire once)."""

    def queue_entry(self, entry_id: int, positions: tuple[int, ...], lac: int,
                    ensemble: Sequence[BookieId], body: bytes, trace: bytes) -> None:
        """Queue a new entry for the bookies now at ``positions`` of ``ensemble`` (the
        hot path: one slot, whatever the number of bookies)."""
        if ensemble is not self._ensemble:
            if self._waiting:  # (the ensemble changed this turn: the old one's part)
                self._spill()
            self._ensemble = ensemble
        ids = self._ids
        slot = len(ids)
        ids.append(entry_id)
        self._bodies.append(body)
        if self._traces is not None:
            self._traces.append(trace)
        self._positions.append(positions)
        if len(positions) != self._size:
            self._partial = True
        if lac > self._lac:
            self._lac = lac
        waiting = self._waiting
        if len(waiting) == self._size:  # (every bookie of the ensemble waits already)
            return
        new = None
        for p in positions:
            bookie = ensemble[p]
            if bookie not in waiting:
                waiting[bookie] = (p, slot)
                if new is None:
                    new = [bookie]
                else:
                    new.append(bookie)
        if new is not None:  # (after the loop: a channel that cannot send takes at once,
            # and the lists must not be renewed while another bookie's part is unrecorded)
            client = self._client
            for bookie in new:
                client.channel(bookie).add_source(self)

    def queue(self, sends: Sequence[tuple[int, int]], lac: int, ensemble: Sequence[BookieId],
              entries: Queued) -> None:
        """Queue ``sends`` (entry id, position) for the bookies now at those positions of
        ``ensemble`` (re-sends after an ensemble change, entries held back during one);
        ``entries`` has each one's body and trace context.  The bodies are taken now (an
        entry may complete before the flush)."""
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
            group[1].append(entry_id)
            group[2].append(entries.body(entry_id))
            if traced:
                group[3].append(entries.trace(entry_id))  # type: ignore[union-attr]
        if lac > self._lac:
            self._lac = lac
        client = self._client
        for bookie in new:  # (a channel that cannot send takes and refuses at once)
            client.channel(bookie).add_source(self)

    def take(self, bookie_id: BookieId) -> list[AddGroup]:
        """What ``bookie_id``'s channel sends now (the AddSource's call): its part of
        the new entries and its queued re-sends, if any."""
        lac = self._lac
        out = []
        part = self._waiting.pop(bookie_id, None)
        if part is not None:
            pos, start = part
            ids, bodies, traces = self._ids, self._bodies, self._traces
            shared = None
            if self._partial:
                chosen = [i for i in range(start, len(ids)) if pos in self._positions[i]]
                ids = [ids[i] for i in chosen]
                bodies = [bodies[i] for i in chosen]
                traces = None if traces is None else [traces[i] for i in chosen]
            elif start:
                ids, bodies = ids[start:], bodies[start:]
                traces = None if traces is None else traces[start:]
            else:  # (all of the lists: the same part as other bookies', maybe)
                shared = self._shared
                if shared is None:
                    shared = self._shared = PackedBodies(bodies)
            if not self._waiting:  # (every bookie took its part: new lists from now on)
                self._reset_entries()
            out.append(self._group(pos, bookie_id, lac, ids, bodies, traces, shared))
        box = self._box
        if box is not None:
            group = box.pop(bookie_id, None)
            if not box:
                self._box = None
            if group is not None:
                pos, entry_ids, group_bodies, group_traces = group
                out.append(self._group(pos, bookie_id, lac, entry_ids, group_bodies,
                                       group_traces))
        if self._box is None and not self._waiting:
            self._lac = -1
        return out

    def discard(self) -> None:
        """Forget what is queued (the handle failed: none of it is sent)."""
        self._box = None
        self._waiting = {}
        self._reset_entries()
        self._lac = -1

    def _group(self, pos: int, bookie_id: BookieId, lac: int, entry_ids: list[int],
               bodies: list[bytes], traces: list[bytes] | None,
               shared: PackedBodies | None = None) -> AddGroup:
        target = self._targets[pos]
        if target is None or target.bookie != bookie_id:
            target = self._targets[pos] = _PositionTarget(self._on_acks, self._on_answer,
                                                          pos, bookie_id)
        if traces is not None and not any(traces):  # (none sampled: the hot path's frames)
            traces = None
        return AddGroup(self._ledger_id, self._master_key, self._flags, lac, entry_ids,
                        bodies, target, self._timeout_s, traces, shared)

    def _reset_entries(self) -> None:
        """New lists (the old ones may be a group's now: never changed again)."""
        self._ids = []
        self._bodies = []
        self._traces = [] if self._traced else None
        self._positions = []
        self._partial = False
        self._shared = None

    def _spill(self) -> None:
        """Move the parts not taken yet into the re-sends' groups, by bookie (the
        ensemble changed in the turn they were queued in: they keep their bookies)."""
        ids, bodies, traces, positions = self._ids, self._bodies, self._traces, self._positions
        box = self._box
        if box is None:
            box = self._box = {}
        for bookie, (pos, start) in self._waiting.items():
            group = box.get(bookie)
            if group is None:  # (the channel is registered already: it will take this)
                group = box[bookie] = (pos, [], [], [] if traces is not None else None)
            for i in range(start, len(ids)):
                if pos in positions[i]:
                    group[1].append(ids[i])
                    group[2].append(bodies[i])
                    if traces is not None:
                        group[3].append(traces[i])  # type: ignore[union-attr]
        self._waiting = {}
        self._reset_entries()


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
