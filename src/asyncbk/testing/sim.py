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
* :class:`SimStorage` over a :class:`SimDisk`: the ``LedgerStorage`` interface
  with group commit; a record is durable (and its add acknowledged) only when
  its simulated fsync completes; a crash loses what was not fsynced, or with a
  torn write keeps a random prefix of the batch being written.
* :class:`SimBookie`: processor + storage + lease registration in the shared
  in-memory metadata store (leases expire in virtual time).

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
from dataclasses import dataclass, field
from typing import Any, cast

from ..bookie.processor import BookieState, RequestProcessor
from ..bookie.registration import Registration
from ..bookie.storage import LedgerInfo
from ..clock import LOOP_CLOCK
from ..config import BookieConfig
from ..errors import NoSuchEntryError, NoSuchLedgerError, TooManyRequestsError
from ..meta.memory import MemoryMetadataState, MemoryMetadataStore
from ..net.server import BookieListener, ServerConnection
from ..types import BookieId


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


# --------------------------------------------------------------------------- disk


@dataclass
class _DurableLedger:
    master_key: bytes
    fenced: bool = False
    lac: int = -1
    explicit_lac: int = -1
    entries: dict[int, bytes] = field(default_factory=dict)


class SimDisk:
    """What a bookie's disks hold: survives crashes (unlike SimStorage)."""

    def __init__(self) -> None:
        self.ledgers: dict[int, _DurableLedger] = {}


class SimStorage:
    """``LedgerStorage`` in memory with group commit over a :class:`SimDisk`."""

    def __init__(self, disk: SimDisk, config: BookieConfig, rng: random.Random,
                 fsync_s: tuple[float, float] = (0.0001, 0.002)) -> None:
        self.disk = disk
        self._config = config
        self._rng = rng
        self._fsync_s = fsync_s
        self._loop = asyncio.get_running_loop()
        self._info: dict[int, LedgerInfo] = {}
        for lid, d in disk.ledgers.items():
            self._info[lid] = LedgerInfo(d.master_key, d.fenced, max(d.lac, d.explicit_lac),
                                         max(d.entries, default=-1))
        self._queue: list[tuple[Any, ...]] = []
        self._in_flight: list[tuple[Any, ...]] = []
        self._space = asyncio.Event()
        self._space.set()
        self.dead = False

    @property
    def config(self) -> BookieConfig:
        return self._config

    def ledger(self, ledger_id: int) -> LedgerInfo | None:
        return self._info.get(ledger_id)

    def is_deleted(self, ledger_id: int) -> bool:
        return False  # the simulator never garbage collects

    def _register(self, ledger_id: int, master_key: bytes) -> LedgerInfo:
        info = self._info.get(ledger_id)
        if info is None:
            info = self._info[ledger_id] = LedgerInfo(master_key)
        return info

    def _enqueue(self, op: tuple[Any, ...]) -> asyncio.Future[None]:
        if len(self._queue) >= self._config.journal_queue_entries_max:
            raise TooManyRequestsError("sim journal queue full")
        fut: asyncio.Future[None] = self._loop.create_future()
        self._queue.append((*op, fut))
        if len(self._queue) >= self._config.journal_queue_entries_max * 3 // 4:
            self._space.clear()
        if not self._in_flight:
            self._start_fsync()
        return fut

    def _start_fsync(self) -> None:
        self._in_flight, self._queue = self._queue, []
        self._loop.call_later(self._rng.uniform(*self._fsync_s), self._fsync_done)

    def _apply(self, op: tuple[Any, ...]) -> None:
        kind, ledger_id = op[0], op[1]
        info = self._info[ledger_id]
        d = self.disk.ledgers.get(ledger_id)
        if d is None:
            d = self.disk.ledgers[ledger_id] = _DurableLedger(info.master_key)
        if kind == "add":
            d.entries[op[2]] = op[3]
        elif kind == "fence":
            d.fenced = True
        elif kind == "lac":
            d.explicit_lac = max(d.explicit_lac, op[2])
        d.lac = max(d.lac, info.lac)

    def _fsync_done(self) -> None:
        if self.dead:
            return
        batch, self._in_flight = self._in_flight, []
        for op in batch:
            self._apply(op)
            if op[0] == "add":
                info = self._info[op[1]]
                info.last_entry_id = max(info.last_entry_id, op[2])
        for op in batch:
            fut = op[-1]
            if not fut.done():
                fut.set_result(None)
        if len(self._queue) < self._config.journal_queue_entries_max * 3 // 4:
            self._space.set()
        if self._queue:
            self._start_fsync()

    def crash(self, torn: bool) -> None:
        """The process dies: unsynced records are lost; a torn write keeps a prefix
        of the batch that was being written (never acknowledged)."""
        self.dead = True
        if torn and self._in_flight:
            keep = self._rng.randrange(len(self._in_flight) + 1)
            for op in self._in_flight[:keep]:
                self._apply(op)
        self._in_flight, self._queue = [], []

    # --- the LedgerStorage interface ------------------------------------------

    def add_entry(self, ledger_id: int, entry_id: int, master_key: bytes,
                  body: bytes) -> asyncio.Future[None]:
        self._register(ledger_id, master_key)
        return self._enqueue(("add", ledger_id, entry_id, body))

    def fence(self, ledger_id: int, master_key: bytes) -> asyncio.Future[None]:
        self._register(ledger_id, master_key).fenced = True
        return self._enqueue(("fence", ledger_id))

    def update_lac(self, ledger_id: int, lac: int) -> bool:
        info = self._info[ledger_id]
        if lac > info.lac:
            info.lac = lac
            return True
        return False

    def write_explicit_lac(self, ledger_id: int, lac: int) -> asyncio.Future[None]:
        return self._enqueue(("lac", ledger_id, lac))

    async def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        await asyncio.sleep(self._rng.uniform(0, 0.0005))
        d = self.disk.ledgers.get(ledger_id)
        info = self._info.get(ledger_id)
        if info is None:
            raise NoSuchLedgerError(str(ledger_id))
        if entry_id == -1:
            entry_id = info.last_entry_id
        body = d.entries.get(entry_id) if d is not None else None
        if body is None:
            raise NoSuchEntryError(f"{ledger_id}:{entry_id}")
        return body

    async def read_entries(self, ledger_id: int, first: int, count_max: int,
                           bytes_max: int) -> list[bytes]:
        out = [await self.read_entry(ledger_id, first)]
        d = self.disk.ledgers.get(ledger_id)
        size = len(out[0])
        for entry_id in range(first + 1, first + count_max):
            body = d.entries.get(entry_id) if d is not None else None
            if body is None or size + len(body) > bytes_max:
                break
            out.append(body)
            size += len(body)
        return out

    @property
    def journal_queue_entries(self) -> int:
        return len(self._queue)

    @property
    def journal_failed(self) -> bool:
        return False

    async def wait_for_queue_space(self) -> None:
        await self._space.wait()

    def disk_usage(self) -> tuple[int, int]:
        return 50 << 30, 100 << 30

    def statistics(self) -> dict[str, Any]:
        return {"queue": len(self._queue)}

    async def close(self) -> None:
        self.dead = True


# --------------------------------------------------------------------------- bookie


class SimBookie:
    def __init__(self, bookie_id: BookieId, net: SimNetwork, meta_state: MemoryMetadataState,
                 config: BookieConfig) -> None:
        self.id = bookie_id
        self.net = net
        self.meta_state = meta_state
        self.config = config
        self.disk = SimDisk()
        self.up = False
        self.storage: SimStorage | None = None
        self.processor: RequestProcessor | None = None
        self.listener: BookieListener | None = None
        self.registration: Registration | None = None
        self.restarts = 0

    async def start(self) -> None:
        self.storage = SimStorage(self.disk, self.config, self.net.rng)
        self.processor = RequestProcessor(self.storage, self.id)
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

    async def crash(self, torn: bool) -> None:
        """SIGKILL: links reset, unsynced data lost, lease left to expire."""
        self.up = False
        self.net.reset_links(self.id)
        if self.storage is not None:
            self.storage.crash(torn)
        if self.registration is not None:
            await self.registration.abandon()
        if self.processor is not None:
            await self.processor.close()

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


__all__ = ["SimBookie", "SimDisk", "SimEventLoop", "SimNetwork", "SimStorage",
           "SimulationStalled"]


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
            lease_ttl_s=3, journal_queue_entries_max=4096).validate()
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
