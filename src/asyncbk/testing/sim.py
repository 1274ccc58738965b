"""Deterministic simulation: virtual time, a simulated network and simulated disks.

The real client (:class:`~asyncbk.client.client.BookKeeper`, ledger handles,
recovery) and the real bookie request processor and registration run
unchanged on top of these parts:

* :class:`SimEventLoop`: an asyncio event loop whose clock is virtual.  When
  nothing is ready to run, time jumps to the next timer instead of waiting,
  so a run that spans minutes of timeouts takes milliseconds; when nothing is
  ready and no timer is set, the run is stuck and :class:`SimulationStalled`
  is raised (a deadlock is a finding, not a hang).
* :class:`SimNetwork`: TCP-like links (in order per direction, a latency per
  chunk drawn from the seeded RNG) plugged into the client through its
  connector seam; partitions hold traffic until healed; a crashed bookie's
  links are reset.
* :class:`SimBookie`: the real ``LedgerStorage`` (group-committed journal, entry
  logs, index, checkpoints, start-up recovery) over a
  :class:`~asyncbk.testing.simfs.SimFileSystem` per bookie, whose blocking calls
  run inline after a simulated delay (:class:`~asyncbk.testing.simfs.InlineOffload`)
  (with ``index_backend = "lmdb"``, the on-disk index on a
  :class:`~asyncbk.testing.simkv.SimKVStore` that crashes with it);
  a crash loses what was not fsynced (or, torn, keeps a random part of it) and the
  restart runs the real recovery; + the real request processor + lease
  registration in the shared in-memory metadata store (leases expire in virtual
  time).

Every random choice comes from one ``random.Random(seed)``, and nothing here
iterates a set or dict whose order depends on hashing of addresses, so a
seed replays the same run.  No threads are used anywhere in a simulated run
(their results would arrive at real, not virtual, times).
"""

from __future__ import annotations

import asyncio
import random
import selectors
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from ..bookie.processor import BookieState, RequestProcessor
from ..bookie.registration import Registration
from ..bookie.storage import LedgerStorage
from ..clock import LOOP_CLOCK
from ..config import BookieConfig
from ..meta.memory import MemoryMetadataState, MemoryMetadataStore
from ..net.server import BookieListener, ServerConnection
from ..types import BookieId
from .simfs import InlineOffload, SimFileSystem
from .simkv import SimKVStore

SIM_STORAGE_CONFIG: dict[str, Any] = {
    "journal_file_bytes_max": 16 * 1024,
    "entry_log_bytes_max": 16 * 1024,
    "entry_log_flush_bytes": 8 * 1024,
    "checkpoint_interval_s": 0.5,
}
"""Small files and frequent checkpoints, so that a run of a few hundred entries over
a few virtual seconds rotates journal files and entry logs, flushes, checkpoints and
trims the journal, and its crashes recover from all of those."""


class SimulationStalled(RuntimeError):
    """Nothing can run and no timer is pending: the simulated system is deadlocked."""


class _VirtualSelector(selectors.SelectSelector):
    def __init__(self) -> None:
        super().__init__()
        self.loop: SimEventLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        assert self.loop is not None
        if timeout is None:
            raise SimulationStalled("no task is runnable and no timer is pending")
        if timeout > 0:
            self.loop.advance(timeout)
        return []


class SimEventLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (see the module docstring)."""

    def __init__(self) -> None:
        self._now = 0.0
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


# --------------------------------------------------------------------------- network


class SimTransport(asyncio.Transport):
    def __init__(self, link: _Link, side: int) -> None:
        super().__init__()
        self._link = link
        self._side = side
        self._closing = False
        self.reading_paused = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closing:
            self._link.send(self._side, bytes(data))

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def close(self) -> None:
        self.abort()

    def abort(self) -> None:
        if not self._closing:
            self._link.reset(f"closed by side {self._side}")

    def is_closing(self) -> bool:
        return self._closing

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False
        self._link.deliver_held_for_reader(self._side)

    def is_reading(self) -> bool:
        return not self.reading_paused

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return (self._link.endpoints[1 - self._side], self._link.number)
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


class _Link:
    """One simulated TCP connection: side 0 is the client, side 1 the bookie."""

    def __init__(self, net: SimNetwork, number: int, client: str, bookie: BookieId,
                 protocols: tuple[asyncio.Protocol, asyncio.Protocol]) -> None:
        self.net = net
        self.number = number
        self.endpoints = (client, bookie)
        self.protocols = protocols
        self.transports = (SimTransport(self, 0), SimTransport(self, 1))
        self.alive = True
        self._last_at = [0.0, 0.0]           # last delivery time per direction (keeps order)
        self._held: list[list[bytes]] = [[], []]         # partitioned, by sender side
        self._unread: list[list[bytes]] = [[], []]       # arrived while reader paused, by reader

    def send(self, side: int, data: bytes) -> None:
        if not self.alive:
            return
        if self._held[side] or self.net.is_partitioned(*self.endpoints):
            self._held[side].append(data)
            return
        self._schedule(side, data)

    def _schedule(self, side: int, data: bytes) -> None:
        loop = self.net.loop
        at = max(loop.time() + self.net.latency_s(), self._last_at[side])
        self._last_at[side] = at
        loop.call_at(at, self._arrive, 1 - side, data)

    def _arrive(self, reader: int, data: bytes) -> None:
        if not self.alive:
            return
        if self.transports[reader].reading_paused or self._unread[reader]:
            self._unread[reader].append(data)
            return
        cast(Any, self.protocols[reader]).data_received(data)

    def deliver_held_for_reader(self, reader: int) -> None:
        while self.alive and self._unread[reader] and not self.transports[reader].reading_paused:
            cast(Any, self.protocols[reader]).data_received(self._unread[reader].pop(0))

    def heal(self) -> None:
        for side in (0, 1):
            held, self._held[side] = self._held[side], []
            for data in held:
                self._schedule(side, data)

    def reset(self, why: str) -> None:
        if not self.alive:
            return
        self.alive = False
        self.net.links.pop(self.number, None)
        for t in self.transports:
            t._closing = True
        loop = self.net.loop
        for p in self.protocols:
            loop.call_soon(p.connection_lost, ConnectionResetError(f"sim: {why}"))


class SimNetwork:
    def __init__(self, loop: SimEventLoop, rng: random.Random,
                 latency_s: tuple[float, float] = (0.00005, 0.001)) -> None:
        self.loop = loop
        self.rng = rng
        self._latency = latency_s
        self.bookies: dict[BookieId, SimBookie] = {}
        self.links: dict[int, _Link] = {}
        self._partitions: set[tuple[str, str]] = set()
        self._next_link = 0

    def latency_s(self) -> float:
        return self.rng.uniform(*self._latency)

    def is_partitioned(self, client: str, bookie: str) -> bool:
        return (client, bookie) in self._partitions

    def partition(self, client: str, bookie: str) -> None:
        self._partitions.add((client, bookie))

    def heal(self, client: str, bookie: str) -> None:
        self._partitions.discard((client, bookie))
        for link in list(self.links.values()):
            if link.endpoints == (client, bookie):
                link.heal()

    def heal_all(self) -> None:
        for client, bookie in sorted(self._partitions):
            self.heal(client, bookie)

    def reset_links(self, endpoint: str) -> None:
        for link in list(self.links.values()):
            if endpoint in link.endpoints:
                link.reset(f"{endpoint} went away")

    def connector(self, client: str) -> Callable[..., Any]:
        async def connect(bookie_id: BookieId, factory: Callable[[], asyncio.Protocol]) -> Any:
            await asyncio.sleep(self.latency_s())
            while self.is_partitioned(client, bookie_id):  # noqa: ASYNC110 - SYN retries
                await asyncio.sleep(0.05)  # SYNs retried until healed or the caller times out
            bookie = self.bookies.get(bookie_id)
            if bookie is None or not bookie.up:
                raise ConnectionRefusedError(f"sim: {bookie_id} is down")
            client_protocol = factory()
            server_protocol = bookie.new_connection()
            self._next_link += 1
            link = _Link(self, self._next_link, client, bookie_id,
                         (client_protocol, server_protocol))
            self.links[link.number] = link
            server_protocol.connection_made(link.transports[1])
            client_protocol.connection_made(link.transports[0])
            return link.transports[0], client_protocol

        return connect


# --------------------------------------------------------------------------- bookie


class SimBookie:
    """One bookie: the real :class:`LedgerStorage` (journal, entry logs, index,
    checkpoints, recovery) on its own :class:`SimFileSystem`, which survives its
    crashes; the real request processor; lease registration."""

    def __init__(self, bookie_id: BookieId, net: SimNetwork, meta_state: MemoryMetadataState,
                 config: BookieConfig, fsync_s: tuple[float, float] = (0.0001, 0.002)) -> None:
        self.id = bookie_id
        self.net = net
        self.meta_state = meta_state
        self.config = config
        self.fs = SimFileSystem(random.Random(net.rng.getrandbits(64)))
        self.offload = InlineOffload(self.fs.rng, fsync_s)
        self.kv = (SimKVStore(random.Random(net.rng.getrandbits(64)), self.fs)
                   if config.index_backend == "lmdb" else None)
        """The on-disk index's store (index_backend = "lmdb"): no real LMDB here."""
        """Every blocking call of the storage waits this long (virtual), then runs inline."""
        self.up = False
        self.storage: LedgerStorage | None = None
        self.processor: RequestProcessor | None = None
        self.listener: BookieListener | None = None
        self.registration: Registration | None = None
        self.restarts = 0

    async def start(self) -> None:
        root = Path("/") / self.id.replace(":", "_")
        self.storage = await LedgerStorage.open(
            root / "journal", root / "ledgers", self.config, log=_QUIET_LOG, clock=LOOP_CLOCK,
            io=self.fs.mount(), offload=self.offload,
            kv_open=self.kv.open if self.kv is not None else None)
        self.processor = RequestProcessor(self.storage, self.id, log=_QUIET_LOG)
        self.listener = BookieListener(self.processor, frame_bytes_max=self.config.frame_bytes_max,
                                       write_buffer_bytes_high=1 << 30, connections_max=10_000)
        processor = self.processor

        def on_change(registered: bool) -> None:
            processor.state = BookieState.WRITABLE if registered else BookieState.UNREGISTERED

        self.registration = Registration(
            MemoryMetadataStore(state=self.meta_state), self.id, self.config.lease_ttl_s,
            on_change=on_change, clock=LOOP_CLOCK)
        self.net.bookies[self.id] = self
        self.up = True
        await self.registration.start()

    def new_connection(self) -> ServerConnection:
        assert self.listener is not None
        return ServerConnection(self.listener)

    def stored_entries(self, ledger_id: int) -> set[int]:
        """The entry ids of ``ledger_id`` the storage holds (indexed, so readable)."""
        if self.storage is None:
            return set()
        return set(self.storage.entry_ids(ledger_id))

    async def crash(self, torn: bool) -> None:
        """SIGKILL and power cut: links reset; the disks lose what was not synced
        (``torn``: keep a random part of it); the lease is left to expire."""
        self.up = False
        self.net.reset_links(self.id)
        self.fs.crash(torn)
        if self.kv is not None:
            self.kv.crash()
        if self.registration is not None:
            await self.registration.abandon()
        if self.processor is not None:
            await self.processor.close()
        if self.storage is not None:
            # The process is gone: its storage's tasks end, its calls fail (dead mount).
            await self.storage.abort()

    async def restart(self) -> None:
        self.restarts += 1
        await self.start()

    async def stop(self) -> None:
        self.up = False
        self.net.reset_links(self.id)
        if self.registration is not None:
            await self.registration.close()
        if self.processor is not None:
            await self.processor.close()
        if self.storage is not None:
            await self.storage.close()


class QuietLog:
    """A logger that drops everything (structlog's cost per call adds up over seeds)."""

    def bind(self, **_kw: Any) -> QuietLog:
        return self

    def _drop(self, *_a: Any, **_kw: Any) -> None:
        return None

    debug = info = warning = error = exception = _drop


_QUIET_LOG = QuietLog()


__all__ = ["SimBookie", "SimEventLoop", "SimNetwork", "SimulationStalled"]


# --------------------------------------------------------------------------- cluster


class BlockableStore(MemoryMetadataStore):
    """A metadata store whose ledger updates can be held at a gate (to freeze an
    interleaving, as BookKeeper's mock tests do with a blocker future) and which
    records every ledger value written."""

    def __init__(self, history: list[Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._history = history
        self.gate: asyncio.Event | None = None
        self.gate_if: Callable[[Any], bool] = lambda md: True
        """Which updates the gate holds (all by default)."""
        self.waiting = asyncio.Event()

    async def create_ledger(self, md: Any) -> Any:
        out = await super().create_ledger(md)
        self._history.append(out)
        return out

    async def update_ledger(self, md: Any) -> Any:
        if self.gate is not None and self.gate_if(md):
            self.waiting.set()
            await self.gate.wait()
        out = await super().update_ledger(md)
        self._history.append(out)
        return out


class SimCluster:
    """Bookies, network and metadata for a simulated run (see the module docstring).

    Must be created and used inside a running :class:`SimEventLoop`.
    """

    def __init__(self, seed: int, bookies: int, *, bookie_config: BookieConfig | None = None,
                 latency_s: tuple[float, float] = (0.00005, 0.001)) -> None:
        loop = asyncio.get_running_loop()
        if not isinstance(loop, SimEventLoop):
            raise RuntimeError("SimCluster needs a SimEventLoop")
        self.rng = random.Random(seed)
        self.loop = loop
        self.state = MemoryMetadataState(clock=LOOP_CLOCK)
        self.net = SimNetwork(loop, self.rng, latency_s)
        self.history: list[Any] = []
        self.bookie_config = bookie_config or BookieConfig(
            lease_ttl_s=3, journal_queue_entries_max=4096, **SIM_STORAGE_CONFIG).validate()
        self.bookies = [SimBookie(f"b{i}:3181", self.net, self.state, self.bookie_config)
                        for i in range(bookies)]
        self.clients: list[Any] = []

    async def start(self) -> None:
        for b in self.bookies:
            await b.start()

    def client(self, name: str, config: Any = None) -> Any:
        """A BookKeeper client named ``name`` on the simulated network."""
        from ..client.client import BookKeeper  # testing may import client; kept local
        from ..config import ClientConfig

        cfg = config or ClientConfig(add_timeout_s=0.5, read_timeout_s=0.5,
                                     connect_timeout_s=0.3, reconnect_backoff_s_max=0.2)
        store = BlockableStore(self.history, state=self.state)
        bk = BookKeeper(store, cfg, connector=self.net.connector(name),
                        rng=random.Random(self.rng.getrandbits(64)))
        bk.bookies.start()
        self.clients.append(bk)
        return bk

    def bookie(self, bookie_id: BookieId) -> SimBookie:
        return next(b for b in self.bookies if b.id == bookie_id)

    async def stop(self) -> None:
        for bk in self.clients:
            await bk.close()
        for b in self.bookies:
            await b.stop()


def run_sim(coro_fn: Callable[[], Any]) -> Any:
    """Run ``coro_fn()`` to completion on a fresh SimEventLoop (for tests)."""
    loop = SimEventLoop()
    try:
        return loop.run_until_complete(coro_fn())
    finally:
        loop.close()
