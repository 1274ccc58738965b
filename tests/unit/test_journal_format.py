"""Journal record format: round trips and the replay rule under damage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncbk.bookie import journal_format as jf
from asyncbk.bookie.journal_format import (
    AddRecord,
    DeleteLedgerRecord,
    ExplicitLacRecord,
    FenceRecord,
    LedgerKeyRecord,
    decode_records,
    encode_record,
)

ids = st.integers(min_value=0, max_value=2**63 - 1)
small_ids = st.integers(min_value=0, max_value=1000)
any_id = st.one_of(ids, small_ids)

records_st = st.one_of(
    st.builds(AddRecord, any_id, any_id, st.binary(max_size=200)),
    st.builds(LedgerKeyRecord, any_id, st.binary(max_size=40)),
    st.builds(FenceRecord, any_id),
    st.builds(DeleteLedgerRecord, any_id),
    st.builds(ExplicitLacRecord, any_id, st.integers(min_value=-1, max_value=2**63 - 1)),
)


def _encode_all(records: list[jf.Record]) -> tuple[bytes, list[int]]:
    """The concatenated encoding and the end offset of each record."""
    parts = [encode_record(r) for r in records]
    ends = []
    total = 0
    for p in parts:
        total += len(p)
        ends.append(total)
    return b"".join(parts), ends


def _check_prefix(records: list[jf.Record], ends: list[int], buf: bytes,
                  intact_until: int) -> None:
    """``buf`` equals the encoding up to ``intact_until``; decoding must return
    exactly the records that end within it (and maybe, if the damage did not
    change anything that matters, more of the written records, in order)."""
    got, good = decode_records(buf)
    complete = sum(1 for e in ends if e <= intact_until)
    assert len(got) >= complete
    assert got == records[: len(got)]  # a prefix of what was written, nothing invented
    assert good == (ends[len(got) - 1] if got else 0)


@given(st.lists(records_st, max_size=20))
def test_round_trip(records: list[jf.Record]) -> None:
    buf, ends = _encode_all(records)
    got, good = decode_records(buf)
    assert got == records
    assert good == len(buf)


@given(st.lists(records_st, min_size=1, max_size=12), st.data())
def test_truncate_at_any_offset(records: list[jf.Record], data: st.DataObject) -> None:
    buf, ends = _encode_all(records)
    cut = data.draw(st.integers(min_value=0, max_value=len(buf)))
    got, good = decode_records(buf[:cut])
    complete = sum(1 for e in ends if e <= cut)
    assert got == records[:complete]
    assert good == (ends[complete - 1] if complete else 0)


@given(st.lists(records_st, min_size=1, max_size=12), st.data())
def test_flip_bits_at_any_offset(records: list[jf.Record], data: st.DataObject) -> None:
    buf, ends = _encode_all(records)
    pos = data.draw(st.integers(min_value=0, max_value=len(buf) - 1))
    mask = data.draw(st.integers(min_value=1, max_value=255))
    damaged = bytearray(buf)
    damaged[pos] ^= mask
    got, good = decode_records(bytes(damaged))
    # every record before the damaged one survives, the damaged one and all after are cut
    complete = sum(1 for e in ends if e <= pos)
    assert got == records[:complete]
    assert good == (ends[complete - 1] if complete else 0)


@given(st.lists(records_st, min_size=1, max_size=12), st.data())
def test_overwrite_run_at_any_offset(records: list[jf.Record], data: st.DataObject) -> None:
    buf, ends = _encode_all(records)
    pos = data.draw(st.integers(min_value=0, max_value=len(buf) - 1))
    junk = data.draw(st.binary(min_size=1, max_size=64))
    damaged = (buf[:pos] + junk + buf[pos + len(junk):])[: max(len(buf), pos + len(junk))]
    _check_prefix(records, ends, damaged, pos)


@given(st.lists(records_st, max_size=12), st.binary(min_size=1, max_size=200))
def test_garbage_appended(records: list[jf.Record], garbage: bytes) -> None:
    buf, ends = _encode_all(records)
    got, good = decode_records(buf + garbage)
    assert got == records
    assert good == len(buf)


@given(st.binary(max_size=500))
def test_random_bytes_never_raise(blob: bytes) -> None:
    got, good = decode_records(blob)
    assert 0 <= good <= len(blob)
    assert got == []  # random bytes essentially never carry a valid xxh3_64


@given(st.lists(records_st, min_size=1, max_size=5), st.integers(min_value=0, max_value=13))
def test_zeroed_tail_is_cut(records: list[jf.Record], zeros: int) -> None:
    buf, _ = _encode_all(records)
    got, good = decode_records(buf + b"\0" * (zeros + 4096))
    assert got == records and good == len(buf)


def test_decode_from_offset_and_scan_offsets() -> None:
    recs: list[jf.Record] = [AddRecord(1, 2, b"a"), FenceRecord(1), ExplicitLacRecord(1, 2)]
    buf, ends = _encode_all(recs)
    pairs, good = jf.scan_records(buf)
    assert [o for o, _ in pairs] == [0, ends[0], ends[1]]
    assert good == len(buf)
    assert decode_records(buf, ends[0]) == (recs[1:], len(buf))


def test_valid_checksum_but_malformed_payload_stops() -> None:
    import struct

    import xxhash

    tail = bytes([jf.TYPE_FENCE]) + b"\1\2\3"  # FENCE needs 8 bytes of payload
    bad = struct.pack("<IQ", len(tail), xxhash.xxh3_64_intdigest(tail)) + tail
    unknown = bytes([99]) + b"x" * 8
    bad2 = struct.pack("<IQ", len(unknown), xxhash.xxh3_64_intdigest(unknown)) + unknown
    good = encode_record(FenceRecord(7))
    assert decode_records(good + bad + good) == ([FenceRecord(7)], len(good))
    assert decode_records(good + bad2 + good) == ([FenceRecord(7)], len(good))


def test_length_limits() -> None:
    import struct

    zero = struct.pack("<IQ", 0, 0) + b"\0"
    huge = struct.pack("<IQ", jf.RECORD_BYTES_MAX + 1, 0) + b"\1"
    assert decode_records(zero) == ([], 0)
    assert decode_records(huge) == ([], 0)
    assert jf.record_size_at(huge, 0) is None
    assert jf.record_size_at(b"\1", 0) == jf.HEADER_BYTES
    rec = encode_record(FenceRecord(1))
    assert jf.record_size_at(rec[:5], 0) == len(rec)


def test_encode_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        jf.encode_add(-1, 0, b"")
    with pytest.raises(ValueError):
        jf.encode_add(0, 2**63, b"")
    with pytest.raises(ValueError):
        jf.encode_explicit_lac(0, -2)


def test_file_names() -> None:
    assert jf.journal_file_name(0x1F) == "000000000000001f.jnl"
    assert jf.parse_journal_file_name("000000000000001f.jnl") == 0x1F
    for bad in ("1f.jnl", "000000000000001F.jnl", "000000000000001f.log", "x" * 16 + ".jnl"):
        assert jf.parse_journal_file_name(bad) is None


@settings(max_examples=50)
@given(st.lists(records_st, min_size=1, max_size=8))
def test_add_body_offset(records: list[jf.Record]) -> None:
    for r in records:
        if isinstance(r, AddRecord):
            enc = encode_record(r)
            assert enc[jf.ADD_BODY_OFFSET:] == r.body


@given(ledger_id=st.integers(0, 2**63 - 1),
       entries=st.lists(st.tuples(st.integers(0, 2**63 - 1), st.binary(max_size=300)),
                        max_size=20))
def test_a_run_is_the_records_of_encode_add_back_to_back(
        ledger_id: int, entries: list[tuple[int, bytes]]) -> None:
    ids = [e for e, _ in entries]
    bodies = [b for _, b in entries]
    records = [jf.encode_add(ledger_id, e, b) for e, b in entries]
    run, sizes = jf.encode_add_run(ledger_id, ids, bodies)
    assert run == b"".join(records)
    assert sizes == [len(r) for r in records]
    decoded, end = jf.decode_records(run)
    assert end == len(run)
    assert [(r.ledger_id, r.entry_id, r.body) for r in decoded] == [  # type: ignore[union-attr]
        (ledger_id, e, b) for e, b in entries]


def test_a_run_checks_the_ids_and_sizes() -> None:
    with pytest.raises(ValueError):
        jf.encode_add_run(-1, [0], [b""])
    with pytest.raises(ValueError):
        jf.encode_add_run(0, [1, 2**63], [b"", b""])
    with pytest.raises(ValueError):
        jf.encode_add_run(0, [-1, 0], [b"", b""])
    with pytest.raises(ValueError):
        jf.encode_add_run(0, [0], [b"x" * jf.RECORD_BYTES_MAX])
    with pytest.raises(ValueError):
        jf.encode_add_run(0, [0, 1], [b""])  # (the lists differ in length)
