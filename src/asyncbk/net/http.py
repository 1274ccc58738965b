"""The HTTP side of admin endpoints: an aiohttp server of JSON routes, plus
``/metrics`` rendered from Prometheus collectors (read at scrape time)."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CollectorRegistry

from .server import token_matches

REQUEST_BYTES_MAX = 64 * 1024


OPEN_PATHS = frozenset({"/metrics", "/healthz"})
"""What ``GET`` may read without a token when ``open_reads`` (scrapers, probes)."""


class AdminHttp:
    """``routes`` and ``GET /metrics`` on ``host:port``; ``start`` returns the bound port
    (useful with port 0).

    With ``tokens``, a request must carry ``Authorization: Bearer <token>`` (compared
    in constant time) or gets 401, except ``GET /metrics`` and ``GET /healthz`` while
    ``open_reads``.  With ``ssl_context``, it is HTTPS (give it a
    :class:`~asyncbk.net.security.LiveServerTLS`'s context to renew its certificate
    while it runs).  :meth:`set_tokens` replaces the tokens: every request is checked
    against the list of the moment."""

    def __init__(self, host: str, port: int, routes: Sequence[web.RouteDef],
                 collectors: Sequence[Any], *, ssl_context: ssl.SSLContext | None = None,
                 tokens: Sequence[bytes] | None = None, open_reads: bool = True) -> None:
        self.host, self.port = host, port
        self.ssl_context = ssl_context
        self.tokens = list(tokens) if tokens is not None else None
        self.open_reads = open_reads
        self.registry = CollectorRegistry(auto_describe=False)
        for collector in collectors:
            self.registry.register(collector)
        app = web.Application(client_max_size=REQUEST_BYTES_MAX,
                              middlewares=[self._authorize] if self.tokens is not None else [])
        app.add_routes([web.get("/metrics", self._metrics), *routes])
        self._runner = web.AppRunner(app, access_log=None)

    def set_tokens(self, tokens: Sequence[bytes]) -> None:
        """Check requests against ``tokens`` from now on (an endpoint made without
        tokens stays open)."""
        if self.tokens is not None:
            self.tokens = list(tokens)

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Any) -> web.StreamResponse:
        assert self.tokens is not None
        if self.open_reads and request.method in ("GET", "HEAD") \
                and request.path in OPEN_PATHS:
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token_matches(given.strip().encode(),
                                                           self.tokens):
            return web.json_response(
                {"error": "unauthorized: send the header 'Authorization: Bearer TOKEN' with "
                          "one of the bookie's tokens"}, status=401,
                headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> int:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context)
        await site.start()
        sockets = getattr(getattr(site, "_server", None), "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        await self._runner.cleanup()


__all__ = ["AdminHttp"]
