"""Writing to a stream from Spark: ``df.write`` and ``writeStream`` with
``format("asyncbk")``.

Tasks write staged ledgers; the driver's commit adopts them into the stream in
one metadata transaction that records the batch under the sink's id
(:mod:`asyncbk.stream.adopt`), so a micro-batch Spark replays is added once
(docs/spark.md has the argument).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructType

from ..client.client import BookKeeper
from ..errors import BKError
from ..log import get_logger
from ..stream.adopt import (
    StagedLedger,
    StagedWriter,
    adopt,
    discard,
    last_txid,
    staged_from,
    staged_to,
    sweep,
)
from ..stream.namespace import Namespace
from .errors import SinkCommitError, SparkOptionError
from .options import WriteOptions
from .runtime import TaskLoop, context_of, run_once

WRITE_CHUNK_ROWS = 2048
"""Rows a task hands to its event loop at a time."""

_log = get_logger(component="spark")


@dataclass
class AsyncbkCommitMessage(WriterCommitMessage):
    """What one write task made: a staged ledger (None if the task had no rows)."""

    staged: dict[str, Any] | None
    owner: str
    partition: int


@dataclass(frozen=True)
class _RowLayout:
    data: int
    data_is_text: bool
    txid: int | None


def row_layout(schema: StructType | None) -> _RowLayout:
    """Where ``data`` (binary or string) and the optional ``txid`` are in a row."""
    if schema is None:
        return _RowLayout(0, False, None)
    names = [f.name for f in schema.fields]
    if "data" not in names:
        raise SparkOptionError(
            f"writing to asyncbk needs a column named data (binary or string); the "
            f"DataFrame has {', '.join(names) or 'no columns'}: select or rename one, e.g. "
            "df.selectExpr(\"to_json(struct(*)) AS data\")")
    data = schema.fields[names.index("data")]
    if not isinstance(data.dataType, (BinaryType, StringType)):
        raise SparkOptionError(f"column data must be binary or string, not "
                               f"{data.dataType.simpleString()}: cast it first")
    txid = None
    if "txid" in names:
        field = schema.fields[names.index("txid")]
        if not isinstance(field.dataType, (LongType, IntegerType)):
            raise SparkOptionError(f"column txid must be a long (bigint), not "
                                   f"{field.dataType.simpleString()}")
        txid = names.index("txid")
    return _RowLayout(names.index("data"), isinstance(data.dataType, StringType), txid)


async def _prepare_stream(bk: BookKeeper, opts: WriteOptions) -> None:
    """Create the target stream if it is absent."""
    ctx = await context_of(bk, opts.namespace)
    ns = Namespace(bk, ctx.namespace, ctx.defaults, ctx.stats)
    if not await ns.stream_exists(opts.stream):
        try:
            await ns.create_stream(opts.stream)
        except BKError as exc:
            if not await ns.stream_exists(opts.stream):
                raise SinkCommitError(f"cannot create stream {opts.namespace}/{opts.stream}: "
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


def _write_task(opts: WriteOptions, layout: _RowLayout, rows: Iterator[Any],
                owner: str, partition: int) -> AsyncbkCommitMessage:
    """Write a task's rows into a staged ledger; the commit message describes it."""
    with TaskLoop(opts) as tl:
        assert tl.bk is not None
        bk = tl.bk

        async def begin() -> tuple[StagedWriter, int]:
            ctx = await context_of(bk, opts.namespace)
            sm = await ctx.md.stream(ctx.namespace, opts.stream)
            writer = StagedWriter(ctx, opts.stream, ctx.stream_config(sm), owner)
            return writer, await last_txid(ctx, opts.stream) + 1

        writer, base = tl.run(begin())

        async def add(chunk: list[Any]) -> None:
            for row in chunk:
                data = row[layout.data]
                if data is None:
                    raise SinkCommitError("column data is null in a row: every record needs "
                                          "bytes (filter nulls out first)")
                if layout.data_is_text:
                    data = data.encode()
                txid = base
                if layout.txid is not None and row[layout.txid] is not None:
                    txid = int(row[layout.txid])
                await writer.add(txid, bytes(data))

        try:
            chunk: list[Any] = []
            for row in rows:
                chunk.append(row)
                if len(chunk) >= WRITE_CHUNK_ROWS:
                    tl.run(add(chunk))
                    chunk = []
            if chunk:
                tl.run(add(chunk))
            staged = tl.run(writer.finish())
        except BaseException:
            tl.run(writer.abort())
            raise
    return AsyncbkCommitMessage(staged_to(staged) if staged else None, owner, partition)


def _staged(messages: list[Any]) -> list[StagedLedger]:
    ok = sorted((m for m in messages if isinstance(m, AsyncbkCommitMessage) and m.staged),
                key=lambda m: m.partition)
    return [staged_from(m.staged) for m in ok if m.staged is not None]


class BatchWriter(DataSourceWriter):
    """``df.write.format("asyncbk")``: all the DataFrame's rows become visible at once,
    or none.  With the options ``sinkId`` and ``batchId`` (in ``foreachBatch``), a
    batch id the sink wrote before is not written again."""

    def __init__(self, opts: WriteOptions, layout: _RowLayout) -> None:
        self.opts = opts
        self.layout = layout
        self.owner = opts.sink_id or f"batch-{uuid.uuid4().hex}"
        run_once(opts, lambda bk: _prepare_stream(bk, opts))

    def write(self, iterator: Iterator[Any]) -> AsyncbkCommitMessage:
        _, partition = _task_owner(self.opts, self.owner)
        return _write_task(self.opts, self.layout, iterator, self.owner, partition)

    def commit(self, messages: list[Any]) -> None:
        staged = _staged(messages)

        async def commit(bk: BookKeeper) -> None:
            ctx = await context_of(bk, self.opts.namespace)
            done = await adopt(ctx, self.opts.stream, staged, sink_id=self.opts.sink_id,
                               batch=self.opts.batch_id)
            if done.replayed:  # sinkId + batchId written before: add nothing twice
                await discard(ctx, self.opts.stream, [s.ledger_id for s in staged])
            await sweep(ctx, self.opts.stream, owner=self.owner)

        run_once(self.opts, commit)

    def abort(self, messages: list[Any]) -> None:
        _discard(self.opts, _staged(messages), self.owner)


def _discard(opts: WriteOptions, staged: list[StagedLedger], owner: str | None) -> None:
    async def discard_all(bk: BookKeeper) -> None:
        ctx = await context_of(bk, opts.namespace)
        await discard(ctx, opts.stream, [s.ledger_id for s in staged])
        if owner is not None:
            await sweep(ctx, opts.stream, owner=owner)

    run_once(opts, discard_all)


class MicroBatchWriter(DataSourceStreamWriter):
    """``writeStream.format("asyncbk")``: each micro-batch is appended exactly once,
    also when Spark replays it (docs/spark.md has the argument)."""

    def __init__(self, opts: WriteOptions, layout: _RowLayout) -> None:
        self.opts = opts
        self.layout = layout
        run_once(opts, lambda bk: _prepare_stream(bk, opts))

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

        async def commit(bk: BookKeeper) -> None:
            ctx = await context_of(bk, self.opts.namespace)
            done = await adopt(ctx, self.opts.stream, staged, sink_id=owner, batch=batchId)
            if done.replayed:  # committed before Spark could record it: add nothing twice
                await discard(ctx, self.opts.stream, [s.ledger_id for s in staged])
                _log.info("batch committed before; its replay adds nothing",
                          stream=self.opts.stream, batch=batchId, last=done.last_batch)
            await sweep(ctx, self.opts.stream, owner=owner)

        run_once(self.opts, commit)

    def abort(self, messages: list[Any], batchId: int) -> None:
        _discard(self.opts, _staged(messages), self._owner(messages))
