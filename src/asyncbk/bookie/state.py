"""The bookie's state, as one pure object: :class:`StateMachine`.

A bookie is in one *phase* of its life:

* ``starting``: storage opened (or opening), not registered yet;
* ``registered``: it holds a lease and is registered, so it serves;
* ``unregistered``: its lease was lost; reads are served, adds refused until it is
  registered again;
* ``draining``: a graceful stop began; new adds are refused while those accepted
  are answered;
* ``closed``: stopped (or the process died).

While registered it is *writable*, or *read-only* when it has at least one reason
to be (:class:`ReadOnlyReason`): it was configured so (``read_only = true``, for
good), every ledger directory's disk is full (until usage falls below the low
mark), its journal failed (for good: a restart is needed), or an operator asked
for maintenance (until asked back).  The externally visible state
(:class:`BookieState`: ``starting``, ``writable``, ``readonly``, ``unregistered``,
``draining``, ``closed``) follows from the phase and the reasons.

Each event is a method that returns a :class:`Change`: the state before and
after, the reasons now, and whether the registration's read-only flag must be
published (the registry moves a bookie between ``writable/`` and ``readonly/``).
The server does the I/O (the registration, the logs); the request processor reads
its admission decision from :attr:`StateMachine.add_status` and
:attr:`StateMachine.recovery_add_status`; the simulator drives the same object
through the same server.  No asyncio, clock or I/O here: hypothesis drives it
through random event sequences (tests/unit/test_bookie_state.py).

Invariants (checked after every event by :meth:`StateMachine.check`):

* ``writable`` exactly when registered without a reason; ``readonly`` exactly when
  registered with one; every other phase is its own state;
* plain adds are admitted only while writable; recovery adds (re-replication,
  ledger recovery) while writable or read-only; nothing else is admitted;
* ``closed`` is final; ``draining`` only ends in ``closed``; nothing goes back to
  ``starting``;
* the configured reason never comes or goes, and a failed journal stays a reason;
* a read-only flag is published only before the bookie drains, and it is the
  flag the reasons say.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from ..errors import invariant
from ..proto import Status


class BookieState(enum.StrEnum):
    """What a bookie tells the world it is (BOOKIE_INFO, the admin endpoint, metrics)."""

    STARTING = "starting"
    WRITABLE = "writable"
    READ_ONLY = "readonly"
    UNREGISTERED = "unregistered"
    """The registration lease was lost: reads are served, adds refused until re-registered."""
    DRAINING = "draining"
    CLOSED = "closed"
    """Stopped: nothing is served any more."""


SERVING_STATES = frozenset({BookieState.WRITABLE, BookieState.READ_ONLY})
"""The states in which a bookie serves reads (and, writable, adds)."""


class ReadOnlyReason(enum.StrEnum):
    """Why a bookie is read-only (several may hold at once); listed in this order."""

    CONFIG = "config"
    """Started with ``read_only = true``: for the life of the process."""
    DISK_FULL = "disk_full"
    """Every ledger directory's disk (or its journal's) is past ``disk_usage_threshold``;
    gone once one is below ``disk_usage_lwm_threshold``."""
    JOURNAL_FAILED = "journal_failed"
    """Every journal failed (a write or fsync error): for good, until a restart."""
    MAINTENANCE = "maintenance"
    """An operator asked (HTTP admin ``PUT /api/v1/bookie/state``), until asked back."""


_REASON_ORDER = tuple(ReadOnlyReason)


class Phase(enum.Enum):
    STARTING = "starting"
    REGISTERED = "registered"
    UNREGISTERED = "unregistered"
    DRAINING = "draining"
    CLOSED = "closed"


_PHASE_STATE = {Phase.STARTING: BookieState.STARTING,
                Phase.UNREGISTERED: BookieState.UNREGISTERED,
                Phase.DRAINING: BookieState.DRAINING, Phase.CLOSED: BookieState.CLOSED}
_LIVE_PHASES = frozenset({Phase.STARTING, Phase.REGISTERED, Phase.UNREGISTERED})
"""Phases in which the registration's read-only flag still matters."""


class Change(NamedTuple):
    """What one event did (a named tuple, as the write path's ``Effects``)."""

    before: BookieState
    after: BookieState
    reasons: tuple[ReadOnlyReason, ...]
    """The read-only reasons after the event, in :class:`ReadOnlyReason` order."""
    reasons_before: tuple[ReadOnlyReason, ...]
    publish: bool | None = None
    """The read-only flag the registration must carry now (written to the registry if
    it is registered, kept for its next registration otherwise); None: nothing to do."""

    @property
    def changed(self) -> bool:
        """Whether the state or the reasons changed (worth a log line)."""
        return self.before is not self.after or self.reasons != self.reasons_before


class StateMachine:
    """The bookie's phase and read-only reasons, with explicit transitions (module
    docstring).  ``read_only``: started with ``read_only = true``."""

    __slots__ = ("_configured", "_phase", "_published", "_reasons", "add_status",
                 "recovery_add_status", "state")

    def __init__(self, *, read_only: bool = False) -> None:
        self._configured = read_only
        self._phase = Phase.STARTING
        self._reasons: frozenset[ReadOnlyReason] = (
            frozenset({ReadOnlyReason.CONFIG}) if read_only else frozenset())
        self._published: bool | None = None
        """The read-only flag the registry is known to hold (None: not registered)."""
        self.state = BookieState.STARTING
        """The state as the world sees it (kept up to date by every event)."""
        self.add_status = Status.NOT_READY
        """What a plain add gets from the state alone: OK, READ_ONLY or NOT_READY."""
        self.recovery_add_status = Status.NOT_READY
        """What a recovery add gets from the state alone: OK or NOT_READY."""
        self._derive()

    # ------------------------------------------------------------------ queries

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def reasons(self) -> tuple[ReadOnlyReason, ...]:
        """Why the bookie is (or, once registered, would be) read-only, in order."""
        return tuple(r for r in _REASON_ORDER if r in self._reasons)

    @property
    def read_only(self) -> bool:
        """Whether the bookie has a reason to be read-only (the registry's flag)."""
        return bool(self._reasons)

    @property
    def serving(self) -> bool:
        """Writable or read-only: registered and not stopping."""
        return self.state in SERVING_STATES

    def pending_publish(self) -> bool | None:
        """The flag to publish again when the registry is known to hold another one
        (an earlier write failed); None when it is up to date or not registered."""
        if self._phase is Phase.REGISTERED and self._published is not None \
                and self._published != self.read_only:
            return self.read_only
        return None

    # ------------------------------------------------------------------ events

    def registered(self, published_read_only: bool) -> Change:
        """The registration succeeded (at start, or again after a lost lease), with
        the read-only flag ``published_read_only``.  Ignored once draining."""
        before = self._snapshot()
        if self._phase in _LIVE_PHASES:
            self._phase = Phase.REGISTERED
            self._published = published_read_only
        publish = self.pending_publish()
        return self._done(before, publish)

    def lease_lost(self) -> Change:
        """The registration lease is gone: adds refused until registered again.
        Ignored before the first registration and once draining."""
        before = self._snapshot()
        if self._phase is Phase.REGISTERED:
            self._phase = Phase.UNREGISTERED
            self._published = None
        return self._done(before)

    def set_reason(self, reason: ReadOnlyReason, on: bool) -> Change:
        """A read-only reason starts (``on``) or ends.  The configured reason cannot be
        changed, and a failed journal cannot be undone (ValueError)."""
        if reason is ReadOnlyReason.CONFIG:
            if on != self._configured:
                raise ValueError("read-only by configuration holds for the life of the "
                                 "process: restart with read_only changed")
            return self._done(self._snapshot())
        if reason is ReadOnlyReason.JOURNAL_FAILED and not on \
                and reason in self._reasons:
            raise ValueError("a failed journal keeps the bookie read-only until it restarts")
        before = self._snapshot()
        was_read_only = self.read_only
        self._reasons = self._reasons | {reason} if on else self._reasons - {reason}
        publish = None
        if self.read_only != was_read_only and self._phase in _LIVE_PHASES:
            publish = self.read_only
        return self._done(before, publish)

    def disk_full(self, full: bool) -> Change:
        return self.set_reason(ReadOnlyReason.DISK_FULL, full)

    def journal_failed(self) -> Change:
        return self.set_reason(ReadOnlyReason.JOURNAL_FAILED, True)

    def maintenance(self, on: bool) -> Change:
        return self.set_reason(ReadOnlyReason.MAINTENANCE, on)

    def published(self, read_only: bool) -> None:
        """The registry now holds ``read_only`` (a write of the flag succeeded)."""
        if self._phase is Phase.REGISTERED:
            self._published = read_only
        self.check()

    def drain(self) -> Change:
        """A graceful stop began: new adds refused, reads still served.  Ignored once
        closed."""
        before = self._snapshot()
        if self._phase is not Phase.CLOSED:
            self._phase = Phase.DRAINING
        self._published = None  # the flag no longer matters: the lease goes soon
        return self._done(before)

    def close(self) -> Change:
        """Stopped (gracefully, after draining, or the process died)."""
        before = self._snapshot()
        self._phase = Phase.CLOSED
        self._published = None
        return self._done(before)

    # ------------------------------------------------------------------ internals

    def _snapshot(self) -> tuple[BookieState, tuple[ReadOnlyReason, ...]]:
        return self.state, self.reasons

    def _done(self, before: tuple[BookieState, tuple[ReadOnlyReason, ...]],
              publish: bool | None = None) -> Change:
        self._derive()
        self.check()
        invariant(publish is None or (publish == self.read_only
                                      and self._phase in _LIVE_PHASES),
                  f"publishing read-only={publish} in phase {self._phase.value} with "
                  f"reasons {self.reasons}")
        return Change(before[0], self.state, self.reasons, before[1], publish)

    def _derive(self) -> None:
        phase = self._phase
        if phase is Phase.REGISTERED:
            if self._reasons:
                self.state = BookieState.READ_ONLY
                self.add_status = Status.READ_ONLY
            else:
                self.state = BookieState.WRITABLE
                self.add_status = Status.OK
            self.recovery_add_status = Status.OK
        else:
            self.state = _PHASE_STATE[phase]
            self.add_status = self.recovery_add_status = Status.NOT_READY

    def check(self) -> None:
        """The invariants of the module docstring that one state can show."""
        state, reasons = self.state, self._reasons
        invariant((state is BookieState.WRITABLE)
                  == (self._phase is Phase.REGISTERED and not reasons),
                  f"state {state} in phase {self._phase.value} with reasons {self.reasons}")
        invariant((state is BookieState.READ_ONLY)
                  == (self._phase is Phase.REGISTERED and bool(reasons)),
                  f"state {state} in phase {self._phase.value} with reasons {self.reasons}")
        invariant((self.add_status is Status.OK) == (state is BookieState.WRITABLE),
                  f"plain adds {self.add_status.name} while {state}")
        invariant((self.recovery_add_status is Status.OK) == (state in SERVING_STATES),
                  f"recovery adds {self.recovery_add_status.name} while {state}")
        invariant((ReadOnlyReason.CONFIG in reasons) == self._configured,
                  "the configured read-only reason changed")
        invariant(self._published is None or self._phase is Phase.REGISTERED,
                  f"a published flag while {self._phase.value}")


def disk_read_only(read_only_now: bool, used: float, threshold: float,
                   lwm_threshold: float) -> bool:
    """Hysteresis of one disk: full at ``threshold`` and above; not full again only
    below ``lwm_threshold``; in between, stay as it is."""
    if used >= threshold:
        return True
    if used < lwm_threshold:
        return False
    return read_only_now


__all__ = ["SERVING_STATES", "BookieState", "Change", "Phase", "ReadOnlyReason",
           "StateMachine", "disk_read_only"]
