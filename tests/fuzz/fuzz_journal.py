"""Fuzz journal record decoding (``asyncbk.bookie.journal_format``) on damaged bytes.

Input: ``[mode][file name: 20 bytes][body...]``.  Mode bit 0 clear: the body is the
journal bytes as they are.  Set: the body is a little grammar (:func:`build`) whose
records get a correct length and checksum, so the fuzzer reaches the type and payload
parsing behind the xxh3 check; its raw pieces put garbage anywhere.

Allowed: nothing (the readers return None on bad input).  Oracles: ``scan_records``
returns back-to-back records from offset 0 and a good end within the buffer, where
``decode_one`` then finds nothing (the replay rule); every record re-encodes to
exactly its bytes; ``record_size_at`` agrees with each record's size; a prefix of the
buffer decodes to the records that end within it; a file name that parses as a
journal file name is the name of its sequence number.

Run: ``python -m tests.fuzz.fuzz_journal [libFuzzer flags] [corpus dirs]``.
"""

from __future__ import annotations

import struct
import sys

import xxhash

from . import _harness

with _harness.instrumented(__name__ == "__main__"):
    from asyncbk.bookie import journal_format as jf

    from .samples import journal_records

_HEAD = struct.Struct("<IQ")


def frame(kind: int, payload: bytes) -> bytes:
    """A record with a correct length and checksum, whatever its type and payload."""
    tail = bytes([kind]) + payload
    return _HEAD.pack(len(tail), xxhash.xxh3_64_intdigest(tail)) + tail


def build(blob: bytes) -> bytes:
    """Journal bytes from a grammar: a sequence of ``[op][n][n bytes]``.  ``op`` with
    the high bit set appends the n bytes raw; otherwise a record of type ``op & 7``
    (0, 6 and 7 are unknown types) with the n bytes as its payload."""
    out = []
    pos = 0
    while pos + 2 <= len(blob):
        op, n = blob[pos], blob[pos + 1]
        piece = blob[pos + 2:pos + 2 + n]
        pos += 2 + n
        out.append(piece if op & 0x80 else frame(op & 7, piece))
    return b"".join(out)


def grammar(records: list[jf.Record]) -> bytes:
    """The grammar bytes that :func:`build` turns into these records (short ones)."""
    out = []
    for r in records:
        raw = jf.encode_record(r)
        out.append(bytes([raw[12], len(raw) - 13]) + raw[13:])
    return b"".join(out)


def check_buffer(buf: bytes, cut: int) -> list[tuple[int, jf.Record]]:
    """The oracles on one journal buffer; returns its good records."""
    pairs, good = jf.scan_records(buf)
    if not 0 <= good <= len(buf):
        raise _harness.Finding(f"good end {good} outside 0..{len(buf)}")
    if jf.decode_one(buf, good) is not None:
        raise _harness.Finding(f"a record decodes at the good end {good}")
    ends = [off for off, _ in pairs[1:]] + ([good] if pairs else [])
    pos = 0
    for (off, record), end in zip(pairs, ends, strict=True):
        if off != pos:
            raise _harness.Finding(f"record at {off}, previous ended at {pos}")
        if jf.encode_record(record) != buf[off:end]:
            raise _harness.Finding(f"the record at {off} does not re-encode to its bytes")
        if jf.record_size_at(buf, off) != end - off:
            raise _harness.Finding(f"record_size_at({off}) disagrees with the record")
        pos = end
    cut %= len(buf) + 1
    prefix, _ = jf.scan_records(buf[:cut])
    if prefix != [p for p, end in zip(pairs, ends, strict=True) if end <= cut]:
        raise _harness.Finding(f"the prefix of {cut} bytes decodes differently")
    return pairs


def check(data: bytes) -> None:
    if len(data) < 21:
        return
    name = data[1:21].decode("latin-1")
    seq = jf.parse_journal_file_name(name)
    if seq is not None and jf.journal_file_name(seq) != name:
        raise _harness.Finding(f"{name!r} parses as journal file {seq}")
    body = data[21:]
    buf = build(body) if data[0] & 1 else body
    check_buffer(buf, data[0] * 31)
    for offset in range(min(len(buf), 40)):  # decoding from any offset never raises
        jf.decode_one(buf, offset)
        jf.record_size_at(buf, offset)


def seeds() -> list[bytes]:
    records = journal_records()
    name = jf.journal_file_name(1).encode()
    raw = b"".join(jf.encode_record(r) for r in records)
    out = [b"\x00" + name + raw, b"\x00" + name + raw[:-5], b"\x00" + name + raw + b"\0" * 13]
    out += [b"\x00" + name + jf.encode_record(r) for r in records]
    out += [b"\x01" + name + grammar(records), b"\x01" + name + grammar(records[:3]) + b"\x86\x04junk"]
    out.append(b"\x00" + b"ffffffffffffffff.jnl" + struct.pack("<IQ", 2**31, 0) + b"\x01" * 8)
    return out


if __name__ == "__main__":
    _harness.run(check)
    sys.exit(0)
