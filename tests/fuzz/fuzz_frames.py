"""Fuzz the frame decoder (``asyncbk.proto.framing.FrameDecoder``) fed incrementally.

Input: ``[limit selector][chunking seed][stream...]``.  The stream is fed in chunks of
pseudo-random sizes (1 byte to 4 KiB, from the seed) to a decoder whose
``frame_bytes_max`` is picked by the selector (1 byte to 2**32 - 1: a declared length
of 2**31 may be legal and still must not be allocated before its bytes arrive).

Allowed: ProtocolError, after which the stream is dropped.  Oracles, against a one-shot
reference parse of the whole stream: the frames returned are the reference's, in
order (a prefix of them if the stream is bad); the error comes iff the reference
finds a bad length; the decoder buffers exactly what it was fed minus what it
returned (less the header of a frame in progress), never more than a header plus a frame.

Run: ``python -m tests.fuzz.fuzz_frames [libFuzzer flags] [corpus dirs]``.
"""

from __future__ import annotations

import struct
import sys

from . import _harness

with _harness.instrumented(__name__ == "__main__"):
    from asyncbk.errors import ProtocolError
    from asyncbk.proto import FRAME_HEADER_BYTES, FrameDecoder, encode_frame

    from .samples import request_frames, response_frames

LIMITS = (1, 2, 16, 255, 4096, 1 << 20, 8 << 20, 1 << 31, (1 << 32) - 1)


def reference(stream: bytes, limit: int) -> tuple[list[bytes], bool]:
    """Every frame of ``stream`` up to the first bad length: (bodies, bad length seen)."""
    bodies = []
    pos = 0
    while len(stream) - pos >= FRAME_HEADER_BYTES:
        (n,) = struct.unpack_from(">I", stream, pos)
        if not 1 <= n <= limit:
            return bodies, True
        if len(stream) - pos - FRAME_HEADER_BYTES < n:
            break
        bodies.append(stream[pos + FRAME_HEADER_BYTES:pos + FRAME_HEADER_BYTES + n])
        pos += FRAME_HEADER_BYTES + n
    return bodies, False


def chunks(stream: bytes, seed: int) -> list[bytes]:
    """``stream`` cut in pieces of 1 to 1, 4, 16 or 4096 bytes (by ``seed``), from a
    linear congruential generator (cheap and the same on every run)."""
    top = (1, 4, 16, 4096)[seed & 3]
    x = seed
    out = []
    pos = 0
    while pos < len(stream):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        n = 1 + (x >> 8) % top
        out.append(stream[pos:pos + n])
        pos += n
    return out


def check(data: bytes) -> None:
    if len(data) < 2:
        return
    limit = LIMITS[data[0] % len(LIMITS)]
    stream = data[2:]
    expected, bad = reference(stream, limit)
    decoder = FrameDecoder(frame_bytes_max=limit)
    got: list[bytes] = []
    fed = returned = 0
    failed = False
    for piece in chunks(stream, data[1]):
        fed += len(piece)
        try:
            bodies = decoder.feed(piece)
        except ProtocolError:
            failed = True
            break
        got.extend(bodies)
        returned += sum(FRAME_HEADER_BYTES + len(b) for b in bodies)
        buffered = decoder.buffered_bytes  # the header of a frame in progress may be gone
        pending = fed - returned
        if buffered not in (pending, pending - FRAME_HEADER_BYTES) or buffered > limit + 4:
            raise _harness.Finding(f"buffers {buffered} bytes after {fed} fed, "
                                   f"{returned} returned (limit {limit})")
    if got != expected[:len(got)]:
        raise _harness.Finding("frames differ from the reference parse")
    if failed != bad:
        raise _harness.Finding(f"ProtocolError raised: {failed}; bad length in stream: {bad}")
    if not failed and len(got) != len(expected):
        raise _harness.Finding(f"{len(got)} frames returned, reference has {len(expected)}")


def seeds() -> list[bytes]:
    frames = request_frames() + response_frames()
    stream = b"".join(frames)
    out = [bytes([LIMITS.index(8 << 20), s]) + stream for s in range(4)]
    out += [bytes([LIMITS.index(8 << 20), 7]) + f for f in frames]
    out += [bytes([LIMITS.index(4096), 1]) + f[:len(f) // 2] for f in frames[::3]]  # truncated
    out.append(bytes([LIMITS.index(16), 2]) + encode_frame(b"x" * 17))  # over the limit
    out.append(bytes([LIMITS.index(1 << 31), 3]) + struct.pack(">I", 1 << 31) + b"\x90" * 64)
    out.append(b"\x00\x00" + b"\x00\x00\x00\x00")  # zero length
    return out


if __name__ == "__main__":
    _harness.run(check)
    sys.exit(0)
