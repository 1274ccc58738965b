"""What waits for a journal batch, and what it gets: :class:`JournalSync`,
:class:`Waiter` (a future, or a :class:`Then` callback).

A record queued in the journal (:mod:`.journal`) is acknowledged once the group commit
covering it is fsynced; its waiter then gets that commit's :class:`JournalSync` (or
the exception that failed it).  The add path's waiters are :class:`Then` callbacks,
called in the loop turn the commit completes; other records wait on futures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class JournalSync:
    """The group commit that made a record durable, what the journal's futures resolve
    to: when its write began and its ``fdatasync`` ended (wall clock, ns: for tracing
    spans), and how many records and bytes it wrote."""

    start_ns: int
    end_ns: int
    records: int
    nbytes: int


class Waiter(Protocol):
    """What waits for a batch: an ``asyncio.Future[JournalSync]`` or a :class:`Then`."""

    def done(self) -> bool: ...

    def set_result(self, result: JournalSync, /) -> None: ...

    def set_exception(self, exc: BaseException, /) -> None: ...


class Then:
    """A :class:`Waiter` that calls ``fn`` with the :class:`JournalSync` or the
    exception, at once (no loop turn, as a future's callbacks take)."""

    __slots__ = ("_done", "fn")

    def __init__(self, fn: Callable[[JournalSync | BaseException], None]) -> None:
        self.fn = fn
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, result: JournalSync, /) -> None:
        self._call(result)

    def set_exception(self, exc: BaseException, /) -> None:
        self._call(exc)

    def _call(self, outcome: JournalSync | BaseException) -> None:
        self._done = True
        try:
            self.fn(outcome)
        except Exception as exc:  # reported as a future's failed callback would be; the
            # batch's other waiters are still completed
            asyncio.get_running_loop().call_exception_handler({
                "message": "a journal waiter's callback failed", "exception": exc})


__all__ = ["JournalSync", "Then", "Waiter"]
