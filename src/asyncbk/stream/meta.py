"""Namespaces, streams and segments in the metadata store.

The keys are in :mod:`asyncbk.meta.keys` (``<root>/streams/...``); the values
are msgpack maps.  A **namespace** holds the defaults of its streams
(:class:`StreamConfig`).  A **stream** record holds its overrides, the highest
segment number it ever had (``max_seq``, so a number is never reused, even
after truncation), the highest txid it ever held, the writer epoch (bumped by
each writer that opens it) and whether it was ended.  Each **segment** is one ledger:
its record (:class:`Segment`) says where it starts and ends in positions,
txids and record counts.  Ledgers staged for a stream (written apart, to be
adopted as its next segments: :mod:`asyncbk.stream.adopt`) and the batches each
sink committed to it are recorded beside it.

Every change to a stream's segments is one transaction that compares the
versions it read of the stream record and of every segment it changes
(:meth:`StreamMetadata.commit`): completing one segment and starting the next
happen together or not at all, and of two writers racing, one loses with
MetadataVersionError and re-reads.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack

from ..client.client import PlacementSpec
from ..errors import (
    ConfigError,
    InvalidNameError,
    MetadataVersionError,
    NamespaceExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchStreamError,
    StreamExistsError,
)
from ..meta import keys
from ..meta.api import KeyValue, KeyValueStore
from ..meta.model import DIGESTS
from ..tiered.location import object_name
from ..topology import POLICIES
from .position import Position

NAMESPACE_NAME_BYTES_MAX = 128
STREAM_NAME_BYTES_MAX = 255
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def check_namespace_name(name: object) -> str:
    if not isinstance(name, str):
        raise InvalidNameError(f"a namespace name is a str, not {type(name).__name__}")
    if not name:
        raise InvalidNameError("a namespace name cannot be empty")
    if len(name.encode()) > NAMESPACE_NAME_BYTES_MAX:
        raise InvalidNameError(f"namespace name longer than {NAMESPACE_NAME_BYTES_MAX} bytes")
    if not _NAMESPACE_RE.fullmatch(name):
        raise InvalidNameError(f"bad namespace name {name!r}: use letters, digits, '.', '_' "
                               "and '-', starting with a letter or digit")
    return name


def check_stream_name(name: object) -> str:
    """Stream names may be path-like (``orders/eu``) but not empty, only slashes,
    with empty or dot-only parts, control characters, or over 255 bytes."""
    if not isinstance(name, str):
        raise InvalidNameError(f"a stream name is a str, not {type(name).__name__}")
    if not name or not name.strip("/"):
        raise InvalidNameError(f"bad stream name {name!r}: it needs a character other than '/'")
    if len(name.encode()) > STREAM_NAME_BYTES_MAX:
        raise InvalidNameError(f"stream name longer than {STREAM_NAME_BYTES_MAX} bytes")
    if _CONTROL_RE.search(name):
        raise InvalidNameError(f"bad stream name {name!r}: control characters")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidNameError(f"bad stream name {name!r}: no empty, '.' or '..' parts "
                               "(no leading, trailing or double '/')")
    return name


@dataclass(frozen=True)
class StreamConfig:
    """A stream's settings: its segments' ledger shape, when the writer rolls to a new
    segment (whichever bound is reached first; 0 turns one off), how long completed
    segments are kept (0: until truncated) and how their ensembles are placed (None:
    the writing client's own setting of that name, see docs/placement.md)."""

    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    digest: str = "xxh3"
    rolling_bytes: int = 256 * 1024 * 1024
    rolling_s: float = 7200.0
    rolling_entries: int = 0
    retention_s: float = 72 * 3600.0
    placement_policy: str | None = None
    """``"random"``, ``"rack-aware"`` or ``"region-aware"`` (None: the client's)."""
    min_racks_per_write_quorum: int | None = None
    """Racks every write set of a segment spans at least (None: the client's)."""
    min_regions_per_write_quorum: int | None = None
    """Region-aware: regions every write set spans at least (None: the client's)."""
    enforce_placement: bool | None = None
    """Fail to start a segment (PlacementError) rather than place it with less spread
    (None: the client's)."""
    backlog_quota_bytes: int = 0
    """A subscription holds back retention and truncation until its backlog (the
    completed segments from the one it is in) exceeds this many bytes; then the
    oldest segments go anyway and it is told (0: no limit)."""
    backlog_quota_s: float = 0.0
    """The same bound on the age of the oldest segment a subscription holds (0: no
    limit)."""
    subscription_ack_interval_s: float = 1.0
    """How often a consumer persists its acknowledgements (at most one metadata write
    per subscription per interval; ``sub.flush()`` persists at once)."""
    offload_after_s: float = 0.0
    """Tiered storage: the offloader copies a completed segment to the object store
    once it was completed this long ago (0: not by age)."""
    offload_after_bytes: int = 0
    """Tiered storage: the offloader also copies the oldest completed segments while
    the stream keeps more than this many bytes on the bookies alone (0: no bound)."""
    offload_deletion_lag_s: float = 4 * 3600.0
    """How long an offloaded segment's ledger stays on the bookies after its object
    was verified and recorded (readers fall back to it while the store fails)."""

    def validate(self) -> StreamConfig:
        if not (self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1):
            raise ConfigError(
                f"need ensemble_size >= write_quorum >= ack_quorum >= 1, got "
                f"{self.ensemble_size}/{self.write_quorum}/{self.ack_quorum}")
        if self.digest not in DIGESTS:
            raise ConfigError(f"unknown digest {self.digest!r}; choose one of {', '.join(DIGESTS)}")
        for name in ("rolling_bytes", "rolling_s", "rolling_entries", "retention_s",
                     "backlog_quota_bytes", "backlog_quota_s", "offload_after_s",
                     "offload_after_bytes", "offload_deletion_lag_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        if not 0 < self.subscription_ack_interval_s <= 3600:
            raise ConfigError("subscription_ack_interval_s must be > 0 and at most 3600, got "
                              f"{self.subscription_ack_interval_s}")
        for name, want in PLACEMENT_FIELDS.items():
            value = getattr(self, name)
            if value is not None and (not isinstance(value, want)
                                      or isinstance(value, bool) is not (want is bool)):
                raise ConfigError(f"{name!r} must be {want.__name__} or None (the client's), "
                                  f"got {type(value).__name__}")
        if self.placement_policy is not None and self.placement_policy not in POLICIES:
            raise ConfigError(f"unknown placement_policy {self.placement_policy!r}; choose one "
                              f"of {', '.join(POLICIES)} (or leave it out: the client's)")
        for name in ("min_racks_per_write_quorum", "min_regions_per_write_quorum"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        return self

    def with_overrides(self, overrides: dict[str, Any]) -> StreamConfig:
        return config_from(overrides, self)

    @property
    def placement(self) -> dict[str, Any]:
        """The placement settings given (those left None are the client's)."""
        return {name: value for name in PLACEMENT_FIELDS
                if (value := getattr(self, name)) is not None}

    def to_record(self) -> dict[str, Any]:
        """The settings as stored: placement settings left None and subscription
        settings left at their defaults are left out, so a namespace that sets none
        reads in clients that predate them."""
        return {k: v for k, v in dataclasses.asdict(self).items()
                if (v is not None or k not in PLACEMENT_FIELDS)
                and (k not in _LATER_FIELDS or v != _LATER_FIELDS[k])}


PLACEMENT_FIELDS: dict[str, type] = {"placement_policy": str,
                                     "min_racks_per_write_quorum": int,
                                     "min_regions_per_write_quorum": int,
                                     "enforce_placement": bool}
"""The placement settings and their types: each may be None (absent), meaning the
setting of the client that writes the segment."""


_LATER_FIELDS: dict[str, Any] = {"backlog_quota_bytes": 0, "backlog_quota_s": 0.0,
                                 "subscription_ack_interval_s": 1.0,
                                 "offload_after_s": 0.0, "offload_after_bytes": 0,
                                 "offload_deletion_lag_s": 4 * 3600.0}
"""Settings added with subscriptions and tiered storage, and their defaults (left out
when at them)."""


def placement_spec(config: StreamConfig) -> PlacementSpec | None:
    """How the ledgers of a stream with ``config`` are placed (None: as the client
    places any ledger)."""
    given = config.placement
    return PlacementSpec(**given) if given else None

_CONFIG_FIELDS = {f.name: f for f in dataclasses.fields(StreamConfig)}


def config_from(values: dict[str, Any], base: StreamConfig | None = None,
                source: str = "stream settings") -> StreamConfig:
    """``base`` (default settings if None) with ``values`` applied, checked.  A
    placement setting may be None: the writing client's own."""
    base = base or StreamConfig()
    checked: dict[str, Any] = {}
    for key, value in values.items():
        f = _CONFIG_FIELDS.get(key)
        if f is None:
            raise ConfigError(f"{source}: unknown setting {key!r}; known: "
                              f"{', '.join(_CONFIG_FIELDS)}")
        if key in PLACEMENT_FIELDS:  # None allowed; checked by validate
            checked[key] = value
            continue
        want = type(getattr(base, key))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or isinstance(value, bool):
            raise ConfigError(f"{source}: {key!r} must be {want.__name__}, "
                              f"got {type(value).__name__}")
        checked[key] = value
    try:
        return dataclasses.replace(base, **checked).validate()
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _pack(d: dict[str, Any]) -> bytes:
    return msgpack.packb(d, use_bin_type=True)


def _unpack(kv: KeyValue, what: str) -> dict[str, Any]:
    try:
        d = msgpack.unpackb(kv.value, raw=False)
    except Exception as exc:
        raise ConfigError(f"{what}: undecodable record at {kv.key}: {exc}") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{what}: record at {kv.key} is not a map")
    return d


OPEN = "open"
COMPLETED = "completed"

BOOKIES = "bookies"
BOOKIES_AND_OBJECT = "bookies+object"
OBJECT = "object"


@dataclass(frozen=True, slots=True)
class Offload:
    """Where a segment's offloaded copy is (tiered storage): the object store's URI
    (no secrets), the object's key under its prefix, the object's layout (see
    :mod:`asyncbk.tiered.format`), when it was recorded, and when the ledger was
    deleted from the bookies (0: not yet)."""

    store: str
    key: str
    size: int
    index_offset: int
    index_length: int
    digest: int
    format: int
    last_entry: int
    """The ledger's last entry (the object holds entries 0 to it)."""
    offloaded_ms: int
    ledger_deleted_ms: int = 0

    @property
    def object_uri(self) -> str:
        """The object's full name: ``s3://bucket/prefix/key[?endpoint=...]``."""
        return object_name(self.store, self.key)

    @classmethod
    def from_record(cls, d: object, where: str) -> Offload:
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: offload record is not a map")
        try:
            return cls(**{k: v for k, v in d.items() if k in _OFFLOAD_FIELDS})
        except TypeError as exc:
            raise ConfigError(f"{where}: offload record is incomplete: {exc}") from None


@dataclass(frozen=True)
class Segment:
    """One segment of a stream: a ledger, and what it holds once completed."""

    seq: int
    ledger_id: int
    state: str = OPEN
    records: int = 0
    """Records in the segment (known when completed)."""
    start_sequence: int = 0
    """Records in the stream before this segment (its first record's sequence number)."""
    first_txid: int = -1
    last_txid: int = -1
    last_entry: int = -1
    last_slot: int = -1
    size_bytes: int = 0
    ctime_ms: int = 0
    completion_ms: int = 0
    start_bytes: int = 0
    """Record bytes in the stream before this segment (kept across truncation)."""
    first_ts_ms: int = -1
    """The first record's timestamp (-1: a segment from before records had times: its
    records all have ``ctime_ms``)."""
    last_ts_ms: int = -1
    """The last record's timestamp (known when completed; -1 as ``first_ts_ms``)."""
    ts_floor_ms: int = 0
    """Record times below this read as this (a staged ledger adopted after records of
    a later time: stream times never decrease)."""
    offload: Offload | None = None
    """Its copy in the object store (None: on the bookies only)."""
    version: int = 0

    @property
    def storage(self) -> str:
        """``"bookies"``, ``"bookies+object"`` (offloaded, the ledger not yet deleted)
        or ``"object"``."""
        if self.offload is None:
            return BOOKIES
        return OBJECT if self.offload.ledger_deleted_ms else BOOKIES_AND_OBJECT

    @property
    def completed(self) -> bool:
        return self.state == COMPLETED

    @property
    def first_ts(self) -> int:
        """The first record's timestamp as readers see it."""
        return max(self.first_ts_ms if self.first_ts_ms >= 0 else self.ctime_ms,
                   self.ts_floor_ms)

    @property
    def last_ts(self) -> int:
        """The last record's timestamp as readers see it (a completed segment)."""
        return max(self.last_ts_ms if self.last_ts_ms >= 0 else self.ctime_ms,
                   self.ts_floor_ms)

    @property
    def first_position(self) -> Position:
        return Position(self.seq, 0, 0)

    @property
    def last_position(self) -> Position | None:
        """The last record's position (None while open, or when empty)."""
        if not self.completed or self.records == 0:
            return None
        return Position(self.seq, self.last_entry, self.last_slot)

    def to_bytes(self) -> bytes:
        d = dataclasses.asdict(self)
        d.pop("version")
        if d["offload"] is None:  # (records of segments never offloaded stay as they were)
            d.pop("offload")
        return _pack(d)

    @classmethod
    def from_kv(cls, kv: KeyValue) -> Segment:
        d = _unpack(kv, "segment")
        fields = {k: v for k, v in d.items() if k in _SEGMENT_FIELDS}
        if fields.get("offload") is not None:
            fields["offload"] = Offload.from_record(fields["offload"], f"segment at {kv.key}")
        try:
            return cls(**fields, version=kv.version)
        except TypeError as exc:
            raise ConfigError(f"segment record at {kv.key} is incomplete: {exc}") from None


_SEGMENT_FIELDS = {f.name for f in dataclasses.fields(Segment)} - {"version"}
_OFFLOAD_FIELDS = {f.name for f in dataclasses.fields(Offload)}


@dataclass(frozen=True)
class StreamMeta:
    namespace: str
    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    max_seq: int = 0
    ended: bool = False
    ctime_ms: int = 0
    last_txid: int = -1
    """The highest txid any completed segment ever held (kept after truncation, so a
    new writer continues the sequence)."""
    last_ts_ms: int = -1
    """The highest record timestamp any completed segment ever held (kept after
    truncation, so a new writer's times do not go below it)."""
    epoch: int = 0
    """Bumped by every writer that opens the stream: an older writer's next change of
    the segments sees it moved and knows it was fenced."""
    version: int = 0

    def to_bytes(self) -> bytes:
        return _pack({"overrides": self.overrides, "max_seq": self.max_seq,
                      "ended": self.ended, "ctime_ms": self.ctime_ms,
                      "last_txid": self.last_txid, "epoch": self.epoch,
                      "last_ts_ms": self.last_ts_ms})


class SinkMark(NamedTuple):
    """A sink's record on a stream: the last batch it committed (None: none yet) and
    the version of the record (0: absent), for a transaction to compare."""

    sink_id: str
    batch: int | None
    version: int


@dataclass
class TxnOps:
    """The operations of one metadata transaction (or of one stream's share of it)."""

    compare: list[tuple[str, int]] = field(default_factory=list)
    put: list[tuple[str, bytes]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)

    def extend(self, other: TxnOps) -> None:
        self.compare += other.compare
        self.put += other.put
        self.delete += other.delete

    @property
    def size(self) -> int:
        """What etcd counts against ``--max-txn-ops``: the larger of the compares (each
        also a read on failure) and the writes."""
        return max(len(self.compare), len(self.put) + len(self.delete))


def _staging_owner(value: bytes) -> str | None:
    """The owner a staging record names (None: unreadable)."""
    try:
        owner = msgpack.unpackb(value, raw=False).get("owner")
    except Exception:
        return None
    return owner if isinstance(owner, str) else None


def _sink_batch(value: bytes) -> int:
    d = msgpack.unpackb(value, raw=False)
    return int(d["batch"]) if isinstance(d, dict) and "batch" in d else -1


class StreamMetadata:
    """Reads and transactions on namespaces, streams and segments (see the module
    docstring)."""

    def __init__(self, meta: KeyValueStore) -> None:
        self.meta = meta
        self.root = meta.root

    # --- namespaces ------------------------------------------------------

    async def create_namespace(self, name: str, config: StreamConfig, ctime_ms: int) -> None:
        key = keys.namespace(self.root, check_namespace_name(name))
        try:
            config.validate()
        except ConfigError as exc:
            raise ConfigError(f"namespace {name!r}: {exc}") from None
        value = _pack({"defaults": config.to_record(), "ctime_ms": ctime_ms})
        try:
            await self.meta.kv_txn([(key, 0)], put=[(key, value)])
        except MetadataVersionError:
            raise NamespaceExistsError(f"namespace {name!r} exists already") from None

    async def namespace_config(self, name: str) -> StreamConfig:
        kv = await self.meta.kv_get(keys.namespace(self.root, check_namespace_name(name)))
        if kv is None:
            raise NoSuchNamespaceError(
                f"no namespace {name!r} (create it with bk.namespace({name!r}, create=True) "
                f"or 'asyncbk stream create-namespace {name}')")
        d = _unpack(kv, f"namespace {name!r}")
        return config_from(dict(d.get("defaults", {})), source=f"namespace {name!r}")

    async def list_namespaces(self) -> list[str]:
        prefix = keys.namespaces_prefix(self.root)
        return [keys.namespace_from_key(self.root, kv.key)
                for kv in await self.meta.kv_range(prefix)]

    async def delete_namespace(self, name: str) -> None:
        """Remove the namespace record (its streams must be gone already)."""
        key = keys.namespace(self.root, check_namespace_name(name))
        kv = await self.meta.kv_get(key)
        if kv is None:
            raise NoSuchNamespaceError(f"no namespace {name!r}")
        if await self.list_streams(name, limit=1):
            raise NamespaceNotEmptyError(
                f"namespace {name!r} still has streams: delete them first, or pass force=True")
        await self.meta.kv_txn([(key, kv.version)], delete=[key])

    # --- streams ---------------------------------------------------------

    async def create_stream(self, namespace: str, name: str, overrides: dict[str, Any],
                            ctime_ms: int) -> StreamMeta:
        ns_key = keys.namespace(self.root, check_namespace_name(namespace))
        key = keys.stream(self.root, namespace, check_stream_name(name))
        ns_kv = await self.meta.kv_get(ns_key)
        if ns_kv is None:
            raise NoSuchNamespaceError(f"no namespace {namespace!r}")
        sm = StreamMeta(namespace, name, dict(overrides), 0, False, ctime_ms)
        try:  # the namespace must not have been deleted meanwhile
            version = await self.meta.kv_txn([(ns_key, ns_kv.version), (key, 0)],
                                             put=[(key, sm.to_bytes())])
        except MetadataVersionError:
            if await self.meta.kv_get(key) is not None:
                raise StreamExistsError(
                    f"stream {name!r} exists already in namespace {namespace!r}") from None
            raise
        return dataclasses.replace(sm, version=version)

    async def stream(self, namespace: str, name: str) -> StreamMeta:
        key = keys.stream(self.root, check_namespace_name(namespace), check_stream_name(name))
        kv = await self.meta.kv_get(key)
        if kv is None:
            if await self.meta.kv_get(keys.namespace(self.root, namespace)) is None:
                raise NoSuchNamespaceError(f"no namespace {namespace!r}")
            raise NoSuchStreamError(f"no stream {name!r} in namespace {namespace!r}")
        d = _unpack(kv, f"stream {namespace}/{name}")
        return StreamMeta(namespace, name, dict(d.get("overrides", {})), int(d.get("max_seq", 0)),
                          bool(d.get("ended", False)), int(d.get("ctime_ms", 0)),
                          int(d.get("last_txid", -1)), int(d.get("last_ts_ms", -1)),
                          int(d.get("epoch", 0)), kv.version)

    async def list_streams(self, namespace: str, prefix: str = "", limit: int = 0) -> list[str]:
        check_namespace_name(namespace)
        key_prefix = keys.streams_prefix(self.root, namespace, prefix)
        out: list[str] = []
        after: str | None = None
        while True:
            page = await self.meta.kv_range(key_prefix, after=after, limit=limit or 1000)
            out.extend(keys.stream_from_key(self.root, namespace, kv.key) for kv in page)
            if limit or len(page) < 1000:
                return out[:limit] if limit else out
            after = page[-1].key

    async def segments(self, namespace: str, name: str, from_seq: int = 0,
                       limit: int = 0) -> list[Segment]:
        """The stream's segments, oldest first: those numbered ``from_seq`` or more, at
        most ``limit`` of them (0: all).  A stream's last segment is numbered
        ``max_seq`` (segments go from the front only), so ``from_seq=sm.max_seq``
        reads just that one, however long the stream."""
        prefix = keys.segments_prefix(self.root, namespace, name)
        out: list[Segment] = []
        after = keys.segment(self.root, namespace, name, from_seq - 1) if from_seq > 0 else None
        while True:
            page = await self.meta.kv_range(prefix, after=after,
                                            limit=min(1000, limit - len(out)) if limit else 1000)
            out.extend(Segment.from_kv(kv) for kv in page)
            if len(page) < 1000 or (limit and len(out) >= limit):
                return out
            after = page[-1].key

    async def commit(self, sm: StreamMeta, *, put: Sequence[Segment] = (),
                     drop: Sequence[Segment] = (), ended: bool | None = None,
                     epoch: int | None = None, sink: SinkMark | None = None,
                     unstage: Sequence[int] = (),
                     also_compare: Sequence[tuple[str, int]] = (),
                     also_put: Sequence[tuple[str, bytes]] = (),
                     also_delete: Sequence[str] = ()) -> tuple[StreamMeta, list[Segment]]:
        """One transaction: write ``put`` (new segments: version 0; changed ones: the
        version read) and remove ``drop``, if the stream record and each of them are
        still at the versions read.  Returns the new stream record and ``put`` with
        their new version.  MetadataVersionError if anything changed meanwhile.
        ``sink``: record that sink's batch ``sink.batch``, if its record is still at
        ``sink.version``.  ``unstage``: remove the staging records of these ledgers.
        ``also_*``: more keys to compare, write and remove in the same transaction."""
        new_sm, ops = self.commit_ops(sm, put=put, drop=drop, ended=ended, epoch=epoch,
                                      sink=sink, unstage=unstage)
        ops.compare += also_compare
        ops.put += also_put
        ops.delete += also_delete
        revision = await self.apply(ops)
        return (dataclasses.replace(new_sm, version=revision),
                [dataclasses.replace(s, version=revision) for s in put])

    def commit_ops(self, sm: StreamMeta, *, put: Sequence[Segment] = (),
                   drop: Sequence[Segment] = (), ended: bool | None = None,
                   epoch: int | None = None, sink: SinkMark | None = None,
                   unstage: Sequence[int] = ()) -> tuple[StreamMeta, TxnOps]:
        """What :meth:`commit` sends, without sending it: the new stream record (its
        version unset) and the operations, to combine with other streams' in one
        transaction (:meth:`apply`)."""
        ns, name = sm.namespace, sm.name
        ops = TxnOps()
        if sink is not None:
            sink_key = keys.sink(self.root, ns, name, sink.sink_id)
            ops.compare.append((sink_key, sink.version))
            ops.put.append((sink_key, _pack({"batch": sink.batch})))
        skey = keys.stream(self.root, ns, name)
        max_seq = max([sm.max_seq, *(s.seq for s in put)])
        last_txid = max([sm.last_txid, *(s.last_txid for s in put)])
        last_ts = max([sm.last_ts_ms, *(s.last_ts for s in put if s.completed and s.records)])
        new_sm = dataclasses.replace(sm, max_seq=max_seq, last_txid=last_txid, last_ts_ms=last_ts,
                                     ended=sm.ended if ended is None else ended,
                                     epoch=sm.epoch if epoch is None else epoch)
        ops.compare += [(skey, sm.version)]
        ops.compare += [(keys.segment(self.root, ns, name, s.seq), s.version) for s in put]
        ops.compare += [(keys.segment(self.root, ns, name, s.seq), s.version) for s in drop]
        ops.put += [(skey, new_sm.to_bytes())]
        ops.put += [(keys.segment(self.root, ns, name, s.seq), s.to_bytes()) for s in put]
        ops.delete += [keys.segment(self.root, ns, name, s.seq) for s in drop]
        ops.delete += [keys.staging(self.root, ns, name, ledger_id) for ledger_id in unstage]
        return new_sm, ops

    async def put_segment(self, namespace: str, name: str, seg: Segment) -> Segment:
        """Rewrite one completed segment's record (its offload), if it is still at the
        version read: MetadataVersionError if it changed or is gone (truncated, the
        stream deleted).  The stream record is not compared: writers rolling meanwhile
        do not disturb it, and whatever drops the segment compares its version."""
        key = keys.segment(self.root, namespace, name, seg.seq)
        if seg.version <= 0:
            raise ValueError("put_segment rewrites a segment read from the store")
        version = await self.meta.kv_txn([(key, seg.version)], put=[(key, seg.to_bytes())])
        return dataclasses.replace(seg, version=version)

    async def apply(self, ops: TxnOps) -> int:
        """Send ``ops`` as one transaction; its revision.  MetadataVersionError if a
        compared key changed."""
        return await self.meta.kv_txn(ops.compare, put=ops.put, delete=ops.delete)

    async def batch_mark(self, namespace: str, sink_id: str) -> SinkMark:
        """The last batch the sink ``sink_id`` committed to streams of ``namespace``
        (:func:`asyncbk.stream.adopt.adopt_streams`)."""
        kv = await self.meta.kv_get(keys.batch_mark(self.root, namespace, sink_id))
        if kv is None:
            return SinkMark(sink_id, None, 0)
        return SinkMark(sink_id, _sink_batch(kv.value), kv.version)

    def batch_mark_ops(self, namespace: str, mark: SinkMark) -> TxnOps:
        """Record ``mark.batch`` if the sink's record is still at ``mark.version``."""
        key = keys.batch_mark(self.root, namespace, mark.sink_id)
        return TxnOps([(key, mark.version)], [(key, _pack({"batch": mark.batch}))])

    # --- staged ledgers and sinks ----------------------------------------

    async def stage(self, namespace: str, name: str, ledger_id: int, owner: str) -> None:
        """Record ``ledger_id`` as staged for the stream by ``owner``."""
        key = keys.staging(self.root, namespace, name, ledger_id)
        await self.meta.kv_txn([], put=[(key, _pack({"owner": owner}))])

    async def unstage(self, namespace: str, name: str, ledger_id: int) -> bool:
        """Remove the staging record of ``ledger_id``, if there is one: False if there
        is none (adopted, or unstaged before), also when a commit adopts it meanwhile."""
        key = keys.staging(self.root, namespace, name, ledger_id)
        kv = await self.meta.kv_get(key)
        if kv is None:
            return False
        try:
            await self.meta.kv_txn([(key, kv.version)], delete=[key])
        except MetadataVersionError:
            return False
        return True

    async def staged(self, namespace: str, name: str) -> list[tuple[int, str | None]]:
        """The ledgers staged for the stream, with their owners (None: unreadable)."""
        prefix = keys.staging_prefix(self.root, namespace, name)
        out: list[tuple[int, str | None]] = []
        for kv in await self.meta.kv_range(prefix):
            out.append((int(kv.key[len(prefix):]), _staging_owner(kv.value)))
        return out

    async def staged_in_namespace(self, namespace: str) -> list[tuple[str, int, str | None]]:
        """The ledgers staged for any stream of ``namespace``: ``(stream, ledger id,
        owner)`` (owner None: unreadable)."""
        out: list[tuple[str, int, str | None]] = []
        for kv in await self.meta.kv_range(keys.namespace_staging_prefix(self.root, namespace)):
            stream, ledger_id = keys.staging_key_parts(self.root, namespace, kv.key)
            out.append((stream, ledger_id, _staging_owner(kv.value)))
        return out

    async def sink_mark(self, namespace: str, name: str, sink_id: str) -> SinkMark:
        """What the sink ``sink_id`` committed to the stream last."""
        kv = await self.meta.kv_get(keys.sink(self.root, namespace, name, sink_id))
        if kv is None:
            return SinkMark(sink_id, None, 0)
        return SinkMark(sink_id, _sink_batch(kv.value), kv.version)

    async def delete_stream(self, sm: StreamMeta) -> None:
        """Remove the stream record and every segment record, if the stream record is
        still at the version read."""
        await self.meta.kv_txn(
            [(keys.stream(self.root, sm.namespace, sm.name), sm.version)],
            delete=[keys.stream(self.root, sm.namespace, sm.name)],
            delete_prefix=[keys.segments_prefix(self.root, sm.namespace, sm.name),
                           keys.sinks_prefix(self.root, sm.namespace, sm.name),
                           keys.subscriptions_prefix(self.root, sm.namespace, sm.name)])
