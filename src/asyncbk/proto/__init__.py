"""The wire protocol, sans I/O: framing and typed messages.  No asyncio, no sockets."""

from .framing import FRAME_HEADER_BYTES, FrameDecoder, encode_frame
from .messages import (
    PROTOCOL_VERSION,
    AddFlag,
    AddRequest,
    AddResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    LongPollLacRequest,
    LongPollLacResponse,
    Op,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadFlag,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    Status,
    WriteLacRequest,
    WriteLacResponse,
    add_request_frame,
    add_request_tail,
    decode_request,
    decode_response,
    encode_add_response,
    encode_request,
    encode_response,
)

__all__ = [
    "FRAME_HEADER_BYTES", "PROTOCOL_VERSION", "AddFlag", "AddRequest", "AddResponse",
    "BookieInfoRequest", "BookieInfoResponse", "FrameDecoder", "LongPollLacRequest",
    "LongPollLacResponse", "Op", "ReadBatchRequest", "ReadBatchResponse", "ReadFlag", "ReadLacRequest", "ReadLacResponse",
    "ReadRequest", "ReadResponse", "Request", "Response", "Status", "WriteLacRequest",
    "WriteLacResponse", "add_request_frame", "add_request_tail", "decode_request",
    "decode_response", "encode_add_response", "encode_frame", "encode_request", "encode_response",
]
