"""Typed protocol messages and their msgpack encoding.

Every message body is one msgpack array::

    request:   [version, op, request_id, *fields]
    response:  [version, op, request_id, status, *fields]

``version`` is :data:`PROTOCOL_VERSION`; ``op`` an :class:`Op`; ``request_id``
a client-chosen unsigned integer, unique among the requests in flight on one
connection, echoed in the response (responses may come in any order).  The
fields of each op are those of its dataclass below, in declaration order.

Decoding is strict: a body that is not msgpack, has the wrong arity, or a
field of the wrong type raises :class:`~asyncbk.errors.ProtocolError`.
Values that are well-typed but out of range (a negative ledger id) are the
request processor's to reject with :attr:`Status.BAD_REQUEST`.

Entry bodies are opaque to the bookie: the client wraps each payload in a
digest envelope (see ``asyncbk.client.digest``); the LAC piggybacked on an
add travels as its own field so the bookie never parses the body.

Optional fields come last, with a default: a sender leaves them out when they hold
their default, so a message without them is byte for byte what it was before they
existed.  They are the tracing contexts (``trace``, ``traces``: empty or
:data:`~asyncbk.tracing.TRACE_CONTEXT_BYTES` bytes each, see :mod:`asyncbk.tracing`).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, TypeAlias, cast

import msgpack

from ..errors import ProtocolError
from ..tracing import TRACE_CONTEXT_BYTES
from .framing import encode_frame

PROTOCOL_VERSION = 1


class Op(enum.IntEnum):
    ADD = 1
    READ = 2
    READ_LAC = 3
    WRITE_LAC = 4
    LONG_POLL_LAC = 5
    BOOKIE_INFO = 6
    READ_BATCH = 7
    ADD_BATCH = 8
    AUTH = 9


class Status(enum.IntEnum):
    OK = 0
    NO_LEDGER = 1
    NO_ENTRY = 2
    FENCED = 3
    UNAUTHORIZED = 4
    READ_ONLY = 5
    BAD_REQUEST = 6
    TOO_MANY_REQUESTS = 7
    IO_ERROR = 8
    BAD_VERSION = 9
    NOT_READY = 10


class AddFlag(enum.IntFlag):
    NONE = 0
    RECOVERY_ADD = 1
    """A recovery re-write: accepted even though the ledger is fenced."""


class ReadFlag(enum.IntFlag):
    NONE = 0
    FENCE = 1
    """Fence the ledger (durably) before answering; needs the master key."""


# ---------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class AddRequest:
    OP: ClassVar[Op] = Op.ADD
    request_id: int
    ledger_id: int
    entry_id: int
    master_key: bytes = field(repr=False)
    flags: int
    lac: int
    body: bytes
    trace: bytes = b""
    """Optional: the client's span context (tracing), or empty."""


@dataclass(frozen=True, slots=True)
class ReadRequest:
    OP: ClassVar[Op] = Op.READ
    request_id: int
    ledger_id: int
    entry_id: int
    """-1 reads the last entry the bookie holds."""
    flags: int
    master_key: bytes = field(repr=False)
    """Required (non-empty) with the FENCE flag; ignored otherwise."""
    trace: bytes = b""
    """Optional: the client's span context (tracing), or empty."""


@dataclass(frozen=True, slots=True)
class ReadLacRequest:
    OP: ClassVar[Op] = Op.READ_LAC
    request_id: int
    ledger_id: int


@dataclass(frozen=True, slots=True)
class WriteLacRequest:
    OP: ClassVar[Op] = Op.WRITE_LAC
    request_id: int
    ledger_id: int
    master_key: bytes = field(repr=False)
    lac: int


@dataclass(frozen=True, slots=True)
class LongPollLacRequest:
    OP: ClassVar[Op] = Op.LONG_POLL_LAC
    request_id: int
    ledger_id: int
    previous_lac: int
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class ReadBatchRequest:
    """Consecutive entries from ``first_entry_id``: at most ``count_max`` of them and
    at most ``bytes_max`` bytes of bodies (always at least the first, if stored)."""
    OP: ClassVar[Op] = Op.READ_BATCH
    request_id: int
    ledger_id: int
    first_entry_id: int
    count_max: int
    bytes_max: int
    trace: bytes = b""
    """Optional: the client's span context (tracing), or empty."""


@dataclass(frozen=True, slots=True)
class AddBatchRequest:
    """Several adds to one ledger in one frame (a client's adds of one loop turn):
    the same as one ADD per entry, answered once when all are journaled."""
    OP: ClassVar[Op] = Op.ADD_BATCH
    request_id: int
    ledger_id: int
    master_key: bytes = field(repr=False)
    flags: int
    lac: int
    entry_ids: list[int]
    bodies: list[bytes]
    traces: list[bytes] = field(default_factory=list)
    """Optional: a span context (or empty) per entry, or no list at all."""


@dataclass(frozen=True, slots=True)
class BookieInfoRequest:
    OP: ClassVar[Op] = Op.BOOKIE_INFO
    request_id: int


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """The first request on a connection to a bookie that requires a token: every
    other request before a successful AUTH is refused with UNAUTHORIZED."""
    OP: ClassVar[Op] = Op.AUTH
    request_id: int
    token: bytes = field(repr=False)  # never in a log line


Request: TypeAlias = (
    AddRequest | ReadRequest | ReadLacRequest | WriteLacRequest | LongPollLacRequest
    | BookieInfoRequest | ReadBatchRequest | AddBatchRequest | AuthRequest
)

# ---------------------------------------------------------------- responses


@dataclass(frozen=True, slots=True)
class AddResponse:
    OP: ClassVar[Op] = Op.ADD
    request_id: int
    status: int
    ledger_id: int
    entry_id: int


@dataclass(frozen=True, slots=True)
class ReadResponse:
    OP: ClassVar[Op] = Op.READ
    request_id: int
    status: int
    ledger_id: int
    entry_id: int
    body: bytes
    lac: int
    """The highest LAC this bookie has seen for the ledger (piggybacked or explicit)."""


@dataclass(frozen=True, slots=True)
class ReadLacResponse:
    OP: ClassVar[Op] = Op.READ_LAC
    request_id: int
    status: int
    ledger_id: int
    lac: int
    last_entry_id: int
    """The highest entry id stored on this bookie (-1 when none)."""


@dataclass(frozen=True, slots=True)
class WriteLacResponse:
    OP: ClassVar[Op] = Op.WRITE_LAC
    request_id: int
    status: int
    ledger_id: int


@dataclass(frozen=True, slots=True)
class LongPollLacResponse:
    OP: ClassVar[Op] = Op.LONG_POLL_LAC
    request_id: int
    status: int
    ledger_id: int
    lac: int


@dataclass(frozen=True, slots=True)
class ReadBatchResponse:
    OP: ClassVar[Op] = Op.READ_BATCH
    request_id: int
    status: int
    ledger_id: int
    first_entry_id: int
    lac: int
    bodies: list[bytes]
    """Entries ``first_entry_id, first_entry_id + 1, ...``: the run stored here, cut
    at the request's limits; empty unless the status is OK."""


@dataclass(frozen=True, slots=True)
class AddBatchResponse:
    OP: ClassVar[Op] = Op.ADD_BATCH
    request_id: int
    status: int
    """OK unless the whole batch was refused (then ``statuses`` holds that status too)."""
    ledger_id: int
    entry_ids: list[int]
    statuses: list[int]
    """One status per entry, in request order (as an ADD response's)."""


@dataclass(frozen=True, slots=True)
class BookieInfoResponse:
    OP: ClassVar[Op] = Op.BOOKIE_INFO
    request_id: int
    status: int
    bookie_id: str
    state: str
    free_bytes: int
    total_bytes: int
    version: str


@dataclass(frozen=True, slots=True)
class AuthResponse:
    OP: ClassVar[Op] = Op.AUTH
    request_id: int
    status: int


Response: TypeAlias = (
    AddResponse | ReadResponse | ReadLacResponse | WriteLacResponse | LongPollLacResponse
    | BookieInfoResponse | ReadBatchResponse | AddBatchResponse | AuthResponse
)

# ---------------------------------------------------------------- codec

_REQUESTS: dict[int, type[Any]] = {
    c.OP: c
    for c in (AddRequest, ReadRequest, ReadLacRequest, WriteLacRequest, LongPollLacRequest,
              BookieInfoRequest, ReadBatchRequest, AddBatchRequest, AuthRequest)
}
_RESPONSES: dict[int, type[Any]] = {
    c.OP: c
    for c in (AddResponse, ReadResponse, ReadLacResponse, WriteLacResponse, LongPollLacResponse,
              BookieInfoResponse, ReadBatchResponse, AddBatchResponse, AuthResponse)
}


class _IntList(list[int]):
    """Schema marker: a list of integers (in the int64/uint64 range)."""


def _field_types(cls: type[Any]) -> tuple[tuple[str, type], ...]:
    out = []
    for f in fields(cls):
        name = f.type if isinstance(f.type, str) else f.type.__name__
        t = {"int": int, "bytes": bytes, "str": str, "list[bytes]": list,
             "list[int]": _IntList}[name]
        out.append((f.name, t))
    return tuple(out)


_SCHEMA: dict[type[Any], tuple[tuple[str, type], ...]] = {
    cls: _field_types(cls) for cls in (*_REQUESTS.values(), *_RESPONSES.values())
}


def _optional_count(cls: type[Any]) -> int:
    """How many of ``cls``'s last fields are optional (have a default)."""
    n = 0
    for f in reversed(fields(cls)):
        if f.default is MISSING and f.default_factory is MISSING:
            break
        n += 1
    return n


_OPTIONAL: dict[type[Any], int] = {cls: _optional_count(cls) for cls in _SCHEMA}

_INT64_MIN = -(1 << 63)
_UINT64_MAX = (1 << 64) - 1


def _pack(op: int, msg: Any) -> bytes:
    cls = type(msg)
    values = [getattr(msg, name) for name, _ in _SCHEMA[cls]]
    optional = _OPTIONAL[cls]
    while optional and not values[-1]:  # (left out while empty: b"" or [])
        values.pop()
        optional -= 1
    return msgpack.packb([PROTOCOL_VERSION, op, *values], use_bin_type=True)


# --- the hot path: an ADD sent to Qw bookies, and its answers ------------------

_ADD_REQUEST_HEAD = bytes([0x99, PROTOCOL_VERSION, Op.ADD])  # fixarray(9), version, op
_FRAME_LENGTH = struct.Struct(">I")
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def _bin_header(n: int) -> bytes:
    if n < 0x100:
        return bytes((0xC4, n))
    if n < 0x10000:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def add_request_tail(ledger_id: int, entry_id: int, master_key: bytes, flags: int, lac: int,
                     body: bytes) -> tuple[bytes, bytes]:
    """Everything of an ADD request after its request id, packed once for all the
    bookies of a write set: ``(fields, body)``; the body is not copied."""
    fields = b"".join((_packb(ledger_id), _packb(entry_id), _packb(master_key), _packb(flags),
                       _packb(lac), _bin_header(len(body))))
    return fields, body


def add_request_frame(request_id: int, tail: tuple[bytes, bytes]) -> tuple[bytes, bytes]:
    """The frame of one ADD request as two pieces, ``(header, body)``: byte for byte
    what :func:`encode_request` makes of the same AddRequest."""
    fields, body = tail
    head = _ADD_REQUEST_HEAD + _packb(request_id)
    length = len(head) + len(fields) + len(body)
    return _FRAME_LENGTH.pack(length) + head + fields, body


_ADD_RESPONSE_HEAD = bytes([0x96, PROTOCOL_VERSION, Op.ADD])  # fixarray(6), version, op


def encode_add_response(request_id: int, status: int, ledger_id: int, entry_id: int) -> bytes:
    """The frame of an ADD response: byte for byte ``encode_response(AddResponse(...))``,
    without building the message object (one per add on a bookie)."""
    body = b"".join((_ADD_RESPONSE_HEAD, _packb(request_id), _packb(status), _packb(ledger_id),
                     _packb(entry_id)))
    return _FRAME_LENGTH.pack(len(body)) + body


_ADD_BATCH_HEAD = bytes([0x99, PROTOCOL_VERSION, Op.ADD_BATCH])  # fixarray(9), version, op
_ADD_BATCH_RESPONSE_HEAD = bytes([0x97, PROTOCOL_VERSION, Op.ADD_BATCH])  # fixarray(7)


def encode_add_batch_request(request_id: int, ledger_id: int, master_key: bytes, flags: int,
                             lac: int, entry_ids: list[int], bodies: list[bytes]) -> bytes:
    """The frame of an ADD_BATCH request (byte for byte ``encode_request``'s)."""
    return b"".join(add_batch_request_parts(request_id, ledger_id, master_key, flags, lac,
                                            entry_ids, pack_bodies(bodies)))


def pack_bodies(bodies: list[bytes]) -> bytes:
    """The bodies of an ADD_BATCH, encoded (once for every bookie that gets them:
    :func:`add_batch_request_parts`)."""
    return _packb(bodies)


def add_batch_request_parts(request_id: int, ledger_id: int, master_key: bytes, flags: int,
                            lac: int, entry_ids: list[int],
                            packed_bodies: bytes) -> tuple[bytes, bytes]:
    """The frame of an ADD_BATCH request in two parts, its head (the length prefix, the
    fields and the entry ids) and the bodies :func:`pack_bodies` encoded: written as
    they are (a vectored write), the bodies are neither copied nor encoded again."""
    head = b"".join((_ADD_BATCH_HEAD, _packb(request_id), _packb(ledger_id),
                     _packb(master_key), _packb(flags), _packb(lac), _packb(entry_ids)))
    return _FRAME_LENGTH.pack(len(head) + len(packed_bodies)) + head, packed_bodies


def encode_add_batch_response(request_id: int, status: int, ledger_id: int,
                              entry_ids: list[int], statuses: list[int]) -> bytes:
    body = b"".join((_ADD_BATCH_RESPONSE_HEAD, _packb(request_id), _packb(status),
                     _packb(ledger_id), _packb(entry_ids), _packb(statuses)))
    return _FRAME_LENGTH.pack(len(body)) + body


def encode_request(msg: Request) -> bytes:
    """The whole frame (length prefix included) for a request."""
    return encode_frame(_pack(msg.OP, msg))


def encode_response(msg: Response) -> bytes:
    """The whole frame (length prefix included) for a response."""
    return encode_frame(_pack(msg.OP, msg))


_INT_ONLY = {int}
_BYTES_ONLY = {bytes}


def _decoded(body: bytes, kind: str) -> Any:
    """``body`` as msgpack decodes it; ProtocolError if it is not msgpack."""
    try:
        return msgpack.unpackb(body, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types; all mean "not msgpack"
        raise ProtocolError(f"{kind} is not valid msgpack: {type(exc).__name__}") from None


def _checked(arr: Any, table: dict[int, type[Any]], kind: str) -> Any:
    """The message of ``table`` that ``arr`` (a decoded body) is, every field checked;
    ProtocolError naming what is wrong."""
    if not isinstance(arr, list) or len(arr) < 3:
        raise ProtocolError(f"{kind} must be an array of at least 3 items")
    version, op = arr[0], arr[1]
    if type(version) is not int or version != PROTOCOL_VERSION:
        # never repr() the value: it is the peer's (a nested list overflows the stack)
        shown = version if type(version) is int else f"of type {type(version).__name__}"
        raise ProtocolError(f"unsupported protocol version {shown}")
    if type(op) is not int:
        raise ProtocolError(f"{kind} op must be an integer")
    cls = table.get(op)
    if cls is None:
        raise ProtocolError(f"unknown {kind} op {op}")
    schema = _SCHEMA[cls]
    values = arr[2:]
    least = len(schema) - _OPTIONAL[cls]
    if not least <= len(values) <= len(schema):
        needs = f"{least} to {len(schema)}" if least < len(schema) else str(least)
        raise ProtocolError(f"{kind} op {Op(op).name} needs {needs} fields, got {len(values)}")
    for (name, t), v in zip(schema, values, strict=False):
        if t is _IntList:  # (type checks by set(map(type, ...)): per entry, at C speed)
            if type(v) is not list or v and (
                    set(map(type, v)) != _INT_ONLY or min(v) < _INT64_MIN
                    or max(v) > _UINT64_MAX):
                raise ProtocolError(f"{kind} op {Op(op).name} field {name} must be a list "
                                    "of integers")
            continue
        if type(v) is not t:
            raise ProtocolError(
                f"{kind} op {Op(op).name} field {name} must be {t.__name__}, got {type(v).__name__}"
            )
        if t is int and not _INT64_MIN <= cast(int, v) <= _UINT64_MAX:
            raise ProtocolError(f"{kind} op {Op(op).name} field {name} out of range")
        if t is list and v and set(map(type, cast(list[Any], v))) != _BYTES_ONLY:
            raise ProtocolError(f"{kind} op {Op(op).name} field {name} must hold only bytes")
    if values[0] < 0:
        raise ProtocolError(f"{kind} request_id must be >= 0")
    if cls is AddBatchRequest:
        ids, bodies, traces = values[5], values[6], values[7] if len(values) > 7 else None
        if len(ids) != len(bodies) or traces is not None and len(traces) != len(ids):
            raise ProtocolError(f"{kind} op ADD_BATCH lists differ in length")
        if traces is not None and any(len(t) not in _TRACE_SIZES for t in traces):
            raise ProtocolError(f"{kind} op ADD_BATCH field traces must hold empty or "
                                f"{TRACE_CONTEXT_BYTES}-byte contexts")
    elif cls is AddBatchResponse and len(values[-2]) != len(values[-1]):
        raise ProtocolError(f"{kind} op ADD_BATCH lists differ in length")
    elif len(values) == len(schema) and schema[-1][0] == "trace" \
            and len(values[-1]) not in _TRACE_SIZES:
        raise ProtocolError(f"{kind} op {Op(op).name} field trace must be empty or "
                            f"{TRACE_CONTEXT_BYTES} bytes")
    return cls(*values)


_TRACE_SIZES = (0, TRACE_CONTEXT_BYTES)


def decode_request(body: bytes) -> Request:
    """Decode one request body (without its length prefix)."""
    arr = _decoded(body, "request")
    # Fast path for the hot message; anything unusual takes the checked path.
    if type(arr) is list and len(arr) == 9 and type(arr[0]) is int and arr[0] == PROTOCOL_VERSION \
            and type(arr[1]) is int and arr[1] == Op.ADD:
        _, _, rid, lid, eid, key, flags, lac, data = arr
        if (type(rid) is int and rid >= 0 and type(lid) is int and type(eid) is int
                and type(key) is bytes and type(flags) is int and type(lac) is int
                and type(data) is bytes):
            return AddRequest(rid, lid, eid, key, flags, lac, data)
    msg: Request = _checked(arr, _REQUESTS, "request")  # (decoded once: a batch is 256 KiB)
    return msg


def decode_response(body: bytes) -> Response:
    """Decode one response body (without its length prefix)."""
    arr = _decoded(body, "response")
    if type(arr) is list and len(arr) == 6 and type(arr[0]) is int and arr[0] == PROTOCOL_VERSION \
            and type(arr[1]) is int and arr[1] == Op.ADD:
        _, _, rid, status, lid, eid = arr
        if type(rid) is int and rid >= 0 and type(status) is int and type(lid) is int \
                and type(eid) is int:
            return AddResponse(rid, status, lid, eid)
    msg: Response = _checked(arr, _RESPONSES, "response")
    return msg


_DEFAULTS: dict[type, Any] = {int: -1, bytes: b"", str: "", list: [], _IntList: []}


def refusal(request: Request, status: Status) -> Response:
    """The answer to ``request`` that only says ``status`` (its other fields copied
    from the request where they share a name, else empty)."""
    cls = _RESPONSES[request.OP]
    values: dict[str, Any] = {}
    for name, kind in _SCHEMA[cls]:
        if name == "status":
            values[name] = int(status)
        elif name == "statuses":
            values[name] = [int(status)] * len(getattr(request, "entry_ids", []))
        elif hasattr(request, name):
            values[name] = getattr(request, name)
        else:
            default = _DEFAULTS[kind]
            values[name] = list(default) if isinstance(default, list) else default
    return cast(Response, cls(**values))
