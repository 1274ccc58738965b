"""``format("asyncbk")``: the PySpark data source over streams and ledgers.

Reads (batch and Structured Streaming) are planned on the driver from stream
metadata and entry headers (:mod:`asyncbk.spark.plan`) and read by the tasks
straight from the bookies, each with its own short-lived client and event loop,
as Arrow record batches.  Writes go through staged ledgers adopted by one
metadata transaction per batch (:mod:`asyncbk.stream.adopt`); see docs/spark.md
for why a streaming write is exactly-once.

Everything Spark pickles (the source, readers, writers, partitions, commit
messages) holds plain settings only; clients and event loops are made where
they are used and never pickled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator
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
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - Spark 4.0/4.1
    ReadAllAvailable = ReadLimit = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

from ..client.client import BookKeeper
from ..errors import NoSuchLedgerError, NoSuchStreamError, TruncatedError
from ..log import get_logger
from ..stream.context import StreamContext
from ..stream.position import Position
from ..stream.reader import resolve_start
from .arrow import entry_columns, stream_batch
from .errors import DataLossError, SparkOptionError
from .options import ReadOptions, StartSpec, read_options, write_options
from .plan import Part, Slice, StreamIndex, canonical, partition_bound, split_limit
from .runtime import LoopThread, TaskLoop, context_of, run_once
from .sink import BatchWriter, MicroBatchWriter, row_layout

STREAM_SCHEMA = "stream string, position string, txid long, data binary"
LEDGER_SCHEMA = "ledger_id long, entry_id long, data binary"
READ_WINDOW_ENTRIES = 64
"""Entries one read request of a task asks for; the next window is read meanwhile."""
WRITE_CHUNK_ROWS = 2048

_STREAM_ARROW = pa.schema([("stream", pa.string()), ("position", pa.string()),
                           ("txid", pa.int64()), ("data", pa.binary())])
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
        return LEDGER_SCHEMA if ledgers else STREAM_SCHEMA

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
    """The ranges cut into partitions of at most the bound (``maxRecordsPerPartition``,
    finer for ``minPartitions``)."""
    bound = partition_bound(sum(r[3] for r in ranges), opts.max_records_per_partition,
                            opts.min_partitions)
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


async def _read_slices(bk: BookKeeper, namespace: str, part: Part,
                       opts: ReadOptions) -> AsyncGenerator[pa.RecordBatch, None]:
    """The records of ``part`` as Arrow batches, in position order."""
    stream = part.stream
    for sl in part.slices:
        try:
            rh = await bk.open_ledger(sl.ledger_id, recovery=False)
        except NoSuchLedgerError:
            _data_loss(opts, namespace, stream, f"segment {sl.segment} (ledger {sl.ledger_id}) "
                                                f"was removed before positions "
                                                f"{part.start}..{part.end} were read")
            continue
        windows = [(lo, min(sl.last_entry, lo + READ_WINDOW_ENTRIES - 1))
                   for lo in range(sl.first_entry, sl.last_entry + 1, READ_WINDOW_ENTRIES)]
        pending: asyncio.Task[Any] | None = None
        try:
            for i, (lo, hi) in enumerate(windows):
                current = pending or asyncio.ensure_future(rh.read_unconfirmed(lo, hi))
                pending = (asyncio.ensure_future(rh.read_unconfirmed(*windows[i + 1]))
                           if i + 1 < len(windows) else None)
                entries = await current
                yield _stream_batch(stream, namespace, sl, entries)
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)


def _stream_batch(stream: str, namespace: str, sl: Slice, entries: list[Any]) -> pa.RecordBatch:
    """The records of ``entries`` (of slice ``sl``) that the slice keeps."""
    pieces = []
    for entry in entries:
        eid = entry.entry_id
        lo = sl.first_slot if eid == sl.first_entry else 0
        hi = sl.end_slot if eid == sl.last_entry and sl.end_slot is not None else None
        txids, datas, lo, hi = entry_columns(
            entry.data, f"stream {namespace}/{stream} segment {sl.segment} entry {eid}", lo, hi)
        pieces.append((eid, txids, datas, lo, hi))
    return stream_batch(stream, sl.segment, pieces)


def _read_partition(opts: ReadOptions, partition: AsyncbkPartition) -> Iterator[pa.RecordBatch]:
    part = partition.part
    if part is None:
        return
    with TaskLoop(opts) as tl:
        assert tl.bk is not None and opts.namespace is not None
        yield from tl.iterate(_read_slices(tl.bk, opts.namespace, part, opts))


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


class StreamMicroBatchReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Structured Streaming over streams.  Offsets: ``{stream: next position}``."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._rt: LoopThread | None = None
        self._target: dict[str, str] | None = None
        self._last_end: dict[str, str] | None = None
        self._available: dict[str, str] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_rt"] = None
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
                      max_rows: int | None) -> dict[str, str]:
        ctx = await context_of(bk, self.opts.namespace)
        names = set(await _selected(ctx, self.opts, strict=False))
        start = dict(start or {})
        out: dict[str, str] = {}
        backlog: dict[str, tuple[StreamIndex, int, int]] = {}
        available: dict[str, str] = {}
        for name in sorted(names | set(start)):
            if name not in names:  # deleted since
                if name in self.opts.streams or self.opts.selects(name):
                    _data_loss(self.opts, ctx.namespace, name, "the stream was deleted")
                continue
            begin_seq = Position.parse(start[name]).segment if name in start else 0
            idx = await StreamIndex.load(ctx, name, begin_seq)
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
        if max_rows is not None and backlog:
            shares = split_limit({n: b[2] - b[1] for n, b in backlog.items()}, max_rows)
            for name, (idx, first, stop) in backlog.items():
                if shares[name] < stop - first:
                    out[name] = str(await idx.position_of(first + shares[name]))
        self._available = canonical(available)
        return canonical(out)

    def latestOffset(self, start: dict[str, str] | None = None,
                     limit: Any = None) -> dict[str, str]:
        if start is None:  # Spark 4.0/4.1: no start, no limit: go on from our last answer
            start = self._last_end
            max_rows = self.opts.max_records_per_trigger if start is not None else None
        elif ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        else:
            max_rows = None
        end = self._run(lambda bk: self._latest(bk, start, max_rows))
        self._last_end = end
        return end

    def getDefaultReadLimit(self) -> Any:
        if self.opts.max_records_per_trigger and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def reportLatestOffset(self) -> dict[str, str] | None:
        """What was available at the last ``latestOffset`` (for the query's progress;
        asking the cluster again at every trigger would double its cost)."""
        if self._available is None:
            return self._run(lambda bk: self._latest(bk, None, None))
        return self._available

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._run(lambda bk: self._latest(bk, None, None))

    # -- batches

    async def _plan(self, bk: BookKeeper, start: dict[str, str],
                    end: dict[str, str]) -> list[AsyncbkPartition]:
        ctx = await context_of(bk, self.opts.namespace)
        ranges: list[_Range] = []
        for name in sorted(end):
            try:
                idx = await StreamIndex.load(
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
        """Nothing to do: offsets live in Spark's checkpoint, and a stream keeps its
        records until truncation or retention (which ignore readers, as Kafka's do)."""

    def stop(self) -> None:
        if self._rt is not None:
            self._rt.close()
            self._rt = None


