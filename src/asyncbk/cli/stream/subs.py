"""The ``asyncbk stream`` subscription commands: ``subscriptions`` (their lag),
``subscribe`` (consume one: print and acknowledge), ``seek-subscription`` and
``delete-subscription``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ...errors import BKError, EndOfStreamError
from ..common import on_stop_signals
from .common import confirm, stdout_gone
from .data import TAIL_WAIT_S, format_json, format_text
from .segments import last_position, segment_rows


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000)) if ms else "-"


async def _subscriptions(ns: Any, args: argparse.Namespace) -> int:
    infos = await ns.subscriptions(args.stream)
    if args.json:
        print(json.dumps([{**dataclasses.asdict(i), "position": str(i.position)}
                          for i in infos], indent=2))
        return 0
    if not infos:
        print(f"{ns.name}/{args.stream}: no subscriptions")
        return 0
    rows = [("NAME", "POSITION", "LAG RECORDS", "LAG BYTES", "LAG S", "EPOCH", "UPDATED", "")]
    for i in infos:
        rows.append((i.name, str(i.position), str(i.lag_records), str(i.lag_bytes),
                     f"{i.lag_s:.1f}", str(i.epoch), _when(i.mtime_ms),
                     "truncated: seek it" if i.truncated else ""))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return 0


async def _consume(ns: Any, args: argparse.Namespace) -> int:
    end = None
    if args.no_follow:
        end = last_position(await segment_rows(ns, await ns.stream_info(args.stream)))
        if end is None:
            return 0
    start = None if args.start_time is not None else args.start
    sub = await ns.subscribe(args.stream, args.name, start, timestamp_ms=args.start_time)
    fmt = format_json if args.json else format_text
    out = sys.stdout.buffer
    printed = 0
    try:
        while True:
            if end is not None and sub.position > end:
                return 0
            try:
                async with asyncio.timeout(TAIL_WAIT_S if end is not None else None):
                    rec = await sub.read_next()
            except TimeoutError:
                continue
            except EndOfStreamError:
                return 0
            try:
                out.write(fmt(rec))
                out.flush()
            except BrokenPipeError:
                stdout_gone()
                return 0
            await sub.ack(rec.position)  # printed: handled
            printed += 1
            if printed == args.count or (end is not None and rec.position >= end):
                return 0
    finally:
        try:
            await sub.close()
        except BKError as exc:
            print(f"could not persist the last acknowledgement: {exc}", file=sys.stderr)


async def _subscribe(ns: Any, args: argparse.Namespace) -> int:
    """``subscribe``: Ctrl-C (or SIGTERM) stops it; the acknowledgements so far are
    persisted."""
    task = asyncio.current_task()
    assert task is not None
    on_stop_signals(task.cancel)
    try:
        return await _consume(ns, args)
    except asyncio.CancelledError:
        if task.uncancel() == 0:
            return 0
        raise


async def _seek(ns: Any, args: argparse.Namespace) -> int:
    pos = await ns.seek_subscription(args.stream, args.name, args.position,
                                     timestamp_ms=args.time_ms)
    print(f"subscription {args.name} of {ns.name}/{args.stream} now resumes at {pos}")
    return 0


async def _delete(ns: Any, args: argparse.Namespace) -> int:
    if not args.force:
        infos = {i.name: i for i in await ns.subscriptions(args.stream)}
        info = infos.get(args.name)
        lag = f" ({info.lag_records} records not acknowledged)" if info is not None else ""
        await confirm(f"delete subscription {args.name} of {ns.name}/{args.stream}{lag}?",
                      f"not deleting subscription {args.name}")
    await ns.delete_subscription(args.stream, args.name)
    print(f"deleted subscription {args.name} of {ns.name}/{args.stream}")
    return 0


ON_NAMESPACE: dict[str, Callable[[Any, argparse.Namespace], Awaitable[int]]] = {
    "subscriptions": _subscriptions,
    "subscribe": _subscribe,
    "seek-subscription": _seek,
    "delete-subscription": _delete,
}
"""The subscription commands, run on the namespace ``args.namespace`` (``ns``)."""
