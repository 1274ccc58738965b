"""``asyncbk.BookKeeper``: the ledger client with namespaces and streams."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

from ..client.client import BookKeeper as LedgerClient
from ..clock import LOOP_CLOCK, Clock
from ..errors import NamespaceExistsError
from .meta import StreamConfig, StreamMetadata, check_namespace_name, config_from
from .namespace import Namespace
from .stats import StreamStats


class BookKeeper(LedgerClient):
    """A connected client: ledgers (see :class:`asyncbk.client.client.BookKeeper`) and
    streams grouped in namespaces.  ``await asyncbk.BookKeeper.connect(uri)``."""

    def __init__(self, *args: Any, rng: random.Random | None = None,
                 clock: Clock = LOOP_CLOCK, **kwargs: Any) -> None:
        super().__init__(*args, rng=rng, **kwargs)
        self.stream_stats = StreamStats()
        self.stream_rng = rng if rng is not None else random.Random()
        """The random generator its streams draw from (back-off jitter): ``rng`` (a
        seeded one in the simulator), else a fresh one."""
        self.stream_clock = clock
        """The clock of its streams: record times, segment times, retention, ack
        intervals (the simulator's virtual one there)."""

    async def namespace(self, name: str, create: bool = False, **defaults: Any) -> Namespace:
        """The namespace ``name``; with ``create=True`` it is created (with ``defaults``:
        ledger shape, rolling, retention, placement: see :class:`StreamConfig`) if
        absent.  NoSuchNamespaceError otherwise."""
        check_namespace_name(name)
        md = StreamMetadata(self.meta)
        if create:
            config = config_from(defaults, source=f"namespace {name!r}")
            try:
                await md.create_namespace(name, config, int(self.stream_clock.wall_s() * 1000))
            except NamespaceExistsError:
                pass
        elif defaults:
            raise TypeError("namespace defaults are only taken with create=True")
        return Namespace(self, name, await md.namespace_config(name), self.stream_stats,
                         self.stream_clock, rng=self.stream_rng)

    async def list_namespaces(self) -> AsyncIterator[str]:
        for name in await StreamMetadata(self.meta).list_namespaces():
            yield name

    async def delete_namespace(self, name: str, force: bool = False) -> None:
        """Delete a namespace: only when it holds no stream, unless ``force`` (which
        deletes its streams first)."""
        ns = await self.namespace(name)
        await ns.delete(force=force)


__all__ = ["BookKeeper", "StreamConfig"]
