"""Pure parts of auto-recovery: the rate limiter and the lost-fragment rules."""

from __future__ import annotations

import time

import pytest

from asyncbk.autorecovery.replication import RateLimiter, lost_positions, needs_recovery_first
from asyncbk.autorecovery.service import AutoRecoveryConfig, AutoRecoveryStatus
from asyncbk.meta.model import LedgerState, new_metadata


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
