"""The client's side of many bookies: :class:`BookieClient`, the pool of channels (one
:class:`~asyncbk.net.channel.BookieChannel` per bookie, made on first use), and the
helpers callers wait on answers with (:func:`next_answers`, :func:`expect_answer`)."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from ..errors import BKError, BookieIOError, BookieUnavailableError, UnauthorizedAccessError
from ..proto import Response
from ..types import BookieId
from .channel import BookieChannel
from .connector import Connector

K = TypeVar("K")
R = TypeVar("R")


def expect_answer(resp: Response, cls: type[R], bookie: BookieId) -> R:
    """``resp`` as a ``cls``.  A channel hands each request only an answer of the
    request's own op (any other fails it with BookieIOError), so a mismatch here means
    a bookie answered out of turn: the same typed error, never an assert."""
    if not isinstance(resp, cls):
        raise BookieIOError(f"bookie {bookie} answered with a {type(resp).__name__}, "
                            f"expected a {cls.__name__}")
    return resp


async def next_answers(inflight: dict[asyncio.Future[Response], K],
                       timeout_s: float | None = None) -> list[tuple[K, Response | BKError]]:
    """Wait until at least one request of ``inflight`` (future -> caller's key) is
    answered and return every answered one as ``(key, response or BKError)``, removed
    from ``inflight``, in the order they were sent (so a simulated run replays the
    same way); ``[]`` if ``timeout_s`` passes first.  Other exceptions propagate."""
    done, _ = await asyncio.wait(inflight, timeout=timeout_s,
                                 return_when=asyncio.FIRST_COMPLETED)
    out: list[tuple[K, Response | BKError]] = []
    for fut in [f for f in inflight if f in done]:
        key = inflight.pop(fut)
        exc = fut.exception()
        if exc is not None and not isinstance(exc, BKError):
            raise exc
        out.append((key, exc if isinstance(exc, BKError) else fut.result()))
    return out


class BookieClient:
    """The client's pool of channels, one per bookie, created on first use."""

    def __init__(
        self,
        *,
        frame_bytes_max: int,
        requests_max: int,
        connect_timeout_s: float,
        reconnect_backoff_s_max: float,
        write_buffer_bytes_max: int = 64 * 1024 * 1024,
        connector: Connector | None = None,
        token: bytes | None = None,
    ) -> None:
        self._kw: dict[str, Any] = dict(
            frame_bytes_max=frame_bytes_max,
            requests_max=requests_max,
            connect_timeout_s=connect_timeout_s,
            reconnect_backoff_s_max=reconnect_backoff_s_max,
            write_buffer_bytes_max=write_buffer_bytes_max,
            connector=connector,
            token=token,
        )
        self._channels: dict[BookieId, BookieChannel] = {}
        self._closed = False

    def channel(self, bookie_id: BookieId) -> BookieChannel:
        ch = self._channels.get(bookie_id)
        if ch is None:
            if self._closed:
                raise BookieUnavailableError("client is closed")
            ch = BookieChannel(bookie_id, **self._kw)
            self._channels[bookie_id] = ch
        return ch

    def judging(self, bookie_id: BookieId) -> bool:
        """Whether the channel to ``bookie_id`` is finding out if the bookie refused this
        client (:attr:`BookieChannel.judging`)."""
        ch = self._channels.get(bookie_id)
        return ch is not None and ch.judging

    async def verdict(self, bookie_id: BookieId) -> UnauthorizedAccessError | None:
        """Whether ``bookie_id`` refused this client (:meth:`BookieChannel.verdict`;
        None without a channel)."""
        ch = self._channels.get(bookie_id)
        return await ch.verdict() if ch is not None else None

    def reset_backoff(self, bookie_id: BookieId) -> None:
        """The bookie is back (registered anew): reconnect at once on the next send."""
        ch = self._channels.get(bookie_id)
        if ch is not None:
            ch.reset_backoff()

    async def close(self) -> None:
        self._closed = True
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            await ch.close()
