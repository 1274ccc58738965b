"""The entry envelope: every digest detects corruption and mis-addressed entries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncbk.client.digest import DIGEST_TYPES, DigestManager, master_key
from asyncbk.errors import DigestMismatchError


@pytest.mark.parametrize("kind", DIGEST_TYPES)
@given(payload=st.binary(max_size=200), entry=st.integers(0, 2**40), lac=st.integers(-1, 2**40))
def test_round_trip(kind: str, payload: bytes, entry: int, lac: int) -> None:
    dm = DigestManager(7, kind, b"pw")
    assert dm.unseal(entry, dm.seal(entry, lac, 99, payload)) == (lac, 99, payload)


@pytest.mark.parametrize("kind", ["xxh3", "hmac-sha256"])
@given(payload=st.binary(min_size=1, max_size=100), data=st.data())
def test_any_flipped_byte_detected(kind: str, payload: bytes, data: st.DataObject) -> None:
    dm = DigestManager(7, kind, b"pw")
    body = bytearray(dm.seal(3, 2, 10, payload))
    i = data.draw(st.integers(0, len(body) - 1))
    body[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(DigestMismatchError):
        dm.unseal(3, bytes(body))


@pytest.mark.parametrize("kind", DIGEST_TYPES)
def test_wrong_entry_or_ledger_detected(kind: str) -> None:
    dm = DigestManager(7, kind, b"pw")
    body = dm.seal(3, 2, 10, b"x")
    with pytest.raises(DigestMismatchError):
        dm.unseal(4, body)
    with pytest.raises(DigestMismatchError):
        DigestManager(8, kind, b"pw").unseal(3, body)
    with pytest.raises(DigestMismatchError):
        dm.unseal(3, body[:10])


def test_hmac_needs_the_password() -> None:
    body = DigestManager(1, "hmac-sha256", b"right").seal(0, -1, 1, b"x")
    with pytest.raises(DigestMismatchError):
        DigestManager(1, "hmac-sha256", b"wrong").unseal(0, body)


def test_master_key_depends_on_password() -> None:
    assert master_key(b"a") != master_key(b"b")
    assert master_key(b"a") == master_key(b"a")


def test_unknown_digest() -> None:
    with pytest.raises(ValueError, match="unknown digest"):
        DigestManager(1, "crc32", b"")
