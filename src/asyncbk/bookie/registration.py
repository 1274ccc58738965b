"""The bookie's registration in the metadata store, kept alive by a lease.

The bookie registers under a lease of ``ttl_s`` seconds and refreshes it every
``ttl_s / 3``.  If it dies, the lease expires and the registration disappears,
which is how clients and auto-recovery learn that it is gone.

If a refresh says the lease is gone, or no refresh has succeeded for a whole
TTL (the store is unreachable, so the lease has certainly expired there), the
bookie reports itself unregistered (it stops taking adds) and tries to
register again with capped exponential back-off (:class:`~asyncbk.backoff.Backoff`,
jittered from the injected ``rng``, so a simulated run replays from its seed); once
it succeeds it is writable again.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from ..backoff import Backoff
from ..clock import SYSTEM_CLOCK, Clock
from ..errors import BKError
from ..log import get_logger
from ..meta.api import SESSION_KEY, BookieRegistration, BookieRegistry

RETRY_S_FIRST = 0.1
"""The first delay before registering again after the lease was lost (it doubles at
each failure, up to ``retry_s_max``, jittered)."""


class Registration:
    def __init__(
        self,
        meta: BookieRegistry,
        bookie_id: str,
        ttl_s: int,
        *,
        info: dict[str, Any] | None = None,
        on_change: Callable[[bool], None] = lambda registered: None,
        retry_s_max: float = 5.0,
        clock: Clock = SYSTEM_CLOCK,
        log: Any = None,
        rng: random.Random | None = None,
    ) -> None:
        self._meta = meta
        self.bookie_id = bookie_id
        self._ttl_s = ttl_s
        self._info = dict(info or {})
        self._on_change = on_change
        self._retry_s_max = retry_s_max
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._log = log or get_logger(bookie_id=bookie_id)
        self.readonly = False
        self.lease_id: int | None = None
        self.registered = False
        self._task: asyncio.Task[None] | None = None
        self.lease_losses = 0

    async def start(self) -> None:
        """Register once (raising if the store refuses), then keep it alive in the background."""
        await self._register()
        self._task = asyncio.get_running_loop().create_task(self._keepalive_loop())

    async def set_readonly(self, readonly: bool) -> None:
        self.readonly = readonly
        if self.lease_id is not None:
            await self._meta.register_bookie(self._registration(self.lease_id), self.lease_id)

    def _registration(self, lease_id: int) -> BookieRegistration:
        # The lease id tells clients this is a new registration (a restart, or a
        # re-registration after a lost lease), even when nothing else changed: a
        # client lets a bookie it had quarantined back in at once.
        return BookieRegistration(self.bookie_id, self.readonly,
                                  {**self._info, SESSION_KEY: lease_id})

    async def _register(self) -> None:
        lease_id = await self._meta.grant_lease(self._ttl_s)
        await self._meta.register_bookie(self._registration(lease_id), lease_id)
        self.lease_id = lease_id
        self._set_registered(True)
        self._log.info("registered", lease_id=lease_id, ttl_s=self._ttl_s, readonly=self.readonly)

    def _set_registered(self, registered: bool) -> None:
        if registered != self.registered:
            self.registered = registered
            self._on_change(registered)

    async def _keepalive_loop(self) -> None:
        interval_s = self._ttl_s / 3
        last_ok_s = self._clock.monotonic_s()
        backoff = Backoff(min(RETRY_S_FIRST, self._retry_s_max), self._retry_s_max,
                          jitter=0.5, rng=self._rng)
        while True:
            await self._clock.sleep(interval_s if self.registered else backoff.next_s())
            if self.registered and self.lease_id is not None:
                # A keep-alive that hangs (etcd unreachable, packets dropped) must not
                # outlast the lease: past last_ok + TTL the lease may be gone already.
                remaining_s = last_ok_s + self._ttl_s - self._clock.monotonic_s()
                try:
                    ttl_left = await self._keepalive_within(self.lease_id, remaining_s)
                except BKError as exc:
                    self._log.warning("lease keep-alive failed", error=str(exc))
                    if self._clock.monotonic_s() - last_ok_s >= self._ttl_s:
                        self._lost("no keep-alive succeeded for a whole TTL")
                    continue
                if ttl_left is None:
                    self._lost("no keep-alive succeeded for a whole TTL (no answer)")
                    continue
                if ttl_left <= 0:
                    self._lost("the lease expired")
                    continue
                last_ok_s = self._clock.monotonic_s()
                backoff.reset()
            else:
                try:
                    await self._register()
                    last_ok_s = self._clock.monotonic_s()
                    backoff.reset()
                except BKError as exc:
                    self._log.warning("re-registration failed", error=str(exc),
                                      retry_in_s_max=round(backoff.peek_s(), 2))

    async def _keepalive_within(self, lease_id: int, limit_s: float) -> int | None:
        """The keep-alive's answer (the TTL left), or None if none came within
        ``limit_s`` of the clock; raises its error."""
        call = asyncio.ensure_future(self._meta.keepalive_lease(lease_id))
        timer = asyncio.ensure_future(self._clock.sleep(max(0.0, limit_s)))
        try:
            await asyncio.wait({call, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (call, timer):
                task.cancel()
            await asyncio.wait({call, timer})
        if call.cancelled():
            return None
        return call.result()

    def _lost(self, why: str) -> None:
        self.lease_losses += 1
        self.lease_id = None
        self._log.warning("registration lost; refusing adds until registered again", reason=why)
        self._set_registered(False)

    async def abandon(self) -> None:
        """Stop refreshing without revoking: what a crash does (the lease expires)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None
        self.lease_id = None

    async def close(self) -> None:
        """Stop refreshing and revoke the lease (the registration disappears at once)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None
        if self.lease_id is not None:
            try:
                await self._meta.revoke_lease(self.lease_id)
            except BKError as exc:
                self._log.warning("could not revoke lease; it will expire", error=str(exc))
            self.lease_id = None
        self._set_registered(False)
