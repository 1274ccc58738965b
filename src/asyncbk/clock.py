"""The time source.  Components take a Clock so that tests and the simulator
can run them on virtual time."""

from __future__ import annotations

import asyncio
import time
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
