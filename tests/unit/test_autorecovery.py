"""Auto-recovery without processes: the rate limiter, the lost-fragment rules, time
from the injected clock (auditor delay, mark age, HTTP), and what a worker does
with a wrong answer from a bookie."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from asyncbk.autorecovery import replication
from asyncbk.autorecovery.http import routes
from asyncbk.autorecovery.replication import RateLimiter, lost_positions, needs_recovery_first
from asyncbk.autorecovery.service import (
    AUDIT_POLL_S,
    AutoRecovery,
    AutoRecoveryConfig,
    AutoRecoveryStatus,
)
from asyncbk.client.digest import DigestManager
from asyncbk.clock import ManualClock
from asyncbk.errors import BKError, BookieIOError, BookieUnavailableError
from asyncbk.meta.api import BookieRegistration
from asyncbk.meta.memory import MemoryMetadataStore
from asyncbk.meta.model import LedgerState, new_metadata
from asyncbk.proto import AddResponse, BookieInfoResponse, ReadResponse, Status


def md_with(fragments: list[tuple[int, tuple[str, ...]]], closed: bool, last: int = 99):
    md = new_metadata(1, list(fragments[0][1]), 2, 2, "xxh3", b"", None, 0)
    md = md.replace(ensembles=tuple(fragments))
    if closed:
        md = md.replace(state=LedgerState.CLOSED, last_entry_id=last)
    return md


def test_lost_positions_and_when_recovery_comes_first() -> None:
    md = md_with([(0, ("a", "b", "c")), (50, ("a", "d", "c"))], closed=False)
    assert lost_positions(md, {"a", "b", "c", "d"}) == []
    assert lost_positions(md, {"a", "c", "d"}) == [(0, 1)]
    assert not needs_recovery_first(md, {"a", "c", "d"})  # only an old fragment lost "b"
    assert lost_positions(md, {"a", "b", "c"}) == [(1, 1)]
    assert needs_recovery_first(md, {"a", "b", "c"})  # the writer's own fragment
    closed = md.replace(state=LedgerState.CLOSED, last_entry_id=80)
    assert not needs_recovery_first(closed, {"a", "b", "c"})


async def test_rate_limiter_paces_and_zero_means_unlimited() -> None:
    limiter = RateLimiter(200, burst=1)
    t0 = time.monotonic()
    for _ in range(41):
        await limiter.acquire()
    assert 0.15 <= time.monotonic() - t0 < 2.0  # 40 tokens at 200/s: about 0.2 s
    unlimited = RateLimiter(0)
    t0 = time.monotonic()
    for _ in range(10_000):
        await unlimited.acquire()
    assert time.monotonic() - t0 < 1.0


def test_config_validation_and_status_json() -> None:
    with pytest.raises(ValueError, match="lost_bookie_delay_s"):
        AutoRecoveryConfig(lost_bookie_delay_s=-1).validate()
    with pytest.raises(ValueError, match="lease_ttl_s"):
        AutoRecoveryConfig(lease_ttl_s=0).validate()
    st = AutoRecoveryStatus("x", lost={"b1"}, lost_pending={"b2": time.monotonic() - 3})
    doc = st.to_json()
    assert doc["lost_bookies"] == ["b1"] and 2.5 < doc["bookies_within_delay"]["b2"] < 10


# --- time from the injected clock ---------------------------------------------------


def has_sleeper(clock: ManualClock) -> bool:
    """Whether something sleeps on ``clock`` (a task came round to its next wait)."""
    return any(not fut.done() for _, fut in clock._sleepers)


async def until(cond: Callable[[], bool], what: str) -> None:
    """Let the loop run until ``cond()`` (a real-time guard only against hanging)."""
    deadline = time.monotonic() + 10.0
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


async def test_rate_limiter_paces_on_the_injected_clock() -> None:
    clock = ManualClock()
    limiter = RateLimiter(2, burst=1, clock=clock)
    await limiter.acquire()  # the bucket starts full: no wait
    second = asyncio.create_task(limiter.acquire())  # owes 1 token at 2/s: 0.5 s
    await until(lambda: has_sleeper(clock), "the limiter to sleep")
    await asyncio.sleep(0.05)  # real time passing changes nothing
    assert not second.done()
    clock.advance(0.25)
    await asyncio.sleep(0.01)
    assert not second.done()
    clock.advance(0.25)
    await asyncio.wait_for(second, 5.0)
    clock.advance(10.0)  # idle on the clock: the bucket refills, the next one is free
    await asyncio.wait_for(limiter.acquire(), 5.0)
    assert not has_sleeper(clock)


def test_status_json_measures_the_delay_on_its_clock() -> None:
    clock = ManualClock()
    st = AutoRecoveryStatus("x", lost_pending={"b2": clock.monotonic_s()}, clock=clock)
    clock.advance(12.5)
    assert st.to_json()["bookies_within_delay"] == {"b2": 12.5}


B1, B2, B3 = "b1:3181", "b2:3181", "b3:3181"


class FakeBookKeeper:
    """The part of a client auto-recovery uses before it copies anything."""

    def __init__(self, meta: MemoryMetadataStore) -> None:
        self.meta = meta
        self.opened: list[int] = []

    async def open_ledger(self, ledger_id: int, password: bytes = b"",
                          recovery: bool = True) -> Any:
        self.opened.append(ledger_id)
        raise StopHere("recovery reached")

    async def close(self) -> None:
        pass


class StopHere(BKError):
    """Ends a worker's attempt where the test has seen what it wanted."""


async def meta_with_ledger(clock: ManualClock, registered: list[str]
                           ) -> tuple[MemoryMetadataStore, dict[str, int]]:
    meta = MemoryMetadataStore(clock=clock)
    leases = {}
    for b in registered:
        leases[b] = await meta.grant_lease(3600)
        await meta.register_bookie(BookieRegistration(b, False), leases[b])
    await meta.create_ledger(new_metadata(7, [B1, B2, B3], 2, 2, "xxh3", b"pw", None, 0))
    return meta, leases


async def test_lost_bookie_delay_follows_the_injected_clock() -> None:
    clock = ManualClock()
    meta, leases = await meta_with_ledger(clock, [B1, B2, B3])
    ar = AutoRecovery(FakeBookKeeper(meta), AutoRecoveryConfig(lost_bookie_delay_s=30.0,
                                                               audit_interval_s=3600.0),
                      "ar-test", clock=clock)
    st = ar.status
    audit = asyncio.create_task(ar._audit())
    try:
        await until(lambda: st.audits == 1 and has_sleeper(clock), "the first audit")
        await meta.revoke_lease(leases[B3])  # B3 is gone
        clock.advance(AUDIT_POLL_S)
        await until(lambda: B3 in st.lost_pending and has_sleeper(clock), "B3 noticed")
        gone_at = clock.monotonic_s()
        clock.advance(29.0)  # within the delay on the clock: nothing is marked
        await until(lambda: has_sleeper(clock), "the auditor's next look")
        assert st.lost == set() and await meta.list_underreplicated() == []
        assert st.to_json()["bookies_within_delay"] == {B3: round(clock.monotonic_s() - gone_at, 1)}
        clock.advance(1.0)  # the delay has passed on the clock: lost, ledger marked
        await until(lambda: st.lost == {B3} and has_sleeper(clock), "B3 lost")
        [mark] = await meta.list_underreplicated()
        assert (mark.ledger_id, mark.bookies) == (7, frozenset({B3}))
        assert mark.marked_ms == int(clock.wall_s() * 1000)  # the store's clock dates it
        assert st.lost_pending == {} and st.ledgers_marked == 1
    finally:
        audit.cancel()
        await asyncio.gather(audit, return_exceptions=True)


async def test_open_ledger_grace_counts_the_mark_age_on_the_injected_clock() -> None:
    clock = ManualClock()
    meta, _ = await meta_with_ledger(clock, [B1, B2])  # B3 of the open ledger is gone
    await meta.mark_underreplicated(7, {B3})
    [mark] = await meta.list_underreplicated()
    bk = FakeBookKeeper(meta)
    ar = AutoRecovery(bk, AutoRecoveryConfig(open_ledger_grace_s=30.0), "ar-test", clock=clock)
    clock.advance(29.0)
    await ar._replicate(mark)  # 29 s old: its writer may still replace B3 itself
    assert bk.opened == []
    clock.advance(1.0)
    with pytest.raises(StopHere):  # 30 s old: fence and close it, then copy
        await ar._replicate(mark)
    assert bk.opened == [7]


async def test_underreplicated_route_ages_marks_on_the_injected_clock() -> None:
    clock = ManualClock()
    meta, _ = await meta_with_ledger(clock, [B1, B2])
    await meta.mark_underreplicated(7, {B3})
    ar = AutoRecovery(FakeBookKeeper(meta), AutoRecoveryConfig(), "ar-test", clock=clock)
    clock.advance(42.0)
    app = web.Application()
    app.add_routes(routes(ar))
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/api/v1/autorecovery/underreplicated")
        assert resp.status == 200
        doc = await resp.json()
    assert doc == {"ledgers": [{"ledger_id": 7, "lost_bookies": [B3], "marked_s_ago": 42.0}]}


# --- a bookie answering with the wrong message type ----------------------------------


class FakeChannel:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.requests: list[Any] = []

    def next_request_id(self) -> int:
        return len(self.requests) + 1

    async def request(self, req: Any, timeout_s: float) -> Any:
        self.requests.append(req)
        return self.answer


def fake_client(answers: dict[str, Any]) -> Any:
    channels = {b: FakeChannel(a) for b, a in answers.items()}
    return SimpleNamespace(bookie_client=SimpleNamespace(channel=channels.__getitem__),
                           config=SimpleNamespace(read_timeout_s=1.0, add_timeout_s=1.0),
                           channels=channels)


INFO = BookieInfoResponse(1, Status.OK, B3, "writable", 1, 2, "0.1.0")


async def test_copy_to_a_bookie_answering_another_message_type_is_a_typed_error() -> None:
    md = new_metadata(7, [B1, B2, B3], 2, 2, "xxh3", b"pw", None, 0)
    bk = fake_client({B3: INFO})
    with pytest.raises(BookieIOError, match=f"copy of ledger 7 entry 0: bookie {B3} answered "
                       "an ADD request with BookieInfoResponse instead of AddResponse"):
        await replication._write_body(bk, md, b"key", 0, b"body", B3)
    bk = fake_client({B3: AddResponse(1, Status.OK, 7, 0)})
    await replication._write_body(bk, md, b"key", 0, b"body", B3)  # the right type passes


async def test_read_for_a_copy_skips_a_replica_answering_another_message_type() -> None:
    md = new_metadata(7, [B1, B2, B3], 2, 2, "xxh3", b"pw", None, 0)
    digest = DigestManager(7, "xxh3", b"pw")
    sealed = digest.seal(0, -1, 5, b"hello")
    good = ReadResponse(1, Status.OK, 7, 0, sealed, -1)
    wrong = AddResponse(1, Status.OK, 7, 0)
    # entry 0 lives on positions 0 and 1 (B1, B2); B3 is the one lost
    bk = fake_client({B1: wrong, B2: good})
    assert await replication._read_body(bk, md, digest, 0, (B1, B2, B3), {2}) == sealed
    bk = fake_client({B1: wrong, B2: INFO})
    with pytest.raises(BookieUnavailableError) as got:
        await replication._read_body(bk, md, digest, 0, (B1, B2, B3), {2})
    assert (f"bookie {B1} answered a READ request with AddResponse instead of ReadResponse"
            in str(got.value))
    assert (f"bookie {B2} answered a READ request with BookieInfoResponse instead of "
            "ReadResponse" in str(got.value))


def test_fix_placement_with_a_random_client_checks_only_ledgers_own_placement() -> None:
    """``--fix-placement`` with the default random policy is accepted: ledgers created
    with their own placement are checked against it, the others accept anything."""
    from asyncbk.autorecovery.placement import PlacementRule, check_ledger
    from asyncbk.config import ClientConfig

    bk = FakeBookKeeper(MemoryMetadataStore())
    bk.config = ClientConfig()  # type: ignore[attr-defined]
    ar = AutoRecovery(bk, AutoRecoveryConfig(fix_placement=True), "ar-test")  # type: ignore[arg-type]
    assert ar.placement_rule == PlacementRule("random")
    md = new_metadata(7, [B1, B2, B3], 2, 2, "xxh3", b"pw", None, 0)
    one_rack = {B1: "/d/r1", B2: "/d/r1", B3: "/d/r1"}
    assert check_ledger(md, ar.placement_rule, one_rack, [B1, B2, B3]) == []
