"""Capped exponential back-off, the one used by every retry loop of asyncbk.

A :class:`Backoff` is pure state: it does no sleeping and reads no clock.  Each
failure asks it for the next delay; a success resets it.  The delay doubles from
``initial_s`` up to ``max_s``; with ``jitter`` (a fraction in [0, 1]) each delay
is drawn uniformly from ``[delay * (1 - jitter), delay]``, so that many clients
losing the same server do not come back in lockstep.  Randomness comes from the
``random.Random`` passed in (a seeded one in the simulator), never the global one.
"""

from __future__ import annotations

import random

from .errors import invariant

_GLOBAL = random.Random()


class Backoff:
    """Delays for successive attempts: ``initial_s``, ``2 * initial_s``, ... capped at
    ``max_s``, each shortened by up to ``jitter`` of itself at random."""

    __slots__ = ("_failures", "_rng", "initial_s", "jitter", "max_s")

    def __init__(self, initial_s: float, max_s: float, *, jitter: float = 0.0,
                 rng: random.Random | None = None) -> None:
        invariant(0 < initial_s <= max_s, f"back-off needs 0 < initial_s ({initial_s}) "
                                          f"<= max_s ({max_s})")
        invariant(0.0 <= jitter <= 1.0, f"back-off jitter {jitter} is not in [0, 1]")
        self.initial_s = initial_s
        self.max_s = max_s
        self.jitter = jitter
        self._rng = rng if rng is not None else _GLOBAL
        self._failures = 0

    @property
    def failures(self) -> int:
        """Delays handed out since the last reset."""
        return self._failures

    def next_s(self) -> float:
        """The delay before the next attempt (and count this failure)."""
        delay = min(self.max_s, self.initial_s * 2.0 ** min(self._failures, 60))
        self._failures += 1
        if self.jitter:
            delay *= 1.0 - self.jitter * self._rng.random()
        return delay

    def peek_s(self) -> float:
        """The un-jittered delay the next failure would get (nothing counted)."""
        return min(self.max_s, self.initial_s * 2.0 ** min(self._failures, 60))

    def reset(self) -> None:
        """After a success: the next delay is ``initial_s`` again."""
        self._failures = 0


__all__ = ["Backoff"]
