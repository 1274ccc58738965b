"""The write path's quorum, completion and survival logic, without I/O.

:class:`WritePath` is the state of one writer's pending appends.  The ledger
handle feeds it events (an entry submitted, a bookie's acknowledgement or
failure, an ensemble change committed) and it answers with :class:`Effects`:
what to send to which ensemble position, which entries are now complete, and
whether an ensemble change must start.  The handle does the I/O (channels,
futures, metadata); this module has no asyncio, clock or sockets, so
hypothesis drives it through random interleavings (tests/unit/test_write_path.py).

The rules (BookKeeper's ``PendingAddOp`` and ``DistributionSchedule``):

* Entry ``e`` goes to its write set: the ``Qw`` consecutive ensemble positions
  from ``e mod E`` (:func:`~asyncbk.client.quorum.write_set`).
* An entry is complete once ``Qa`` positions of its write set acknowledged
  it, and entries complete in id order: each completion makes it the LAC.
  Sends piggyback the LAC (a recovery's writer piggybacks -1: readers must not
  learn of entries past an end a concurrent recovery may choose).
* An answer from a bookie no longer at its position (replaced since) is stale
  and ignored.
* A failed position (an error, a timeout, READ_ONLY, NOT_READY) asks for an
  ensemble change.  While a change is in progress nothing completes and new
  entries are held back: an entry that reached its ack quorum with the help of
  a bookie being replaced is no longer complete once that position belongs to
  another bookie.
* When the change commits, every pending entry's acknowledgement from a
  renewed position is withdrawn and the entry re-sent to the position's new
  bookie (survival); entries held back go to their whole write set.
* With no replacement to be had, the handle may write on without the failed
  positions (degraded) while every write set keeps ``Qa`` other positions:
  sends skip them and their failures are ignored until they are renewed.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import NamedTuple

from ..errors import invariant
from ..types import BookieId
from .quorum import write_set


class Effects(NamedTuple):
    """What the handle must do after one event (a named tuple, cheaper than a frozen
    dataclass; a new entry's sends come from :meth:`WritePath.submit_to`, without one)."""

    sends: tuple[tuple[int, int], ...] = ()
    """(entry id, ensemble position) pairs to send now, in this order."""
    lac: int = -1
    """The LAC to piggyback on those sends."""
    completed: tuple[int, ...] = ()
    """Entries now complete, in id order (the last is the new LAC)."""
    newly_failed: tuple[int, ...] = ()
    """Positions that just failed (to quarantine their bookie and log)."""
    start_change: bool = False
    """Start an ensemble change (none was in progress)."""


NOTHING = Effects()


COMPLETE_TABLE_POSITIONS_MAX = 12
"""Ensembles up to this size look completion up in a table of 2**E bytes."""
RING_CUT_MIN = 1024
"""The acknowledgements' list is cut once this many completed slots lead it (and they
are more than half of it)."""


class WritePath:
    """Pending appends of one writer: acknowledgements, completion, ensemble changes.

    ``ensemble`` is the current (last) fragment's; ``lac`` the last entry already
    complete (entries continue from ``lac + 1``); ``publish_lac`` False for a
    recovery's writer (it piggybacks -1).
    """

    def __init__(self, ensemble: Sequence[BookieId], write_quorum: int, ack_quorum: int, *,
                 lac: int = -1, publish_lac: bool = True) -> None:
        invariant(len(ensemble) >= write_quorum >= ack_quorum >= 1,
                  f"bad quorums: E={len(ensemble)} Qw={write_quorum} Qa={ack_quorum}")
        self.ensemble: tuple[BookieId, ...] = tuple(ensemble)
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.lac = lac
        """The last complete entry (all before it complete too)."""
        self.next_entry_id = lac + 1
        self.lac_sent = lac
        """The highest LAC told to the bookies (piggybacked or explicit)."""
        self.failed_positions: set[int] = set()
        """Positions that failed and wait for an ensemble change (or are degraded)."""
        self.degraded: set[int] = set()
        """Failed positions left unreplaced (no spare): sends skip them."""
        self.changing = False
        """An ensemble change is in progress: nothing completes, new entries wait."""
        self.halted = False
        """The handle failed (``fail_all``): every later event is ignored."""
        self._publish_lac = publish_lac
        self._acks: list[int] = []
        """The pending entries' acknowledgements as data, not objects: from index
        ``_head`` on, one bitmask of ensemble positions per entry ``lac + 1``,
        ``lac + 2``, ... (a ring kept in a list: completing advances ``_head``; the
        list is cut when the head passes its middle)."""
        self._head = 0
        self._sent_upto = lac + 1
        """Entries below this id were sent; those from it on are held back (submitted
        during an ensemble change: always the newest, so one watermark says it)."""
        size = len(self.ensemble)
        self._write_sets = [tuple(write_set(s, size, write_quorum)) for s in range(size)]
        """The write set of each ``entry_id mod E`` (the ensemble's size never changes)."""
        self._every_position = write_quorum == size
        """Every entry goes to every position (E == Qw): any acknowledgement is in its
        entry's write set."""
        self._complete_at: bytes | None = (
            bytes(m.bit_count() >= ack_quorum for m in range(1 << size))
            if size <= COMPLETE_TABLE_POSITIONS_MAX else None)
        """Whether a bitmask of positions is an ack quorum, by bitmask (small ensembles)."""

    # ------------------------------------------------------------------ queries

    @property
    def ensemble_size(self) -> int:
        return len(self.ensemble)

    @property
    def pending(self) -> int:
        """Entries submitted and not complete."""
        return 0 if self.halted else self.next_entry_id - self.lac - 1

    @property
    def head(self) -> int | None:
        """The oldest pending entry (the next to complete), if any."""
        return self.lac + 1 if self.pending else None

    def write_set(self, entry_id: int) -> tuple[int, ...]:
        return self._write_sets[entry_id % len(self.ensemble)]

    def is_current(self, position: int, bookie: BookieId) -> bool:
        """Whether ``bookie`` still holds ``position`` (else its answers are stale)."""
        return self.ensemble[position] == bookie

    def is_pending(self, entry_id: int) -> bool:
        return not self.halted and self.lac < entry_id < self.next_entry_id

    def ack_quorum_survives(self, positions: Collection[int]) -> bool:
        """Whether every write set keeps ``Qa`` positions outside ``positions``."""
        spare = self.write_quorum - self.ack_quorum
        return all(sum(p in positions for p in self.write_set(s)) <= spare
                   for s in range(len(self.ensemble)))

    # ------------------------------------------------------------------ events

    def submit(self, entry_id: int) -> Effects:
        """A new entry (the next id): send it to its write set, unless a change is
        in progress (:meth:`submit_to` as Effects)."""
        positions, lac = self.submit_to(entry_id)
        if not positions:
            return NOTHING
        return Effects(tuple([(entry_id, p) for p in positions]), lac)

    def submit_to(self, entry_id: int) -> tuple[tuple[int, ...], int]:
        """:meth:`submit` for the hot path: the positions to send the new entry to now
        (none while a change is in progress, or if every one is degraded) and the LAC
        to piggyback, without an Effects and its pairs."""
        if self.halted or entry_id != self.next_entry_id:  # (formatted only on failure)
            invariant(False, f"submitted entry {entry_id}, expected {self.next_entry_id}"
                      f"{' (halted)' if self.halted else ''}")
        self.next_entry_id = entry_id + 1
        self._acks.append(0)
        if self.changing:
            return (), -1
        self._sent_upto = entry_id + 1
        positions = self._write_sets[entry_id % len(self.ensemble)]
        if self.degraded:
            positions = tuple(p for p in positions if p not in self.degraded)
            if not positions:
                return (), -1
        lac = self.lac if self._publish_lac else -1
        if lac > self.lac_sent:
            self.lac_sent = lac
        return positions, lac

    def ack(self, entry_id: int, position: int, bookie: BookieId) -> Effects:
        """``bookie`` at ``position`` made ``entry_id`` durable."""
        # (the hot path of single adds, so written out)
        if self.halted or self.ensemble[position] != bookie:
            return NOTHING  # halted, or stale (replaced since)
        offset = entry_id - self.lac - 1
        if not 0 <= offset < self.next_entry_id - self.lac - 1:
            return NOTHING  # complete already (a late acknowledgement), or not submitted
        if (position - entry_id) % len(self.ensemble) >= self.write_quorum:
            invariant(False, f"ack of entry {entry_id} from position {position}, "
                      "not in its write set")
        self._acks[self._head + offset] |= 1 << position
        if self.changing or offset:
            return NOTHING
        return Effects(completed=self._complete())

    def ack_many(self, entry_ids: Sequence[int], position: int, bookie: BookieId) -> Effects:
        """``bookie`` at ``position`` made every entry of ``entry_ids`` durable: the
        same state and completions as :meth:`ack` for each in turn, with one Effects
        (an answer to a batch of adds: one call, not one per entry)."""
        if self.halted or self.ensemble[position] != bookie or not entry_ids:
            return NOTHING
        first = self.lac + 1
        count = self.next_entry_id - first
        acks = self._acks
        head = self._head
        bit = 1 << position
        low = entry_ids[0] - first
        high = entry_ids[-1] - first + 1
        if high - low == len(entry_ids) and low >= 0 and high <= count \
                and self._every_position \
                and entry_ids == list(range(low + first, high + first)):
            # (the usual batch: consecutive ids, all pending, every position storing
            # every entry: one pass over the slice)
            acks[head + low:head + high] = [mask | bit for mask in acks[head + low:head + high]]
        else:
            size = len(self.ensemble)
            write_quorum = self.write_quorum
            for entry_id in entry_ids:
                offset = entry_id - first
                if 0 <= offset < count:
                    if (position - entry_id) % size >= write_quorum:
                        invariant(False, f"ack of entry {entry_id} from position {position}, "
                                  "not in its write set")
                    acks[head + offset] |= bit
        if self.changing:
            return NOTHING
        completed = self._complete()
        return Effects(completed=completed) if completed else NOTHING

    def failed(self, position: int, bookie: BookieId) -> Effects:
        """``bookie`` at ``position`` failed an add: it must be replaced."""
        if self.halted or not self.is_current(position, bookie) or position in self.degraded:
            return NOTHING
        newly = position not in self.failed_positions
        self.failed_positions.add(position)
        start = not self.changing
        self.changing = True
        if not newly and not start:
            return NOTHING
        return Effects(newly_failed=(position,) if newly else (), start_change=start)

    def begin_change(self) -> bool:
        """Start a change with no new failure (retrying degraded positions); False if
        one is in progress already or the path halted."""
        if self.changing or self.halted:
            return False
        self.changing = True
        return True

    def ensemble_changed(self, ensemble: Sequence[BookieId], renewed: Collection[int]) -> Effects:
        """The new ensemble is committed: the ``renewed`` positions (all failed) have a
        new bookie, or their own back.  Their acknowledgements are withdrawn and the
        entries re-sent there; entries held back are sent to their whole write set."""
        invariant(self.changing, "ensemble change committed while none is in progress")
        invariant(len(ensemble) == len(self.ensemble), "ensemble size changed")
        invariant(set(renewed) <= self.failed_positions,
                  f"renewed positions {sorted(renewed)} not all failed "
                  f"({sorted(self.failed_positions)})")
        invariant(all(ensemble[p] == b for p, b in enumerate(self.ensemble) if p not in renewed),
                  "the new ensemble differs at a position not renewed")
        if self.halted:
            return NOTHING
        self.failed_positions.difference_update(renewed)
        self.degraded.difference_update(renewed)
        self.ensemble = tuple(ensemble)
        withdrawn = 0
        for p in renewed:
            withdrawn |= 1 << p
        keep = ~withdrawn
        sends: list[tuple[int, int]] = []
        acks = self._acks
        index = self._head
        for entry_id in range(self.lac + 1, self.next_entry_id):
            positions = self.write_set(entry_id)
            if entry_id >= self._sent_upto:
                sends.extend((entry_id, p) for p in positions if p not in self.degraded)
            else:
                acks[index] &= keep
                sends.extend((entry_id, p) for p in positions if p in renewed)
            index += 1
        self._sent_upto = self.next_entry_id
        return self._with_lac(sends)

    def degrade(self, positions: Collection[int]) -> None:
        """Write on without the failed ``positions`` (no spare bookie for them)."""
        invariant(self.changing, "degrade outside an ensemble change")
        invariant(set(positions) <= self.failed_positions,
                  "degrading a position that has not failed")
        invariant(self.ack_quorum_survives(positions),
                  f"positions {sorted(positions)} leave a write set short of its ack quorum")
        self.degraded = set(positions)

    def change_ended(self) -> Effects:
        """The ensemble change is over (renewed, or degraded): send what was held back,
        complete what can be."""
        self.changing = False
        if self.halted:
            return NOTHING
        sends = [(entry_id, p) for entry_id in range(self._sent_upto, self.next_entry_id)
                 for p in self.write_set(entry_id) if p not in self.degraded]
        self._sent_upto = self.next_entry_id
        lac = self._piggyback_lac() if sends else -1  # (before what completes now)
        completed = self._complete()
        if not sends:
            return Effects(completed=completed) if completed else NOTHING
        return Effects(sends=tuple(sends), lac=lac, completed=completed)

    def fail_all(self) -> tuple[int, ...]:
        """The handle failed: the entries still pending (each fails); later events are
        ignored."""
        out = tuple(range(self.lac + 1, self.next_entry_id)) if not self.halted else ()
        self.halted = True
        self._acks = []
        self._head = 0
        return out

    def explicit_lac(self) -> int | None:
        """The LAC to tell the bookies explicitly (an idle writer), if they do not
        know it yet."""
        if self.halted or self.lac <= self.lac_sent:
            return None
        self.lac_sent = self.lac
        return self.lac

    # ------------------------------------------------------------------ internals

    def _complete(self) -> tuple[int, ...]:
        """Complete the entries from the head on whose ack quorum is in: their ids."""
        acks = self._acks
        start = index = self._head
        end = len(acks)
        table = self._complete_at
        quorum = self.ack_quorum
        if table is not None:
            while index < end and table[acks[index]]:
                index += 1
        else:
            while index < end and acks[index].bit_count() >= quorum:
                index += 1
        done = index - start
        if not done:
            return ()
        first = self.lac + 1
        self.lac += done
        if index > RING_CUT_MIN and index * 2 > end:
            del acks[:index]
            index = 0
        self._head = index
        return tuple(range(first, first + done))

    def _piggyback_lac(self) -> int:
        lac = self.lac if self._publish_lac else -1
        self.lac_sent = max(self.lac_sent, lac)
        return lac

    def _with_lac(self, sends: list[tuple[int, int]]) -> Effects:
        if not sends:
            return NOTHING
        return Effects(sends=tuple(sends), lac=self._piggyback_lac())
