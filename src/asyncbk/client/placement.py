"""Ensemble placement: which bookies a new ledger (or a replacement) uses."""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

from ..errors import NotEnoughBookiesError
from ..types import BookieId


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
