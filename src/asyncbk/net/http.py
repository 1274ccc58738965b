"""The HTTP side of admin endpoints: an aiohttp server of JSON routes, plus
``/metrics`` rendered from Prometheus collectors (read at scrape time)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CollectorRegistry

REQUEST_BYTES_MAX = 64 * 1024


class AdminHttp:
    """``routes`` and ``GET /metrics`` on ``host:port``; ``start`` returns the bound port
    (useful with port 0)."""

    def __init__(self, host: str, port: int, routes: Sequence[web.RouteDef],
                 collectors: Sequence[Any]) -> None:
        self.host, self.port = host, port
        self.registry = CollectorRegistry(auto_describe=False)
        for collector in collectors:
            self.registry.register(collector)
        app = web.Application(client_max_size=REQUEST_BYTES_MAX)
        app.add_routes([web.get("/metrics", self._metrics), *routes])
        self._runner = web.AppRunner(app, access_log=None)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> int:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        sockets = getattr(getattr(site, "_server", None), "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        await self._runner.cleanup()


__all__ = ["AdminHttp"]
