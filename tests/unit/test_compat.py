"""Compatibility: bytes written by an earlier version (tests/fixtures/compat/v1) are read
by this one as they were meant, and this version still writes those bytes.

A failure here means an on-disk or wire format changed.  If that is intended: bump
the format's version, write a new fixture set with make_fixtures.py (``--out
.../v2``), keep v1 and decide (and document in docs/deploy.md) what the new code does
with it.  Never regenerate v1.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest

from asyncbk.bookie.cookie import COOKIE_FILE, Cookie
from asyncbk.bookie.journal_format import (
    AddRecord,
    decode_records,
    encode_record,
    scan_records,
)
from asyncbk.bookie.storage import (
    CHECKPOINT_VERSION,
    ENTRYLOG_DIR,
    INDEX_FILE,
    INDEX_RECORD,
    LedgerStorage,
    entry_log_name,
    read_checkpoint,
)
from asyncbk.clock import ManualClock
from asyncbk.errors import NoSuchLedgerError
from asyncbk.meta import keys
from asyncbk.meta.memory import MemoryMetadataStore
from asyncbk.proto import (
    AddBatchRequest,
    AddBatchResponse,
    AddRequest,
    AddResponse,
    FrameDecoder,
    add_request_frame,
    add_request_tail,
    decode_request,
    decode_response,
    encode_add_batch_request,
    encode_add_batch_response,
    encode_add_response,
)
from asyncbk.stream import codec
from asyncbk.stream.meta import StreamMetadata
from tests.fixtures.compat import make_fixtures as fx

V1 = Path(fx.__file__).resolve().parent / "v1"
JOURNAL_FILE = V1 / "journal" / "0000000000000001.jnl"


def stored() -> dict[int, list[bytes]]:
    """The entries the fixture's ledgers hold (ledger 2 was deleted)."""
    out: dict[int, list[bytes]] = {}
    for op in fx.OPS:
        if op.kind == "add":
            out.setdefault(op.ledger_id, []).append(fx.body(op.ledger_id, op.value))
        elif op.kind == "delete":
            del out[op.ledger_id]
    return out


# --- the journal --------------------------------------------------------------------------


def test_journal_file_decodes_to_the_records_written() -> None:
    data = JOURNAL_FILE.read_bytes()
    records, good = decode_records(data)
    assert good == len(data)  # no torn tail
    assert records == fx.journal_records()
    kinds = {type(r).__name__ for r in records}
    assert kinds == {"AddRecord", "LedgerKeyRecord", "FenceRecord", "ExplicitLacRecord",
                     "DeleteLedgerRecord"}
    assert b"".join(encode_record(r) for r in records) == data  # still encoded the same


# --- the storage ------------------------------------------------------------------------


def copy(tmp_path: Path, *names: str) -> Path:
    """A writable copy of the fixture's directories (opening storage changes them)."""
    for name in names:
        shutil.copytree(V1 / name, tmp_path / name)
    return tmp_path


async def open_copy(root: Path) -> LedgerStorage:
    clock = ManualClock(fx.CLOCK_START_S + 60.0)  # a minute after it was written
    return await LedgerStorage.open(root / "journal", root / "ledgers", fx.storage_config(),
                                    clock=clock)


async def check_state(s: LedgerStorage) -> None:
    entries = stored()
    assert sorted(s.ledger_ids()) == sorted(entries) == [1, 3]
    for ledger_id, bodies in entries.items():
        info = s.ledger(ledger_id)
        assert info is not None and info.master_key == fx.KEYS[ledger_id]
        assert info.last_entry_id == len(bodies) - 1
        assert await s.read_entries(ledger_id, 0, 100, 1 << 20) == bodies
        assert await s.read_entry(ledger_id, -1) == bodies[-1]
    one, three = s.ledger(1), s.ledger(3)
    assert one is not None and one.fenced and one.explicit_lac == 3 and one.lac == 3
    assert three is not None and not three.fenced and three.explicit_lac == -1
    assert s.is_deleted(2)  # its tombstone: a zombie writer's adds are refused
    with pytest.raises(NoSuchLedgerError):
        await s.read_entry(2, 0)


async def test_storage_opens_from_its_checkpoint_and_serves_the_entries(tmp_path: Path) -> None:
    s = await open_copy(copy(tmp_path, "journal", "ledgers"))
    try:
        recovery = s.statistics()["recovery"]
        assert recovery["records_replayed"] == 0  # the checkpoint covered the journal
        assert recovery["entries_indexed"] == 10 and recovery["bytes_cut"] == 0
        await check_state(s)
    finally:
        await s.close()


async def test_storage_replays_the_journal_alone(tmp_path: Path) -> None:
    """Without the ledger directory, the journal rebuilds the same state."""
    s = await open_copy(copy(tmp_path, "journal"))
    try:
        recovery = s.statistics()["recovery"]
        assert recovery["records_replayed"] == len(fx.journal_records())
        assert recovery["bytes_cut"] == 0
        await check_state(s)
    finally:
        await s.close()


def test_checkpoint_index_and_entry_logs_decode() -> None:
    ledger_dir = V1 / "ledgers"
    payload = read_checkpoint(ledger_dir)
    logs = sorted((ledger_dir / ENTRYLOG_DIR).iterdir())
    assert [p.name for p in logs] == [entry_log_name(0), entry_log_name(1)]
    index = (ledger_dir / INDEX_FILE).read_bytes()
    assert payload == {
        "version": CHECKPOINT_VERSION,
        "journal_seq": 1,
        "journal_offset": JOURNAL_FILE.stat().st_size,
        "entry_log_id": 1,
        "entry_log_length": logs[-1].stat().st_size,
        "index_length": len(index),
        "ledgers": [[1, fx.KEYS[1], True, 3, 3], [3, fx.KEYS[3], False, -1, -1]],
        "tombstones": [[2, int(fx.CLOCK_START_S * 1000)]],
    }
    # entry logs: the journal's ADD records, verbatim and in order
    adds = [r for r in fx.journal_records() if isinstance(r, AddRecord)]
    in_logs: list[tuple[int, int, int, AddRecord]] = []
    for log_id, path in enumerate(logs):
        data = path.read_bytes()
        pairs, good = scan_records(data)
        assert good == len(data)
        ends = [off for off, _ in pairs[1:]] + [good]
        for (off, rec), end in zip(pairs, ends, strict=True):
            assert isinstance(rec, AddRecord)
            in_logs.append((log_id, off, end - off, rec))
    assert [rec for *_, rec in in_logs] == adds
    # index.log: one record per ADD, pointing at it
    assert list(INDEX_RECORD.iter_unpack(index)) == [
        (rec.ledger_id, rec.entry_id, log_id, off, length) for log_id, off, length, rec in in_logs]


def test_cookie_parses() -> None:
    for d in ("journal", "ledgers"):
        data = (V1 / d / COOKIE_FILE).read_bytes()
        cookie = Cookie.from_bytes(data, d)
        assert cookie == fx.COOKIE and cookie.format == 1
        assert cookie.to_bytes() == data


# --- the wire -----------------------------------------------------------------------------


def frames(name: str) -> list[bytes]:
    decoder = FrameDecoder(8 * 1024 * 1024)
    bodies = decoder.feed((V1 / "frames" / name).read_bytes())
    assert decoder.buffered_bytes == 0
    return bodies


def test_request_frames_decode_to_the_messages_sent() -> None:
    bodies = frames("requests.bin")
    assert [decode_request(b) for b in bodies] == list(fx.REQUESTS)
    assert {type(m).__name__ for m in fx.REQUESTS} == {
        "AddRequest", "ReadRequest", "ReadLacRequest", "WriteLacRequest", "LongPollLacRequest",
        "BookieInfoRequest", "ReadBatchRequest", "AddBatchRequest"}
    # the hot-path encoders write the same bytes
    for msg, body in zip(fx.REQUESTS, bodies, strict=True):
        frame = len(body).to_bytes(4, "big") + body
        if isinstance(msg, AddRequest):
            head, data = add_request_frame(msg.request_id, add_request_tail(
                msg.ledger_id, msg.entry_id, msg.master_key, msg.flags, msg.lac, msg.body))
            assert head + data == frame
        elif isinstance(msg, AddBatchRequest):
            assert encode_add_batch_request(msg.request_id, msg.ledger_id, msg.master_key,
                                            msg.flags, msg.lac, msg.entry_ids,
                                            msg.bodies) == frame


def test_response_frames_decode_to_the_messages_sent() -> None:
    bodies = frames("responses.bin")
    assert [decode_response(b) for b in bodies] == list(fx.RESPONSES)
    assert {type(m).__name__ for m in fx.RESPONSES} == {
        "AddResponse", "ReadResponse", "ReadLacResponse", "WriteLacResponse",
        "LongPollLacResponse", "BookieInfoResponse", "ReadBatchResponse", "AddBatchResponse"}
    for msg, body in zip(fx.RESPONSES, bodies, strict=True):
        frame = len(body).to_bytes(4, "big") + body
        if isinstance(msg, AddResponse):
            assert encode_add_response(msg.request_id, msg.status, msg.ledger_id,
                                       msg.entry_id) == frame
        elif isinstance(msg, AddBatchResponse):
            assert encode_add_batch_response(msg.request_id, msg.status, msg.ledger_id,
                                             msg.entry_ids, msg.statuses) == frame


# --- this version still writes v1 ---------------------------------------------------------


def test_this_version_writes_exactly_the_v1_bytes(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    fx.write_all(fresh)
    assert fx.differences(V1, fresh) == [], (
        "this version writes other bytes than fixture set v1: a format changed (see the "
        "module docstring)")


# --- a stream's entries and metadata (sets streams-v1 and streams-v2) ------------------------

STREAMS_V1 = Path(fx.__file__).resolve().parent / "streams-v1"
STREAMS_V2 = Path(fx.__file__).resolve().parent / "streams-v2"


def test_stream_v1_entries_decode_to_the_records_written() -> None:
    payloads = fx.read_stream_entries(STREAMS_V1 / "entries.bin")
    assert payloads == fx.stream_entry_payloads_v1()
    assert len(payloads) == len(fx.STREAM_ENTRIES)
    ctime = {s.seq: s.ctime_ms for s in fx.STREAM_SEGMENTS}
    before: dict[int, int] = {}
    for payload, (seq, entry_id, records, flags) in zip(payloads, fx.STREAM_ENTRIES,
                                                        strict=True):
        batch = codec.decode(payload, f"segment {seq} entry {entry_id}", ctime[seq])
        assert batch.records == records and batch.flags == flags
        assert batch.records_before == before.get(seq, 0)
        assert batch.end_of_stream is bool(flags & codec.END_OF_STREAM)
        # no key, no headers, the segment's creation time
        assert batch.extras is None and list(batch.timestamps) == [ctime[seq]] * len(records)
        before[seq] = batch.records_before + len(records)


def test_stream_v2_entries_decode_to_the_records_written() -> None:
    payloads = fx.read_stream_entries(STREAMS_V2 / "entries.bin")
    assert len(payloads) == len(fx.STREAM_ENTRIES_V2)
    before: dict[int, int] = {}
    for payload, (seq, entry_id, records, flags) in zip(payloads, fx.STREAM_ENTRIES_V2,
                                                        strict=True):
        batch = codec.decode(payload, f"segment {seq} entry {entry_id}")
        assert batch.records == [(r.txid, r.data) for r in records] and batch.flags & 1 == flags
        assert list(batch.timestamps) == [r.timestamp_ms for r in records]
        assert [batch.extras_of(i) for i in range(batch.count)] == \
            [(r.key, r.headers or {}) for r in records]
        assert batch.records_before == before.get(seq, 0)
        before[seq] = batch.records_before + len(records)


async def _stored(directory: Path, meta: Any, segments: list[Any]) -> StreamMetadata:
    store = MemoryMetadataStore("/asyncbk")
    ns, name = meta.namespace, meta.name
    put = [(keys.stream(store.root, ns, name), (directory / "stream.bin").read_bytes())]
    put += [(keys.segment(store.root, ns, name, s.seq),
             (directory / f"segment-{s.seq}.bin").read_bytes()) for s in segments]
    await store.kv_txn([], put=put)
    return StreamMetadata(store)


@pytest.mark.parametrize("version", [1, 2])
async def test_stream_metadata_reads_as_written(version: int) -> None:
    directory, meta, segs = ((STREAMS_V1, fx.STREAM_META, fx.STREAM_SEGMENTS) if version == 1
                             else (STREAMS_V2, fx.STREAM_META_V2, fx.STREAM_SEGMENTS_V2))
    md = await _stored(directory, meta, segs)
    got = await md.stream(meta.namespace, meta.name)
    assert dataclasses.replace(got, version=0) == meta
    segments = await md.segments(meta.namespace, meta.name)
    assert [dataclasses.replace(s, version=0) for s in segments] == segs
    if version == 1:  # times unknown: a segment's records read as of its creation
        assert [(s.first_ts, s.last_ts) for s in segments] == \
            [(s.ctime_ms, s.ctime_ms) for s in segs]


def test_this_version_writes_exactly_the_streams_v2_bytes(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    fx.write_streams(fresh)
    assert fx.differences(STREAMS_V2, fresh) == [], (
        "this version writes other bytes than fixture set streams-v2: a stream format "
        "changed (see the module docstring)")
