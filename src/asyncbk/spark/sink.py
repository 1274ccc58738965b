"""Writing to a stream from Spark: ``df.write`` and ``writeStream`` with
``format("asyncbk")``.

Tasks write staged ledgers; the driver's commit adopts them into the stream in
one metadata transaction that records the batch under the sink's id
(:mod:`asyncbk.stream.adopt`), so a micro-batch Spark replays is added once
(docs/spark.md has the argument).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
)

from ..client.client import BookKeeper
from ..errors import BKError, InvalidNameError, NoSuchStreamError
from ..log import get_logger
from ..stream.adopt import (
    INFLIGHT_ENTRIES,
    STREAMS_PER_BATCH_MAX,
    StagedLedger,
    StagedWriter,
    adopt_streams,
    discard,
    last_txid,
    staged_from,
    staged_to,
    sweep_owner,
)
from ..stream.codec import TIMESTAMP_MS_MAX, pack_extras
from ..stream.context import StreamContext
from ..stream.meta import check_stream_name
from ..stream.namespace import Namespace
from .errors import SinkCommitError, SparkOptionError
from .options import NO_STREAM, WriteOptions
from .runtime import TaskLoop, context_of, run_once

WRITE_CHUNK_ROWS = 2048
"""Rows a task hands to its event loop at a time."""
ROUTED_INFLIGHT_ENTRIES = 8
"""Entries (of up to 1 MiB) a task writing a ``stream`` column keeps in flight per
stream: at most 31 streams x 9 MiB."""

_log = get_logger(component="spark")


@dataclass
class AsyncbkCommitMessage(WriterCommitMessage):
    """What one write task made: a staged ledger per stream it wrote to (empty if the
    task had no rows)."""

    staged: dict[str, dict[str, Any]]
    owner: str
    partition: int


@dataclass(frozen=True)
class RowLayout:
    """Where a row's columns are (None: the DataFrame has no such column) and how they
    are typed."""

    data: int
    data_is_text: bool = False
    txid: int | None = None
    key: int | None = None
    key_is_text: bool = False
    headers: int | None = None
    headers_are_text: bool = False
    timestamp: int | None = None
    timestamp_is_ms: bool = False
    """A long column of milliseconds, not a timestamp."""
    stream: int | None = None


def _field(schema: StructType, name: str) -> tuple[int, DataType] | None:
    names = [f.name for f in schema.fields]
    if name not in names:
        return None
    i = names.index(name)
    return i, schema.fields[i].dataType


def _wrong(column: str, takes: str, got: DataType) -> SparkOptionError:
    return SparkOptionError(f"column {column} must be {takes}, not {got.simpleString()}: "
                            "cast it, or drop the column")


def row_layout(schema: StructType | None) -> RowLayout:
    """Where ``data`` (binary or string) and the optional ``txid``, ``key``,
    ``headers``, ``timestamp`` and ``stream`` columns are in a row, checked."""
    if schema is None:
        return RowLayout(0)
    names = [f.name for f in schema.fields]
    data = _field(schema, "data")
    if data is None:
        raise SparkOptionError(
            f"writing to asyncbk needs a column named data (binary or string); the "
            f"DataFrame has {', '.join(names) or 'no columns'}: select or rename one, e.g. "
            "df.selectExpr(\"to_json(struct(*)) AS data\")")
    if not isinstance(data[1], (BinaryType, StringType)):
        raise _wrong("data", "binary or string", data[1])
    layout: dict[str, Any] = {"data": data[0], "data_is_text": isinstance(data[1], StringType)}
    if (txid := _field(schema, "txid")) is not None:
        if not isinstance(txid[1], (LongType, IntegerType)):
            raise _wrong("txid", "a long (bigint)", txid[1])
        layout["txid"] = txid[0]
    if (key := _field(schema, "key")) is not None:
        if not isinstance(key[1], (BinaryType, StringType)):
            raise _wrong("key", "binary or string", key[1])
        layout.update(key=key[0], key_is_text=isinstance(key[1], StringType))
    if (headers := _field(schema, "headers")) is not None:
        t = headers[1]
        if not (isinstance(t, MapType) and isinstance(t.keyType, StringType)
                and isinstance(t.valueType, (BinaryType, StringType))):
            raise _wrong("headers", "map<string,binary> (or map<string,string>)", t)
        layout.update(headers=headers[0], headers_are_text=isinstance(t.valueType, StringType))
    if (ts := _field(schema, "timestamp")) is not None:
        if not isinstance(ts[1], (TimestampType, LongType)):
            raise _wrong("timestamp", "a timestamp (or a long of ms since the epoch)", ts[1])
        layout.update(timestamp=ts[0], timestamp_is_ms=isinstance(ts[1], LongType))
    if (stream := _field(schema, "stream")) is not None:
        if not isinstance(stream[1], StringType):
            raise _wrong("stream", "a string (the name of the row's stream)", stream[1])
        layout["stream"] = stream[0]
    return RowLayout(**layout)


async def _create_stream(bk: BookKeeper, namespace: str, stream: str) -> None:
    """Create ``stream`` if it is absent (another task may be creating it too)."""
    ctx = await context_of(bk, namespace)
    ns = Namespace(bk, ctx.namespace, ctx.defaults, ctx.stats)
    if not await ns.stream_exists(stream):
        try:
            await ns.create_stream(stream)
        except BKError as exc:
            if not await ns.stream_exists(stream):
                raise SinkCommitError(f"cannot create stream {namespace}/{stream}: "
                                      f"{exc}") from None


def _task_owner(opts: WriteOptions, fallback: str | None) -> tuple[str, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    owner = opts.sink_id or fallback
    if owner is None and ctx is not None:
        query = ctx.getLocalProperty("sql.streaming.queryId")
        owner = f"query-{query}" if query else None
    if owner is None:
        raise SparkOptionError("a streaming write to asyncbk outside a streaming query needs the "
                               "option sinkId (the identity its batches are recorded under)")
    return owner, partition


_TOO_MANY_STREAMS = (
    f"this batch writes to more than {STREAMS_PER_BATCH_MAX} streams, the most one commit can "
    "add to at once (one etcd transaction of at most 128 operations); nothing of it was "
    "committed: split the DataFrame by stream and write the parts one after the other")


def _time_ms(value: Any) -> int:
    """A row's timestamp as ms since the epoch (a timestamp column arrives as a
    datetime: naive ones are in the worker's local time, as PySpark makes them)."""
    if isinstance(value, datetime.datetime):
        ms = int(value.replace(microsecond=0).timestamp()) * 1000 + value.microsecond // 1000
    else:
        ms = int(value)
    if not 0 <= ms <= TIMESTAMP_MS_MAX:
        raise SinkCommitError(f"column timestamp: {value!r} is outside what a record's time can "
                              "be (from 1970-01-01 UTC, in ms, below 2**48)")
    return ms


class _TaskWrite:
    """One write task: a staged ledger per stream its rows name."""

    def __init__(self, bk: BookKeeper, opts: WriteOptions, layout: RowLayout,
                 owner: str) -> None:
        self.bk = bk
        self.opts = opts
        self.layout = layout
        self.owner = owner
        self.writers: dict[str, tuple[StagedWriter, int]] = {}
        self._ctx: StreamContext | None = None

    async def _open(self, stream: str) -> tuple[StagedWriter, int]:
        if len(self.writers) >= STREAMS_PER_BATCH_MAX:
            raise SinkCommitError(_TOO_MANY_STREAMS)
        try:
            check_stream_name(stream)
        except InvalidNameError as exc:
            raise SinkCommitError(f"column stream: {exc}") from None
        if self._ctx is None:
            self._ctx = await context_of(self.bk, self.opts.namespace)
        ctx = self._ctx
        try:
            sm = await ctx.md.stream(ctx.namespace, stream)
        except NoSuchStreamError:
            if not self.opts.create_streams:
                raise SinkCommitError(
                    f"column stream names stream {stream!r}, which namespace "
                    f"{ctx.namespace!r} does not have: create it first, or set the option "
                    "createStreams to true") from None
            await _create_stream(self.bk, ctx.namespace, stream)
            sm = await ctx.md.stream(ctx.namespace, stream)
        # A task routing rows to many streams keeps a writer for each: fewer entries
        # in flight apiece keep the task's memory near a one-stream task's.
        inflight = ROUTED_INFLIGHT_ENTRIES if self.layout.stream is not None \
            else INFLIGHT_ENTRIES
        writer = StagedWriter(ctx, stream, ctx.stream_config(sm), self.owner,
                              inflight_entries=inflight)
        got = self.writers[stream] = (writer, await last_txid(ctx, stream) + 1)
        return got

    async def add(self, chunk: list[Any]) -> None:
        layout = self.layout
        default = self.opts.stream
        for row in chunk:
            data = row[layout.data]
            if data is None:
                raise SinkCommitError("column data is null in a row: every record needs "
                                      "bytes (filter nulls out first)")
            if layout.data_is_text:
                data = data.encode()
            stream = default
            if layout.stream is not None and row[layout.stream] is not None:
                stream = row[layout.stream]
            if stream is None:
                raise SinkCommitError("a row's stream column is null and there is no stream "
                                      "option: set .option(\"stream\", ...) for such rows, or "
                                      "fill the column")
            got = self.writers.get(stream)
            writer, txid = got if got is not None else await self._open(stream)
            if layout.txid is not None and row[layout.txid] is not None:
                txid = int(row[layout.txid])
            extras = b""
            if layout.key is not None or layout.headers is not None:
                extras = _extras(row, layout)
            ts = None
            if layout.timestamp is not None and row[layout.timestamp] is not None:
                ts = _time_ms(row[layout.timestamp])
            await writer.add(txid, bytes(data), ts, extras)

    async def finish(self) -> dict[str, dict[str, Any]]:
        out = {}
        for stream, (writer, _) in self.writers.items():
            staged = await writer.finish()
            if staged is not None:
                out[stream] = staged_to(staged)
        return out

    async def abort(self) -> None:
        for writer, _ in self.writers.values():
            await writer.abort()


def _extras(row: Any, layout: RowLayout) -> bytes:
    """A row's key and headers, packed as a record stores them."""
    key = None
    if layout.key is not None and (key := row[layout.key]) is not None:
        key = key.encode() if layout.key_is_text else bytes(key)
    headers = None
    if layout.headers is not None and (given := row[layout.headers]):
        headers = {}
        for name, value in given.items():
            if value is None:
                raise SinkCommitError(f"column headers: header {name!r} is null in a row; a "
                                      "header needs a value (use empty bytes)")
            headers[name] = value.encode() if layout.headers_are_text else bytes(value)
    return pack_extras(key, headers)


def _write_task(opts: WriteOptions, layout: RowLayout, rows: Iterator[Any],
                owner: str, partition: int) -> AsyncbkCommitMessage:
    """Write a task's rows into staged ledgers; the commit message describes them."""
    with TaskLoop(opts) as tl:
        assert tl.bk is not None
        task = _TaskWrite(tl.bk, opts, layout, owner)
        try:
            chunk: list[Any] = []
            for row in rows:
                chunk.append(row)
                if len(chunk) >= WRITE_CHUNK_ROWS:
                    tl.run(task.add(chunk))
                    chunk = []
            if chunk:
                tl.run(task.add(chunk))
            staged = tl.run(task.finish())
        except BaseException:
            tl.run(task.abort())
            raise
    return AsyncbkCommitMessage(staged, owner, partition)


def _staged(messages: list[Any]) -> dict[str, list[StagedLedger]]:
    """Each stream's staged ledgers, in partition order."""
    ok = sorted((m for m in messages if isinstance(m, AsyncbkCommitMessage) and m.staged),
                key=lambda m: m.partition)
    out: dict[str, list[StagedLedger]] = {}
    for m in ok:
        for stream, staged in m.staged.items():
            out.setdefault(stream, []).append(staged_from(staged))
    return out


async def _commit(bk: BookKeeper, opts: WriteOptions, staged: dict[str, list[StagedLedger]],
                  owner: str | None, sink_id: str | None, batch: int | None) -> None:
    """Adopt every stream's staged ledgers in one transaction (recording ``batch``
    under ``sink_id``), then sweep what the owner left staged."""
    ctx = await context_of(bk, opts.namespace)
    if staged or (sink_id is not None and batch is not None):
        if sum(1 for ledgers in staged.values() if ledgers) > STREAMS_PER_BATCH_MAX:
            raise SinkCommitError(_TOO_MANY_STREAMS)
        done = await adopt_streams(ctx, staged, sink_id=sink_id, batch=batch)
        if done.replayed:  # committed before Spark could record it: add nothing twice
            for stream, ledgers in staged.items():
                await discard(ctx, stream, [s.ledger_id for s in ledgers])
            _log.info("batch committed before; its replay adds nothing", sink=sink_id,
                      batch=batch, last=done.last_batch)
    if owner is not None:
        await sweep_owner(ctx, owner)


class BatchWriter(DataSourceWriter):
    """``df.write.format("asyncbk")``: all the DataFrame's rows become visible at once,
    or none.  With the options ``sinkId`` and ``batchId`` (in ``foreachBatch``), a
    batch id the sink wrote before is not written again."""

    def __init__(self, opts: WriteOptions, layout: RowLayout) -> None:
        self.opts = opts
        self.layout = layout
        self.owner = opts.sink_id or f"batch-{uuid.uuid4().hex}"
        _prepare(opts, layout)

    def write(self, iterator: Iterator[Any]) -> AsyncbkCommitMessage:
        _, partition = _task_owner(self.opts, self.owner)
        return _write_task(self.opts, self.layout, iterator, self.owner, partition)

    def commit(self, messages: list[Any]) -> None:
        staged = _staged(messages)
        run_once(self.opts, lambda bk: _commit(bk, self.opts, staged, self.owner,
                                               self.opts.sink_id, self.opts.batch_id))

    def abort(self, messages: list[Any]) -> None:
        _discard(self.opts, _staged(messages), self.owner)


def _prepare(opts: WriteOptions, layout: RowLayout) -> None:
    """On the driver, before any task: the ``stream`` option's stream exists (created
    if absent); without that option, rows must name theirs."""
    if opts.stream is None:
        if layout.stream is None:
            raise SparkOptionError(NO_STREAM)
        return
    if layout.stream is not None:
        _log.warning("the rows have a stream column: each goes to the stream it names, and "
                     "only rows with a null one to the stream option's (drop the column to "
                     "write every row there; a DataFrame read from asyncbk has one)",
                     stream=opts.stream)
    stream = opts.stream
    run_once(opts, lambda bk: _create_stream(bk, opts.namespace, stream))


def _discard(opts: WriteOptions, staged: dict[str, list[StagedLedger]], owner: str | None) -> None:
    async def discard_all(bk: BookKeeper) -> None:
        ctx = await context_of(bk, opts.namespace)
        for stream, ledgers in staged.items():
            await discard(ctx, stream, [s.ledger_id for s in ledgers])
        if owner is not None:
            await sweep_owner(ctx, owner)

    run_once(opts, discard_all)


class MicroBatchWriter(DataSourceStreamWriter):
    """``writeStream.format("asyncbk")``: each micro-batch is appended exactly once,
    also when Spark replays it, to every stream its rows name, all streams in one
    transaction (docs/spark.md has the argument)."""

    def __init__(self, opts: WriteOptions, layout: RowLayout) -> None:
        self.opts = opts
        self.layout = layout
        _prepare(opts, layout)

    def write(self, iterator: Iterator[Any]) -> AsyncbkCommitMessage:
        owner, partition = _task_owner(self.opts, None)
        return _write_task(self.opts, self.layout, iterator, owner, partition)

    def _owner(self, messages: list[Any]) -> str | None:
        owners = {m.owner for m in messages if isinstance(m, AsyncbkCommitMessage)}
        return self.opts.sink_id or (owners.pop() if len(owners) == 1 else None)

    def commit(self, messages: list[Any], batchId: int) -> None:
        staged = _staged(messages)
        owner = self._owner(messages)
        if owner is None:
            if staged:
                raise SinkCommitError("the tasks of one batch named different sinks; set the "
                                      "option sinkId")
            return  # an empty batch: nothing to add, nothing to record
        run_once(self.opts, lambda bk: _commit(bk, self.opts, staged, owner, owner, batchId))

    def abort(self, messages: list[Any], batchId: int) -> None:
        _discard(self.opts, _staged(messages), self._owner(messages))
