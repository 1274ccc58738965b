"""The object an offloaded segment becomes (format version 1): pure encoding and
decoding, no I/O.  docs/tiered-storage.md describes it for other readers.

One object per segment's ledger, little-endian throughout::

    header   16 bytes   "ABKSEG" | version u16 | ledger id u64
    block    ...        "BLK1" | entries n u32 | first entry id u64
                        n x (length u32 | payload)
                        xxh3-64 of the block's bytes before it, u64
    ...                 (blocks of consecutive entries, about ``block_bytes`` each)
    index               "IDX1" | first entry id u64 | entries u64 | payload bytes u64
                        | blocks m u32 | m x first entry id u64 | m x offset u64
                        | m x length u32 | xxh3-64 of the index's bytes before it, u64
    trailer  32 bytes   index offset u64 | index length u64
                        | xxh3-64 of every byte before the trailer u64 | "ABKEND01"

A payload is the entry as the stream writer wrote it (a batch of records), so
reading an offloaded entry decodes exactly as reading it from the bookies.  The
segment's metadata records the index's offset and length: reading one entry is
two ranged GETs at most (the index, kept once read, and the entry's block), and a
sequential read streams whole blocks.  Every block carries its own checksum,
checked on every read; the trailer's digest covers the whole object (the
offloader's verification reads it all back).
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

import xxhash

from ..errors import CorruptObjectError

FORMAT_VERSION = 1
MAGIC = b"ABKSEG"
BLOCK_MAGIC = b"BLK1"
INDEX_MAGIC = b"IDX1"
TRAILER_MAGIC = b"ABKEND01"
HEADER = struct.Struct("<6sHQ")
BLOCK_HEAD = struct.Struct("<4sIQ")
INDEX_HEAD = struct.Struct("<4sQQQI")
TRAILER = struct.Struct("<QQQ8s")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
BLOCK_BYTES_DEFAULT = 1024 * 1024
"""A block is closed once it holds this many bytes (an entry larger than this is a
block of its own)."""


@dataclass(frozen=True, slots=True)
class ObjectLayout:
    """What the metadata records of an object: its size, where its index is, its
    entries, and the digest of its bytes before the trailer."""

    size: int
    index_offset: int
    index_length: int
    first_entry: int
    entries: int
    payload_bytes: int
    digest: int


class ObjectBuilder:
    """Builds the object of one ledger, entry by entry (pure state): :meth:`add`
    returns the bytes ready to upload (the header and every completed block) and
    :meth:`finish` the rest."""

    def __init__(self, ledger_id: int, first_entry: int = 0,
                 block_bytes: int = BLOCK_BYTES_DEFAULT) -> None:
        if block_bytes < 1:
            raise ValueError("block_bytes must be >= 1")
        self.ledger_id = ledger_id
        self.block_bytes = block_bytes
        self._next = first_entry
        self._first = first_entry
        self._parts: list[bytes] = []
        self._block_first = first_entry
        self._block_size = 0
        self._offset = 0
        self._digest = xxhash.xxh3_64()
        self._payload_bytes = 0
        self._firsts: list[int] = []
        self._offsets: list[int] = []
        self._lengths: list[int] = []
        self._started = False
        self._finished = False

    def _emit(self, data: bytes, out: list[bytes]) -> None:
        self._digest.update(data)
        self._offset += len(data)
        out.append(data)

    def add(self, entry_id: int, payload: bytes) -> list[bytes]:
        """Add the next entry (ids consecutive from ``first_entry``)."""
        if self._finished:
            raise ValueError("the object is finished")
        if entry_id != self._next:
            raise ValueError(f"entry {entry_id} out of order: expected {self._next}")
        out: list[bytes] = []
        if not self._started:
            self._started = True
            self._emit(HEADER.pack(MAGIC, FORMAT_VERSION, self.ledger_id), out)
        if self._parts and self._block_size + 4 + len(payload) > self.block_bytes:
            self._close_block(out)
        if not self._parts:
            self._block_first = entry_id
        self._parts.append(_U32.pack(len(payload)))
        self._parts.append(payload)
        self._block_size += 4 + len(payload)
        self._payload_bytes += len(payload)
        self._next = entry_id + 1
        return out

    def _close_block(self, out: list[bytes]) -> None:
        count = len(self._parts) // 2
        body = b"".join([BLOCK_HEAD.pack(BLOCK_MAGIC, count, self._block_first), *self._parts])
        block = body + _U64.pack(xxhash.xxh3_64_intdigest(body))
        self._firsts.append(self._block_first)
        self._offsets.append(self._offset)
        self._lengths.append(len(block))
        self._emit(block, out)
        self._parts = []
        self._block_size = 0

    def finish(self) -> tuple[list[bytes], ObjectLayout]:
        """The last bytes to upload (the last block, the index, the trailer) and the
        object's layout."""
        if self._finished:
            raise ValueError("the object is finished")
        self._finished = True
        out: list[bytes] = []
        if not self._started:
            self._started = True
            self._emit(HEADER.pack(MAGIC, FORMAT_VERSION, self.ledger_id), out)
        if self._parts:
            self._close_block(out)
        m = len(self._firsts)
        entries = self._next - self._first
        index_body = b"".join([
            INDEX_HEAD.pack(INDEX_MAGIC, self._first, entries, self._payload_bytes, m),
            struct.pack(f"<{m}Q", *self._firsts), struct.pack(f"<{m}Q", *self._offsets),
            struct.pack(f"<{m}I", *self._lengths)])
        index = index_body + _U64.pack(xxhash.xxh3_64_intdigest(index_body))
        index_offset = self._offset
        self._emit(index, out)
        digest = self._digest.intdigest()
        trailer = TRAILER.pack(index_offset, len(index), digest, TRAILER_MAGIC)
        out.append(trailer)
        size = self._offset + len(trailer)
        return out, ObjectLayout(size, index_offset, len(index), self._first, entries,
                                 self._payload_bytes, digest)


@dataclass(frozen=True, slots=True)
class ObjectIndex:
    """An object's index: where each block is and which entries it holds."""

    first_entry: int
    entries: int
    payload_bytes: int
    block_firsts: tuple[int, ...]
    block_offsets: tuple[int, ...]
    block_lengths: tuple[int, ...]

    @property
    def last_entry(self) -> int:
        return self.first_entry + self.entries - 1

    def block_of(self, entry_id: int) -> int:
        """The block holding ``entry_id`` (ValueError if the object has no such entry)."""
        if not self.first_entry <= entry_id <= self.last_entry:
            raise ValueError(f"entry {entry_id} is not in this object (entries "
                             f"{self.first_entry}..{self.last_entry})")
        return bisect.bisect_right(self.block_firsts, entry_id) - 1

    def block_range(self, block: int) -> tuple[int, int]:
        """Bytes ``[start, end)`` of ``block`` in the object."""
        start = self.block_offsets[block]
        return start, start + self.block_lengths[block]

    def block_entries(self, block: int) -> tuple[int, int]:
        """The first and last entry ids of ``block``."""
        last = (self.block_firsts[block + 1] - 1 if block + 1 < len(self.block_firsts)
                else self.last_entry)
        return self.block_firsts[block], last


def decode_header(data: bytes, where: str) -> int:
    """The ledger id of an object's header (CorruptObjectError if it is not one)."""
    if len(data) < HEADER.size:
        raise CorruptObjectError(f"{where}: too short for an asyncbk segment object")
    magic, version, ledger_id = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptObjectError(f"{where}: not an asyncbk segment object")
    if version != FORMAT_VERSION:
        raise CorruptObjectError(f"{where}: segment object format {version}; this asyncbk "
                                 f"reads format {FORMAT_VERSION} (upgrade it)")
    return int(ledger_id)


def decode_index(data: bytes, where: str) -> ObjectIndex:
    """An object's index, its checksum checked."""
    if len(data) < INDEX_HEAD.size + 8:
        raise CorruptObjectError(f"{where}: index too short ({len(data)} bytes)")
    body, (digest,) = data[:-8], _U64.unpack_from(data, len(data) - 8)
    if xxhash.xxh3_64_intdigest(body) != digest:
        raise CorruptObjectError(f"{where}: index checksum mismatch")
    magic, first, entries, payload_bytes, m = INDEX_HEAD.unpack_from(body)
    if magic != INDEX_MAGIC or len(body) != INDEX_HEAD.size + m * 20:
        raise CorruptObjectError(f"{where}: malformed index")
    at = INDEX_HEAD.size
    firsts = struct.unpack_from(f"<{m}Q", body, at)
    offsets = struct.unpack_from(f"<{m}Q", body, at + 8 * m)
    lengths = struct.unpack_from(f"<{m}I", body, at + 16 * m)
    if (m and firsts[0] != first) or any(b <= a for a, b in zip(firsts, firsts[1:], strict=False)) \
            or (m == 0) != (entries == 0) or (m and firsts[-1] > first + entries - 1):
        raise CorruptObjectError(f"{where}: the index's blocks do not cover its entries")
    return ObjectIndex(first, entries, payload_bytes, firsts, offsets, lengths)


def decode_block(data: bytes | memoryview, where: str, first_entry: int | None = None,
                 last_entry: int | None = None) -> list[bytes]:
    """The payloads of a block (given as bytes or a view of them), its checksum checked
    (and, when given, that it holds entries ``first_entry`` to ``last_entry``)."""
    if len(data) < BLOCK_HEAD.size + 8:
        raise CorruptObjectError(f"{where}: block too short ({len(data)} bytes)")
    end = len(data) - 8
    if xxhash.xxh3_64_intdigest(data[:end]) != _U64.unpack_from(data, end)[0]:
        raise CorruptObjectError(f"{where}: block checksum mismatch")
    magic, count, first = BLOCK_HEAD.unpack_from(data)
    if magic != BLOCK_MAGIC:
        raise CorruptObjectError(f"{where}: not a block")
    if first_entry is not None and (first != first_entry or (
            last_entry is not None and first + count - 1 != last_entry)):
        raise CorruptObjectError(f"{where}: block holds entries {first}..{first + count - 1}, "
                                 f"the index says {first_entry}..{last_entry}")
    out: list[bytes] = []
    at = BLOCK_HEAD.size
    unpack = _U32.unpack_from
    for _ in range(count):
        if at + 4 > end:
            raise CorruptObjectError(f"{where}: block truncated")
        (n,) = unpack(data, at)
        at += 4
        if at + n > end:
            raise CorruptObjectError(f"{where}: block truncated")
        out.append(bytes(data[at:at + n]))
        at += n
    if at != end:
        raise CorruptObjectError(f"{where}: {end - at} stray bytes after the block's entries")
    return out


def decode_trailer(data: bytes, where: str) -> tuple[int, int, int]:
    """``(index offset, index length, digest)`` of an object's last 32 bytes."""
    if len(data) != TRAILER.size:
        raise CorruptObjectError(f"{where}: trailer of {len(data)} bytes")
    index_offset, index_length, digest, magic = TRAILER.unpack(data)
    if magic != TRAILER_MAGIC:
        raise CorruptObjectError(f"{where}: not an asyncbk segment object (no trailer)")
    return int(index_offset), int(index_length), int(digest)
