"""Message codec: every message round-trips; malformed bodies raise ProtocolError."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncbk.errors import ProtocolError
from asyncbk.proto import (
    PROTOCOL_VERSION,
    AddBatchRequest,
    AddBatchResponse,
    AddRequest,
    AddResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    FrameDecoder,
    LongPollLacRequest,
    LongPollLacResponse,
    Op,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    WriteLacRequest,
    WriteLacResponse,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from asyncbk.tracing import TRACE_CONTEXT_BYTES

ids = st.integers(min_value=0, max_value=2**63 - 1)
eids = st.integers(min_value=-1, max_value=2**63 - 1)
blobs = st.binary(max_size=64)

requests = st.one_of(
    st.builds(AddRequest, ids, ids, eids, blobs, st.integers(0, 3), eids, blobs),
    st.builds(ReadRequest, ids, ids, eids, st.integers(0, 3), blobs),
    st.builds(ReadLacRequest, ids, ids),
    st.builds(WriteLacRequest, ids, ids, blobs, eids),
    st.builds(LongPollLacRequest, ids, ids, eids, st.integers(0, 60_000)),
    st.builds(BookieInfoRequest, ids),
    st.builds(ReadBatchRequest, ids, ids, eids, ids, ids),
    st.integers(0, 5).flatmap(lambda n: st.builds(
        AddBatchRequest, ids, ids, blobs, st.integers(0, 3), eids,
        st.lists(ids, min_size=n, max_size=n), st.lists(blobs, min_size=n, max_size=n))),
)
responses = st.one_of(
    st.builds(AddResponse, ids, st.integers(0, 10), ids, eids),
    st.builds(ReadResponse, ids, st.integers(0, 10), ids, eids, blobs, eids),
    st.builds(ReadLacResponse, ids, st.integers(0, 10), ids, eids, eids),
    st.builds(WriteLacResponse, ids, st.integers(0, 10), ids),
    st.builds(LongPollLacResponse, ids, st.integers(0, 10), ids, eids),
    st.builds(BookieInfoResponse, ids, st.integers(0, 10), st.text(max_size=20),
              st.text(max_size=10), ids, ids, st.text(max_size=10)),
    st.builds(ReadBatchResponse, ids, st.integers(0, 10), ids, eids, eids,
              st.lists(blobs, max_size=5)),
    st.integers(0, 5).flatmap(lambda n: st.builds(
        AddBatchResponse, ids, st.integers(0, 10), ids, st.lists(ids, min_size=n, max_size=n),
        st.lists(st.integers(0, 10), min_size=n, max_size=n))),
)


def _body(frame: bytes) -> bytes:
    (body,) = FrameDecoder(1 << 20).feed(frame)
    return body


@given(requests)
def test_request_round_trip(msg) -> None:  # type: ignore[no-untyped-def]
    assert decode_request(_body(encode_request(msg))) == msg


@given(responses)
def test_response_round_trip(msg) -> None:  # type: ignore[no-untyped-def]
    assert decode_response(_body(encode_response(msg))) == msg


contexts = st.one_of(st.just(b""), st.binary(min_size=TRACE_CONTEXT_BYTES,
                                             max_size=TRACE_CONTEXT_BYTES))
traced_requests = st.one_of(
    st.builds(AddRequest, ids, ids, eids, blobs, st.integers(0, 3), eids, blobs, contexts),
    st.builds(ReadRequest, ids, ids, eids, st.integers(0, 3), blobs, contexts),
    st.builds(ReadBatchRequest, ids, ids, eids, ids, ids, contexts),
    st.integers(0, 5).flatmap(lambda n: st.builds(
        AddBatchRequest, ids, ids, blobs, st.integers(0, 3), eids,
        st.lists(ids, min_size=n, max_size=n), st.lists(blobs, min_size=n, max_size=n),
        st.lists(contexts, min_size=n, max_size=n))),
)


@given(traced_requests)
def test_traced_request_round_trip(msg) -> None:  # type: ignore[no-untyped-def]
    assert decode_request(_body(encode_request(msg))) == msg


def test_a_request_without_trace_is_the_bytes_it_was() -> None:
    """The optional fields are left out when empty: the frame is the untraced one."""
    add = AddRequest(7, 1, 2, b"key", 0, 1, b"body")
    assert msgpack.unpackb(_body(encode_request(add))) == \
        [PROTOCOL_VERSION, Op.ADD, 7, 1, 2, b"key", 0, 1, b"body"]
    batch = AddBatchRequest(7, 1, b"key", 0, 1, [2, 3], [b"a", b"b"], [b"", b""])
    assert len(msgpack.unpackb(_body(encode_request(batch)))) == 10  # traces kept: a list
    batch = AddBatchRequest(7, 1, b"key", 0, 1, [2, 3], [b"a", b"b"])
    assert len(msgpack.unpackb(_body(encode_request(batch)))) == 9
    traced = AddRequest(7, 1, 2, b"key", 0, 1, b"body", b"t" * TRACE_CONTEXT_BYTES)
    assert msgpack.unpackb(_body(encode_request(traced)))[-1] == b"t" * TRACE_CONTEXT_BYTES


@pytest.mark.parametrize("body", [
    msgpack.packb([PROTOCOL_VERSION, Op.ADD, 1, 1, 1, b"k", 0, -1, b"b", b"short"]),
    msgpack.packb([PROTOCOL_VERSION, Op.ADD, 1, 1, 1, b"k", 0, -1, b"b", b"", b"more"]),
    msgpack.packb([PROTOCOL_VERSION, Op.READ, 1, 1, 1, 0, b"", "text"]),
    msgpack.packb([PROTOCOL_VERSION, Op.ADD_BATCH, 1, 1, b"k", 0, -1, [1, 2], [b"a", b"b"],
                   [b""]]),  # one trace for two entries
    msgpack.packb([PROTOCOL_VERSION, Op.ADD_BATCH, 1, 1, b"k", 0, -1, [1], [b"a"],
                   [b"x" * 40]]),
], ids=["short-trace", "extra-field", "text-trace", "traces-count", "trace-size"])
def test_malformed_traces_rejected(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_request(body)


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # never-used msgpack byte
        msgpack.packb(5),
        msgpack.packb([PROTOCOL_VERSION]),
        msgpack.packb([99, Op.ADD, 1, 1, 1, b"k", 0, -1, b"b"]),  # bad version
        msgpack.packb([PROTOCOL_VERSION, 77, 1]),  # unknown op
        msgpack.packb([PROTOCOL_VERSION, Op.ADD, 1, 1]),  # too few fields
        msgpack.packb([PROTOCOL_VERSION, Op.ADD, 1, "x", 1, b"k", 0, -1, b"b"]),  # wrong type
        msgpack.packb([PROTOCOL_VERSION, Op.ADD, -5, 1, 1, b"k", 0, -1, b"b"]),  # negative rid
        msgpack.packb([PROTOCOL_VERSION, Op.READ_LAC, 1, True]),  # bool is not int
    ],
)
def test_malformed_requests_rejected(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_request(body)


@given(requests)
def test_fast_add_batch_encoder_matches(msg) -> None:  # type: ignore[no-untyped-def]
    from asyncbk.proto import encode_add_batch_request

    if isinstance(msg, AddBatchRequest):
        assert encode_add_batch_request(msg.request_id, msg.ledger_id, msg.master_key,
                                        msg.flags, msg.lac, msg.entry_ids,
                                        msg.bodies) == encode_request(msg)


@pytest.mark.parametrize(("entry_ids", "bodies"), [
    ([1, 2], [b"a"]),            # lists differ in length
    ([1, "2"], [b"a", b"b"]),    # an id that is not an integer
    ([1, True], [b"a", b"b"]),   # a bool is not an integer
    ([[1]], [b"a"]),             # a list where an id should be
    ([1], ["text"]),             # a body that is not bytes
])
def test_malformed_add_batch_rejected(entry_ids: object, bodies: object) -> None:
    with pytest.raises(ProtocolError):
        decode_request(msgpack.packb([PROTOCOL_VERSION, Op.ADD_BATCH, 1, 1, b"k", 0, -1,
                                      entry_ids, bodies], use_bin_type=True))


@pytest.mark.parametrize("bodies", [[b"a", "text"], [b"a", 1], "notalist", [[b"a"]]])
def test_batch_response_bodies_must_be_bytes(bodies: object) -> None:
    with pytest.raises(ProtocolError):
        decode_response(msgpack.packb([PROTOCOL_VERSION, Op.READ_BATCH, 1, 0, 1, 0, -1, bodies],
                                      use_bin_type=True))


@given(st.binary(max_size=200))
def test_arbitrary_bytes_only_raise_protocol_error(body: bytes) -> None:
    try:
        decode_request(body)
    except ProtocolError:
        pass


@given(st.builds(AddRequest, ids, ids, eids, st.binary(max_size=64), st.integers(0, 3), eids,
                 st.one_of(st.binary(max_size=300), st.binary(min_size=70_000, max_size=70_010))))
def test_shared_add_frame_is_byte_identical(msg: AddRequest) -> None:
    from asyncbk.proto import add_request_frame, add_request_tail

    tail = add_request_tail(msg.ledger_id, msg.entry_id, msg.master_key, msg.flags, msg.lac,
                            msg.body)
    assert b"".join(add_request_frame(msg.request_id, tail)) == encode_request(msg)


@pytest.mark.parametrize("arr", [
    [PROTOCOL_VERSION, Op.ADD, 1, True, 1, b"k", 0, -1, b"b"],      # bool is not int
    [PROTOCOL_VERSION, True, 1, 1, 1, b"k", 0, -1, b"b"],           # bool op
    [PROTOCOL_VERSION, Op.ADD, -1, 1, 1, b"k", 0, -1, b"b"],        # negative request id
    [PROTOCOL_VERSION, Op.ADD, 1, 1, 1, "k", 0, -1, b"b"],          # str key
])
def test_fast_path_rejects_what_the_checked_path_rejects(arr: list[object]) -> None:
    with pytest.raises(ProtocolError):
        decode_request(msgpack.packb(arr, use_bin_type=True))
    resp = [PROTOCOL_VERSION, Op.ADD, arr[2], 0, arr[3], 1]
    if arr[2] == -1 or arr[3] is True:
        with pytest.raises(ProtocolError):
            decode_response(msgpack.packb(resp, use_bin_type=True))


@given(st.builds(AddResponse, ids, st.integers(0, 10), ids, eids))
def test_fast_add_response_is_byte_identical(msg: AddResponse) -> None:
    from asyncbk.proto import encode_add_response

    assert encode_add_response(msg.request_id, msg.status, msg.ledger_id,
                               msg.entry_id) == encode_response(msg)
