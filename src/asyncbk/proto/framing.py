"""Length-prefixed frames.

A frame is a 4-byte big-endian unsigned length ``n`` followed by ``n`` bytes
of body (one msgpack message).  ``n`` must be at least 1 and at most the
decoder's ``frame_bytes_max``; the length is checked as soon as the 4 header
bytes are in, before any of the body is buffered, so an oversized frame costs
the receiver nothing.
"""

from __future__ import annotations

import struct

from ..errors import ProtocolError

FRAME_HEADER_BYTES = 4
_HEADER = struct.Struct(">I")


def encode_frame(body: bytes) -> bytes:
    """Prefix ``body`` with its length."""
    return _HEADER.pack(len(body)) + body


class FrameDecoder:
    """Incremental frame decoder: feed it bytes as they arrive, get whole frame bodies.

    Raises :class:`ProtocolError` on an empty or oversized frame; after that the
    stream is out of sync and the connection must be closed.
    """

    __slots__ = ("_buf", "_need", "frame_bytes_max")

    def __init__(self, frame_bytes_max: int) -> None:
        if frame_bytes_max < 1:
            raise ValueError("frame_bytes_max must be >= 1")
        self.frame_bytes_max = frame_bytes_max
        self._buf = bytearray()
        self._need = -1  # body length of the frame being read; -1 = reading a header

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data``; return the bodies of every frame completed by it, in order.

        Each body is copied once, from ``data`` itself when nothing was buffered (a
        frame that arrived whole is never buffered first); only an unfinished frame's
        bytes are kept."""
        buf = self._buf
        if buf:
            buf += data
            src: bytes | bytearray | memoryview = buf
        else:
            src = data
        out: list[bytes] = []
        pos = 0
        need = self._need
        with memoryview(src) as view:
            end = len(view)
            while True:
                if need < 0:
                    if end - pos < FRAME_HEADER_BYTES:
                        break
                    (need,) = _HEADER.unpack_from(view, pos)
                    if need == 0 or need > self.frame_bytes_max:
                        self._buf = bytearray()
                        self._need = -1
                        raise ProtocolError(
                            f"frame length {need} outside 1..{self.frame_bytes_max} bytes"
                        )
                    pos += FRAME_HEADER_BYTES
                if end - pos < need:
                    break
                out.append(bytes(view[pos : pos + need]))
                pos += need
                need = -1
            if src is not buf and pos < end:
                buf += view[pos:]
        if src is buf and pos:
            del buf[:pos]
        self._need = need
        return out
