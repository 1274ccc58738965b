"""The time source.  Components take a Clock so that tests and the simulator
can run them on virtual time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def monotonic_s(self) -> float: ...

    def wall_s(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Real time: ``time.monotonic`` / ``time.time`` / ``asyncio.sleep``."""

    def monotonic_s(self) -> float:
        return time.monotonic()

    def wall_s(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class LoopClock:
    """The running event loop's clock.  Under a real loop this is ``time.monotonic``;
    under the simulator's virtual-time loop it is virtual time, so timeouts,
    ``call_later`` and this clock always agree."""

    def monotonic_s(self) -> float:
        return asyncio.get_running_loop().time()

    def wall_s(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def loop_timer(clock: Clock, loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """``clock.monotonic_s`` for code that runs on ``loop`` and asks the time per
    entry: for the loop's clock, ``loop.time`` itself (``LoopClock`` asks
    ``asyncio.get_running_loop()`` each time, which before Python 3.12 makes a
    ``getpid`` system call); any other clock as it is."""
    return loop.time if type(clock) is LoopClock else clock.monotonic_s


class ManualClock:
    """A clock moved by hand (unit tests): sleeping waits until ``advance``."""

    def __init__(self, start_s: float = 1_000.0) -> None:
        self._now_s = start_s
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def monotonic_s(self) -> float:
        return self._now_s

    def wall_s(self) -> float:
        return self._now_s

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._now_s + max(0.0, seconds), fut))
        await fut

    def advance(self, seconds: float) -> None:
        self._now_s += seconds
        due = [s for s in self._sleepers if s[0] <= self._now_s]
        self._sleepers = [s for s in self._sleepers if s[0] > self._now_s]
        for _, fut in due:
            if not fut.done():
                fut.set_result(None)


SYSTEM_CLOCK = SystemClock()
LOOP_CLOCK = LoopClock()


class RateLimiter:
    """A token bucket of ``rate_per_s`` units a second (entries, bytes...); 0 means no
    limit.  ``await acquire(n)`` takes ``n`` units; a request larger than what is in
    the bucket runs at once and is paid back by sleeping, so a large chunk (4 MiB
    read by compaction) is paced instead of refused.  Time (refill and the sleeps)
    comes from ``clock``; the bucket starts full at the first ``acquire``."""

    def __init__(self, rate_per_s: float, burst: float | None = None, *,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.rate = rate_per_s
        self.burst = burst if burst is not None else max(1.0, rate_per_s / 10)
        self.clock = clock
        self._tokens = self.burst
        self._last: float | None = None

    async def acquire(self, amount: float = 1.0) -> None:
        if self.rate <= 0:
            return
        now = self.clock.monotonic_s()
        if self._last is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= amount
        if self._tokens < 0:
            await self.clock.sleep(-self._tokens / self.rate)
