"""What the local cluster's server children (etcd, the object store) share: their
process, ``pid`` and ``running``, ``kill()`` (SIGKILL, synchronous, safe from an
``atexit`` hook), a tail of their log for error messages, and ``async with``.

A server registers itself while its process may be alive (:meth:`ServerProcess.track`);
an ``atexit`` hook kills every one still registered when the interpreter exits, so
no test run leaves one behind."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
from pathlib import Path
from types import TracebackType
from typing import Self

LOG_TAIL_BYTES = 4000

_RUNNING: set[ServerProcess] = set()
"""Servers whose process may be alive (strong references on purpose: a
forgotten server must still be killed at exit)."""


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_RUNNING):
        server.kill()


class ServerProcess:
    """The process part of a local server; subclasses start and stop it."""

    _proc: asyncio.subprocess.Process | None = None
    log_path: Path
    what = "the server"
    """How its log is named in messages."""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    def track(self) -> None:
        """Its process may be alive from now on: killed at exit unless reaped."""
        _RUNNING.add(self)

    def untrack(self) -> None:
        _RUNNING.discard(self)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process if it runs (directly to the pid, not through the
        asyncio transport, so that it also works after the loop is gone)."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL now, without waiting (safe to call any time; ``stop()`` reaps)."""
        self.signal(signal.SIGKILL)

    async def log_tail(self, nbytes: int = LOG_TAIL_BYTES) -> str:
        """The last ``nbytes`` of its log (for error messages)."""

        def read() -> str:
            try:
                with self.log_path.open("rb") as fh:
                    fh.seek(0, os.SEEK_END)
                    fh.seek(max(0, fh.tell() - nbytes))
                    return fh.read().decode(errors="replace")
            except OSError as exc:
                return f"<cannot read {self.log_path}: {exc}>"

        return await asyncio.to_thread(read)

    stop_timeout_s: float = 10.0

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_timeout_s``; returns once the process is
        gone (its data and ports stay, for a later ``start()``).  Cancelled half-way,
        it kills the process rather than leave it running."""
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.returncode is None:
                self.signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
                self.signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), self.stop_timeout_s)
                except TimeoutError:
                    self.kill()
            await self.reap()
        except BaseException:
            self.kill()
            raise
        finally:
            if proc.returncode is not None:
                self.untrack()
                self._proc = None
        await self.stopped()

    async def stopped(self) -> None:
        """Called once the process is gone (a subclass cleans up after it)."""

    async def reap(self) -> None:
        """Wait for the process to end (after a kill)."""
        if self._proc is not None:
            await self._proc.wait()
            self.untrack()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
