"""The journal (write-ahead log) format: pure encoding and decoding, no I/O.

This docstring is the complete contract for bytes on disk; ``journal.py``
writes it, ``storage.py`` replays it, and entry log files reuse it.

Files
-----
A bookie's journal directory holds files named ``<seq:016x>.jnl``: ``seq`` is
a 64-bit sequence number in 16 lower-case hex digits, so lexical order is
numeric order (``0000000000000001.jnl``, ``0000000000000002.jnl``, ...).  A
file has no header: it is a plain concatenation of records, possibly followed by
zero bytes (space the writer allocated ahead of its writes,
``journal_preallocate_bytes``; replay stops at the first of them, a zero length,
as at any tail, and cuts them).  Records are only ever added after the last one
(recovery may cut a torn tail, see below, and then writing resumes in a new
file); a new file (``seq + 1``) is started when the current one reaches
``journal_file_bytes_max``, once the current one is cut to its last record
(durably), and a file is deleted only once a checkpoint has made every record in
it redundant.  Other names in the directory are ignored.

Records
-------
Every record is::

    offset  size  field
    0       4     length    u32 little-endian: bytes after the checksum
                            (1 type byte + payload), 1 <= length <= RECORD_BYTES_MAX
    4       8     checksum  u64 little-endian: xxh3_64 (seed 0) of the
                            ``length`` bytes that follow (type + payload)
    12      1     type      one of the record types below
    13      ...   payload   ``length - 1`` bytes, layout fixed by the type

Integers in payloads are little-endian signed 64-bit (``<q``).  Types:

=====  =============  ===============================================  ======
type   name           payload                                          size
=====  =============  ===============================================  ======
1      ADD            ledger_id, entry_id, then the entry body (raw)   >= 16
2      LEDGER_KEY     ledger_id, then the ledger's master key (raw)    >= 8
3      FENCE          ledger_id                                        == 8
4      EXPLICIT_LAC   ledger_id, lac                                   == 16
5      DELETE_LEDGER  ledger_id                                        == 8
=====  =============  ===============================================  ======

``ledger_id`` and ``entry_id`` are >= 0; ``lac`` is >= -1.  A LEDGER_KEY
record is journaled before the first ADD (or FENCE) of a ledger the bookie
has not seen, so replay always learns a ledger's key before its entries.
DELETE_LEDGER (added with garbage collection) says the bookie forgot the
ledger: replay drops its state (and, unless a later LEDGER_KEY registers it
again, its entries) and gives it a tombstone dated at replay time (the record
carries no time).

The type numbers are part of the format: a type is never renumbered or
reused, and a new type is only ever added.  A bookie that does not know a
type treats the record as garbage (see the replay rule), so a journal holding
a newer type must not be replayed by an older bookie; after a graceful stop
nothing is replayed (the final checkpoint covers the whole journal).

Why this layout: the length comes first so a reader knows how much to read
before checking anything; the 64-bit checksum covers the type and payload, so
a torn write, a zeroed page (length 0) or stale bytes are rejected with
probability ~1 - 2**-64; fixed fields are ``struct``-packed so encoding an
ADD is one pack, one hash and one concatenation.

Replay rule
-----------
A journal is the concatenation of its files in ``seq`` order.  Decoding
stops at the first record that

* is truncated (fewer bytes left than the header, or than ``length`` says),
* has a bad length (0 or > RECORD_BYTES_MAX),
* fails its checksum, or
* has a valid checksum but an unknown type, a payload of the wrong size or
  an out-of-range id.

Everything from that offset on is the torn or garbage tail: it is cut (the
file truncated to the last good offset and every later journal file removed)
and never replayed -- no attempt is made to resynchronise past it, because a
record after garbage cannot be told apart from garbage that happens to parse.
Since a record is acknowledged only after the fsync that covers it, and a new
file is only started after the previous one was fully written, a torn tail
can only hold records that were never acknowledged (unless the disk itself
corrupted acknowledged data, which the checksum then turns into a visible cut
that the bookie logs as an error).

Entry log files (``storage.py``) hold ADD records in exactly this format, so
an entry read from disk is verified with the same checksum.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import xxhash

JOURNAL_FILE_SUFFIX: Final = ".jnl"

RECORD_BYTES_MAX: Final = 128 * 1024 * 1024
"""Largest ``length`` accepted: far above any entry (wire frames are 8 MiB by
default) yet small enough that a garbage length is recognised as garbage."""

TYPE_ADD: Final = 1
TYPE_LEDGER_KEY: Final = 2
TYPE_FENCE: Final = 3
TYPE_EXPLICIT_LAC: Final = 4
TYPE_DELETE_LEDGER: Final = 5

_HEAD = struct.Struct("<IQ")  # length, checksum
HEADER_BYTES: Final = _HEAD.size + 1  # + type byte = 13
_ADD_TAIL = struct.Struct("<Bqq")  # type, ledger_id, entry_id
_KEY_TAIL = struct.Struct("<Bq")  # type, ledger_id
_FENCE_TAIL = struct.Struct("<Bq")
_LAC_TAIL = struct.Struct("<Bqq")  # type, ledger_id, lac
_QQ = struct.Struct("<qq")
_Q = struct.Struct("<q")
_LEN = struct.Struct("<I")

ADD_BODY_OFFSET: Final = _HEAD.size + _ADD_TAIL.size
"""Offset of the entry body inside an encoded ADD record (29)."""

_ID_MAX: Final = 2**63 - 1
_hash = xxhash.xxh3_64_intdigest


@dataclass(frozen=True, slots=True)
class AddRecord:
    ledger_id: int
    entry_id: int
    body: bytes


@dataclass(frozen=True, slots=True)
class LedgerKeyRecord:
    ledger_id: int
    master_key: bytes


@dataclass(frozen=True, slots=True)
class FenceRecord:
    ledger_id: int


@dataclass(frozen=True, slots=True)
class ExplicitLacRecord:
    ledger_id: int
    lac: int


@dataclass(frozen=True, slots=True)
class DeleteLedgerRecord:
    """The ledger was deleted (garbage collected) on this bookie: forget it."""

    ledger_id: int


Record = AddRecord | LedgerKeyRecord | FenceRecord | ExplicitLacRecord | DeleteLedgerRecord


# --- file names -------------------------------------------------------------


def journal_file_name(seq: int) -> str:
    """``<seq:016x>.jnl``."""
    if not 0 <= seq <= 2**64 - 1:
        raise ValueError(f"journal seq out of range: {seq}")
    return f"{seq:016x}{JOURNAL_FILE_SUFFIX}"


def parse_journal_file_name(name: str) -> int | None:
    """The seq of a journal file name, or None if ``name`` is not one."""
    if len(name) != 16 + len(JOURNAL_FILE_SUFFIX) or not name.endswith(JOURNAL_FILE_SUFFIX):
        return None
    digits = name[:16]
    if any(c not in "0123456789abcdef" for c in digits):
        return None
    return int(digits, 16)


# --- encoding ---------------------------------------------------------------


def _check_id(name: str, value: int, low: int = 0) -> None:
    if not low <= value <= _ID_MAX:
        raise ValueError(f"{name} out of range: {value}")


def _frame(tail: bytes) -> bytes:
    n = len(tail)
    if n > RECORD_BYTES_MAX:
        raise ValueError(f"journal record of {n} bytes exceeds {RECORD_BYTES_MAX}")
    return _HEAD.pack(n, _hash(tail)) + tail


ADD_RECORD_OVERHEAD_BYTES = _HEAD.size + _ADD_TAIL.size
"""Bytes of an ADD record besides its body."""


def encode_add(ledger_id: int, entry_id: int, body: bytes | bytearray | memoryview) -> bytes:
    """An ADD record (the hot path: one pack, one hash, two concatenations)."""
    _check_id("ledger_id", ledger_id)
    _check_id("entry_id", entry_id)
    return _frame(_ADD_TAIL.pack(TYPE_ADD, ledger_id, entry_id) + body)


def encode_add_run(ledger_id: int, entry_ids: list[int],
                   bodies: list[bytes]) -> tuple[bytes, list[int]]:
    """The ADD records of one ledger's entries as one buffer (the records of
    :func:`encode_add` back to back: the bytes on disk are the same) and each record's
    size, in order: one object for a batch of adds instead of one per entry."""
    _check_id("ledger_id", ledger_id)
    if entry_ids:
        _check_id("entry_id", min(entry_ids))
        _check_id("entry_id", max(entry_ids))
    pack_tail, pack_head, digest = _ADD_TAIL.pack, _HEAD.pack, _hash
    head_size = _HEAD.size
    parts = []
    sizes = []
    for entry_id, body in zip(entry_ids, bodies, strict=True):
        tail = pack_tail(TYPE_ADD, ledger_id, entry_id) + body
        n = len(tail)
        if n > RECORD_BYTES_MAX:
            raise ValueError(f"journal record of {n} bytes exceeds {RECORD_BYTES_MAX}")
        parts.append(pack_head(n, digest(tail)))
        parts.append(tail)
        sizes.append(head_size + n)
    return b"".join(parts), sizes


def encode_ledger_key(ledger_id: int, master_key: bytes) -> bytes:
    _check_id("ledger_id", ledger_id)
    return _frame(_KEY_TAIL.pack(TYPE_LEDGER_KEY, ledger_id) + master_key)


def encode_fence(ledger_id: int) -> bytes:
    _check_id("ledger_id", ledger_id)
    return _frame(_FENCE_TAIL.pack(TYPE_FENCE, ledger_id))


def encode_explicit_lac(ledger_id: int, lac: int) -> bytes:
    _check_id("ledger_id", ledger_id)
    _check_id("lac", lac, -1)
    return _frame(_LAC_TAIL.pack(TYPE_EXPLICIT_LAC, ledger_id, lac))


def encode_delete_ledger(ledger_id: int) -> bytes:
    _check_id("ledger_id", ledger_id)
    return _frame(_FENCE_TAIL.pack(TYPE_DELETE_LEDGER, ledger_id))


def encode_record(record: Record) -> bytes:
    """Encode any record (convenience for tests and tools)."""
    if isinstance(record, AddRecord):
        return encode_add(record.ledger_id, record.entry_id, record.body)
    if isinstance(record, LedgerKeyRecord):
        return encode_ledger_key(record.ledger_id, record.master_key)
    if isinstance(record, FenceRecord):
        return encode_fence(record.ledger_id)
    if isinstance(record, DeleteLedgerRecord):
        return encode_delete_ledger(record.ledger_id)
    return encode_explicit_lac(record.ledger_id, record.lac)


# --- decoding ---------------------------------------------------------------

Buffer = bytes | bytearray | memoryview


def _parse(kind: int, payload: memoryview) -> Record | None:
    """The record for a checksummed type+payload, or None if it is malformed."""
    n = len(payload)
    if kind == TYPE_ADD:
        if n < 16:
            return None
        ledger_id, entry_id = _QQ.unpack_from(payload)
        if ledger_id < 0 or entry_id < 0:
            return None
        return AddRecord(ledger_id, entry_id, bytes(payload[16:]))
    if kind == TYPE_LEDGER_KEY:
        if n < 8:
            return None
        (ledger_id,) = _Q.unpack_from(payload)
        return None if ledger_id < 0 else LedgerKeyRecord(ledger_id, bytes(payload[8:]))
    if kind == TYPE_FENCE:
        if n != 8:
            return None
        (ledger_id,) = _Q.unpack_from(payload)
        return None if ledger_id < 0 else FenceRecord(ledger_id)
    if kind == TYPE_DELETE_LEDGER:
        if n != 8:
            return None
        (ledger_id,) = _Q.unpack_from(payload)
        return None if ledger_id < 0 else DeleteLedgerRecord(ledger_id)
    if kind == TYPE_EXPLICIT_LAC:
        if n != 16:
            return None
        ledger_id, lac = _QQ.unpack_from(payload)
        return None if ledger_id < 0 or lac < -1 else ExplicitLacRecord(ledger_id, lac)
    return None


def decode_one(buf: Buffer, offset: int = 0) -> tuple[Record, int] | None:
    """Decode the record at ``offset``: ``(record, end_offset)``, or None if the
    bytes there are truncated, have a bad length, fail the checksum or are malformed."""
    view = memoryview(buf)
    end = len(view)
    if end - offset < HEADER_BYTES:
        return None
    length, checksum = _HEAD.unpack_from(view, offset)
    if length == 0 or length > RECORD_BYTES_MAX:
        return None
    start = offset + _HEAD.size
    stop = start + length
    if stop > end:
        return None
    tail = view[start:stop]
    if _hash(tail) != checksum:
        return None
    record = _parse(tail[0], tail[1:])
    if record is None:
        return None
    return record, stop


def scan_records(buf: Buffer, start: int = 0) -> tuple[list[tuple[int, Record]], int]:
    """Decode records from ``start`` under the replay rule.

    Returns ``([(offset, record), ...], good_end)``: the offset of each record
    and the offset just past the last good one.  Never raises on bad input;
    ``buf[good_end:]`` is the torn/garbage tail (empty if all is good).  The
    raw bytes of record ``i`` are ``buf[offset_i:offset_{i+1}]`` (or up to
    ``good_end`` for the last).
    """
    out: list[tuple[int, Record]] = []
    view = memoryview(buf)
    pos = start
    while True:
        got = decode_one(view, pos)
        if got is None:
            return out, pos
        out.append((pos, got[0]))
        pos = got[1]


def decode_records(buf: Buffer, start: int = 0) -> tuple[list[Record], int]:
    """Decode records from ``start``: ``(records, good_length)``; see :func:`scan_records`."""
    pairs, good = scan_records(buf, start)
    return [r for _, r in pairs], good


def record_size_at(buf: Buffer, offset: int) -> int | None:
    """How many bytes the record starting at ``offset`` claims to span.

    Lets a streaming reader tell "need more bytes" from "garbage": returns
    ``HEADER_BYTES`` if not even the length field is buffered, None if it
    is invalid (0 or too large), else header + length (which may run past the
    end of ``buf``; the checksum is not checked here).
    """
    if len(buf) - offset < _LEN.size:
        return HEADER_BYTES
    (length,) = _LEN.unpack_from(buf, offset)
    if length == 0 or length > RECORD_BYTES_MAX:
        return None
    return _HEAD.size + length
