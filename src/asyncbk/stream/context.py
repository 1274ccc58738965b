"""What a namespace shares with its writers, readers, staged writers and Spark's
planner: :class:`StreamContext`.

They are given the context, never the :class:`~asyncbk.stream.namespace.Namespace`
or the client: the ledger operations they use (:class:`LedgerOps`, which a
:class:`~asyncbk.client.client.BookKeeper` has), the stream metadata, the
namespace's name and defaults, the counters, the limits, the clock, a random
generator (the client's seeded one in the simulator) and a logger factory.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..client.ledger import FRAME_OVERHEAD_BYTES_MAX
from ..clock import LOOP_CLOCK, Clock
from ..config import ClientConfig
from ..log import get_logger
from ..meta.api import MetadataStore
from ..tiered.store import ObjectStores
from .cas import BatchedCas
from .codec import HEADER_BYTES, RECORD_OVERHEAD_BYTES_MAX
from .meta import StreamConfig, StreamMeta, StreamMetadata
from .stats import StreamStats

if TYPE_CHECKING:
    from ..client.client import PlacementSpec
    from ..client.ledger import LedgerHandle, ReadHandle


class LedgerOps(Protocol):
    """The ledger operations of the stream layer (a BookKeeper client has them)."""

    async def create_ledger(self, ensemble_size: int, write_quorum: int, ack_quorum: int,
                            digest: str = "xxh3", password: bytes = b"",
                            metadata: dict[str, bytes] | None = None, *,
                            placement: PlacementSpec | None = None) -> LedgerHandle: ...

    async def open_ledger(self, ledger_id: int, password: bytes = b"",
                          recovery: bool = True) -> ReadHandle: ...

    async def delete_ledger(self, ledger_id: int) -> None: ...


class LedgerClient(LedgerOps, Protocol):
    """A ledger client as a context is made from (a
    :class:`~asyncbk.client.client.BookKeeper`): its ledger operations, its metadata
    store and its configuration."""

    @property
    def meta(self) -> MetadataStore: ...

    @property
    def config(self) -> ClientConfig: ...

    @property
    def objects(self) -> ObjectStores: ...


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """Bounds that come from the client's configuration."""

    entry_bytes_max: int
    """Bytes of payload one ledger entry carries at most (``frame_bytes_max`` less the
    frame's own overhead)."""

    @classmethod
    def from_frame_bytes_max(cls, frame_bytes_max: int) -> StreamLimits:
        return cls(frame_bytes_max - FRAME_OVERHEAD_BYTES_MAX)

    @property
    def record_bytes_max(self) -> int:
        """The largest record one ledger entry carries (alone, with its batch header)."""
        return self.entry_bytes_max - HEADER_BYTES - RECORD_OVERHEAD_BYTES_MAX


@dataclass(frozen=True, slots=True)
class StreamContext:
    """What the parts of the stream layer use, for the streams of one namespace."""

    ledgers: LedgerOps
    """Creates, opens and deletes ledgers (the client)."""
    md: StreamMetadata
    namespace: str
    defaults: StreamConfig
    """The namespace's settings, which a stream's overrides replace."""
    stats: StreamStats
    limits: StreamLimits
    rng: random.Random
    """For back-off jitter (the client's injected generator, when it has one)."""
    clock: Clock = LOOP_CLOCK
    logger: Callable[..., Any] = get_logger
    """``logger(**context)``: a structlog logger with ``context`` bound."""
    cas: BatchedCas = field(default_factory=BatchedCas)
    """Coalesces the subscriptions' cursor writes into shared transactions."""
    objects: ObjectStores = field(default_factory=ObjectStores)
    """The object stores offloaded segments are read from (the client's)."""
    object_read_timeout_s: float = 60.0
    """How long a read of an offloaded segment retries a store that does not answer."""

    @classmethod
    def create(cls, client: LedgerClient, namespace: str, defaults: StreamConfig, *,
               stats: StreamStats | None = None, rng: random.Random | None = None,
               clock: Clock = LOOP_CLOCK) -> StreamContext:
        """The context of ``namespace`` (whose settings are ``defaults``) on ``client``;
        fresh counters and a fresh random generator unless given."""
        return cls(ledgers=client, md=StreamMetadata(client.meta), namespace=namespace,
                   defaults=defaults, stats=stats if stats is not None else StreamStats(),
                   limits=StreamLimits.from_frame_bytes_max(client.config.frame_bytes_max),
                   rng=rng if rng is not None else random.Random(), clock=clock,
                   logger=get_logger, objects=_objects_of(client),
                   object_read_timeout_s=client.config.object_store_read_timeout_s)

    def stream_config(self, sm: StreamMeta) -> StreamConfig:
        """The settings of the stream ``sm``: the namespace's, with its overrides."""
        return self.defaults.with_overrides(sm.overrides)

    def log(self, **context: Any) -> Any:
        """A logger bound to this namespace and ``context``."""
        return self.logger(namespace=self.namespace, **context)

    def now_ms(self) -> int:
        """Wall-clock milliseconds (the times recorded in segment metadata)."""
        return int(self.clock.wall_s() * 1000)


def _objects_of(client: LedgerClient) -> ObjectStores:
    """The client's object stores; a client made before tiered storage (one without
    them) gets its own set, signing in from the environment."""
    objects = getattr(client, "objects", None)
    return objects if isinstance(objects, ObjectStores) else ObjectStores()


async def open_context(client: LedgerClient, namespace: str, *,
                       stats: StreamStats | None = None, rng: random.Random | None = None,
                       clock: Clock = LOOP_CLOCK) -> StreamContext:
    """The context of the existing namespace ``namespace``, its settings read from the
    metadata store (an error says so when there is none): what the parts that need no
    :class:`~asyncbk.stream.namespace.Namespace` work with (Spark's planner, tasks and
    sink)."""
    defaults = await StreamMetadata(client.meta).namespace_config(namespace)
    return StreamContext.create(client, namespace, defaults, stats=stats, rng=rng, clock=clock)
