"""Regression tests of the fuzzing findings F1-F4 (tests/fuzz/README.md)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import msgpack
import pytest
import xxhash

from asyncbk.bookie.journal_format import encode_add
from asyncbk.bookie.storage import (
    INDEX_RECORD,
    LedgerStorage,
    entry_log_name,
    read_checkpoint,
)
from asyncbk.bookie.storage.entrylog import EntryLogReader, parse_entry_log_name
from asyncbk.config import BookieConfig
from asyncbk.errors import BookieIOError, ProtocolError
from asyncbk.proto import Op, decode_request, decode_response

# --- F1: the protocol version is the integer 1, and never quoted back -------------

NESTED = b"\x91" * 1000 + b"\x01"  # [[[...[1]...]]], 1,000 lists deep


@pytest.mark.parametrize("version", [msgpack.packb(True), msgpack.packb(1.0), b"\x91\x01",
                                     msgpack.packb("v" * 5000), NESTED],
                         ids=["bool", "float", "list", "long-str", "nested"])
@pytest.mark.parametrize(("decode", "tail"), [
    (decode_request, [Op.READ_LAC, 1, 1]),
    (decode_request, [Op.ADD, 1, 1, 0, b"k", 0, -1, b"b"]),  # the ADD fast path
    (decode_response, [Op.ADD, 1, 0, 1, 0]),
], ids=["request", "add-request", "add-response"])
def test_a_version_that_is_not_the_integer_1_is_refused(version: bytes, decode: object,
                                                        tail: list[object]) -> None:
    body = bytes([0x90 + 1 + len(tail)]) + version + b"".join(
        msgpack.packb(x, use_bin_type=True) for x in tail)
    with pytest.raises(ProtocolError) as err:
        decode(body)  # type: ignore[operator]
    assert len(str(err.value)) < 200


# --- F2: a checksummed checkpoint is still checked --------------------------------

GOOD = {"version": 1, "journal_seq": 0, "journal_offset": 0, "entry_log_id": 0,
        "entry_log_length": 0, "index_length": 0, "ledgers": [], "tombstones": []}


@pytest.mark.parametrize("payload", [
    b"\xc1", b"", msgpack.packb(GOOD) + b"\x00",
    msgpack.packb({"version": 1}),
    msgpack.packb({**GOOD, "journal_seq": "0"}),
    msgpack.packb({**GOOD, "index_length": -32}),
    msgpack.packb({**GOOD, "entry_log_id": 2**40}),
    msgpack.packb({**GOOD, "ledgers": [[1, b"k", False, -1]]}),
    msgpack.packb({**GOOD, "ledgers": 5}),
    msgpack.packb({**GOOD, "tombstones": [[1]]}),
], ids=["not-msgpack", "empty", "extra-data", "no-mark", "str-seq", "negative-length",
        "log-id-past-u32", "short-ledger", "ledgers-int", "short-tombstone"])
async def test_a_checksummed_but_malformed_checkpoint_is_a_bookie_io_error(
        tmp_path: Path, payload: bytes) -> None:
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()
    (ledgers / "checkpoint").write_bytes(
        struct.pack("<Q", xxhash.xxh3_64_intdigest(payload)) + payload)
    with pytest.raises(BookieIOError):
        read_checkpoint(ledgers)
    with pytest.raises(BookieIOError):
        await LedgerStorage.open(tmp_path / "journal", ledgers, BookieConfig())


# --- F3: index.log records are checked when loaded and when used -------------------

async def _storage_with_index_record(root: Path, field: int, value: int) -> None:
    s = await LedgerStorage.open(root / "journal", root / "ledgers", BookieConfig())
    for e in range(3):
        await s.add_entry(1, e, b"key", b"body %d" % e)
    await s.close()
    path = root / "ledgers" / "index.log"
    data = bytearray(path.read_bytes())
    record = list(INDEX_RECORD.unpack_from(data, INDEX_RECORD.size))
    record[field] = value
    INDEX_RECORD.pack_into(data, INDEX_RECORD.size, *record)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("field", "value"), [
    (0, -1), (1, -1), (1, -3), (2, 7), (3, 2**32), (3, 2**63), (4, 0), (4, 2**32 - 1)],
    ids=["negative-ledger", "entry-minus-1", "entry-minus-3", "unknown-log",
         "offset-past-u32", "offset-past-int64", "length-0", "length-4GiB"])
async def test_a_corrupt_index_record_stops_the_bookie(tmp_path: Path, field: int,
                                                       value: int) -> None:
    await _storage_with_index_record(tmp_path, field, value)
    with pytest.raises(BookieIOError, match=r"index\.log record 1"):
        await LedgerStorage.open(tmp_path / "journal", tmp_path / "ledgers", BookieConfig())


@pytest.mark.parametrize("loc", [(0, 0, 2**32 - 1), (0, 2**63, 30), (0, 0, 0)],
                         ids=["length-4GiB", "offset-past-int64", "length-0"])
def test_the_entry_log_reader_refuses_impossible_locations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loc: tuple[int, int, int]) -> None:
    (tmp_path / entry_log_name(0)).write_bytes(encode_add(1, 0, b"x"))
    real = os.pread

    def pread(fd: int, length: int, offset: int) -> bytes:
        assert length <= 128 << 20, f"os.pread of {length} bytes"
        return real(fd, length, offset)

    monkeypatch.setattr(os, "pread", pread)
    reader = EntryLogReader(tmp_path)
    try:
        with pytest.raises(BookieIOError):
            reader.read(loc, 1, 0)
        with pytest.raises(BookieIOError):
            reader.read_run([loc], 1, 0)
    finally:
        reader.close()


# --- F4: only entry_log_name's names are entry logs --------------------------------

@pytest.mark.parametrize("name", ["0x000001.log", " 0000001.log", "0000001 .log",
                                  "0000_001.log", "-0000001.log", "+0000001.log",
                                  "0000000A.log", "0000000a.LOG"])
def test_only_entry_log_names_parse(name: str) -> None:
    assert parse_entry_log_name(name) is None


@pytest.mark.parametrize("log_id", [0, 1, 0xABCDEF12, 0xFFFFFFFF])
def test_entry_log_names_round_trip(log_id: int) -> None:
    assert parse_entry_log_name(entry_log_name(log_id)) == log_id
