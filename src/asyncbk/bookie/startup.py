"""Checks a bookie makes before it looks at its cookie: is its port free, and is a
bookie with its id already registered and running?

Without them, a second bookie started by mistake on the port of a live one
(with other, empty directories) would get as far as the cookie check and be
told its disk was wiped, with advice to delete the cookie of the *live*
bookie.  So the order is: the port, then the registry, then the cookie.

The network is a seam (:class:`BookieNetwork`): is a port free, does an address
answer, and listening itself.  The bookie runs :data:`OS_NETWORK` (sockets); the
simulator its simulated network.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..errors import ConfigError, CookieError
from ..meta.api import BookieRegistry

if TYPE_CHECKING:
    from ..net.server import BookieListener

PROBE_TIMEOUT_S = 2.0
"""How long a connection to a registered bookie's address may take to say it is alive."""

_TCP_LISTEN = "0A"


def port_free(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now (same options as the bookie's:
    SO_REUSEADDR, so connections of a stopped process in TIME_WAIT do not count)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return True  # the listener reports a bad host itself
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10 or parts[3] != _TCP_LISTEN:
                continue
            local_port = parts[1].rsplit(":", 1)[-1]
            with contextlib.suppress(ValueError):
                if int(local_port, 16) == port:
                    inodes.add(parts[9])
    return inodes


def port_user(port: int, width: int = 100) -> str | None:
    """``"pid N: command line"`` of the process listening on TCP ``port``, if this
    user may see it (Linux ``/proc``); else None."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    proc = Path("/proc")
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in wanted:
                    raw = (entry / "cmdline").read_bytes()
                    text = " ".join(p.decode(errors="replace") for p in raw.split(b"\0") if p)
                    cut = f"{text[:width]}..." if len(text) > width else text
                    return f"pid {entry.name}: {cut}" if cut else f"pid {entry.name}"
            except OSError:
                continue
    return None


def port_in_use_message(port: int, option: str) -> str:
    """``port P is in use (by ...), choose another OPTION``: blocking, run in a thread."""
    who = port_user(port)
    return f"port {port} is in use (by {who or 'another process'}), choose another {option}"


async def _answers(host: str, port: int, timeout_s: float) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


class Acceptor(Protocol):
    """A listening endpoint (what :meth:`BookieNetwork.listen` returns)."""

    async def stop_accepting(self) -> None:
        """Refuse new connections (those accepted go on)."""
        ...


class BookieNetwork(Protocol):
    """The bookie's network seam: the checks before start, and listening."""

    async def port_free(self, host: str, port: int) -> bool:
        """Whether a listener could bind ``host:port`` now."""
        ...

    async def port_in_use_message(self, port: int, option: str) -> str:
        """``port P is in use (by ...), choose another OPTION``."""
        ...

    async def answers(self, host: str, port: int, timeout_s: float) -> bool:
        """Whether something accepts connections at ``host:port`` within ``timeout_s``."""
        ...

    async def listen(self, listener: BookieListener, host: str, port: int) -> Acceptor:
        """Start accepting connections for ``listener`` at ``host:port``."""
        ...


class OsNetwork:
    """:class:`BookieNetwork` over real sockets."""

    async def port_free(self, host: str, port: int) -> bool:
        return await asyncio.to_thread(port_free, host, port)

    async def port_in_use_message(self, port: int, option: str) -> str:
        return await asyncio.to_thread(port_in_use_message, port, option)

    async def answers(self, host: str, port: int, timeout_s: float) -> bool:
        return await _answers(host, port, timeout_s)

    async def listen(self, listener: BookieListener, host: str, port: int) -> Acceptor:
        await listener.start(host, port)
        return listener


OS_NETWORK = OsNetwork()


async def check_not_running(meta: BookieRegistry, bookie_id: str, host: str, port: int,
                            probe_timeout_s: float = PROBE_TIMEOUT_S, *,
                            network: BookieNetwork = OS_NETWORK) -> None:
    """Refuse to start (ConfigError / CookieError) when the listen port is taken or a
    bookie with this id is registered and answering.  A registration left by a
    bookie that died moments ago (its lease has not expired yet, nothing answers at
    its address) does not count: that is the restart of a crashed bookie."""
    free = await network.port_free(host, port)
    registered = bookie_id in await meta.list_bookies()
    if registered:
        id_host, _, id_port = bookie_id.rpartition(":")
        live = not free or await network.answers(id_host.strip("[]"), int(id_port),
                                                 probe_timeout_s)
        if live:
            raise CookieError(
                f"a bookie with id {bookie_id} is already registered and running; this is a "
                f"second process with the same id. Leave the running one alone: to start "
                f"another bookie, give it its own --port and directories.")
    if not free:
        raise ConfigError(await network.port_in_use_message(port, "--port"))
