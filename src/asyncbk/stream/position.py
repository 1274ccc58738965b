"""Positions in a stream: ``(segment, entry, slot)``.

``segment`` is the segment's sequence number in its stream (1, 2, ...; never
reused), ``entry`` the entry id in the segment's ledger, ``slot`` the record's
index inside that entry (small records are batched, several to an entry).
Positions compare in that order.  ``str(p)`` is ``"segment:entry:slot"`` and
``bytes(p)`` 20 big-endian bytes; ``Position.parse`` and ``Position.from_bytes``
take them back.

Two markers stand for positions not known in advance: ``Position.EARLIEST``
(the first record still in the stream) and ``Position.LATEST`` (just after the
last durable record: a reader started there sees only new records).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

_BYTES = struct.Struct(">QQI")
_MAX64 = (1 << 64) - 1
_MAX32 = (1 << 32) - 1
_REAL_MAX63 = (1 << 63) - 1
"""Real positions stay below this (ledger entry ids are signed 64-bit), so none can
be mistaken for the LATEST marker."""


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """A record's place in a stream (see the module docstring)."""

    segment: int
    entry: int
    slot: int

    EARLIEST: ClassVar[Position]
    LATEST: ClassVar[Position]

    def __str__(self) -> str:
        if self == _EARLIEST:
            return "earliest"
        if self == _LATEST:
            return "latest"
        return f"{self.segment}:{self.entry}:{self.slot}"

    def __bytes__(self) -> bytes:
        return _BYTES.pack(self.segment, self.entry, self.slot)

    @classmethod
    def parse(cls, text: str) -> Position:
        """The position ``str()`` printed (also ``earliest`` / ``latest``)."""
        if not isinstance(text, str):
            raise TypeError(f"Position.parse takes a str, not {type(text).__name__}")
        t = text.strip().lower()
        if t == "earliest":
            return _EARLIEST
        if t == "latest":
            return _LATEST
        parts = t.split(":")
        try:
            if len(parts) != 3:
                raise ValueError
            segment, entry, slot = (int(p) for p in parts)
        except ValueError:
            raise ValueError(f"bad stream position {text!r}: expected SEGMENT:ENTRY:SLOT "
                             "(e.g. 3:120:0), 'earliest' or 'latest'") from None
        return cls.checked(segment, entry, slot)

    @classmethod
    def from_bytes(cls, data: bytes) -> Position:
        if len(data) != _BYTES.size:
            raise ValueError(f"a stream position is {_BYTES.size} bytes, got {len(data)}")
        return cls(*_BYTES.unpack(data))

    @classmethod
    def checked(cls, segment: int, entry: int, slot: int) -> Position:
        if not (1 <= segment <= _REAL_MAX63 and 0 <= entry <= _REAL_MAX63
                and 0 <= slot < _MAX32):
            raise ValueError(f"bad stream position {segment}:{entry}:{slot}: expected "
                             f"SEGMENT:ENTRY:SLOT with segment >= 1, entry >= 0, slot >= 0 "
                             f"(segment and entry below 2**63, slot below 2**32 - 1)")
        return cls(segment, entry, slot)

    def is_marker(self) -> bool:
        """EARLIEST or LATEST rather than a real position."""
        return self in (_EARLIEST, _LATEST)


_EARLIEST = Position(0, 0, 0)
_LATEST = Position(_MAX64, _MAX64, _MAX32)
Position.EARLIEST = _EARLIEST
Position.LATEST = _LATEST

_new = object.__new__
_set_segment = Position.__dict__["segment"].__set__
_set_entry = Position.__dict__["entry"].__set__
_set_slot = Position.__dict__["slot"].__set__


def make_position(segment: int, entry: int, slot: int) -> Position:
    """``Position(segment, entry, slot)`` without the frozen dataclass's per-field
    ``object.__setattr__`` calls (about twice as fast): for the paths that make one
    per record (readers, acknowledgements).  No checks, like the constructor."""
    p = _new(Position)
    _set_segment(p, segment)
    _set_entry(p, entry)
    _set_slot(p, slot)
    return p
