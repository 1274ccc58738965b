"""Valid messages of every op, made by filling each message dataclass exported by
``asyncbk.proto`` (so an op added later is sampled without editing this file), and
journal records of every type: the seeds of the corpora and the property tests."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import asyncbk.proto as proto
from asyncbk.bookie import journal_format as jf

_INTS = (0, 1, 7, 300, -1, 2**63 - 1, 2**64 - 1, -(2**63))


def _value(kind: str, variant: int, n: int) -> Any:
    if kind == "int":
        return _INTS[variant % len(_INTS)]
    if kind == "bytes":
        return b"k" * (32 * (variant % 3))
    if kind == "str":
        return ("", "bookie-1:3181", "read-only")[variant % 3]
    if kind == "list[int]":
        return [_INTS[(variant + i) % 5] for i in range(n)]
    if kind == "list[bytes]":
        return [b"entry-%d" % i * (variant + 1) for i in range(n)]
    raise AssertionError(f"no sample for a field of type {kind}")


@functools.cache
def message_classes(suffix: str) -> tuple[type[Any], ...]:
    """The message dataclasses of ``asyncbk.proto`` whose names end with ``suffix``."""
    out = []
    for name in proto.__all__:
        obj = getattr(proto, name)
        if (isinstance(obj, type) and dataclasses.is_dataclass(obj) and hasattr(obj, "OP")
                and name.endswith(suffix)):
            out.append(obj)
    return tuple(out)


def messages(suffix: str) -> list[Any]:
    """Three instances of every request (``"Request"``) or response (``"Response"``)
    class; list fields of one message have equal lengths (0, 1, 3)."""
    out = []
    for cls in message_classes(suffix):
        for variant in range(3):
            n = (0, 1, 3)[variant]
            values = {}
            for i, f in enumerate(dataclasses.fields(cls)):
                kind = f.type if isinstance(f.type, str) else f.type.__name__
                v = _value(kind, variant + i, n)
                if f.name == "request_id" and v < 0:
                    v = 5
                values[f.name] = v
            out.append(cls(**values))
    return out


def request_frames() -> list[bytes]:
    return [proto.encode_request(m) for m in messages("Request")]


def response_frames() -> list[bytes]:
    return [proto.encode_response(m) for m in messages("Response")]


def journal_records() -> list[jf.Record]:
    return [
        jf.LedgerKeyRecord(1, b"k" * 32),
        jf.AddRecord(1, 0, b"body-0"),
        jf.AddRecord(1, 1, b"x" * 100),
        jf.AddRecord(2**63 - 1, 2**63 - 1, b""),
        jf.ExplicitLacRecord(1, 0),
        jf.ExplicitLacRecord(1, -1),
        jf.FenceRecord(1),
        jf.DeleteLedgerRecord(1),
        jf.LedgerKeyRecord(2, b""),
    ]
