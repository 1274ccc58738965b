"""Lease registration: kept alive, lost (lease gone or store unreachable), regained."""

from __future__ import annotations

import asyncio
import random

import pytest

from asyncbk.bookie.registration import Registration
from asyncbk.clock import ManualClock
from asyncbk.errors import MetadataError
from asyncbk.meta.memory import MemoryMetadataStore

pytestmark = pytest.mark.usefixtures("loop_errors")


class FlakyStore(MemoryMetadataStore):
    unreachable = False

    async def keepalive_lease(self, lease_id: int) -> int:
        if self.unreachable:
            raise MetadataError("store unreachable")
        return await super().keepalive_lease(lease_id)

    async def grant_lease(self, ttl_s: int) -> int:
        if self.unreachable:
            raise MetadataError("store unreachable")
        return await super().grant_lease(ttl_s)


async def spin(clock: ManualClock, seconds: float, step_s: float = 0.25) -> None:
    """Advance virtual time in steps, letting the loop run between them."""
    t = 0.0
    while t < seconds:
        clock.advance(step_s)
        t += step_s
        for _ in range(10):
            await asyncio.sleep(0)


async def test_kept_alive_then_lost_then_regained() -> None:
    clock = ManualClock()
    meta = FlakyStore(clock=clock)
    changes: list[bool] = []
    reg = Registration(meta, "127.0.0.1:9", ttl_s=3, on_change=changes.append, clock=clock)
    await reg.start()
    try:
        assert changes == [True]
        await spin(clock, 30)  # ten TTLs: keep-alives hold the registration
        assert "127.0.0.1:9" in await meta.list_bookies()
        assert changes == [True]

        await meta.revoke_lease(reg.lease_id)  # lease lost behind the bookie's back
        assert "127.0.0.1:9" not in await meta.list_bookies()
        await spin(clock, 2)
        assert changes[:2] == [True, False]
        await spin(clock, 5)
        assert changes == [True, False, True]  # registered again
        assert "127.0.0.1:9" in await meta.list_bookies()
        assert reg.lease_losses == 1
    finally:
        await reg.close()
    assert "127.0.0.1:9" not in await meta.list_bookies()  # revoked on close


async def test_unreachable_store_for_a_ttl_means_unregistered() -> None:
    clock = ManualClock()
    meta = FlakyStore(clock=clock)
    changes: list[bool] = []
    reg = Registration(meta, "127.0.0.1:9", ttl_s=3, on_change=changes.append, clock=clock)
    await reg.start()
    try:
        meta.unreachable = True
        await spin(clock, 1.5)
        assert changes == [True]  # a missed keep-alive or two is not yet a loss
        await spin(clock, 3)
        assert changes == [True, False]
        meta.unreachable = False
        await spin(clock, 10)
        assert changes == [True, False, True]
    finally:
        await reg.close()


class HangingStore(MemoryMetadataStore):
    """A store whose keep-alives never answer (etcd behind a partition that drops
    packets): the call hangs until its own timeout, longer than the lease."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.reachable = asyncio.Event()
        self.reachable.set()

    async def keepalive_lease(self, lease_id: int) -> int:
        await self.reachable.wait()
        return await super().keepalive_lease(lease_id)

    async def grant_lease(self, ttl_s: int) -> int:
        await self.reachable.wait()
        return await super().grant_lease(ttl_s)


async def test_a_hanging_keepalive_loses_the_registration_within_a_ttl() -> None:
    clock = ManualClock()
    meta = HangingStore(clock=clock)
    changes: list[bool] = []
    reg = Registration(meta, "127.0.0.1:9", ttl_s=3, on_change=changes.append, clock=clock)
    await reg.start()
    try:
        await spin(clock, 2)
        meta.reachable.clear()
        await spin(clock, 2)
        assert changes == [True]  # the last keep-alive was under a TTL ago
        await spin(clock, 1.5)
        # no answer for a whole TTL since the last one that succeeded: not registered
        assert changes == [True, False]
        await spin(clock, 5)
        assert changes == [True, False]
        meta.reachable.set()
        await spin(clock, 5)
        assert changes == [True, False, True]
    finally:
        await reg.close()


class RecordingClock(ManualClock):
    """A manual clock that notes every sleep asked of it."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await super().sleep(seconds)


async def _retry_delays(seed: int) -> list[float]:
    """The delays between re-registration attempts while the store is unreachable."""
    clock = RecordingClock()
    meta = FlakyStore(clock=clock)

    def changed(registered: bool) -> None:
        if not registered:
            clock.sleeps.clear()  # from the loss on: only the back-off's sleeps

    reg = Registration(meta, "127.0.0.1:9", ttl_s=3, clock=clock, retry_s_max=2.0,
                       rng=random.Random(seed), on_change=changed)
    await reg.start()
    try:
        meta.unreachable = True  # the lease is lost after a whole TTL without keep-alives
        await spin(clock, 24, step_s=0.05)
        assert not reg.registered
    finally:
        await reg.close()
    return clock.sleeps


async def test_re_registration_backs_off_with_jitter_from_the_injected_rng() -> None:
    """Capped exponential back-off (asyncbk.backoff.Backoff), jittered by the rng the
    registration was given: the same seed retries at the same times."""
    a, b, other = await _retry_delays(7), await _retry_delays(7), await _retry_delays(8)
    assert a == b and a != other
    assert len(a) >= 8 and max(a) <= 2.0
    for k, delay in enumerate(a):
        nominal = min(2.0, 0.1 * 2 ** k)  # doubling from 0.1 s up to retry_s_max
        assert nominal / 2 <= delay <= nominal
