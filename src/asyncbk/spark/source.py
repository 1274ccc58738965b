"""``format("asyncbk")``: the PySpark data source over streams and ledgers.

Reads (batch and Structured Streaming) are planned on the driver from stream
metadata and entry headers (:mod:`asyncbk.spark.plan`) and read by the tasks
straight from the bookies, as Arrow record batches, with the client their Python
worker process keeps (:mod:`asyncbk.spark.runtime`).  Writes go through staged
ledgers, a staged ledger per stream a task's rows name, adopted by one metadata
transaction per batch across all its streams (:mod:`asyncbk.stream.adopt`); see
docs/spark.md for why a streaming write is exactly-once.

Everything Spark pickles (the source, readers, writers, partitions, commit
messages) holds plain settings only; clients and event loops are made where
they are used and never pickled.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import time
from collections.abc import AsyncGenerator, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import StructType

try:  # Spark 4.2+: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - Spark 4.0/4.1
    ReadAllAvailable = ReadLimit = ReadMaxRows = None  # type: ignore[assignment,misc]
    ReadMaxBytes = ReadMinRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

from ..client.client import BookKeeper
from ..errors import BKError, NoSuchLedgerError, NoSuchStreamError, TruncatedError
from ..log import get_logger
from ..stream.context import StreamContext
from ..stream.position import Position
from ..stream.reader import resolve_start
from ..stream.subscription import mirror
from ..tiered.reader import ObjectSegmentReader
from .arrow import Piece, entry_columns, stream_batch
from .errors import DataLossError, SparkOptionError
from .options import ReadOptions, StartSpec, include_headers, read_options, write_options
from .plan import Part, Slice, StreamIndex, canonical, open_slice, partition_bound, split_limit
from .runtime import LoopThread, TaskLoop, context_of, run_once
from .sink import BatchWriter, MicroBatchWriter, row_layout

STREAM_SCHEMA = ("stream string, position string, txid long, data binary, key binary, "
                 "timestamp timestamp")
STREAM_SCHEMA_WITH_HEADERS = STREAM_SCHEMA + ", headers map<string,binary>"
LEDGER_SCHEMA = "ledger_id long, entry_id long, data binary"
READ_WINDOW_ENTRIES = 64
"""Entries one read request of a task asks for; the next window is read meanwhile."""
WRITE_CHUNK_ROWS = 2048

_LEDGER_ARROW = pa.schema([("ledger_id", pa.int64()), ("entry_id", pa.int64()),
                           ("data", pa.binary())])

_log = get_logger(component="spark")


# ---------------------------------------------------------------------- the source


class AsyncbkDataSource(DataSource):
    """``spark.read.format("asyncbk")``, ``readStream``, ``write`` and ``writeStream``.

    Register it once per session: ``spark.dataSource.register(AsyncbkDataSource)``.
    Options: see docs/spark.md (``metadataUri``, ``namespace``, ``streams`` /
    ``streamsPattern`` / ``ledgers``, ``startingPositions``, ``endingPositions``,
    ``failOnDataLoss``, ``maxRecordsPerTrigger``, ``maxRecordsPerPartition``,
    ``minPartitions``, ``stream``, ``sinkId``)."""

    @classmethod
    def name(cls) -> str:
        return "asyncbk"

    def schema(self) -> str:
        ledgers = next((v for k, v in self.options.items() if str(k).lower() == "ledgers"), None)
        if ledgers:
            return LEDGER_SCHEMA
        return STREAM_SCHEMA_WITH_HEADERS if include_headers(self.options) else STREAM_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = read_options(self.options, streaming=False)
        if opts.over_ledgers:
            return LedgerBatchReader(opts)
        return StreamBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamMicroBatchReader(read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise SparkOptionError("asyncbk streams are append-only: use mode(\"append\") "
                                   "(truncate or delete the stream with the asyncbk API or CLI)")
        opts = write_options(self.options, streaming=False)
        return BatchWriter(opts, row_layout(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise SparkOptionError("asyncbk streams are append-only: use outputMode(\"append\") "
                                   "(complete mode would append the whole result each batch)")
        opts = write_options(self.options, streaming=True)
        return MicroBatchWriter(opts, row_layout(schema))


# ---------------------------------------------------------------------- partitions


class AsyncbkPartition(InputPartition):
    """One input partition: slices of one stream (``part``) or entries of a ledger."""

    def __init__(self, part: Part | None = None,
                 ledger: tuple[int, int, int] | None = None) -> None:
        super().__init__((part.stream, part.start, part.end) if part else ledger)
        self.part = part
        self.ledger = ledger


# ---------------------------------------------------------------------- reading


async def _selected(ctx: StreamContext, opts: ReadOptions, strict: bool = True) -> list[str]:
    """The streams a read covers: the named ones (each must exist when ``strict``) and
    those the globs and pattern match now."""
    found = set()
    ns = ctx.namespace
    for name in opts.streams:
        try:
            await ctx.md.stream(ns, name)
        except NoSuchStreamError:
            if strict:
                raise SparkOptionError(f"option streams: no stream {name!r} in namespace "
                                       f"{ns!r} (list them with `asyncbk stream list {ns}`)"
                                       ) from None
        else:
            found.add(name)
    if opts.discovers:
        for name in await ctx.md.list_streams(ns, ""):
            if opts.selects(name):
                found.add(name)
    return sorted(found)


async def _resolve(idx: StreamIndex, spec: StartSpec, opts: ReadOptions,
                   option: str) -> Position:
    """A real position for a start or end spec of one stream."""
    if spec.kind == "earliest":
        return idx.first_position
    if spec.kind == "latest":
        return await idx.end_position()
    if spec.kind == "txid":
        assert spec.txid is not None
        return await resolve_start(idx.ctx, idx.stream, None, spec.txid)
    if spec.kind == "timestamp":  # the stream layer's time seek; past the end: the end
        assert spec.timestamp_ms is not None
        return await resolve_start(idx.ctx, idx.stream, None, None, spec.timestamp_ms)
    assert spec.position is not None
    if idx.truncated(spec.position):
        _data_loss(opts, idx.namespace, idx.stream,
                   f"{option} {spec.position} was truncated; the stream now starts at "
                   f"{idx.first_position}")
        return idx.first_position
    return spec.position


def _data_loss(opts: ReadOptions, namespace: str, stream: str, what: str) -> None:
    """Raise DataLossError, or only warn if failOnDataLoss is false."""
    message = f"stream {namespace}/{stream}: {what}"
    if opts.fail_on_data_loss:
        raise DataLossError(
            f"{message}. Records this query was to read are gone (truncation, retention or "
            "deletion). If that is acceptable, set the option failOnDataLoss to false to skip "
            "to the first record still there.")
    _log.warning("data loss: skipping to the first record still there", detail=message)


_Range = tuple[StreamIndex, Position, Position, int]


async def _counted(idx: StreamIndex, begin: Position, stop: Position, opts: ReadOptions,
                   namespace: str) -> _Range | None:
    """``[begin, stop)`` of one stream with its record count (None: nothing to read, or
    truncated away and failOnDataLoss is false)."""
    try:
        count = await idx.sequence_of(stop) - await idx.sequence_of(begin)
    except TruncatedError as exc:
        _data_loss(opts, namespace, idx.stream, str(exc))
        return None
    return (idx, begin, stop, count) if count > 0 else None


async def _partitions(ranges: list[_Range], opts: ReadOptions) -> list[AsyncbkPartition]:
    """The ranges cut into partitions of at most the bound (``maxRecordsPerPartition``
    records and about 64 MiB, finer for ``minPartitions``)."""
    total_bytes = 0.0
    for idx, begin, stop, _ in ranges:
        total_bytes += await idx.bytes_between(await idx.sequence_of(begin),
                                               await idx.sequence_of(stop))
    bound = partition_bound(sum(r[3] for r in ranges), opts.max_records_per_partition,
                            opts.min_partitions, total_bytes)
    out: list[AsyncbkPartition] = []
    for idx, begin, stop, _ in ranges:
        out.extend(AsyncbkPartition(p) for p in await idx.parts(begin, stop, bound))
    return out


async def _plan_batch(bk: BookKeeper, opts: ReadOptions) -> list[AsyncbkPartition]:
    ctx = await context_of(bk, opts.namespace)
    ranges: list[_Range] = []
    for name in await _selected(ctx, opts):
        idx = await StreamIndex.load(ctx, name)
        start = await _resolve(idx, opts.starting.for_stream(name), opts, "startingPositions")
        end = await _resolve(idx, opts.ending.for_stream(name), opts, "endingPositions")
        if (r := await _counted(idx, start, end, opts, ctx.namespace)) is not None:
            ranges.append(r)
    return await _partitions(ranges, opts)


async def _read_slices(bk: BookKeeper, namespace: str, part: Part, opts: ReadOptions,
                       task_context: contextvars.Context | None = None,
                       ) -> AsyncGenerator[pa.RecordBatch, None]:
    """The records of ``part`` as Arrow batches, in position order (the reads run in
    ``task_context`` if given: with the task's tracing span current)."""
    stream = part.stream
    loop = asyncio.get_running_loop()

    def start(coro: Coroutine[Any, Any, list[Any]]) -> asyncio.Task[list[Any]]:
        return loop.create_task(coro, context=task_context)

    for sl in part.slices:
        try:
            rh = await open_slice(bk, sl)
        except NoSuchLedgerError:
            _data_loss(opts, namespace, stream, f"segment {sl.segment} (ledger {sl.ledger_id}) "
                                                f"was removed before positions "
                                                f"{part.start}..{part.end} were read")
            continue
        if isinstance(rh, ObjectSegmentReader):  # offloaded: one streamed read of the slice
            window: list[Any] = []
            async for entry in rh.tail(sl.first_entry, last_entry=sl.last_entry):
                window.append(entry)
                if len(window) >= READ_WINDOW_ENTRIES:
                    yield _stream_batch(stream, namespace, sl, window, opts.include_headers)
                    window = []
            if window:
                yield _stream_batch(stream, namespace, sl, window, opts.include_headers)
            continue
        windows = [(lo, min(sl.last_entry, lo + READ_WINDOW_ENTRIES - 1))
                   for lo in range(sl.first_entry, sl.last_entry + 1, READ_WINDOW_ENTRIES)]
        pending: asyncio.Task[Any] | None = None
        try:
            for i, (lo, hi) in enumerate(windows):
                current = pending or start(rh.read_unconfirmed(lo, hi))
                pending = (start(rh.read_unconfirmed(*windows[i + 1]))
                           if i + 1 < len(windows) else None)
                entries = await current
                yield _stream_batch(stream, namespace, sl, entries, opts.include_headers)
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)


def _stream_batch(stream: str, namespace: str, sl: Slice, entries: list[Any],
                  include_headers: bool = False) -> pa.RecordBatch:
    """The records of ``entries`` (of slice ``sl``) that the slice keeps."""
    pieces = []
    for entry in entries:
        eid = entry.entry_id
        lo = sl.first_slot if eid == sl.first_entry else 0
        hi = sl.end_slot if eid == sl.last_entry and sl.end_slot is not None else None
        where = f"stream {namespace}/{stream} segment {sl.segment} entry {eid}"
        pieces.append(Piece(eid, entry_columns(entry.data, where, lo, hi, sl.v1_ts_ms), where))
    return stream_batch(stream, sl.segment, pieces, include_headers, sl.ts_floor_ms)


def _read_partition(opts: ReadOptions, partition: AsyncbkPartition) -> Iterator[pa.RecordBatch]:
    part = partition.part
    if part is None:
        return
    with TaskLoop(opts) as tl:
        assert tl.bk is not None and opts.namespace is not None
        tracing = tl.bk.context.tracing
        if tracing is None:
            yield from tl.iterate(_read_slices(tl.bk, opts.namespace, part, opts))
            return
        span = tracing.start("asyncbk.spark.read", {
            "asyncbk.namespace": opts.namespace, "asyncbk.stream": part.stream,
            "asyncbk.start": str(part.start), "asyncbk.end": str(part.end)})
        rows = 0
        try:
            for batch in tl.iterate(_read_slices(tl.bk, opts.namespace, part, opts,
                                                 tracing.context_of(span))):
                rows += batch.num_rows
                yield batch
        except BaseException as exc:
            tracing.failed(span, exc)
            raise
        span.set_attribute("asyncbk.records", rows)
        span.end()


class StreamBatchReader(DataSourceReader):
    """A batch read of streams: one partition per slice of at most
    ``maxRecordsPerPartition`` records."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[AsyncbkPartition]:
        parts = run_once(self.opts, lambda bk: _plan_batch(bk, self.opts))
        return parts or [AsyncbkPartition()]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, AsyncbkPartition)
        return _read_partition(self.opts, partition)


class LedgerBatchReader(DataSourceReader):
    """A batch read of ledgers: every entry up to the LAC (the last entry if closed)."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[AsyncbkPartition]:
        async def plan(bk: BookKeeper) -> list[AsyncbkPartition]:
            out: list[AsyncbkPartition] = []
            for ledger_id in self.opts.ledgers:
                try:
                    rh = await bk.open_ledger(ledger_id, recovery=False)
                except NoSuchLedgerError:
                    raise SparkOptionError(f"option ledgers: no ledger {ledger_id}") from None
                md = rh.metadata
                last = md.last_entry_id if md.is_closed else rh.last_add_confirmed
                step = self.opts.max_records_per_partition
                out.extend(AsyncbkPartition(ledger=(ledger_id, lo, min(last, lo + step - 1)))
                           for lo in range(0, last + 1, step))
            return out

        parts = run_once(self.opts, plan)
        return parts or [AsyncbkPartition()]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, AsyncbkPartition)
        if partition.ledger is None:
            return iter(())
        ledger_id, first, last = partition.ledger

        async def entries(bk: BookKeeper) -> AsyncGenerator[pa.RecordBatch, None]:
            try:
                rh = await bk.open_ledger(ledger_id, recovery=False)
            except NoSuchLedgerError:
                raise DataLossError(f"ledger {ledger_id} was deleted before it was read") from None
            for lo in range(first, last + 1, READ_WINDOW_ENTRIES):
                got = await rh.read_unconfirmed(lo, min(last, lo + READ_WINDOW_ENTRIES - 1))
                yield pa.RecordBatch.from_arrays(
                    [pa.array([ledger_id] * len(got), pa.int64()),
                     pa.array([e.entry_id for e in got], pa.int64()),
                     pa.array([e.data for e in got], pa.binary())], schema=_LEDGER_ARROW)

        def rows() -> Iterator[pa.RecordBatch]:
            with TaskLoop(self.opts) as tl:
                assert tl.bk is not None
                yield from tl.iterate(entries(tl.bk))

        return rows()


# ---------------------------------------------------------------------- streaming reads


@dataclass(frozen=True)
class Limits:
    """Admission control of one trigger (``maxRecordsPerTrigger``,
    ``maxBytesPerTrigger``, ``minRecordsPerTrigger`` with ``maxTriggerDelay``)."""

    max_rows: int | None
    max_bytes: int | None
    min_rows: int | None
    max_delay_ms: int

    @property
    def any(self) -> bool:
        return bool(self.max_rows or self.max_bytes or self.min_rows)


async def _caps(backlog: dict[str, tuple[StreamIndex, int, int]], limits: Limits
                ) -> dict[str, int]:
    """Records each stream may add to the batch: shares of ``max_rows`` by records and
    of ``max_bytes`` by bytes (each stream at least one record), the smaller of both."""
    waiting = {n: stop - first for n, (_, first, stop) in backlog.items()}
    caps = dict(waiting)
    if limits.max_rows:
        caps = split_limit(waiting, limits.max_rows)
    if limits.max_bytes:
        sizes = {n: await idx.bytes_between(first, stop)
                 for n, (idx, first, stop) in backlog.items()}
        shares = split_limit({n: max(1, round(b)) for n, b in sizes.items()}, limits.max_bytes)
        for n, share in shares.items():
            per_record = sizes[n] / waiting[n] if sizes[n] > 0 else 0.0
            fit = waiting[n] if per_record <= 0 else max(1, int(share // per_record))
            caps[n] = min(caps[n], fit)
    return caps



class StreamMicroBatchReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Structured Streaming over streams.  Offsets: ``{stream: next position}``."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._rt: LoopThread | None = None
        self._target: dict[str, str] | None = None
        self._last_end: dict[str, str] | None = None
        self._available: dict[str, str] | None = None
        self._published: dict[str, str] | None = None
        self._indexes: tuple[dict[str, str], dict[str, str], dict[str, StreamIndex]] | None = None
        self._last_trigger_s = 0.0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_rt"] = None
        state["_indexes"] = None  # holds ledger handles: made again where it is used
        return state

    def _run(self, work: Any) -> Any:
        if self._rt is None:
            self._rt = LoopThread(self.opts)
        return self._rt.run(work)

    # -- offsets

    def initialOffset(self) -> dict[str, str]:
        async def initial(bk: BookKeeper) -> dict[str, str]:
            ctx = await context_of(bk, self.opts.namespace)
            out = {}
            for name in await _selected(ctx, self.opts):
                idx = await StreamIndex.load(ctx, name)
                spec = self.opts.starting.for_stream(name)
                out[name] = str(await _resolve(idx, spec, self.opts, "startingPositions"))
            return canonical(out)

        return self._run(initial)

    async def _latest(self, bk: BookKeeper, start: dict[str, str] | None,
                      limits: Limits | None) -> dict[str, str]:
        ctx = await context_of(bk, self.opts.namespace)
        names = set(await _selected(ctx, self.opts, strict=False))
        start = dict(start or {})
        out: dict[str, str] = {}
        backlog: dict[str, tuple[StreamIndex, int, int]] = {}
        available: dict[str, str] = {}
        indexes: dict[str, StreamIndex] = {}
        self._indexes = None
        for name in sorted(names | set(start)):
            if name not in names:  # deleted since
                if name in self.opts.streams or self.opts.selects(name):
                    _data_loss(self.opts, ctx.namespace, name, "the stream was deleted")
                continue
            begin_seq = Position.parse(start[name]).segment if name in start else 0
            idx = await StreamIndex.load(ctx, name, begin_seq)
            indexes[name] = idx
            end = await idx.end_position()
            available[name] = str(end)
            if self._target is not None:
                if name not in self._target:
                    continue  # Trigger.AvailableNow: nothing that came after it began
                target = Position.parse(self._target[name])
                if not idx.truncated(target) and \
                        await idx.sequence_of(target) < await idx.sequence_of(end):
                    end = target
            begin = Position.parse(start[name]) if name in start else idx.first_position
            if idx.truncated(begin):
                out[name] = str(end)  # partitions() reports it (or skips, if allowed)
                continue
            first, stop = await idx.sequence_of(begin), await idx.sequence_of(end)
            if stop <= first:
                out[name] = start.get(name, str(begin))
                continue
            out[name] = str(end)
            backlog[name] = (idx, first, stop)
        self._available = canonical(available)
        if limits is not None and backlog:
            waiting = sum(stop - first for _, first, stop in backlog.values())
            now = time.monotonic()
            if limits.min_rows and waiting < limits.min_rows and self._target is None \
                    and (now - self._last_trigger_s) * 1000 < limits.max_delay_ms:
                return canonical(start)  # too few records, and the delay has not passed
            self._last_trigger_s = now
            caps = await _caps(backlog, limits)
            for name, (idx, first, stop) in backlog.items():
                if caps.get(name, stop - first) < stop - first:
                    out[name] = str(await idx.position_of(first + caps[name]))
        out = canonical(out)
        # Spark plans the batch [start, out) next: the same indexes serve (their segment
        # lists and entry headers are what ``out`` was made from).
        self._indexes = (canonical(start), out, indexes)
        return out

    def _limits(self, limit: Any) -> Limits | None:
        """What bounds the next batch: Spark's limit says whether to apply the options
        (``ReadAllAvailable``, as for ``Trigger.Once``, says not to)."""
        o = self.opts
        if ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable):
            return None
        limits = Limits(o.max_records_per_trigger, o.max_bytes_per_trigger,
                        o.min_records_per_trigger, o.max_trigger_delay_ms)
        # The one number Spark's limit carries is Spark's to set; the others come
        # from the options.
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            limits = dataclasses.replace(limits, max_rows=limit.max_rows)
        elif ReadMaxBytes is not None and isinstance(limit, ReadMaxBytes):
            limits = dataclasses.replace(limits, max_bytes=limit.max_bytes)
        elif ReadMinRows is not None and isinstance(limit, ReadMinRows):
            limits = dataclasses.replace(limits, min_rows=limit.min_rows)
        return limits if limits.any else None

    def latestOffset(self, start: dict[str, str] | None = None,
                     limit: Any = None) -> dict[str, str]:
        if start is None:  # Spark 4.0/4.1: no start, no limit: go on from our last answer
            start = self._last_end
            limits = self._limits(None) if start is not None else None
        else:
            # Spark asks for the next batch once the previous one is in its commit log:
            # ``start`` is committed, and the subscription may show it.
            self._publish(start)
            limits = self._limits(limit)
        end = self._run(lambda bk: self._latest(bk, start, limits))
        self._last_end = end
        return end

    def getDefaultReadLimit(self) -> Any:
        """A token that tells Spark this source limits its batches (PySpark's read limits
        carry one number each; the options hold the combination, applied in
        ``latestOffset``)."""
        o = self.opts
        if ReadMaxRows is None:
            return None
        if o.max_records_per_trigger:
            return ReadMaxRows(o.max_records_per_trigger)
        if o.max_bytes_per_trigger and ReadMaxBytes is not None:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.min_records_per_trigger and ReadMinRows is not None:
            return ReadMinRows(o.min_records_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, str] | None:
        """What was available at the last ``latestOffset`` (for the query's progress;
        asking the cluster again at every trigger would double its cost)."""
        if self._available is None:
            return self._run(lambda bk: self._latest(bk, None, None))
        return self._available

    def _publish(self, offsets: dict[str, str]) -> None:
        """Mirror committed offsets as the ``subscription`` of each stream (best effort:
        a failure leaves the subscription behind, which only holds more records)."""
        name = self.opts.subscription
        if name is None or offsets == self._published:
            return

        async def publish(bk: BookKeeper) -> None:
            ctx = await context_of(bk, self.opts.namespace)
            for stream, pos in offsets.items():
                try:
                    await mirror(ctx, stream, name, Position.parse(pos))
                except NoSuchStreamError:
                    continue  # deleted: the read reports it

        try:
            self._run(publish)
        except BKError as exc:
            _log.warning("could not publish the query's progress as its subscription; "
                         "retention keeps the records meanwhile", subscription=name,
                         error=str(exc))
            return
        self._published = dict(offsets)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._run(lambda bk: self._latest(bk, None, None))

    # -- batches

    async def _plan(self, bk: BookKeeper, start: dict[str, str],
                    end: dict[str, str]) -> list[AsyncbkPartition]:
        ctx = await context_of(bk, self.opts.namespace)
        ranges: list[_Range] = []
        known: dict[str, StreamIndex] = {}
        if self._indexes is not None and self._indexes[:2] == (canonical(start), end):
            known = self._indexes[2]
        for name in sorted(end):
            try:
                idx = known.get(name) or await StreamIndex.load(
                    ctx, name, Position.parse(start[name]).segment if name in start else 0)
            except NoSuchStreamError:
                _data_loss(self.opts, ctx.namespace, name, "the stream was deleted")
                continue
            stop = Position.parse(end[name])
            begin = Position.parse(start[name]) if name in start else idx.first_position
            if idx.truncated(begin):
                _data_loss(self.opts, ctx.namespace, name,
                           f"positions {begin}..{stop} were truncated before they were read; "
                           f"the stream now starts at {idx.first_position}")
                begin = idx.first_position
                if stop < begin:
                    continue
            if (r := await _counted(idx, begin, stop, self.opts, ctx.namespace)) is not None:
                ranges.append(r)
        return await _partitions(ranges, self.opts)

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> list[AsyncbkPartition]:
        return self._run(lambda bk: self._plan(bk, start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, AsyncbkPartition)
        return _read_partition(self.opts, partition)

    def commit(self, end: dict[str, str]) -> None:
        """Offsets live in Spark's checkpoint; with the ``subscription`` option, ``end``
        is published as that subscription (so retention waits for the query)."""
        self._publish(end)

    def stop(self) -> None:
        if self._rt is not None:
            self._rt.close()
            self._rt = None


