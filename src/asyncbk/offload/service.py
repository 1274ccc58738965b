"""The offloader as a long-running service: beside a bookie (``asyncbk bookie
--offload-object-store``) or on its own (``asyncbk offload``).  Any number may run;
a pass is made only by the one holding the ``offloader`` lock (bound to its etcd
lease, so a dead holder frees it within the lease's TTL), so two never copy the
same segment at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ..autorecovery.service import LeaseKeeper
from ..clock import SYSTEM_CLOCK, Clock
from ..errors import BKError
from ..log import get_logger
from ..meta.keys import OFFLOADER_LOCK
from ..stream.context import LedgerClient
from ..tiered.store import ObjectStore
from .offloader import Offloader, OffloaderOptions, PassReport, StepHook

LEASE_TTL_S = 15


class OffloadService:
    """Passes every ``interval_s`` while this process holds the offloader lock (see the
    module docstring).  ``start()`` checks the store first: wrong credentials, a
    missing bucket or an unreachable endpoint fail it with one clear error."""

    def __init__(self, client: LedgerClient, store: ObjectStore, options: OffloaderOptions,
                 interval_s: float, owner: str, *, namespaces: Sequence[str] | None = None,
                 owns_client: bool = False, clock: Clock = SYSTEM_CLOCK,
                 progress: Callable[[str], None] | None = None,
                 step_hook: StepHook | None = None,
                 on_pass: Callable[[PassReport], Any] | None = None) -> None:
        self.client = client
        self.store = store
        self.offloader = Offloader(client, store, options, progress=progress,
                                   step_hook=step_hook)
        self.interval_s = interval_s
        self.owner = owner
        self.namespaces = namespaces
        self._owns_client = owns_client
        self._clock = clock
        self._on_pass = on_pass
        self._log = get_logger(component="offloader", owner=owner)
        self._keeper = LeaseKeeper(client.meta, LEASE_TTL_S, self._log, clock=clock)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.passes = 0

    async def start(self) -> None:
        await self.store.check()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._keeper.run()), loop.create_task(self._run())]

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                async with asyncio.timeout(self.interval_s):
                    lease = await self._keeper.ready()
                holder = await self.client.meta.acquire_lock(OFFLOADER_LOCK, self.owner, lease)
                if holder == self.owner:
                    report = await self.offloader.run_pass(self.namespaces)
                    self.passes += 1
                    if self._on_pass is not None:
                        self._on_pass(report)
            except (BKError, OSError, TimeoutError) as exc:
                self._log.warning("offload pass failed; trying again later", error=str(exc))
            try:
                async with asyncio.timeout(self.interval_s):
                    await self._stop.wait()
            except TimeoutError:
                pass

    async def close(self) -> None:
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._keeper.lease_id is not None:
            try:
                await self.client.meta.revoke_lease(self._keeper.lease_id)
            except BKError:
                pass
        if self._owns_client:
            await self.client.close()  # type: ignore[attr-defined]
