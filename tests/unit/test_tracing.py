"""asyncbk.tracing: the wire form of a span context, spans with remote parents, the
exporters a process configures, and one-line errors without the otel extra."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed: "
                    "pip install -e '.[test]'")

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from asyncbk import tracing
from asyncbk.config import BookieConfig, from_mapping
from asyncbk.errors import ConfigError, MissingExtraError
from asyncbk.tracing import (
    TRACE_CONTEXT_BYTES,
    JsonLinesExporter,
    Tracing,
    check_exporter,
    decode_context,
    encode_context,
)


@given(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.integers(0, 255))
def test_a_context_round_trips(trace_id: int, span_id: int, flags: int) -> None:
    data = encode_context(trace_id, span_id, flags)
    assert len(data) == TRACE_CONTEXT_BYTES
    assert decode_context(data) == (trace_id, span_id, flags)


@pytest.mark.parametrize("data", [
    b"", b"\x00" * 25, b"\x00" * 27,
    b"\x01" + b"\x01" * 25,  # an unknown version
    encode_context(1, 1, 1)[:1] + b"\x00" * 16 + encode_context(1, 1, 1)[17:],  # no trace id
    encode_context(1, 1, 1)[:17] + b"\x00" * 8 + b"\x01",  # no span id
])
def test_what_is_not_a_context_is_ignored(data: bytes) -> None:
    assert decode_context(data) is None


def _tracing() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing.from_provider(provider), exporter


def test_a_span_continues_the_trace_its_request_carried() -> None:
    t, exporter = _tracing()
    client = t.start("asyncbk.append", {"asyncbk.entry_id": 7})
    wire = Tracing.wire(client)
    assert len(wire) == TRACE_CONTEXT_BYTES
    bookie = t.start("asyncbk.bookie.add", parent=wire)
    t.child(bookie, "asyncbk.journal.fsync", 1_000, 2_000, {"asyncbk.journal.records": 3})
    bookie.end()
    client.end()
    fsync, add, append = exporter.get_finished_spans()
    assert add.context.trace_id == append.context.trace_id == fsync.context.trace_id
    assert add.parent is not None and add.parent.is_remote
    assert add.parent.span_id == append.context.span_id
    assert fsync.parent is not None and fsync.parent.span_id == add.context.span_id
    assert (fsync.start_time, fsync.end_time) == (1_000, 2_000)


def test_a_bad_context_starts_a_new_trace() -> None:
    t, exporter = _tracing()
    t.start("asyncbk.bookie.add", parent=b"\x07" * TRACE_CONTEXT_BYTES).end()
    (span,) = exporter.get_finished_spans()
    assert span.parent is None


def test_current_makes_the_span_the_parent_of_requests_and_fails_with_the_block() -> None:
    t, exporter = _tracing()
    assert t.current_wire() == b""
    with pytest.raises(ValueError), t.current("asyncbk.recovery") as span:
        wire = t.current_wire()
        ids = decode_context(wire)
        assert ids is not None and ids[:2] == (span.context.trace_id, span.context.span_id)
        assert ids[2] & 1  # sampled
        raise ValueError("boom")
    (done,) = exporter.get_finished_spans()
    assert done.status.status_code.name == "ERROR"
    assert done.status.description == "ValueError: boom"
    assert t.current_wire() == b""


def test_context_of_carries_the_span_into_another_context() -> None:
    t, _ = _tracing()
    span = t.start("asyncbk.spark.read")
    ctx = t.context_of(span)
    assert ctx.run(t.current_wire) == Tracing.wire(span)
    assert t.current_wire() == b""  # (the caller's context is untouched)


def test_an_unsampled_span_sends_no_context() -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    provider = TracerProvider(sampler=ALWAYS_OFF)
    t = Tracing.from_provider(provider)
    assert Tracing.wire(t.start("asyncbk.append")) == b""


def test_the_jsonl_exporter_appends_one_line_a_span(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    exporter = JsonLinesExporter(str(path))
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    t = Tracing.from_provider(provider)
    parent = t.start("a")
    t.start("b", {"asyncbk.ledger_id": 3}, parent=Tracing.wire(parent)).end()
    parent.end()
    b, a = (json.loads(line) for line in path.read_text().splitlines())
    assert (a["name"], b["name"]) == ("a", "b")
    assert b["parent_id"] == a["span_id"] and b["remote_parent"] and b["trace_id"] == a["trace_id"]
    assert b["attributes"] == {"asyncbk.ledger_id": 3}
    assert a["parent_id"] is None and a["start_ns"] <= a["end_ns"]
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("exporter", ["", "jsonl", "jsonl:", "otlp:x", "zipkin", "console"])
def test_an_unknown_exporter_is_a_config_error(exporter: str) -> None:
    with pytest.raises(ConfigError, match="use otlp or jsonl:FILE"):
        check_exporter(exporter)


def test_the_bookie_setting_is_checked() -> None:
    assert from_mapping(BookieConfig, {"otel_exporter": "jsonl:/x"}, "t").otel_exporter == "jsonl:/x"
    with pytest.raises(ConfigError, match="otel_exporter 'zipkin'"):
        from_mapping(BookieConfig, {"otel_exporter": "zipkin"}, "t")


def test_without_the_extra_each_entry_point_says_which_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    for call in (Tracing.from_global, lambda: check_exporter("otlp"),
                 lambda: tracing.configure("jsonl:/x", "t")):
        with pytest.raises(MissingExtraError) as info:
            call()
        assert "pip install 'asyncbk[otel]'" in str(info.value)
        assert info.value.extra == "otel"


async def test_a_client_without_the_extra_fails_before_connecting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncbk.client.client import BookKeeper

    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(MissingExtraError, match=r"asyncbk\[otel\]"):  # (nothing listens)
        await BookKeeper.connect("etcd://127.0.0.1:1/x", tracing=True)
