"""The bookie's HTTP admin endpoint (aiohttp) and its Prometheus metrics.

Routes:

* ``GET /healthz``: 200 ``ok`` while the bookie serves (writable or read-only),
  503 otherwise (starting, lease lost, draining).
* ``GET /metrics``: Prometheus text format.  Values are read from the bookie's
  own counters and histograms at scrape time, so serving metrics costs the
  request path nothing.
* ``GET /api/v1/bookie/info``: id, state, disk usage, version, ledgers, entries.
* ``GET /api/v1/bookie/state``: ``{"state": ..., "read_only": ..., "reasons": [...]}``.
* ``PUT /api/v1/bookie/state`` with ``{"read_only": true|false}``: switch to
  read-only for maintenance (adds refused, reads served, the registration moves)
  and back.  A bookie read-only for another reason (disk, journal, config) stays so.

Bad requests get a 4xx with ``{"error": "..."}``; the server keeps serving.

The endpoint sees the bookie through :class:`~.admin.BookieAdmin` (its state, its
figures, the maintenance switch, garbage collection), never through its parts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from aiohttp import web
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)

from .._version import __version__
from ..errors import BKError
from ..net.http import AdminHttp
from ..stats import MetricFamilies
from .admin import BookieAdmin
from .state import SERVING_STATES, BookieState, ReadOnlyReason

PREFIX = "asyncbk_bookie"


class BookieCollector:
    """A Prometheus collector reading a bookie (its :class:`~.admin.BookieAdmin`) at
    scrape time."""

    def __init__(self, bookie: BookieAdmin) -> None:
        self.bookie = bookie

    def describe(self) -> list[Metric]:
        return []  # collected lazily: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        b = self.bookie
        families = MetricFamilies(PREFIX, "bookie", b.bookie_id)
        gauge, counter, histogram = families.gauge, families.counter, families.histogram

        view = b.state_view()
        state = view.state
        g = GaugeMetricFamily(f"{PREFIX}_state", "1 for the bookie's current state",
                              labels=["bookie", "state"])
        for each in BookieState:
            g.add_metric([b.bookie_id, each.value], 1.0 if each is state else 0.0)
        yield g
        yield gauge("read_only", "1 while the bookie refuses adds (read-only)",
                    1.0 if state is BookieState.READ_ONLY else 0.0)
        reasons = GaugeMetricFamily(
            f"{PREFIX}_read_only_reason", "1 for each read-only reason in force (config, "
            "disk_full, journal_failed, maintenance); several may hold at once",
            labels=["bookie", "reason"])
        for reason in ReadOnlyReason:
            reasons.add_metric([b.bookie_id, reason.value],
                               1.0 if reason.value in view.reasons else 0.0)
        yield reasons
        listener = b.listener_figures()
        if listener is not None:
            yield gauge("connections", "open client connections", listener.connections)
            yield counter("protocol_errors", "connections closed for a malformed frame",
                          listener.protocol_errors)
        p = b.processor_figures()
        if p is not None:
            c = p.counters
            yield counter("add_requests", "adds accepted for journaling", c["adds"])
            yield counter("add_rejected", "adds refused (read-only, fenced, bad request...)",
                          c["rejected"])
            yield counter("add_errors", "adds that failed in the journal", c["add_errors"])
            yield counter("written_bytes", "entry bytes accepted by adds", c["add_bytes"])
            yield counter("read_requests", "read and batch-read requests", c["reads"])
            yield counter("read_entries", "entries returned by reads", c["read_entries"])
            yield counter("read_bytes", "entry bytes returned by reads", c["read_bytes"])
            yield counter("read_errors", "reads answered with an I/O error", c["read_errors"])
            yield counter("fence_requests", "fencing reads", c["fences"])
            yield histogram("add_latency_seconds",
                            "add: arrival to answer (journal fsync included)", p.add_latency)
            yield histogram("read_latency_seconds", "read: arrival to answer", p.read_latency)
        st = b.storage_statistics()
        if st is not None:
            j = st["journal"]
            yield gauge("ledgers", "ledgers stored", st["ledgers"])
            yield gauge("entries", "entries indexed", st["entries"])
            yield gauge("disk_free_bytes", "free bytes of the ledger disk", st["disk_free_bytes"])
            yield gauge("disk_total_bytes", "size of the ledger disk", st["disk_total_bytes"])
            yield counter("checkpoints", "checkpoints written", st["checkpoints"])
            yield counter("entry_log_flushes", "background entry-log fsyncs",
                          st["entry_log_flushes"])
            yield counter("journal_files_deleted", "journal files removed after checkpoints",
                          st["journal_files_deleted"])
            yield counter("ledgers_deleted", "ledgers garbage collected", st["ledgers_deleted"])
            yield counter("compactions", "entry logs compacted", st["compactions"])
            yield counter("compaction_freed_bytes", "entry log bytes reclaimed by compaction",
                          st["compacted_bytes"] - st["compaction_moved_bytes"])
            yield counter("compaction_moved_bytes", "live bytes moved by compaction",
                          st["compaction_moved_bytes"])
            yield gauge("journal_queue_entries", "records waiting for or in a journal write",
                        j["queue_entries"])
            yield counter("journal_records", "records journaled", j["records"])
            yield counter("journal_bytes", "bytes journaled", j["bytes"])
            yield counter("journal_batches", "group commits (one write + fdatasync each)",
                          j["batches"])
            fr = CounterMetricFamily(f"{PREFIX}_journal_flushes", "group commits by reason",
                                     labels=["bookie", "reason"])
            for reason, n in sorted(j["flush_reasons"].items()):
                fr.add_metric([b.bookie_id, reason], n)
            yield fr
            yield gauge("journal_failed", "1 once the journal failed (bookie read-only)",
                        1.0 if j["failed"] else 0.0)
            yield from _directory_families(b, st)
        journals = b.journal_figures()
        if journals is not None:
            yield histogram("journal_fsync_seconds", "journal fdatasync time",
                            journals.fsync_latency)
            yield histogram("journal_batch_records", "records per group commit",
                            journals.batch_records)


def _directory_families(b: BookieAdmin, st: dict[str, Any]) -> Iterator[Metric]:
    """Per directory: free and total bytes of each ledger directory's file system (the
    storage's figures, refreshed every second) and of each journal directory's (the
    disk watch's, every ``disk_check_interval_s``), whether each ledger directory is
    full, and the disk watch's two marks.  Nothing here asks a disk."""
    _, ledger_setting = b.directories()
    check = b.disk_check()
    if "directories" in st:  # several ledger directories
        ledgers = [(d["ledger_dir"], d["disk_free_bytes"], d["disk_total_bytes"], d["full"])
                   for d in st["directories"]]
    else:
        name, full = ledger_setting, False
        if check is not None and len(check.directories) == 1:
            name, full = check.directories[0].ledger_dir, check.directories[0].full
        ledgers = [(name, st["disk_free_bytes"], st["disk_total_bytes"], full)]
    labels = ["bookie", "dir", "kind"]
    free = GaugeMetricFamily(f"{PREFIX}_directory_free_bytes", "free bytes of the file "
                             "system of a ledger or journal directory", labels=labels)
    total = GaugeMetricFamily(f"{PREFIX}_directory_total_bytes", "size of the file "
                              "system of a ledger or journal directory", labels=labels)
    full_family = GaugeMetricFamily(
        f"{PREFIX}_directory_full", "1 while a ledger directory takes no plain adds (its "
        "disk or its journal's went past the high mark, not yet below the low mark)",
        labels=["bookie", "dir"])
    for name, f, t, is_full in ledgers:
        free.add_metric([b.bookie_id, name, "ledger"], f)
        total.add_metric([b.bookie_id, name, "ledger"], t)
        full_family.add_metric([b.bookie_id, name], 1.0 if is_full else 0.0)
    journals: dict[str, tuple[int, int]] = {}
    for d in check.directories if check is not None else ():
        if d.journal_free_bytes is not None and d.journal_total_bytes is not None:
            journals.setdefault(d.journal_dir, (d.journal_free_bytes, d.journal_total_bytes))
    for name, (f, t) in journals.items():
        free.add_metric([b.bookie_id, name, "journal"], f)
        total.add_metric([b.bookie_id, name, "journal"], t)
    yield free
    yield total
    yield full_family
    if check is not None:
        families = MetricFamilies(PREFIX, "bookie", b.bookie_id)
        yield families.gauge("disk_usage_threshold", "used fraction at which a directory "
                             "turns full (disk_usage_threshold)", check.threshold)
        yield families.gauge("disk_usage_lwm_threshold", "used fraction below which a full "
                             "directory is writable again (disk_usage_lwm_threshold)",
                             check.lwm_threshold)


class AdminHttpServer:
    """aiohttp server of one bookie's admin routes; ``start`` returns the bound port."""

    def __init__(self, bookie: BookieAdmin, host: str, port: int,
                 extra_routes: Sequence[web.RouteDef] = (),
                 extra_collectors: Sequence[Any] = (), **security: Any) -> None:
        self.bookie = bookie
        self._http = AdminHttp(host, port, [
            web.get("/healthz", self.healthz),
            web.get("/api/v1/bookie/info", self.info),
            web.get("/api/v1/bookie/state", self.get_state),
            web.put("/api/v1/bookie/state", self.put_state),
            web.put("/api/v1/bookie/gc", self.run_gc),
            web.get("/api/v1/bookie/gc", self.gc_status),
            *extra_routes,
        ], [BookieCollector(bookie), *extra_collectors],  # extra: auto-recovery in-process
            **security)  # ssl_context, tokens, open_reads

    @property
    def port(self) -> int:
        return self._http.port

    def set_tokens(self, tokens: Sequence[bytes]) -> None:
        self._http.set_tokens(tokens)

    async def start(self) -> int:
        return await self._http.start()

    async def close(self) -> None:
        await self._http.close()

    # ------------------------------------------------------------------ routes

    async def healthz(self, request: web.Request) -> web.Response:
        state = self.bookie.state_view().state
        if state in SERVING_STATES:
            return web.Response(text="ok\n")
        return web.Response(status=503, text=f"not serving: {state.value}\n")

    async def info(self, request: web.Request) -> web.Response:
        b = self.bookie
        out: dict[str, Any] = {"bookie_id": b.bookie_id, "state": b.state_view().state.value,
                               "version": __version__, "http_port": self.port}
        st = b.storage_statistics()
        if st is not None:
            free, total = st["disk_free_bytes"], st["disk_total_bytes"]
            journal_dir, ledger_dir = b.directories()
            out.update(ledgers=st["ledgers"], entries=st["entries"],
                       disk={"free_bytes": free, "total_bytes": total,
                             "used_fraction": round(1 - free / total, 6) if total else None},
                       journal_dir=journal_dir, ledger_dir=ledger_dir)
            if "directories" in st:  # several ledger directories: each one's state
                out["directories"] = st["directories"]
        return web.json_response(out)

    async def get_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.bookie.state_view().to_json())

    async def put_state(self, request: web.Request) -> web.Response:
        try:
            doc = json.loads(await request.text())
        except ValueError:
            return _error(400, 'body must be JSON, e.g. {"read_only": true}')
        if not isinstance(doc, dict) or not isinstance(doc.get("read_only"), bool) \
                or set(doc) - {"read_only"}:
            return _error(400, 'body must be {"read_only": true} or {"read_only": false}')
        state = self.bookie.state_view().state
        if state not in SERVING_STATES:
            return _error(409, f"bookie is {state.value}: try again when it serves")
        try:
            view = await self.bookie.set_maintenance(doc["read_only"])
        except BKError as exc:
            return _error(503, f"could not switch: {exc}")
        return web.json_response(view.to_json())

    async def gc_status(self, request: web.Request) -> web.Response:
        stats = self.bookie.gc_statistics()
        if stats is None:
            return _error(409, "garbage collection is not running yet")
        return web.json_response(stats)

    async def run_gc(self, request: web.Request) -> web.Response:
        """Run a garbage collection round now, compacting every log below the major
        threshold (as BookKeeper's forced GC)."""
        try:
            done = await self.bookie.run_gc()
        except BKError as exc:
            return _error(503, f"garbage collection failed: {exc}")
        if done is None:
            return _error(409, "garbage collection is not running yet")
        return web.json_response(done)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


__all__ = ["AdminHttpServer", "BookieCollector"]
