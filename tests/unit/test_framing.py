"""Framing: round trips at any split, and bad frames rejected before buffering."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncbk.errors import ProtocolError
from asyncbk.proto import FrameDecoder, encode_frame

bodies = st.lists(st.binary(min_size=1, max_size=300), max_size=20)


@given(bodies=bodies, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
@settings(max_examples=300)
def test_round_trip_split_anywhere(bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(b) for b in bodies)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    decoder = FrameDecoder(frame_bytes_max=1024)
    out: list[bytes] = []
    for a, b in zip(points, points[1:], strict=False):
        out.extend(decoder.feed(stream[a:b]))
    assert out == bodies
    assert decoder.buffered_bytes == 0


@given(body=st.binary(min_size=1, max_size=100))
def test_byte_at_a_time(body: bytes) -> None:
    decoder = FrameDecoder(frame_bytes_max=1024)
    frame = encode_frame(body)
    out = []
    for i in range(len(frame)):
        out.extend(decoder.feed(frame[i : i + 1]))
    assert out == [body]


def test_oversize_rejected_from_header_alone() -> None:
    decoder = FrameDecoder(frame_bytes_max=100)
    with pytest.raises(ProtocolError, match="outside"):
        decoder.feed(struct.pack(">I", 101))  # no body bytes needed to reject it
    assert decoder.buffered_bytes == 0


def test_zero_length_rejected() -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder(frame_bytes_max=100).feed(b"\0\0\0\0")


@given(garbage=st.binary(min_size=4, max_size=64))
def test_garbage_never_hangs_or_overbuffers(garbage: bytes) -> None:
    decoder = FrameDecoder(frame_bytes_max=16)
    try:
        frames = decoder.feed(garbage)
    except ProtocolError:
        return
    assert all(1 <= len(f) <= 16 for f in frames)
    assert decoder.buffered_bytes <= 4 + 16
