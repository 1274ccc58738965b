"""Ensemble placement: which bookies a new ledger (or a replacement) uses, and the
quarantine of bookies that failed recently."""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from typing import Any

from ..clock import LOOP_CLOCK, Clock
from ..errors import NotEnoughBookiesError
from ..types import BookieId


class Quarantine:
    """Bookies that failed an add recently, kept out of new ensembles and replacements
    for ``duration_s`` (one client-wide view: a bookie that failed one ledger's adds
    is likely to fail the others').

    A quarantine is bounded: it ends after ``duration_s``, or at once when the bookie
    registers anew (``release_if_new_session``: a restarted bookie is healthy again),
    so a run of faults can never exclude every spare for good."""

    def __init__(self, duration_s: float, clock: Clock = LOOP_CLOCK) -> None:
        self.duration_s = duration_s
        self._clock = clock
        self._until_s: dict[BookieId, float] = {}
        self._session: dict[BookieId, Any] = {}

    def add(self, bookie: BookieId, session: Any = None) -> None:
        """Quarantine ``bookie`` (whose registration was ``session`` when it failed)."""
        if self.duration_s <= 0:
            return
        self._until_s[bookie] = self._clock.monotonic_s() + self.duration_s
        self._session[bookie] = session

    def release_if_new_session(self, bookie: BookieId, session: Any) -> bool:
        """End ``bookie``'s quarantine if it has registered anew since it failed."""
        if bookie in self._until_s and session is not None \
                and session != self._session.get(bookie):
            self._release(bookie)
            return True
        return False

    def release(self, bookie: BookieId) -> None:
        """End ``bookie``'s quarantine (it was found healthy)."""
        self._release(bookie)

    def _release(self, bookie: BookieId) -> None:
        self._until_s.pop(bookie, None)
        self._session.pop(bookie, None)

    def active(self) -> set[BookieId]:
        """The bookies quarantined now."""
        now = self._clock.monotonic_s()
        for bookie in [b for b, until in self._until_s.items() if until <= now]:
            self._release(bookie)
        return set(self._until_s)


class RandomPlacement:
    """Uniformly random choice among writable bookies (BookKeeper's default policy)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def new_ensemble(
        self, size: int, writable: Collection[BookieId], exclude: Collection[BookieId] = ()
    ) -> list[BookieId]:
        candidates: Sequence[BookieId] = sorted(set(writable) - set(exclude))
        if len(candidates) < size:
            raise NotEnoughBookiesError(
                f"need {size} writable bookies, {len(candidates)} available"
                + (f" ({', '.join(candidates)})" if candidates else "")
                + "; start more bookies or lower ensemble_size")
        return self._rng.sample(list(candidates), size)
