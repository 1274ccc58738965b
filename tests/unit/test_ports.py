"""Ports for local servers come from outside the kernel's ephemeral range, where
outgoing connections take their local ports (a CI run once lost a bookie's admin port
to a client connection between choosing it and binding it)."""

from __future__ import annotations

import socket
from pathlib import Path

from asyncbk.local.ports import LOW, ephemeral_range, free_port


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    low, high = ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    for port in ports:
        assert LOW <= port < low or port > high
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_ephemeral_range_read_from_the_kernel_file_or_the_linux_default(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ephemeral_range(f) == (40000, 50000)
    f.write_text("garbage")
    assert ephemeral_range(f) == (32768, 60999)
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)
