"""Fuzz request and response decoding (``decode_request`` / ``decode_response``).

Input: one message body (a frame without its length prefix), given to both decoders.

Allowed: ProtocolError, with a message of at most ``MESSAGE_CHARS_MAX`` characters
(it is logged).  Oracles for a body that decodes: every field has its declared type;
the message re-encodes to a body that decodes to the same message; the hot-path
encoders (ADD, ADD_BATCH and their responses) give the generic encoder's bytes;
``refusal()`` of a request gives a response that round-trips.

Run: ``python -m tests.fuzz.fuzz_requests [libFuzzer flags] [corpus dirs]``.
"""

from __future__ import annotations

import sys
from dataclasses import astuple, fields
from typing import Any

import msgpack

from . import _harness

with _harness.instrumented(__name__ == "__main__"):
    import asyncbk.proto as proto
    from asyncbk.errors import ProtocolError

    from .samples import message_classes, request_frames, response_frames

_TYPES = {"int": int, "bytes": bytes, "str": str}


def _version_is_not_an_int(body: bytes) -> bool:
    """Known finding F1: the version is compared with ``!=`` (so True and 1.0 pass) and
    quoted with ``repr`` in the error (a nested list raises RecursionError)."""
    try:
        arr = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception:
        return False
    return isinstance(arr, list) and bool(arr) and type(arr[0]) is not int


def _check_types(msg: Any) -> None:
    for f in fields(msg):
        v = getattr(msg, f.name)
        if f.type in _TYPES:
            ok = type(v) is _TYPES[f.type]
        else:
            item = int if f.type == "list[int]" else bytes
            ok = type(v) is list and all(type(x) is item for x in v)
        if not ok:
            raise _harness.Finding(f"{type(msg).__name__}.{f.name} is {type(v).__name__}")


def _check_fast_encoders(msg: Any) -> None:
    p = proto
    # (the hot-path encoders write untraced requests: a trace takes the general one)
    if isinstance(msg, p.AddRequest) and not getattr(msg, "trace", b""):
        tail = p.add_request_tail(*astuple(msg)[1:7])
        fast = b"".join(p.add_request_frame(msg.request_id, tail))
    elif isinstance(msg, p.AddBatchRequest) and not getattr(msg, "traces", []):
        fast = p.encode_add_batch_request(*astuple(msg)[:7])
    elif isinstance(msg, p.AddResponse):
        fast = p.encode_add_response(*astuple(msg))
    elif isinstance(msg, p.AddBatchResponse):
        fast = p.encode_add_batch_response(*astuple(msg))
    else:
        return
    encode = p.encode_request if type(msg).__name__.endswith("Request") else p.encode_response
    if fast != encode(msg):
        raise _harness.Finding(f"the hot-path encoder of {type(msg).__name__} differs")


def check(data: bytes) -> None:
    for suffix, decode, encode in (("Request", proto.decode_request, proto.encode_request),
                                   ("Response", proto.decode_response, proto.encode_response)):
        try:
            msg = decode(data)
        except ProtocolError as exc:
            if len(str(exc)) > _harness.MESSAGE_CHARS_MAX:
                raise _harness.Finding(f"a ProtocolError of {len(str(exc))} chars") from None
            continue
        if _version_is_not_an_int(data):  # F1 (fixed)
            raise _harness.Finding(f"accepted a body whose version is not the integer 1: {msg}")
        if type(msg) not in message_classes(suffix):
            raise _harness.Finding(f"decoded as {type(msg).__name__}")
        _check_types(msg)
        if decode(encode(msg)[4:]) != msg:
            raise _harness.Finding(f"{type(msg).__name__} does not round-trip")
        _check_fast_encoders(msg)
        refusal = getattr(proto, "refusal", None)
        if refusal is not None and suffix == "Request":
            answer = refusal(msg, proto.Status.UNAUTHORIZED)
            if proto.decode_response(proto.encode_response(answer)[4:]) != answer:
                raise _harness.Finding(f"refusal of {type(msg).__name__} does not round-trip")


def seeds() -> list[bytes]:
    bodies = [f[4:] for f in request_frames() + response_frames()]
    out = bodies + [b[:len(b) // 2] for b in bodies[::2]] + [b[:-1] for b in bodies[1::2]]
    pack = msgpack.packb
    out += [b"", b"\xc1", pack([1]), pack([2, 1, 0]), pack([1, 99, 0]), pack([1, True, 0]),
            pack({"a": 1}), b"\xdd\xff\xff\xff\xff", b"\xc6\x7f\xff\xff\xff"]
    return out


if __name__ == "__main__":
    _harness.run(check)
    sys.exit(0)
