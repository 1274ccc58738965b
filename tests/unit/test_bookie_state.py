"""The bookie's state machine (bookie/state.py): explicit transitions, checked against
a model over random event sequences (hypothesis), and the rules one by one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncbk.bookie.state import (
    SERVING_STATES,
    BookieState,
    Phase,
    ReadOnlyReason,
    StateMachine,
)
from asyncbk.proto import Status

EVENTS = st.one_of(
    st.tuples(st.just("registered"), st.booleans()),
    st.tuples(st.just("lease_lost"), st.none()),
    st.tuples(st.just("disk_full"), st.booleans()),
    st.tuples(st.just("journal_failed"), st.none()),
    st.tuples(st.just("maintenance"), st.booleans()),
    st.tuples(st.just("published"), st.booleans()),
    st.tuples(st.just("drain"), st.none()),
    st.tuples(st.just("close"), st.none()),
)


class Model:
    """The rules of the module docstring, written the plain way."""

    def __init__(self, configured: bool) -> None:
        self.phase = "starting"
        self.reasons = {"config"} if configured else set()
        self.published: bool | None = None

    def apply(self, name: str, arg: bool | None) -> bool | None:
        """The event; returns the flag to publish (None: nothing)."""
        live = self.phase in ("starting", "registered", "unregistered")
        if name == "registered":
            if live:
                self.phase, self.published = "registered", arg
            return self.pending()
        if name == "lease_lost":
            if self.phase == "registered":
                self.phase, self.published = "unregistered", None
            return None
        if name in ("disk_full", "journal_failed", "maintenance"):
            reason = {"disk_full": "disk_full", "journal_failed": "journal_failed",
                      "maintenance": "maintenance"}[name]
            on = True if arg is None else arg
            was = bool(self.reasons)
            if on:
                self.reasons.add(reason)
            else:
                self.reasons.discard(reason)
            return bool(self.reasons) if bool(self.reasons) != was and live else None
        if name == "published":
            if self.phase == "registered":
                self.published = arg
            return None
        if name == "drain":
            if self.phase != "closed":
                self.phase = "draining"
            self.published = None
            return None
        assert name == "close"
        self.phase, self.published = "closed", None
        return None

    def pending(self) -> bool | None:
        if self.phase == "registered" and self.published is not None \
                and self.published != bool(self.reasons):
            return bool(self.reasons)
        return None

    def state(self) -> BookieState:
        if self.phase == "registered":
            return BookieState.READ_ONLY if self.reasons else BookieState.WRITABLE
        return BookieState(self.phase)


def _fire(machine: StateMachine, name: str, arg: bool | None) -> bool | None:
    if name == "published":
        assert arg is not None
        machine.published(arg)
        return None
    if name in ("lease_lost", "journal_failed", "drain", "close"):
        change = getattr(machine, name)()
    else:
        change = getattr(machine, name)(arg)
    return change.publish


@given(st.booleans(), st.lists(EVENTS, max_size=40))
def test_random_event_sequences_follow_the_model(configured: bool,
                                                 events: list[tuple[str, bool | None]]) -> None:
    machine = StateMachine(read_only=configured)
    model = Model(configured)
    seen_phases = [machine.phase]
    journal_failed_at: int | None = None
    for i, (name, arg) in enumerate(events):
        before = machine.state
        publish = _fire(machine, name, arg)
        assert publish == model.apply(name, arg), (name, arg)
        state = model.state()
        assert machine.state is state
        assert set(machine.reasons) == {ReadOnlyReason(r) for r in model.reasons}
        assert list(machine.reasons) == [r for r in ReadOnlyReason if r.value in model.reasons]
        assert machine.pending_publish() == model.pending()
        # admission follows the state alone
        assert (machine.add_status is Status.OK) == (state is BookieState.WRITABLE)
        assert machine.add_status in (Status.OK, Status.READ_ONLY, Status.NOT_READY)
        if state is BookieState.READ_ONLY:
            assert machine.add_status is Status.READ_ONLY
        assert (machine.recovery_add_status is Status.OK) == (state in SERVING_STATES)
        # the configured reason never changes; a failed journal stays
        assert (ReadOnlyReason.CONFIG in machine.reasons) == configured
        if name == "journal_failed" and journal_failed_at is None:
            journal_failed_at = i
        if journal_failed_at is not None:
            assert ReadOnlyReason.JOURNAL_FAILED in machine.reasons
        # closed is final; draining only ends in closed; never back to starting
        if before is BookieState.CLOSED:
            assert machine.state is BookieState.CLOSED
        if before is BookieState.DRAINING:
            assert machine.state in (BookieState.DRAINING, BookieState.CLOSED)
        if seen_phases[-1] is not Phase.STARTING:
            assert machine.phase is not Phase.STARTING
        seen_phases.append(machine.phase)


def test_the_life_of_a_bookie() -> None:
    m = StateMachine()
    assert m.state is BookieState.STARTING and m.add_status is Status.NOT_READY
    c = m.registered(False)
    assert (c.before, c.after, c.publish) == (BookieState.STARTING, BookieState.WRITABLE, None)
    assert m.add_status is Status.OK and m.serving
    c = m.disk_full(True)
    assert (c.after, c.reasons, c.publish) == (BookieState.READ_ONLY,
                                               (ReadOnlyReason.DISK_FULL,), True)
    assert m.add_status is Status.READ_ONLY and m.recovery_add_status is Status.OK
    assert m.pending_publish() is True  # the registry holds False until the server writes
    c = m.maintenance(True)
    assert c.changed and c.publish is None  # read-only already: nothing to publish
    assert m.reasons == (ReadOnlyReason.DISK_FULL, ReadOnlyReason.MAINTENANCE)
    m.published(True)
    c = m.disk_full(False)
    assert c.after is BookieState.READ_ONLY and c.publish is None  # maintenance holds
    c = m.maintenance(False)
    assert (c.after, c.publish) == (BookieState.WRITABLE, False)
    c = m.lease_lost()
    assert c.after is BookieState.UNREGISTERED and m.add_status is Status.NOT_READY
    assert m.recovery_add_status is Status.NOT_READY
    c = m.disk_full(True)  # while unregistered: the registration keeps the flag
    assert (c.after, c.publish) == (BookieState.UNREGISTERED, True)
    c = m.registered(False)  # registered again with the old flag: publish again
    assert (c.after, c.publish) == (BookieState.READ_ONLY, True)
    assert m.pending_publish() is True  # until the write succeeds
    m.published(True)
    assert m.pending_publish() is None
    c = m.drain()
    assert c.after is BookieState.DRAINING and m.add_status is Status.NOT_READY
    assert m.registered(False).after is BookieState.DRAINING  # ignored once draining
    assert m.disk_full(False).publish is None  # nothing published any more
    assert m.close().after is BookieState.CLOSED
    assert m.drain().after is BookieState.CLOSED


def test_configured_and_failed_journal_reasons_hold() -> None:
    m = StateMachine(read_only=True)
    assert m.registered(True).after is BookieState.READ_ONLY
    assert m.reasons == (ReadOnlyReason.CONFIG,)
    with pytest.raises(ValueError, match="restart"):
        m.set_reason(ReadOnlyReason.CONFIG, False)
    assert not m.set_reason(ReadOnlyReason.CONFIG, True).changed
    m.journal_failed()
    with pytest.raises(ValueError, match="failed journal"):
        m.set_reason(ReadOnlyReason.JOURNAL_FAILED, False)
    assert m.reasons == (ReadOnlyReason.CONFIG, ReadOnlyReason.JOURNAL_FAILED)


