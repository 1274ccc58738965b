"""The client's live view of registered bookies (:class:`BookieWatcher`)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from ..meta.api import BookieRegistration, MetadataStore
from ..topology import LOCATION_KEY, resolve_locations
from ..types import BookieId

WRITABLE_STATE = "writable"
"""The state a bookie reports in BOOKIE_INFO when it takes adds."""


class BookieWatcher:
    """The live view of registered bookies, kept by a watch on the metadata store.

    ``on_registered(bookie, session)`` is called for each registration the watch
    delivers that is new (a bookie that appeared, or registered anew after a restart
    or a lost lease).  ``static_locations`` (bookie id -> ``/region/rack``) win over
    the locations bookies registered (:meth:`locations`)."""

    def __init__(self, meta: MetadataStore,
                 on_registered: Callable[[BookieId, Any], None] = lambda b, s: None,
                 static_locations: Mapping[BookieId, str] | None = None) -> None:
        self._meta = meta
        self._on_registered = on_registered
        self._static_locations = dict(static_locations or {})
        self._locations: dict[BookieId, str] | None = None
        self._listed: dict[BookieId, BookieRegistration] = {}
        self._view: dict[BookieId, BookieRegistration] | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        async for view in self._meta.watch_bookies():
            before = self._view or {}
            self._view = view
            self._locations = None
            for bookie, reg in view.items():
                old = before.get(bookie)
                if old is None or old.session != reg.session:
                    self._on_registered(bookie, reg.session)
            self._changed.set()
            self._changed = asyncio.Event()

    def session(self, bookie: BookieId) -> Any:
        """The bookie's current registration (None if not registered or not known yet)."""
        reg = (self._view or {}).get(bookie)
        return reg.session if reg is not None else None

    async def writable(self, timeout_s: float) -> list[BookieId]:
        if self._view is None:
            # Not yet delivered by the watch: ask directly.
            async with asyncio.timeout(timeout_s):
                view = await self._meta.list_bookies()
            self._listed = view
            self._locations = None
        else:
            view = self._view
        return sorted(b for b, reg in view.items() if not reg.readonly)

    def locations(self) -> dict[BookieId, str]:
        """Normalized network locations of the bookies known (registered ones from the
        registry, the static mapping winning); bookies absent are in the default
        location.  Kept until the registry changes: do not modify."""
        if self._locations is None:
            view = self._view if self._view is not None else self._listed
            registered = {b: str(reg.info.get(LOCATION_KEY, "")) for b, reg in view.items()}
            self._locations = resolve_locations(registered, self._static_locations)
        return self._locations

    async def wait_for_change(self, timeout_s: float) -> None:
        """Return when the registry changes next, or after ``timeout_s``."""
        with contextlib.suppress(builtins.TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._changed.wait()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None
