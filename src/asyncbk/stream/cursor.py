"""A subscription's cursor as one consumer holds it: pure state, no I/O.

:class:`CursorState` takes events (records delivered, acknowledgements, a
persistence started, done or refused, a takeover) and says what to persist; the
:class:`~asyncbk.stream.subscription.Subscription` does the I/O.  Positions are
*resume positions*: the first record not yet acknowledged (an ack of ``p`` moves
it just after ``p``).

Invariants (checked by :meth:`CursorState.check`, and by the property tests
against a plain model):

- ``persisted <= acked``: nothing is persisted that was not acknowledged;
- ``acked`` never moves backwards, and never past a record delivered to this
  consumer (an ack must name a delivered record at or after the last one acked);
- once fenced, nothing more is persisted and every ack is refused.

:func:`release` decides, for retention and truncation, which of the segments
they would drop the subscriptions let go (and which go only by a backlog quota).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import InvalidAckError, SubscriptionFencedError, TooManyRequestsError
from .meta import Segment
from .position import Position, make_position

UNACKED_ENTRIES_MAX = 100_000
"""Entries a consumer may hold delivered and unacknowledged (a consumer that never
acknowledges is told, rather than growing without bound)."""


@dataclass(slots=True)
class _Span:
    """Records delivered from one entry: slots ``first..last``."""

    segment: int
    entry: int
    first: int
    last: int


class CursorState:
    """One consumer's cursor (see the module docstring).  ``persisted``: the resume
    position stored when the consumer subscribed."""

    __slots__ = ("_head", "_spans", "acked", "fenced", "persisted", "persisting", "why_fenced")

    def __init__(self, persisted: Position) -> None:
        self.persisted = persisted
        """The resume position known stored (what a crash resumes from)."""
        self.acked = persisted
        """The resume position after the last acknowledgement."""
        self.persisting: Position | None = None
        """A persistence under way (at most one)."""
        self.fenced = False
        self.why_fenced = ""
        self._spans: list[_Span] = []
        self._head = 0

    # --- delivery and acknowledgement --------------------------------------

    def delivered(self, position: Position) -> None:
        """A record at ``position`` was handed to the consumer (records come in stream
        order)."""
        spans = self._spans
        if len(spans) > self._head:
            tail = spans[-1]
            if tail.entry == position.entry and tail.segment == position.segment:
                tail.last = position.slot
                return
        if len(spans) - self._head >= UNACKED_ENTRIES_MAX:
            raise TooManyRequestsError(
                f"{UNACKED_ENTRIES_MAX} entries of records delivered and not acknowledged: "
                "acknowledge what was handled (sub.ack(rec.position), cumulative)")
        spans.append(_Span(position.segment, position.entry, position.slot, position.slot))

    @property
    def unacked_entries(self) -> int:
        return len(self._spans) - self._head

    def ack(self, position: Position) -> bool:
        """Acknowledge everything up to ``position``, a record delivered; True if the
        cursor moved.  InvalidAckError (nothing changes) for a position never
        delivered or below the last acknowledged; SubscriptionFencedError once
        fenced."""
        if self.fenced:
            raise SubscriptionFencedError(self.why_fenced)
        if type(position) is not Position:
            raise TypeError(f"ack takes a Position (rec.position), not {type(position).__name__}")
        spans, head = self._spans, self._head
        if head < len(spans):  # the common case: a record of the oldest entry delivered
            s = spans[head]
            slot = position.slot
            if s.entry == position.entry and s.segment == position.segment \
                    and s.first <= slot <= s.last:
                if slot == s.last:
                    self._head = head + 1
                    if head > 1024 and head * 2 > len(spans):
                        del spans[:head + 1]
                        self._head = 0
                else:
                    s.first = slot + 1
                self.acked = make_position(s.segment, s.entry, slot + 1)
                return True
        if position < self.acked:
            if _just_before(position, self.acked):
                return False  # the last acknowledged again: nothing to do
            raise InvalidAckError(
                f"ack of {position} goes backwards: everything before {self.acked} is "
                "acknowledged already (acks are cumulative; to go back, "
                "ns.seek_subscription)")
        spans, i = self._spans, self._head
        n = len(spans)
        while i < n:
            s = spans[i]
            if (s.segment, s.entry) >= (position.segment, position.entry):
                break
            i += 1
        if i == n or spans[i].segment != position.segment or spans[i].entry != position.entry \
                or not spans[i].first <= position.slot <= spans[i].last:
            raise InvalidAckError(
                f"ack of {position}: no record there was delivered to this consumer "
                "(ack the position of a record it received)")
        s = spans[i]
        if position.slot == s.last:
            i += 1
        else:
            s.first = position.slot + 1
        self._head = i
        if i > 1024 and i * 2 > n:
            del spans[:i]
            self._head = 0
        self.acked = make_position(position.segment, position.entry, position.slot + 1)
        return True

    # --- persistence --------------------------------------------------------

    def due(self) -> Position | None:
        """What to persist now, if anything (and marks it under way)."""
        if self.fenced or self.persisting is not None or self.acked <= self.persisted:
            return None
        self.persisting = self.acked
        return self.persisting

    def persisted_as(self, position: Position) -> None:
        """The persistence of ``position`` (from :meth:`due`) succeeded."""
        self.persisting = None
        if position > self.persisted:
            self.persisted = position

    def persist_failed(self) -> None:
        """It failed without an answer on the store's side: try again later."""
        self.persisting = None

    def fence(self, why: str) -> None:
        """Another consumer took over (or the subscription was sought or deleted)."""
        self.fenced = True
        self.why_fenced = why
        self.persisting = None

    def check(self) -> None:
        """Raise AssertionError if an invariant is broken."""
        assert self.persisted <= self.acked, (self.persisted, self.acked)
        spans = self._spans[self._head:]
        for a, b in zip(spans, spans[1:], strict=False):
            assert (a.segment, a.entry) < (b.segment, b.entry)
        for s in spans:
            assert s.first <= s.last
            assert Position(s.segment, s.entry, s.first) >= self.acked


def _just_before(position: Position, acked: Position) -> bool:
    return (position.segment, position.entry, position.slot + 1) == \
        (acked.segment, acked.entry, acked.slot)


# --- retention ---------------------------------------------------------------


def holds(position: Position, seg: Segment) -> bool:
    """Whether a subscription resuming at ``position`` has not acknowledged every
    record of the completed segment ``seg``."""
    last = seg.last_position
    return last is not None and position <= last


@dataclass(frozen=True, slots=True)
class Release:
    """What retention or truncation may drop, of what they would."""

    segments: list[Segment]
    """The segments that may go (a prefix of those asked)."""
    evicted: dict[str, list[int]]
    """Subscriptions whose unacknowledged segments go by their backlog quota: the
    numbers of those segments."""
    held_by: list[str]
    """The subscriptions that keep the first segment not released (if any)."""


def release(doomed: Sequence[Segment], segments: Sequence[Segment],
            cursors: Mapping[str, Position], quota_bytes: int, quota_s: float,
            now_ms: int) -> Release:
    """Of ``doomed`` (segments retention or truncation would drop, oldest first), the
    prefix the subscriptions (``cursors``: name -> resume position) let go: a segment
    some subscription holds goes only if every subscription holding it is over its
    backlog quota (bytes of the completed segments from that one on, or the age of
    its first record; a quota of 0 is no limit)."""
    out: list[Segment] = []
    evicted: dict[str, list[int]] = {}
    for seg in doomed:
        holders = [name for name, pos in cursors.items() if holds(pos, seg)]
        if holders:
            backlog = sum(s.size_bytes for s in segments if s.seq >= seg.seq and s.completed)
            age_ms = now_ms - seg.first_ts
            over = (quota_bytes > 0 and backlog > quota_bytes) or \
                (quota_s > 0 and age_ms > quota_s * 1000)
            if not over:
                return Release(out, evicted, sorted(holders))
            for name in holders:
                evicted.setdefault(name, []).append(seg.seq)
        out.append(seg)
    return Release(out, evicted, [])
