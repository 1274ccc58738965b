"""HTTP routes and Prometheus metrics of auto-recovery.

Served by ``asyncbk autorecovery --http-port P`` on its own, and by a bookie
running auto-recovery in-process (``asyncbk bookie --autorecovery``) beside the
bookie's routes:

* ``GET /api/v1/autorecovery/status``: this process's role and progress.
* ``GET /api/v1/autorecovery/auditor``: ``{"auditor": id or null}``.
* ``GET /api/v1/autorecovery/underreplicated``: the marked ledgers, with the lost
  bookies of each and how long ago they were marked (by the process's clock).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator

from aiohttp import web
from prometheus_client.core import Metric

from ..errors import BKError
from ..net.http import AdminHttp
from ..stats import MetricFamilies
from .service import AUDITOR_LOCK, AutoRecovery

PREFIX = "asyncbk_autorecovery"


class AutoRecoveryCollector:
    def __init__(self, ar: AutoRecovery) -> None:
        self.ar = ar

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        st = self.ar.status
        r = st.replication
        families = MetricFamilies(PREFIX, "id", st.id)
        gauge, counter = families.gauge, families.counter

        yield gauge("is_auditor", "1 while this process is the elected auditor",
                    1.0 if st.is_auditor else 0.0)
        yield gauge("lost_bookies", "bookies found lost by this auditor", len(st.lost))
        yield gauge("bookies_within_delay", "bookies gone but not yet lost (within the delay)",
                    len(st.lost_pending))
        yield gauge("underreplicated_ledgers", "marked ledgers at the worker's last round",
                    st.underreplicated)
        yield gauge("replicating", "1 while a ledger is being re-replicated",
                    0.0 if st.replicating is None else 1.0)
        yield counter("ledgers_marked", "ledgers marked under-replicated by this auditor",
                      st.ledgers_marked)
        yield counter("audits", "full scans of the ledgers", st.audits)
        yield counter("replicated_ledgers", "ledgers made whole again", st.replicated_ledgers)
        yield counter("recovered_open_ledgers", "open ledgers fenced and closed to copy them",
                      st.recovered_open_ledgers)
        yield counter("copied_entries", "entries copied to replacement bookies", r.entries)
        yield counter("copied_bytes", "bytes copied to replacement bookies", r.bytes)
        yield counter("copied_fragments", "fragments copied", r.fragments)
        yield counter("errors", "re-replication attempts that failed", r.errors)
        yield counter("placement_checks", "placement checks of every ledger (--fix-placement)",
                      st.placement_checks)
        yield gauge("placement_violating_ledgers",
                    "ledgers violating the placement policy at the last check",
                    st.placement_violating)
        yield counter("placement_fixed_fragments",
                      "fragments moved to comply with the placement policy",
                      st.placement_fixed_fragments)
        yield gauge("placement_left_fragments",
                    "violating fragments left at the last check", st.placement_left)
        yield counter("placement_blocked_replications",
                      "re-replications deferred: no replacement meets a ledger's enforced "
                      "placement", st.placement_blocked)


def routes(ar: AutoRecovery) -> list[web.RouteDef]:
    async def status(request: web.Request) -> web.Response:
        return web.json_response(ar.status.to_json())

    async def auditor(request: web.Request) -> web.Response:
        try:
            return web.json_response({"auditor": await ar.meta.lock_holder(AUDITOR_LOCK)})
        except BKError as exc:
            return web.json_response({"error": str(exc)}, status=503)

    async def underreplicated(request: web.Request) -> web.Response:
        try:
            marks = await ar.meta.list_underreplicated()
        except BKError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        now_ms = ar.clock.wall_s() * 1000
        return web.json_response({"ledgers": [
            {"ledger_id": m.ledger_id, "lost_bookies": sorted(m.bookies),
             "marked_s_ago": round((now_ms - m.marked_ms) / 1000, 1)} for m in marks]})

    return [web.get("/api/v1/autorecovery/status", status),
            web.get("/api/v1/autorecovery/auditor", auditor),
            web.get("/api/v1/autorecovery/underreplicated", underreplicated)]


class AutoRecoveryHttpServer:
    """The HTTP endpoint of a stand-alone auto-recovery process; HTTPS with
    ``ssl_context`` (e.g. :func:`asyncbk.net.security.server_context`)."""

    def __init__(self, ar: AutoRecovery, host: str, port: int, *,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        async def healthz(request: web.Request) -> web.Response:
            return web.Response(text="ok\n")

        self._http = AdminHttp(host, port, [web.get("/healthz", healthz), *routes(ar)],
                               [AutoRecoveryCollector(ar)], ssl_context=ssl_context)

    async def start(self) -> int:
        return await self._http.start()

    async def close(self) -> None:
        await self._http.close()


__all__ = ["AutoRecoveryCollector", "AutoRecoveryHttpServer", "routes"]
