"""The fuzz harnesses' oracles (tests/fuzz/) under hypothesis, in the default run.

Random bytes and mutated seeds (valid frames, message bodies, journal records and
bookie files made by the real encoders) go through the same ``check`` functions that
atheris drives (``nox -s fuzz``): only the documented errors, no broken invariant.
Then the allocation bounds: a declared length is never allocated before its bytes are
there.  Known findings are skipped here as in the harnesses (tests/fuzz/README.md).
"""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncbk.bookie import journal_format as jf
from asyncbk.errors import ProtocolError
from asyncbk.proto import FrameDecoder, decode_request, decode_response
from tests.fuzz import fuzz_frames, fuzz_journal, fuzz_requests, fuzz_storage

HARNESSES = [fuzz_frames, fuzz_requests, fuzz_journal, fuzz_storage]
_ids = [h.__name__.rsplit("_", 1)[1] for h in HARNESSES]


def _mutate(seed: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    """Bit flips, cuts, insertions and overwrites at positions modulo the length."""
    b = bytearray(seed)
    for op, pos, blob in edits:
        pos %= len(b) + 1
        if op == 0 and b:
            b[pos % len(b)] ^= 1 << (blob[0] % 8)
        elif op == 1:
            del b[pos:]
        elif op == 2:
            b[pos:pos] = blob
        else:
            b[pos:pos + len(blob)] = blob
    return bytes(b)


_edits = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 16),
                            st.binary(min_size=1, max_size=8)), min_size=1, max_size=4)


@pytest.mark.parametrize("harness", HARNESSES, ids=_ids)
def test_random_bytes(harness: object) -> None:
    check: Callable[[bytes], None] = harness.check  # type: ignore[attr-defined]

    @settings(max_examples=300)
    @given(st.binary(max_size=600))
    def run(data: bytes) -> None:
        check(data)

    run()


@pytest.mark.parametrize("harness", HARNESSES, ids=_ids)
def test_seeds_and_their_mutants(harness: object) -> None:
    check: Callable[[bytes], None] = harness.check  # type: ignore[attr-defined]
    seeds: list[bytes] = harness.seeds()  # type: ignore[attr-defined]
    for seed in seeds:
        check(seed)

    @settings(max_examples=600)
    @given(st.sampled_from(seeds), _edits)
    def run(seed: bytes, edits: list[tuple[int, int, bytes]]) -> None:
        check(_mutate(seed, edits))

    run()


@contextmanager
def _peak_below(limit: int) -> Iterator[None]:
    """Fail if the Python allocations of the block peak above ``limit`` bytes."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, f"allocated {peak} bytes at the peak"


def test_a_frame_declaring_2_gib_is_not_allocated_before_its_bytes() -> None:
    decoder = FrameDecoder(frame_bytes_max=(1 << 32) - 1)
    with _peak_below(1 << 20):
        assert decoder.feed(struct.pack(">I", 1 << 31) + b"x" * 1000) == []
    assert decoder.buffered_bytes == 1000


@pytest.mark.parametrize("body", [
    b"\xdd\xff\xff\xff\xff",  # array32 of 2**32 - 1 items
    b"\xdf\xff\xff\xff\xff",  # map32
    b"\xc6\xff\xff\xff\xff",  # bin32 of 4 GiB
    b"\xdb\x7f\xff\xff\xff",  # str32 of 2 GiB
    b"\x93\x01\x01\xdd\x80\x00\x00\x00",  # a field declaring 2**31 items
], ids=["array32", "map32", "bin32", "str32", "nested"])
def test_msgpack_declared_sizes_are_not_allocated(body: bytes) -> None:
    for decode in (decode_request, decode_response):
        with _peak_below(1 << 20), pytest.raises(ProtocolError):
            decode(body)


@pytest.mark.parametrize("length", [jf.RECORD_BYTES_MAX, 1 << 31, (1 << 32) - 1])
def test_a_journal_record_declaring_a_huge_length_is_not_allocated(length: int) -> None:
    head = struct.pack("<IQ", length, 0) + b"\x01" + b"\0" * 100
    with _peak_below(1 << 20):
        assert jf.scan_records(head) == ([], 0)
    assert jf.record_size_at(head, 0) == (None if length > jf.RECORD_BYTES_MAX
                                          else length + 12)


def test_journal_replay_reads_at_most_one_record_more_than_it_has() -> None:
    """A torn tail whose length field says 128 MiB (the most a record may have): replay
    reads that much once (the documented bound), and nothing for a larger length."""
    tail = struct.pack("<IQ", jf.RECORD_BYTES_MAX, 0) + b"\x01" * 64
    records = fuzz_journal.grammar([jf.LedgerKeyRecord(1, b"k"), jf.AddRecord(1, 0, b"b")])
    for junk, limit in ((tail, jf.RECORD_BYTES_MAX + (32 << 20)),
                        (struct.pack("<IQ", 1 << 31, 0), 32 << 20)):
        data = b"\x00\x00" + b"00000000.log" + records + bytes([0x80, len(junk)]) + junk
        with _peak_below(limit):
            fuzz_storage.check(data)

