"""The ``asyncbk stream`` admin commands: namespaces (``namespaces``,
``create-namespace``, ``namespace-info``, ``delete-namespace``) and streams
(``list``, ``create``, ``info``, ``delete``, ``retention``, ``truncate``), and the
``info`` table."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ...stream.meta import StreamConfig, StreamMetadata, config_from
from ..common import CliError, on_stop_signals
from .args import SETTINGS
from .common import confirm, records_text
from .segments import last_position, segment_rows

# ------------------------------------------------------------------ on the cluster


async def _namespaces(bk: Any, args: argparse.Namespace) -> int:
    async for name in bk.list_namespaces():
        print(name)
    return 0


async def _create_namespace(bk: Any, args: argparse.Namespace) -> int:
    settings = {f: getattr(args, f) for _, f, *_ in SETTINGS}
    config = config_from(settings, source=f"namespace {args.namespace!r}")
    await StreamMetadata(bk.meta).create_namespace(args.namespace, config,
                                                   int(time.time() * 1000))
    print(f"created namespace {args.namespace}")
    return 0


ON_CLUSTER: dict[str, Callable[[Any, argparse.Namespace], Awaitable[int]]] = {
    "namespaces": _namespaces,
    "create-namespace": _create_namespace,
}
"""The commands run on the client itself (``bk``): no namespace is opened first."""

# ------------------------------------------------------------------ on a namespace


async def _delete_namespace(ns: Any, args: argparse.Namespace) -> int:
    streams = [s async for s in ns.list_streams()]
    if streams and not args.force:
        shown = ", ".join(streams[:5]) + (", ..." if len(streams) > 5 else "")
        await confirm(f"delete namespace {ns.name} and its {len(streams)} stream(s) "
                      f"({shown}) with all their records?",
                      f"not deleting namespace {ns.name} and its streams")
    await ns.delete(force=bool(streams))
    print(f"deleted namespace {ns.name}" + (f" and its {len(streams)} stream(s)"
                                            if streams else ""))
    return 0


async def _namespace_info(ns: Any, args: argparse.Namespace) -> int:
    streams = len([s async for s in ns.list_streams()])
    if args.json:
        print(json.dumps({"namespace": ns.name, "config": dataclasses.asdict(ns.defaults),
                          "streams": streams}, indent=2))
        return 0
    print(f"namespace {ns.name}: {streams} stream(s); the defaults of its streams:")
    _print_settings(ns.defaults)
    return 0


async def _list(ns: Any, args: argparse.Namespace) -> int:
    async for name in ns.list_streams(args.prefix):
        print(name)
    return 0


async def _create(ns: Any, args: argparse.Namespace) -> int:
    overrides = {f: v for _, f, *_ in SETTINGS if (v := getattr(args, f)) is not None}
    await ns.create_stream(args.stream, **overrides)
    print(f"created stream {ns.name}/{args.stream}")
    return 0


async def _info(ns: Any, args: argparse.Namespace) -> int:
    info = await ns.stream_info(args.stream)
    rows = await segment_rows(ns, info)
    if args.json:
        last = last_position(rows)
        print(json.dumps({
            "namespace": info.namespace, "stream": info.stream,
            "config": dataclasses.asdict(info.config),
            "ended": info.ended,
            "first_position": str(info.first_position) if rows else None,
            "last_position": str(last) if last else None,
            "records": sum(r["records"] or 0 for r in rows),
            "segments": rows}, indent=2))
    else:
        _print_info(info, rows)
    return 0


async def _delete(ns: Any, args: argparse.Namespace) -> int:
    info = await ns.stream_info(args.stream)
    if not args.force:
        rows = await segment_rows(ns, info)
        records = sum(r["records"] or 0 for r in rows)
        live = any(r["state"] != "completed" for r in rows)
        await confirm(f"delete stream {ns.name}/{args.stream} ({len(rows)} segment(s), "
                      f"{records_text(records)}"
                      + ("; a writer may still be writing to it" if live else "")
                      + ")?", f"not deleting stream {ns.name}/{args.stream}")
    await ns.delete_stream(args.stream)
    print(f"deleted stream {ns.name}/{args.stream}")
    return 0


async def _retention_pass(ns: Any, args: argparse.Namespace) -> None:
    names = [args.stream] if args.stream else [n async for n in ns.list_streams()]
    for name in names:
        dropped = await ns.apply_retention(name)
        if args.every:
            await ns.subscriptions(name)  # the lag gauges, also when retention is off
        print(f"{ns.name}/{name}: dropped {dropped} segment(s)", flush=True)


async def _retention(ns: Any, args: argparse.Namespace) -> int:
    if not args.every:
        if args.metrics_port is not None:
            raise CliError("--metrics-port needs --every (a retention service)")
        await _retention_pass(ns, args)
        return 0
    task = asyncio.current_task()
    assert task is not None
    on_stop_signals(task.cancel)
    http = None
    try:
        if args.metrics_port is not None:
            from ...net.http import AdminHttp
            from ...stream.metrics import StreamCollector

            http = AdminHttp(args.metrics_host, args.metrics_port, [],
                             [StreamCollector(ns.bk, name="retention")])
            port = await http.start()
            print(f"serving /metrics on {args.metrics_host}:{port}", flush=True)
        while True:
            await _retention_pass(ns, args)
            await asyncio.sleep(args.every)
    except asyncio.CancelledError:
        if task.uncancel() == 0:
            return 0
        raise
    finally:
        if http is not None:
            await http.close()


async def _truncate(ns: Any, args: argparse.Namespace) -> int:
    dropped = await ns.truncate(args.stream, args.before, force=args.force)
    info = await ns.stream_info(args.stream)
    start = info.first_position
    print(f"dropped {dropped} segment(s) of {ns.name}/{args.stream}"
          + (f"; it now starts at {start}" if start is not None else ""))
    return 0


ON_NAMESPACE: dict[str, Callable[[Any, argparse.Namespace], Awaitable[int]]] = {
    "delete-namespace": _delete_namespace,
    "namespace-info": _namespace_info,
    "list": _list,
    "create": _create,
    "info": _info,
    "delete": _delete,
    "retention": _retention,
    "truncate": _truncate,
}
"""The admin commands run on the namespace ``args.namespace`` (``ns``), once opened."""

# ------------------------------------------------------------------ the info table


def _fmt_ms(ms: int | None) -> str:
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def placement_text(cfg: StreamConfig) -> str:
    """The placement settings of ``cfg`` in words; a setting left out is the writing
    client's."""
    def given(value: object) -> str:
        return "the client's" if value is None else str(value)

    if not cfg.placement:
        return "placement: the writing client's settings"
    enforce = {None: "the client's", True: "yes", False: "no"}[cfg.enforce_placement]
    return (f"placement: policy {given(cfg.placement_policy)}, min racks per write quorum "
            f"{given(cfg.min_racks_per_write_quorum)}, min regions per write quorum "
            f"{given(cfg.min_regions_per_write_quorum)}, enforce {enforce}")


def _print_settings(cfg: StreamConfig) -> None:
    print(f"settings: ensemble {cfg.ensemble_size}, write quorum {cfg.write_quorum}, ack "
          f"quorum {cfg.ack_quorum}, digest {cfg.digest}; rolling at {cfg.rolling_bytes} "
          f"bytes / {cfg.rolling_s:g} s / {cfg.rolling_entries} records (0: off); "
          f"retention {cfg.retention_s:g} s (0: until truncated); {placement_text(cfg)}")


def _print_info(info: Any, rows: list[dict[str, Any]]) -> None:
    cfg = info.config
    records = sum(r["records"] or 0 for r in rows)
    last = last_position(rows)
    txids = [r[k] for r in rows for k in ("first_txid", "last_txid") if r.get(k) is not None]
    print(f"stream {info.namespace}/{info.stream}: {len(rows)} segment(s), "
          f"{records_text(records)}"
          + (f", positions {rows[0]['first_position']} .. {last}" if last else "")
          + (f", txids {min(txids)} .. {max(txids)}" if txids else "")
          + (", ENDED" if info.ended else ""))
    _print_settings(cfg)
    if not rows:
        print("no segments yet (nothing was ever written)")
        return
    head = ["seq", "ledger", "state", "first", "last", "first_txid", "last_txid", "records",
            "bytes", "created", "completed", "storage"]
    table = [head]
    for r in rows:
        def cell(key: str, row: dict[str, Any] = r) -> str:
            v = row.get(key)
            return "-" if v is None else str(v)

        state = r["state"] + (" (so far)" if r.get("so_far") else "")
        table.append([cell("seq"), cell("ledger_id"), state, cell("first_position"),
                      cell("last_position"), cell("first_txid"), cell("last_txid"),
                      cell("records"), cell("size_bytes"), _fmt_ms(r["ctime_ms"]),
                      _fmt_ms(r["completion_ms"]), r["storage"]])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
