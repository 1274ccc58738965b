"""A ledger handle's pending appends, as data: :class:`PendingAppends`.

One slot per entry not yet complete, from the oldest on, in parallel lists (the
application's future, the sealed body, the ledger length it makes, when it was
submitted; the span and its wire context only when the client traces), not an
object per entry.  Entries complete in id order, so the lists are a ring: completing
advances a head index, and the lists are cut once the head passes their middle.
No asyncio, clock or I/O here; the handle (:mod:`.ledger`) decides, this keeps.
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

RING_CUT_MIN = 1024
"""The lists are cut once this many completed slots lead them (and they are more than
half of them)."""


class Completed(NamedTuple):
    """What :meth:`PendingAppends.complete` hands back for the entries that completed."""

    futures: list[asyncio.Future[int]]
    submitted_s: list[float]
    length: int
    """The ledger's length once the last of them is in."""
    spans: list[Any] | None
    """Tracing: their spans (None when the client does not trace)."""


class PendingAppends:
    """The pending appends of one handle, entries ``first``, ``first + 1``, ..."""

    __slots__ = ("_head", "bodies", "first", "futures", "lengths", "spans", "submitted_s",
                 "traces")

    def __init__(self, first: int, *, traced: bool) -> None:
        self.first = first
        """The oldest pending entry's id (the next to complete)."""
        self._head = 0
        self.futures: list[asyncio.Future[int]] = []
        self.bodies: list[bytes] = []
        """The sealed entries, as sent (again after an ensemble change)."""
        self.lengths: list[int] = []
        """The ledger's length with each entry in."""
        self.submitted_s: list[float] = []
        self.spans: list[Any] | None = [] if traced else None
        self.traces: list[bytes] | None = [] if traced else None
        """Tracing: each span's context, sent with the entry."""

    def __len__(self) -> int:
        return len(self.futures) - self._head

    def push(self, future: asyncio.Future[int], body: bytes, length: int,
             submitted_s: float, span: Any = None, trace: bytes = b"") -> int:
        """The next entry (id ``first + len(self)``); returns how many are pending now
        (the hot path's ``len``, without a second call)."""
        futures = self.futures
        futures.append(future)
        self.bodies.append(body)
        self.lengths.append(length)
        self.submitted_s.append(submitted_s)
        if self.spans is not None and self.traces is not None:
            self.spans.append(span)
            self.traces.append(trace)
        return len(futures) - self._head

    def body(self, entry_id: int) -> bytes:
        return self.bodies[self._head + entry_id - self.first]

    def trace(self, entry_id: int) -> bytes:
        return b"" if self.traces is None else self.traces[self._head + entry_id - self.first]

    def oldest_submitted_s(self) -> float:
        return self.submitted_s[self._head]

    def complete(self, count: int) -> Completed:
        """Take the ``count`` oldest entries (they completed)."""
        head = self._head
        end = head + count
        spans = self.spans
        out = Completed(self.futures[head:end], self.submitted_s[head:end],
                        self.lengths[end - 1], None if spans is None else spans[head:end])
        self.first += count
        if end > RING_CUT_MIN and end * 2 > len(self.futures):
            for column in self._columns():
                del column[:end]
            end = 0
        self._head = end
        return out

    def clear(self) -> Completed | None:
        """Take every pending entry (the handle failed); None if there is none."""
        if not len(self):
            return None
        out = self.complete(len(self))
        for column in self._columns():
            column.clear()
        self._head = 0
        return out

    def _columns(self) -> list[list[Any]]:
        columns: list[list[Any]] = [self.futures, self.bodies, self.lengths, self.submitted_s]
        if self.spans is not None and self.traces is not None:
            columns += [self.spans, self.traces]
        return columns


__all__ = ["Completed", "PendingAppends"]
