"""Deterministic simulation: virtual time, a simulated network and simulated disks.

The real client (:class:`~asyncbk.client.client.BookKeeper`, ledger handles,
recovery) and the real bookie run unchanged on top of these parts:

* :class:`SimEventLoop`: an asyncio event loop whose clock is virtual.  When
  nothing is ready to run, time jumps to the next timer instead of waiting,
  so a run that spans minutes of timeouts takes milliseconds; when nothing is
  ready and no timer is set, the run is stuck and :class:`SimulationStalled`
  is raised (a deadlock is a finding, not a hang).  :data:`SIM_CLOCK` is its
  clock, wall time included (a fixed epoch plus virtual time), for every part.
* :class:`SimNetwork`: TCP-like links (in order per direction, a latency per
  chunk drawn from the seeded RNG) plugged into the client through its
  connector seam and into the bookie through its network seam
  (:class:`~asyncbk.bookie.startup.BookieNetwork`: port checks, listening);
  partitions hold traffic until healed; a crashed bookie's links are reset.
* :class:`SimBookie`: the bookie's real composition root,
  :class:`~asyncbk.bookie.server.BookieServer`, started over a
  :class:`~asyncbk.testing.simfs.SimFileSystem` per bookie (its file seam, disk
  probe and directory lock), whose blocking calls run inline after a simulated
  delay (:class:`~asyncbk.testing.simfs.InlineOffload`), on the shared in-memory
  metadata store (leases expire in virtual time): the port and namesake checks,
  the directory lock, the cookie, one or several ledger directories (with
  ``index_backend = "lmdb"``, each one's index on a
  :class:`~asyncbk.testing.simkv.SimKVStore` that crashes with it), the request
  processor, lease registration, the disk watch switching read-only and back,
  garbage collection and compaction.  A crash loses what was not fsynced (or,
  torn, keeps a random part of it) and the restart runs the real recovery.
* :meth:`SimCluster.start_autorecovery`: an auto-recovery process (auditor and
  replication worker) with a client of its own.

Every random choice comes from one ``random.Random(seed)`` (each bookie, client
and worker gets its own generator drawn from it), and nothing here iterates a set
or dict whose order depends on hashing of addresses, so a seed replays the same
run.  No threads are used anywhere in a simulated run (their results would arrive
at real, not virtual, times).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import selectors
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from ..bookie.context import BookieContext
from ..bookie.processor import RequestProcessor
from ..bookie.registration import Registration
from ..bookie.server import BookieServer
from ..bookie.startup import Acceptor
from ..bookie.state import BookieState, Change
from ..bookie.storage import LedgerStorage, MultiDirStorage
from ..bookie.storage.api import Storage
from ..clock import LoopClock
from ..config import BookieConfig
from ..meta.api import MetadataStore
from ..meta.memory import MemoryMetadataState, MemoryMetadataStore
from ..net.server import BookieListener, ServerConnection
from ..types import BookieId
from .simfs import InlineOffload, SimFileSystem
from .simkv import SimKV, SimKVStore

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


SIM_BOOKIE_CONFIG: dict[str, Any] = {
    **SIM_STORAGE_CONFIG,
    "lease_ttl_s": 3,
    "journal_queue_entries_max": 4096,
    "disk_check_interval_s": 0.2,
    "gc_interval_s": 1.0,
    "minor_compaction_interval_s": 2.0,
    "major_compaction_interval_s": 6.0,
    "compaction_rate_bytes_per_s": 0.0,
    "gc_tombstone_s": 60.0,
    "drain_timeout_s": 2.0,
    "register_retry_s_max": 1.0,
}
"""A simulated cluster's bookies: :data:`SIM_STORAGE_CONFIG`, and the disk watch, garbage
collection and compaction every few virtual seconds, so that a run exercises them."""

SIM_EPOCH_S = 1_700_000_000.0
"""The simulated wall clock's time at virtual time 0."""


class SimClock(LoopClock):
    """The clock of a simulated run: the loop's virtual time, and a wall clock that
    moves with it (from :data:`SIM_EPOCH_S`), so that tombstone ages, under-replication
    marks and lease expiry all follow virtual time."""

    def wall_s(self) -> float:
        return SIM_EPOCH_S + asyncio.get_running_loop().time()


SIM_CLOCK = SimClock()


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

    def mark_closed(self) -> None:
        """Its link went down: later writes are dropped."""
        self._closing = True

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
            t.mark_closed()
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
        self.listeners: dict[BookieId, BookieListener] = {}
        """What listens at each bookie address (the bookies' network seam fills it)."""
        self.links: dict[int, _Link] = {}
        self._partitions: set[tuple[str, str]] = set()
        self._next_link = 0
        self.bookie_network = SimBookieNetwork(self)
        """The bookies' :class:`~asyncbk.bookie.startup.BookieNetwork`."""

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

    def unplug(self, bookie_id: BookieId) -> None:
        """The bookie's process is gone: nothing listens at its address any more and
        its connections are reset."""
        self.listeners.pop(bookie_id, None)
        self.reset_links(bookie_id)

    def connector(self, client: str) -> Callable[..., Any]:
        async def connect(bookie_id: BookieId, factory: Callable[[], asyncio.Protocol]) -> Any:
            await asyncio.sleep(self.latency_s())
            while self.is_partitioned(client, bookie_id):  # noqa: ASYNC110 - SYN retries
                await asyncio.sleep(0.05)  # SYNs retried until healed or the caller times out
            listener = self.listeners.get(bookie_id)
            if listener is None:
                raise ConnectionRefusedError(f"sim: {bookie_id} is down")
            client_protocol = factory()
            server_protocol = ServerConnection(listener)
            self._next_link += 1
            link = _Link(self, self._next_link, client, bookie_id,
                         (client_protocol, server_protocol))
            self.links[link.number] = link
            server_protocol.connection_made(link.transports[1])
            client_protocol.connection_made(link.transports[0])
            return link.transports[0], client_protocol

        return connect


class _SimAcceptor:
    def __init__(self, net: SimNetwork, bookie_id: BookieId, listener: BookieListener) -> None:
        self._net = net
        self._id = bookie_id
        self._listener = listener

    async def stop_accepting(self) -> None:
        if self._net.listeners.get(self._id) is self._listener:
            del self._net.listeners[self._id]


class SimBookieNetwork:
    """The bookies' network seam on a :class:`SimNetwork`: an address is taken while a
    bookie listens there."""

    def __init__(self, net: SimNetwork) -> None:
        self._net = net

    async def port_free(self, host: str, port: int) -> bool:
        return f"{host}:{port}" not in self._net.listeners

    async def port_in_use_message(self, port: int, option: str) -> str:
        return f"port {port} is in use (by another simulated bookie), choose another {option}"

    async def answers(self, host: str, port: int, timeout_s: float) -> bool:
        await asyncio.sleep(min(timeout_s, self._net.latency_s()))
        return f"{host}:{port}" in self._net.listeners

    async def listen(self, listener: BookieListener, host: str, port: int) -> Acceptor:
        bookie_id = f"{host}:{port}"
        if bookie_id in self._net.listeners:
            raise OSError(f"sim: {bookie_id} is in use")
        self._net.listeners[bookie_id] = listener
        return _SimAcceptor(self._net, bookie_id, listener)


# --------------------------------------------------------------------------- bookie


class SimKVStores:
    """The on-disk index stores of one bookie's ledger directories (``index_backend =
    "lmdb"``), one :class:`SimKVStore` per directory; they survive its crashes."""

    def __init__(self, rng: random.Random, fs: SimFileSystem) -> None:
        self._rng = rng
        self._fs = fs
        self.stores: dict[str, SimKVStore] = {}

    def open(self, path: Path) -> SimKV:
        store = self.stores.get(str(path))
        if store is None:
            store = self.stores[str(path)] = SimKVStore(
                random.Random(self._rng.getrandbits(64)), self._fs)
        return store.open(path)

    def crash(self) -> None:
        for _, store in sorted(self.stores.items()):
            store.crash()


class SimBookie:
    """One bookie: the real :class:`~asyncbk.bookie.server.BookieServer` on its own
    :class:`SimFileSystem`, which survives its crashes, on the simulated network and
    the shared in-memory metadata store (module docstring).  ``ledger_dirs``: how many
    ledger directories it has (one journal directory)."""

    def __init__(self, bookie_id: BookieId, net: SimNetwork, meta_state: MemoryMetadataState,
                 config: BookieConfig, fsync_s: tuple[float, float] = (0.0001, 0.002), *,
                 ledger_dirs: int = 1,
                 on_state_change: Callable[[str, Change], None] | None = None) -> None:
        self.id = bookie_id
        self.net = net
        self.meta_state = meta_state
        host, _, port = bookie_id.rpartition(":")
        root = Path("/") / bookie_id.replace(":", "_")
        ledgers = [root / "ledgers"] + [root / f"ledgers{i}" for i in range(1, ledger_dirs)]
        self.config = dataclasses.replace(
            config, metadata_uri="memory://sim", host=host, port=int(port),
            advertised_host="", journal_dir=str(root / "journal"),
            ledger_dir=",".join(str(d) for d in ledgers), http_enabled=False)
        self.fs = SimFileSystem(random.Random(net.rng.getrandbits(64)))
        self.offload = InlineOffload(self.fs.rng, fsync_s)
        """Every blocking call of the bookie waits this long (virtual), then runs inline."""
        self.kv = (SimKVStores(random.Random(net.rng.getrandbits(64)), self.fs)
                   if config.index_backend == "lmdb" else None)
        """The on-disk indexes (index_backend = "lmdb"): no real LMDB here."""
        self.rng = random.Random(net.rng.getrandbits(64))
        """The bookie's randomness (registration back-off)."""
        self._on_state_change = on_state_change
        self.server: BookieServer | None = None
        self.up = False
        self.starting = False
        """A process of this bookie is starting (:meth:`start` under way)."""
        self.lost = False
        """Gone for good (:meth:`lose`): its disks are no longer counted."""
        self.restarts = 0
        net.bookies[bookie_id] = self

    @property
    def ledger_dirs(self) -> list[Path]:
        return [Path(d) for d in self.config.ledger_dirs]

    @property
    def processor(self) -> RequestProcessor | None:
        return self.server.processor if self.server is not None else None

    @property
    def storage(self) -> Storage | None:
        return self.server.storage if self.server is not None else None

    @property
    def registration(self) -> Registration | None:
        return self.server.registration if self.server is not None else None

    @property
    def listener(self) -> BookieListener | None:
        return self.server.listener if self.server is not None else None

    @property
    def state(self) -> BookieState:
        return self.server.state if self.server is not None else BookieState.CLOSED

    def context(self) -> BookieContext:
        """The seams of a new process of this bookie (a fresh mount of its disks)."""
        return BookieContext(
            clock=SIM_CLOCK, rng=self.rng, open_metadata=self._open_metadata,
            io=self.fs.mount(), offload=self.offload,
            kv_open=self.kv.open if self.kv is not None else None,
            disk_usage=self.fs.disk_usage, device_of=_one_device,
            lock_directories=self.fs.lock, resolve=_as_given,
            network=self.net.bookie_network, log=_QUIET_LOG,
            on_state_change=self._on_state_change)

    async def _open_metadata(self, config: BookieConfig) -> MetadataStore:
        return MemoryMetadataStore(state=self.meta_state)

    async def start(self) -> None:
        """Start a new process of this bookie (its composition root, every check
        included); raises what the bookie's start raises."""
        self.starting = True
        try:
            self.server = BookieServer(self.config, context=self.context())
            await self.server.start()
        finally:
            self.starting = False
        self.up = True

    def stored_entries(self, ledger_id: int) -> set[int]:
        """The entry ids of ``ledger_id`` the storage holds (indexed, so readable)."""
        storage = self.storage
        if storage is None or self.lost:
            return set()
        return set(cast("LedgerStorage | MultiDirStorage", storage).entry_ids(ledger_id))

    def stored_ledgers(self) -> set[int]:
        storage = self.storage
        if storage is None or self.lost:
            return set()
        return set(storage.ledger_ids())

    async def crash(self, torn: bool) -> None:
        """SIGKILL and power cut: links reset; the disks lose what was not synced
        (``torn``: keep a random part of it); the lease is left to expire."""
        self.up = False
        self.net.unplug(self.id)
        self.fs.crash(torn)
        if self.kv is not None:
            self.kv.crash()
        if self.server is not None:
            # The process is gone: its tasks end, its calls fail (dead mount).
            await self.server.abort()

    async def restart(self) -> None:
        """Start it again after a crash or a stop (nothing when it runs or is starting)."""
        if self.up or self.starting:
            return
        self.restarts += 1
        await self.start()

    async def lose(self) -> None:
        """The machine is gone for good (crashed, never to come back)."""
        self.lost = True
        await self.crash(torn=False)

    def refuse_adds(self) -> None:
        """As if its lease were lost: adds refused (NOT_READY), reads served."""
        if self.server is not None:
            self.server.on_registration_change(False)

    def take_adds(self) -> None:
        """End :meth:`refuse_adds` (when the registration still holds)."""
        server = self.server
        if server is not None and self.up and server.registration is not None \
                and server.registration.registered:
            server.on_registration_change(True)

    async def stop(self) -> None:
        """Graceful stop (SIGTERM)."""
        self.up = False
        if self.server is not None:
            await self.server.stop()
        self.net.unplug(self.id)


def _one_device(path: Path) -> int:
    return 0  # one simulated file system per bookie


def _as_given(path: Path) -> Path:
    return path  # simulated paths are absolute already


class QuietLog:
    """A logger that drops everything (structlog's cost per call adds up over seeds)."""

    def bind(self, **_kw: Any) -> QuietLog:
        return self

    def _drop(self, *_a: Any, **_kw: Any) -> None:
        return None

    debug = info = warning = error = exception = _drop


_QUIET_LOG = QuietLog()


__all__ = ["SIM_BOOKIE_CONFIG", "SIM_CLOCK", "SIM_STORAGE_CONFIG", "SimBookie", "SimClock",
           "SimEventLoop", "SimNetwork", "SimulationStalled"]


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
    ``ledger_dirs``: ledger directories per bookie; ``trace``: told of every change of
    a bookie's state (``"b1:3181 writable -> readonly [disk_full]"``).

    Must be created and used inside a running :class:`SimEventLoop`.
    """

    def __init__(self, seed: int, bookies: int, *, bookie_config: BookieConfig | None = None,
                 latency_s: tuple[float, float] = (0.00005, 0.001), ledger_dirs: int = 1,
                 trace: Callable[[str], None] | None = None) -> None:
        loop = asyncio.get_running_loop()
        if not isinstance(loop, SimEventLoop):
            raise RuntimeError("SimCluster needs a SimEventLoop")
        self.rng = random.Random(seed)
        self.loop = loop
        self.clock = SIM_CLOCK
        self.state = MemoryMetadataState(clock=SIM_CLOCK)
        self.net = SimNetwork(loop, self.rng, latency_s)
        self.history: list[Any] = []
        self.trace = trace
        self.bookie_config = bookie_config or BookieConfig(**SIM_BOOKIE_CONFIG).validate()
        self.bookies = [SimBookie(f"b{i}:3181", self.net, self.state, self.bookie_config,
                                  ledger_dirs=ledger_dirs, on_state_change=self._state_changed)
                        for i in range(bookies)]
        self.clients: list[Any] = []
        self.autorecovery: list[Any] = []
        """The auto-recovery processes started (:meth:`start_autorecovery`)."""

    def _state_changed(self, bookie_id: str, change: Change) -> None:
        if self.trace is not None:
            self.trace(f"{bookie_id} {change.before.value} -> {change.after.value} "
                       f"[{','.join(r.value for r in change.reasons)}]")

    async def start(self) -> None:
        for b in self.bookies:
            await b.start()

    def client(self, name: str, config: Any = None) -> Any:
        """A BookKeeper client named ``name`` on the simulated network, with its own
        generator drawn from the cluster's seed."""
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

    async def start_autorecovery(self, config: Any = None, name: str = "autorecovery",
                                 client_config: Any = None) -> Any:
        """An auto-recovery process (auditor candidate and replication worker) named
        ``name``, with a client of its own on the simulated network; returns its
        :class:`~asyncbk.autorecovery.service.AutoRecovery` (closed by :meth:`stop`)."""
        from ..autorecovery.service import AutoRecovery, AutoRecoveryConfig

        cfg = config or AutoRecoveryConfig(lost_bookie_delay_s=2.0, audit_interval_s=5.0,
                                           open_ledger_grace_s=3.0, rate_entries_per_s=0.0,
                                           lease_ttl_s=3, election_poll_s=0.5,
                                           worker_poll_s=0.5, metadata_timeout_s=5.0)
        ar = AutoRecovery(self.client(name, client_config), cfg, process_id=name,
                          clock=SIM_CLOCK, rng=random.Random(self.rng.getrandbits(64)),
                          log=_QUIET_LOG)
        await ar.start()
        self.autorecovery.append(ar)
        return ar

    def bookie(self, bookie_id: BookieId) -> SimBookie:
        return next(b for b in self.bookies if b.id == bookie_id)

    async def stop(self) -> None:
        for ar in self.autorecovery:
            await ar.close()
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
