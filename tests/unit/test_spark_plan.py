"""The pure parts of the Spark source: option parsing and admission control.

No Spark and no cluster here: ``asyncbk.spark.options`` and ``asyncbk.spark.plan``
import neither pyspark nor a network.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncbk.spark.errors import SparkOptionError
from asyncbk.spark.options import read_options, write_options
from asyncbk.spark.plan import partition_bound, split_limit
from asyncbk.stream.position import Position

URI = "etcd://127.0.0.1:2379/asyncbk"


@given(st.dictionaries(st.text("abcdef", min_size=1, max_size=3),
                       st.integers(0, 10_000), max_size=8),
       st.integers(1, 5_000))
def test_split_limit_bounds_every_stream_and_starves_none(backlogs: dict[str, int],
                                                          limit: int) -> None:
    shares = split_limit(backlogs, limit)
    waiting = {s for s, b in backlogs.items() if b > 0}
    assert set(shares) == waiting
    for s, n in shares.items():
        assert 1 <= n <= backlogs[s]
    total = sum(backlogs.values())
    if total <= limit:
        assert shares == {s: backlogs[s] for s in waiting}
    else:
        assert sum(shares.values()) <= limit + len(waiting)
        if limit >= len(waiting):
            assert sum(shares.values()) >= limit - len(waiting)


def test_split_limit_is_proportional_to_backlog() -> None:
    shares = split_limit({"big": 3000, "mid": 300, "small": 30}, 500)
    assert shares["big"] > shares["mid"] > shares["small"] >= 1
    assert sum(shares.values()) == 500
    assert shares == {"big": 450, "mid": 45, "small": 5}  # 450.45, 45.05, 4.50: largest remainder


def test_partition_bound_honours_min_partitions() -> None:
    assert partition_bound(1000, 300, None) == 300
    assert partition_bound(1000, 300, 10) == 100
    assert partition_bound(0, 300, 10) == 300
    assert partition_bound(5, 300, 10) == 1


def test_partition_bound_keeps_partitions_near_the_byte_target() -> None:
    mib = 1024 * 1024
    assert partition_bound(1_000_000, 10**6, None, 100 * mib) == 500_000  # 100 MB: 2
    assert partition_bound(1_000_000, 10**6, None, 1000 * mib) == 62_500  # 16 of 62.5 MB
    assert partition_bound(1_000_000, 300_000, None, 10 * mib) == 300_000  # the record cap
    assert partition_bound(1_000_000, 10**6, 8, 100 * mib) == 125_000  # minPartitions


def _read(streaming: bool = False, **options: str) -> object:
    return read_options({"metadataUri": URI, "namespace": "ns", **options}, streaming)


def test_options_are_case_insensitive_and_typed() -> None:
    opts = read_options({"METADATAURI": URI, "NameSpace": "ns", "streams": "a, b,c*",
                         "maxrecordsperpartition": "7", "failondataloss": "False",
                         "startingpositions": '{"a": "2:3:1", "b": {"txid": 9}}'}, False)
    assert opts.streams == ("a", "b") and opts.globs == ("c*",)
    assert opts.max_records_per_partition == 7 and not opts.fail_on_data_loss
    assert opts.starting.for_stream("a").position == Position(2, 3, 1)
    assert opts.starting.for_stream("b").txid == 9
    assert opts.starting.for_stream("cx").kind == "earliest"
    assert read_options({"metadataUri": URI, "namespace": "ns", "streams": "a"},
                        True).starting.default.kind == "latest"
    assert opts.selects("cat") and not opts.selects("dog")


@pytest.mark.parametrize(("options", "streaming", "words"), [
    ({"namespace": "ns", "streams": "a"}, False, "metadataUri is required"),
    ({"metadataUri": "http://x", "namespace": "ns", "streams": "a"}, False, "not a metadata URI"),
    ({"metadataUri": URI, "streams": "a"}, False, "namespace is required"),
    ({"metadataUri": URI, "namespace": "ns"}, False, "exactly one of"),
    ({"metadataUri": URI, "namespace": "ns", "streams": "a", "ledgers": "1"}, False,
     "got streams and ledgers"),
    ({"metadataUri": URI, "namespace": "ns", "streams": "a", "startingPositions": "{nope"},
     False, "not valid JSON"),
    ({"metadataUri": URI, "namespace": "ns", "streams": "a",
      "startingPositions": '{"a": "1:x:0"}'}, False, "bad stream position"),
    ({"metadataUri": URI, "namespace": "ns", "streams": "a",
      "startingPositions": '{"zz": "earliest"}'}, False, "does not select"),
    ({"metadataUri": URI, "namespace": "ns", "streams": "a", "startingPositions": "1:0:0"},
     False, "needs its stream"),
    ({"metadataUri": URI, "namespace": "ns", "streams": "a", "maxRecordsPerPartition": "ten"},
     False, "must be an integer"),
    ({"metadataUri": URI, "namespace": "ns", "streams": "a", "maxRecordsPerTrigger": "0"},
     True, "must be an integer >= 1"),
    ({"metadataUri": URI, "namespace": "ns", "streams": "a", "failOnDataLoss": "maybe"},
     False, "true or false"),
    ({"metadataUri": URI, "namespace": "ns", "streams": "a", "endingPositions": "latest"},
     True, "does not apply"),
    ({"metadataUri": URI, "namespace": "ns", "streams": "a", "endingPositions": "earliest"},
     False, "cannot be earliest"),
    ({"metadataUri": URI, "namespace": "ns", "ledgers": "1"}, True, "for batch reads"),
    ({"metadataUri": URI, "ledgers": "1,x"}, False, "not a ledger id"),
    ({"metadataUri": URI, "namespace": "ns", "streamsPattern": "(("}, False,
     "not a valid regular expression"),
    ({"metadataUri": URI, "namespace": "n/s", "streams": "a"}, False, "bad namespace name"),
])
def test_bad_read_options_fail_with_one_clear_message(options: dict[str, str], streaming: bool,
                                                       words: str) -> None:
    with pytest.raises(SparkOptionError, match=words):
        read_options(options, streaming)


def test_write_options() -> None:
    opts = write_options({"metadataUri": URI, "namespace": "ns", "stream": "out",
                          "checkpointLocation": "/tmp/x"}, True)
    assert (opts.stream, opts.sink_id) == ("out", None)
    # Without the option, rows must name their stream (a stream column): the writer,
    # which sees the DataFrame's columns, says "option stream is required" otherwise.
    opts = write_options({"metadataUri": URI, "namespace": "ns", "createStreams": "yes"}, False)
    assert (opts.stream, opts.create_streams) == (None, True)
    with pytest.raises(SparkOptionError, match="does not apply"):
        write_options({"metadataUri": URI, "namespace": "ns", "stream": "o",
                       "streams": "a"}, False)
    with pytest.raises(SparkOptionError, match="sinkId cannot be empty"):
        write_options({"metadataUri": URI, "namespace": "ns", "stream": "o", "sinkId": " "},
                      True)
