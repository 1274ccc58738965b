"""The write path's state machine (client/write_path.py): random interleavings of
submits, acknowledgements, failures, stale answers, ensemble changes, degraded
writing and handle failure against a model, plus examples; and, on the
simulator, the two handle bugs the refactoring found."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from asyncbk.client.quorum import write_set
from asyncbk.client.write_path import NOTHING, RING_CUT_MIN, Effects, WritePath
from asyncbk.config import ClientConfig
from asyncbk.errors import InvariantError
from asyncbk.testing.sim import SimCluster, run_sim

from .test_static import ROOT, sans_io_violations

PW = b"pw"
PENDING_MAX = 24


@st.composite
def shapes(draw: Any) -> tuple[int, int, int]:
    e = draw(st.integers(1, 5))
    w = draw(st.integers(1, e))
    a = draw(st.integers(1, w))
    return e, w, a


class WritePathMachine(RuleBasedStateMachine):
    """Drives a WritePath the way the ledger handle does and checks it against a model.

    The network is a bag of sends not answered yet, delivered in any order as an
    acknowledgement or a failure, including answers from bookies replaced since.
    An ensemble change renews every failed position (a fresh bookie, or the same
    one taking its position back), or settles for degraded writing when every
    write set keeps an ack quorum."""

    wp: WritePath

    @initialize(shape=shapes(), recovery=st.booleans(), lac=st.integers(-1, 3))
    def start(self, shape: tuple[int, int, int], recovery: bool, lac: int) -> None:
        e, self.w, self.a = shape
        self.ensemble = [f"b{i}" for i in range(e)]
        self.fresh = itertools.count(e)
        self.publish = not recovery
        self.wp = WritePath(self.ensemble, self.w, self.a, lac=lac, publish_lac=self.publish)
        self.lac = lac
        self.next = lac + 1
        self.lac_sent = lac
        self.piggybacked = -1
        self.completed: list[int] = []
        self.failed_entries: list[int] = []
        self.valid: dict[int, set[int]] = {}
        """Pending entry -> positions whose current bookie acknowledged it."""
        self.sent: dict[int, bool] = {}
        self.network: list[tuple[int, int, str]] = []
        self.failed: set[int] = set()
        self.degraded: set[int] = set()
        self.changing = False
        self.halted = False

    # ------------------------------------------------------------------ checking effects

    def ws(self, entry_id: int) -> list[int]:
        return write_set(entry_id, len(self.ensemble), self.w)

    def pending(self) -> list[int]:
        return [] if self.halted else list(range(self.lac + 1, self.next))

    def apply(self, fx: Effects) -> None:
        for entry_id, pos in fx.sends:
            assert entry_id in self.pending(), f"send of entry {entry_id}, not pending"
            assert pos in self.ws(entry_id), f"entry {entry_id} sent outside its write set"
            assert pos not in self.degraded, f"entry {entry_id} sent to degraded position {pos}"
            self.network.append((entry_id, pos, self.ensemble[pos]))
            self.sent[entry_id] = True
        if fx.sends:
            assert fx.lac == (self.lac if self.publish else -1), "piggybacked LAC"
            assert fx.lac >= self.piggybacked, "piggybacked LAC went back"
            self.piggybacked = fx.lac
            self.lac_sent = max(self.lac_sent, fx.lac)
        if fx.completed:
            assert not self.changing, "completed during an ensemble change"
        for entry_id in fx.completed:
            assert entry_id == self.lac + 1, f"completed {entry_id} after {self.lac}: out of order"
            assert entry_id not in self.failed_entries, f"entry {entry_id} failed and completed"
            acked_by = {self.ensemble[p] for p in self.valid[entry_id]}
            assert self.valid[entry_id] <= set(self.ws(entry_id))
            assert len(acked_by) >= self.a, (
                f"entry {entry_id} completed with {sorted(acked_by)}, ack quorum {self.a}")
            self.lac = entry_id
            self.completed.append(entry_id)
            del self.valid[entry_id]

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: not self.halted and self.next - self.lac <= PENDING_MAX)
    @rule(hot=st.booleans())
    def submit(self, hot: bool) -> None:
        entry_id = self.wp.next_entry_id
        assert entry_id == self.next
        if hot:  # the handle's hot path: submit_to, the same decision without Effects
            positions, lac = self.wp.submit_to(entry_id)
            fx = Effects(tuple((entry_id, p) for p in positions), lac) if positions else NOTHING
        else:
            fx = self.wp.submit(entry_id)
        self.next += 1
        self.valid[entry_id] = set()
        self.sent[entry_id] = False
        if self.changing:
            assert fx == NOTHING, "sent during an ensemble change"
        else:
            assert list(fx.sends) == [(entry_id, p) for p in self.ws(entry_id)
                                      if p not in self.degraded]
        self.apply(fx)

    @precondition(lambda self: self.network)
    @rule(data=st.data(), ok=st.sampled_from([True, True, True, False]))
    def deliver(self, data: st.DataObject, ok: bool) -> None:
        entry_id, pos, bookie = self.network.pop(data.draw(st.integers(0, len(self.network) - 1)))
        current = not self.halted and self.ensemble[pos] == bookie
        if ok:
            fx = self.wp.ack(entry_id, pos, bookie)
            if current and entry_id in self.valid:
                self.valid[entry_id].add(pos)
            if not current:
                assert fx == NOTHING, "a stale acknowledgement had an effect"
            self.apply(fx)
            return
        fx = self.wp.failed(pos, bookie)
        if not current or pos in self.degraded:
            assert fx == NOTHING, "a stale or degraded failure had an effect"
            return
        newly = pos not in self.failed
        start = not self.changing
        self.failed.add(pos)
        self.changing = True
        assert fx.newly_failed == ((pos,) if newly else ())
        assert fx.start_change == start
        assert not fx.sends and not fx.completed

    @precondition(lambda self: self.network)
    @rule(data=st.data())
    def deliver_batch(self, data: st.DataObject) -> None:
        """A batch of acknowledgements from one bookie at one position (an ADD_BATCH
        answered OK): ``ack_many``, which must act as ``ack`` for each in turn."""
        _, pos, bookie = self.network[data.draw(st.integers(0, len(self.network) - 1))]
        mine = [i for i, (_, p, b) in enumerate(self.network) if p == pos and b == bookie]
        chosen = sorted(data.draw(st.lists(st.sampled_from(mine), min_size=1, unique=True)))
        entry_ids = [self.network[i][0] for i in chosen]
        for i in reversed(chosen):
            self.network.pop(i)
        current = not self.halted and self.ensemble[pos] == bookie
        fx = self.wp.ack_many(entry_ids, pos, bookie)
        if current:
            for entry_id in entry_ids:
                if entry_id in self.valid:
                    self.valid[entry_id].add(pos)
        else:
            assert fx == NOTHING, "a stale batch of acknowledgements had an effect"
        self.apply(fx)

    @precondition(lambda self: self.changing and self.failed and not self.halted)
    @rule(data=st.data())
    def commit_change(self, data: st.DataObject) -> None:
        renewed = sorted(self.failed)
        new = list(self.ensemble)
        for p in renewed:
            if data.draw(st.booleans()):  # a fresh bookie, else its own back
                new[p] = f"b{next(self.fresh)}"
        expected = []
        for entry_id in self.pending():
            if self.sent[entry_id]:  # survival: re-sent to exactly the renewed positions
                expected += [(entry_id, p) for p in self.ws(entry_id) if p in renewed]
            else:
                expected += [(entry_id, p) for p in self.ws(entry_id)
                             if p not in self.degraded - set(renewed)]
        fx = self.wp.ensemble_changed(new, renewed)
        assert sorted(fx.sends) == sorted(expected), "re-sends after the ensemble change"
        assert not fx.completed and not fx.start_change
        self.ensemble = new
        self.failed.clear()
        self.degraded -= set(renewed)
        for acked in self.valid.values():
            acked.difference_update(renewed)
        self.apply(fx)

    @precondition(lambda self: self.changing and not self.failed and not self.halted)
    @rule()
    def end_change(self) -> None:
        held = [e for e in self.pending() if not self.sent[e]]
        self.changing = False
        fx = self.wp.change_ended()
        assert sorted(fx.sends) == sorted((e, p) for e in held for p in self.ws(e)
                                          if p not in self.degraded), "held-back entries"
        self.apply(fx)

    @precondition(lambda self: self.changing and self.failed and not self.halted)
    @rule()
    def degrade(self) -> None:
        survives = all(len(set(self.ws(s)) - self.failed) >= self.a
                       for s in range(len(self.ensemble)))
        assert self.wp.ack_quorum_survives(self.failed) == survives
        if not survives:
            with pytest.raises(InvariantError):
                self.wp.degrade(self.failed)
            return
        self.wp.degrade(self.failed)
        self.degraded = set(self.failed)
        held = [e for e in self.pending() if not self.sent[e]]
        self.changing = False
        fx = self.wp.change_ended()
        assert sorted(fx.sends) == sorted((e, p) for e in held for p in self.ws(e)
                                          if p not in self.degraded), "held-back entries"
        self.apply(fx)

    @precondition(lambda self: not self.changing and self.degraded and not self.halted)
    @rule()
    def retry_degraded(self) -> None:
        assert self.wp.begin_change()
        assert not self.wp.begin_change()
        self.changing = True

    @precondition(lambda self: not self.halted)
    @rule(data=st.data())
    def fail_handle(self, data: st.DataObject) -> None:
        if data.draw(st.integers(0, 9)):  # rarely: it ends the run's interest
            return
        pending = self.pending()
        assert list(self.wp.fail_all()) == pending
        assert not set(pending) & set(self.completed)
        self.failed_entries += pending
        self.halted = True
        self.valid.clear()

    @rule()
    def explicit_lac(self) -> None:
        expected = None if self.halted or self.lac <= self.lac_sent else self.lac
        assert self.wp.explicit_lac() == expected
        if expected is not None:
            self.lac_sent = expected

    # ------------------------------------------------------------------ invariants

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "wp"):
            return
        wp = self.wp
        assert wp.lac == self.lac and wp.next_entry_id == self.next
        assert self.completed == sorted(set(self.completed)), "an entry completed twice"
        assert wp.pending == len(self.pending())
        assert wp.changing == self.changing and wp.halted == self.halted
        assert wp.failed_positions == self.failed and wp.degraded == self.degraded
        assert tuple(self.ensemble) == wp.ensemble
        head = self.lac + 1
        if not self.changing and not self.halted and head < self.next:
            # eager: the head completes as soon as its ack quorum is in
            assert len(self.valid[head]) < self.a, f"entry {head} complete but not completed"

    def teardown(self) -> None:
        """Liveness: with the failed positions renewed and every send acknowledged,
        every entry completes."""
        if not hasattr(self, "wp") or self.halted:
            return
        if not self.changing and self.degraded:
            self.retry_degraded()
        if self.changing:
            if self.failed:
                self.commit_change(_AllFresh())
            self.end_change()
        while self.network:
            entry_id, pos, bookie = self.network.pop()
            if self.ensemble[pos] == bookie and entry_id in self.valid:
                self.valid[entry_id].add(pos)
            self.apply(self.wp.ack(entry_id, pos, bookie))
        assert self.lac == self.next - 1, f"entries {self.lac + 1}..{self.next - 1} never completed"


class _AllFresh:
    """A stand-in for ``st.data()``: every renewed position gets a fresh bookie."""

    def draw(self, strategy: Any) -> bool:
        return True


TestWritePathMachine = WritePathMachine.TestCase
TestWritePathMachine.settings = settings(max_examples=300, stateful_step_count=60)


# ---------------------------------------------------------------------- examples

def _path(e: int = 3, w: int = 2, a: int = 2, **kw: Any) -> WritePath:
    return WritePath([f"b{i}" for i in range(e)], w, a, **kw)


def test_completion_in_entry_order() -> None:
    wp = _path()
    assert wp.submit(0).sends == ((0, 0), (0, 1))
    assert wp.submit(1).sends == ((1, 1), (1, 2))
    assert wp.ack(1, 1, "b1") == NOTHING
    assert wp.ack(1, 2, "b2") == NOTHING  # complete, but entry 0 is not
    assert wp.ack(0, 0, "b0") == NOTHING
    assert wp.ack(0, 1, "b1").completed == (0, 1)
    assert wp.lac == 1 and wp.pending == 0
    assert wp.ack(0, 0, "b0") == NOTHING  # late and duplicate answers change nothing


def test_no_completion_during_a_change_and_withdrawn_acks() -> None:
    wp = _path(3, 3, 2)
    wp.submit(0)
    fx = wp.failed(0, "b0")
    assert fx.start_change and fx.newly_failed == (0,)
    assert wp.ack(0, 1, "b1") == NOTHING
    assert wp.ack(0, 0, "b0") == NOTHING  # b0 answered late: it counts until replaced...
    assert wp.submit(1) == NOTHING  # held back until the change is over
    fx = wp.ensemble_changed(["b9", "b1", "b2"], [0])
    assert fx.sends == ((0, 0), (1, 1), (1, 2), (1, 0))  # ...and is withdrawn now
    assert wp.change_ended() == NOTHING  # entry 0 has b1 only
    assert wp.ack(0, 0, "b0") == NOTHING  # stale: position 0 is b9's
    assert wp.ack(0, 2, "b2").completed == (0,)


def test_degraded_writing_sends_what_was_held_back() -> None:
    wp = _path(3, 3, 2)
    wp.submit(0)
    assert wp.failed(2, "b2").start_change
    wp.submit(1)  # held back
    assert wp.ack_quorum_survives([2]) and not wp.ack_quorum_survives([1, 2])
    wp.degrade([2])
    fx = wp.change_ended()
    assert fx.sends == ((1, 1), (1, 0))
    assert wp.failed(2, "b2") == NOTHING  # known and left out
    assert wp.submit(2).sends == ((2, 0), (2, 1))


def test_recovery_piggybacks_no_lac_and_explicit_lac() -> None:
    wp = _path(2, 2, 1, lac=4, publish_lac=False)
    assert wp.submit(5).lac == -1
    assert wp.ack(5, 0, "b0").completed == (5,)
    assert wp.explicit_lac() == 5 and wp.explicit_lac() is None
    writer = _path(2, 2, 1)
    writer.submit(0)
    writer.ack(0, 1, "b1")
    assert writer.submit(1).lac == 0  # piggybacked: no explicit LAC needed
    assert writer.explicit_lac() is None


def test_long_runs_cut_the_ring() -> None:
    """Thousands of entries, acknowledged in batches out of order by position: every
    one completes once, in order, across the cuts of the acknowledgements' list."""
    bookies = ["a", "b", "c"]
    wp = WritePath(bookies, 3, 2)
    completed: list[int] = []
    batch = 100
    for start in range(0, 5000, batch):
        ids = list(range(start, start + batch))
        for entry_id in ids:
            wp.submit(entry_id)
        completed += wp.ack_many(ids[1::2], 2, "c").completed  # (not consecutive)
        completed += wp.ack_many(ids, 1, "b").completed
        assert wp.lac == start - 1 if start else wp.lac == -1
        completed += wp.ack_many(ids, 0, "a").completed
        assert wp.lac == start + batch - 1 and wp.pending == 0
    assert completed == list(range(5000))
    assert len(wp._acks) < 2 * RING_CUT_MIN


def test_fail_all_fails_the_pending_only() -> None:
    wp = _path(1, 1, 1)
    for i in range(3):
        wp.submit(i)
    assert wp.ack(0, 0, "b0").completed == (0,)
    assert wp.fail_all() == (1, 2)
    assert wp.ack(1, 0, "b0") == NOTHING and wp.failed(0, "b0") == NOTHING
    with pytest.raises(InvariantError):
        wp.submit(3)


def test_write_path_is_sans_io() -> None:
    for name in ("write_path.py", "quorum.py"):
        path = ROOT / "src" / "asyncbk" / "client" / name
        assert not sans_io_violations(path.read_text(), name)


# ---------------------------------------------------------------------- the handle's bugs

def config(**kw: object) -> ClientConfig:
    base: dict[str, object] = dict(add_timeout_s=0.5, read_timeout_s=0.5, connect_timeout_s=0.3,
                                   reconnect_backoff_s_max=0.2, explicit_lac_interval_s=0.0,
                                   add_quorum_timeout_s=30.0)
    base.update(kw)
    return ClientConfig(**base).validate()  # type: ignore[arg-type]


def test_cancelled_append_future_does_not_wedge_the_ledger() -> None:
    async def body() -> None:
        c = SimCluster(1, 3)
        await c.start()
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        first = lh.append(b"a")
        first.cancel()
        assert await asyncio.wait_for(lh.append(b"b"), 10) == 1
        assert lh.last_add_confirmed == 1
        await lh.close()
        await c.stop()

    run_sim(body)


def test_append_submitted_while_going_degraded_is_sent() -> None:
    async def body() -> None:
        c = SimCluster(1, 3)
        await c.start()
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        assert await lh.append(b"e0") == 0
        await asyncio.sleep(1)  # all three have acknowledged it
        dead = c.bookie(lh.metadata.ensembles[0][1][0])
        await dead.crash(torn=False)
        later: asyncio.Future[asyncio.Future[int]] = asyncio.get_running_loop().create_future()
        add = bk.quarantine.add

        def quarantined(bookie: str, session: object = None) -> None:
            add(bookie, session)
            if not later.done():  # the add that failed: append again before the change runs
                asyncio.get_running_loop().call_soon(lambda: later.set_result(lh.append(b"e2")))

        bk.quarantine.add = quarantined
        f1 = lh.append(b"e1")  # its add to the dead bookie fails: an ensemble change starts
        f2 = await later
        assert await asyncio.wait_for(asyncio.gather(f1, f2), 10) == [1, 2]
        await lh.close()
        await c.stop()

    run_sim(body)
