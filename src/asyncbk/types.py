"""Small shared value types and constants."""

from __future__ import annotations

from dataclasses import dataclass

BookieId = str
"""A bookie id is ``"host:port"``: the address clients connect to."""

INVALID_ENTRY_ID = -1
"""Entry id meaning "none" (an empty ledger's last entry, an unknown LAC)."""

LAST_ENTRY_ID = -1
"""In a read request: the last entry the bookie holds for the ledger."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One entry read back from a ledger."""

    ledger_id: int
    entry_id: int
    data: bytes

    def __len__(self) -> int:
        return len(self.data)


def parse_bookie_id(bookie_id: BookieId) -> tuple[str, int]:
    """Split ``"host:port"``; raises ValueError if it is not of that form."""
    host, sep, port = bookie_id.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bookie id must be 'host:port', got {bookie_id!r}")
    return host.strip("[]"), int(port)
