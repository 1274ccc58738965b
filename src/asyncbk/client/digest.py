"""The entry envelope and its digest.

What a bookie stores for an entry (opaque to it)::

    [ledger_id: i64][entry_id: i64][lac: i64][total_length: i64][digest][payload]

all big-endian; ``total_length`` is the ledger's length in payload bytes up
to and including this entry (recovery takes the closed length from the last
entry); ``digest`` covers the 32 header bytes and the payload, so an entry cannot be served under another
ledger or entry id, nor with another LAC, without detection.

Digests: ``xxh3`` (xxh3-64, 8 bytes: fast, detects corruption), ``hmac-sha256``
(32 bytes, keyed by the password: also detects tampering), ``none``.
The master key sent with adds is derived from the password (``master_key``).
"""

from __future__ import annotations

import hashlib
import hmac
import struct

import xxhash

from ..errors import DigestMismatchError

_HEADER = struct.Struct(">qqqq")
HEADER_BYTES = _HEADER.size
DIGEST_TYPES = ("xxh3", "hmac-sha256", "none")


def master_key(password: bytes) -> bytes:
    """The key a bookie checks on every add (so a wrong password cannot write)."""
    return hashlib.sha256(b"asyncbk-ledger\0" + password).digest()


class DigestManager:
    __slots__ = ("_hmac_key", "digest_bytes", "kind", "ledger_id")

    def __init__(self, ledger_id: int, kind: str, password: bytes) -> None:
        if kind not in DIGEST_TYPES:
            raise ValueError(f"unknown digest {kind!r}; choose one of {', '.join(DIGEST_TYPES)}")
        self.ledger_id = ledger_id
        self.kind = kind
        self._hmac_key = hashlib.sha256(b"asyncbk-mac\0" + password).digest()
        self.digest_bytes = {"xxh3": 8, "hmac-sha256": 32, "none": 0}[kind]

    def _digest(self, header: bytes, payload: bytes) -> bytes:
        if self.kind == "xxh3":  # one call over both (the same digest as streaming them)
            return xxhash.xxh3_64_digest(header + payload)
        if self.kind == "hmac-sha256":
            m = hmac.new(self._hmac_key, header, hashlib.sha256)
            m.update(payload)
            return m.digest()
        return b""

    def seal(self, entry_id: int, lac: int, total_length: int, payload: bytes) -> bytes:
        header = _HEADER.pack(self.ledger_id, entry_id, lac, total_length)
        if self.kind == "xxh3":  # (the default, once per append: :meth:`_digest` inline)
            return b"".join((header, xxhash.xxh3_64_digest(header + payload), payload))
        return b"".join((header, self._digest(header, payload), payload))

    def unseal(self, entry_id: int, body: bytes) -> tuple[int, int, bytes]:
        """``(lac, total_length, payload)`` of a stored entry; DigestMismatchError if it
        does not verify."""
        n = HEADER_BYTES + self.digest_bytes
        if len(body) < n:
            raise DigestMismatchError(
                f"ledger {self.ledger_id} entry {entry_id}: body of {len(body)} bytes is too short")
        ledger_id, eid, lac, total_length = _HEADER.unpack_from(body)
        header = body[:HEADER_BYTES]
        payload = body[n:]
        if ledger_id != self.ledger_id or eid != entry_id:
            raise DigestMismatchError(
                f"ledger {self.ledger_id} entry {entry_id}: envelope names ledger {ledger_id} "
                f"entry {eid}")
        expected = self._digest(header, payload)
        if not hmac.compare_digest(expected, body[HEADER_BYTES:n]):
            raise DigestMismatchError(f"ledger {self.ledger_id} entry {entry_id}: digest mismatch")
        return lac, total_length, payload
