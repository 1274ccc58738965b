"""Free loopback ports for local servers, chosen where outgoing connections do not go.

The kernel's pick for port 0 comes from the *ephemeral* range
(``/proc/sys/net/ipv4/ip_local_port_range``), the same range it gives every
outgoing connection its local port from.  A port chosen that way and bound a
moment later by a child process can meanwhile have become the local end of
some client's connection (``EADDRINUSE``).  So servers get ports from below
that range, where only listeners live; a port is handed out once per process.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

LOW = 10_000
"""Lowest port handed out (below are well-known and registered services)."""

_ATTEMPTS = 200
_given: set[int] = set()
_lock = threading.Lock()
_random = random.SystemRandom()


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux's
    default where it cannot be read)."""
    try:
        low, high = (int(v) for v in path.read_text().split()[:2])
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, outside the ephemeral range where possible.

    Another process may still take it before it is bound; callers that choose
    ports themselves retry with a new one then."""
    low, high = ephemeral_range()
    candidates = [(LOW, low - 1)] if low - 1 > LOW else []
    if high < 65535:
        candidates.append((high + 1, 65535))
    with _lock:
        for _ in range(_ATTEMPTS if candidates else 0):
            first, last = _random.choice(candidates)
            port = _random.randint(first, last)
            if port not in _given and _bindable(host, port):
                _given.add(port)
                return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        _given.add(port)
        return port
