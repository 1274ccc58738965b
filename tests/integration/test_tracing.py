"""Tracing end to end: a client traced with the OpenTelemetry SDK's in-memory exporter,
real bookie processes exporting their spans to a file (``otel_exporter = "jsonl:..."``),
and the spans joined by the trace context the requests carried.

append (client) -> bookie.add (each bookie of the write set) -> journal.fsync (the
group commit that made the entry durable); read -> bookie.read; recovery -> its fencing
reads on the bookies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed: "
                    "pip install -e '.[test]'")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from asyncbk.testing import LocalCluster

pytestmark = pytest.mark.integration

ENTRIES = 20


def _client_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _hex(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def _bookie_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_append_read_and_recovery_are_traced_through_the_bookies(tmp_path: Path) -> None:
    spans_file = tmp_path / "bookie-spans.jsonl"
    provider, exporter = _client_provider()
    cluster = LocalCluster(bookies=3, data_dir=tmp_path / "cluster",
                           bookie_config={"otel_exporter": f"jsonl:{spans_file}"})
    async with cluster:
        bk = await cluster.client(tracer_provider=provider)
        lh = await bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2,
                                    password=b"pw")
        futures = [lh.append(b"traced %d" % i) for i in range(ENTRIES)]
        assert [await f for f in futures] == list(range(ENTRIES))
        entries = await lh.read(0, ENTRIES - 1)
        assert [e.data for e in entries] == [b"traced %d" % i for i in range(ENTRIES)]
        # a second, untraced client: its requests carry no context, no bookie span
        plain = await cluster.client()
        other = await plain.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2,
                                          password=b"pw")
        await other.append(b"untraced")
        # recovery of the traced writer's ledger, still open, by another traced client
        recoverer = await cluster.client(tracer_provider=provider)
        recovered = await recoverer.open_ledger(lh.id, password=b"pw")
        assert recovered.metadata.last_entry_id == ENTRIES - 1
    # the bookies stopped (gracefully): their exporters wrote their last spans
    client_spans = exporter.get_finished_spans()
    bookie_spans = _bookie_spans(spans_file)
    assert {s["service"] for s in bookie_spans} == {"asyncbk-bookie"}
    by_parent: dict[str, list[dict[str, Any]]] = {}
    for s in bookie_spans:
        by_parent.setdefault(s["parent_id"], []).append(s)

    # append -> bookie.add on each of the write set's 2 bookies -> journal.fsync
    appends = [s for s in client_spans if s.name == "asyncbk.append"
               and s.attributes and s.attributes["asyncbk.ledger_id"] == lh.id
               and not s.attributes["asyncbk.recovery"]]
    assert sorted(s.attributes["asyncbk.entry_id"] for s in appends  # type: ignore[index]
                  ) == list(range(ENTRIES))
    for append in appends:
        trace_id, span_id = _hex(append)
        adds = [s for s in by_parent.get(span_id, []) if s["name"] == "asyncbk.bookie.add"]
        assert len(adds) == 2, (append.attributes, by_parent.get(span_id))
        assert len({s["attributes"]["asyncbk.bookie"] for s in adds}) == 2
        for add in adds:
            assert add["trace_id"] == trace_id and add["remote_parent"]
            assert add["attributes"]["asyncbk.entry_id"] == append.attributes["asyncbk.entry_id"]  # type: ignore[index]
            assert add["attributes"]["asyncbk.status"] == "OK"
            (fsync,) = by_parent[add["span_id"]]
            assert fsync["name"] == "asyncbk.journal.fsync"
            assert fsync["trace_id"] == trace_id and not fsync["remote_parent"]
            assert fsync["attributes"]["asyncbk.journal.records"] >= 1
            assert add["start_ns"] <= fsync["start_ns"] <= fsync["end_ns"] <= add["end_ns"]
            # the bookie answered before the client saw the ack quorum complete
            assert add["end_ns"] <= append.end_time  # type: ignore[operator]

    # read -> bookie.read
    (read,) = [s for s in client_spans if s.name == "asyncbk.read"
               and s.attributes and s.attributes["asyncbk.ledger_id"] == lh.id
               and s.attributes["asyncbk.last"] == ENTRIES - 1]
    reads = by_parent.get(_hex(read)[1], [])
    assert reads and {s["name"] for s in reads} == {"asyncbk.bookie.read"}
    assert sum(s["attributes"]["asyncbk.entries"] for s in reads) >= ENTRIES

    # recovery -> its fencing reads on the bookies of the last ensemble
    (recovery,) = [s for s in client_spans if s.name == "asyncbk.recovery"]
    assert recovery.attributes is not None
    assert recovery.attributes["asyncbk.ledger_id"] == lh.id
    assert recovery.attributes["asyncbk.last_entry_id"] == ENTRIES - 1
    fences = by_parent.get(_hex(recovery)[1], [])
    assert len([s for s in fences if s["name"] == "asyncbk.bookie.read"]) >= 3

    # the untraced client's ledger left no span anywhere
    assert not [s for s in bookie_spans if s["attributes"].get("asyncbk.ledger_id") == other.id]
    assert not [s for s in client_spans
                if (s.attributes or {}).get("asyncbk.ledger_id") == other.id]


async def test_a_failed_append_ends_its_span_as_an_error(tmp_path: Path) -> None:
    """A writer fenced by a recovery: its next append fails, and so does its span."""
    provider, exporter = _client_provider()
    async with LocalCluster(bookies=3, data_dir=tmp_path / "cluster") as cluster:
        bk = await cluster.client(tracer_provider=provider)
        lh = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3,
                                    password=b"pw")
        await lh.append(b"first")
        other = await cluster.client()
        await other.open_ledger(lh.id, password=b"pw")  # recovers: fences the ledger
        with pytest.raises(Exception):  # noqa: B017 (the fenced writer's error, any)
            await lh.append(b"second")
    failed = [s for s in exporter.get_finished_spans() if s.name == "asyncbk.append"
              and (s.attributes or {}).get("asyncbk.entry_id") == 1]
    assert len(failed) == 1
    assert failed[0].status.status_code.name == "ERROR"
    assert failed[0].status.description


async def test_a_bookie_exports_its_spans_over_otlp(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``otel_exporter = "otlp"``: the bookie processes send their spans over OTLP/HTTP
    to where ``OTEL_EXPORTER_OTLP_ENDPOINT`` says (here a collector stand-in that
    decodes each request with OpenTelemetry's own protobuf classes)."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http",
                        reason="the otel extra's OTLP exporter is not installed: "
                        "pip install -e '.[test]'")
    from aiohttp import web
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    received: list[Any] = []

    async def traces(request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        received.append(message)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    provider, exporter = _client_provider()
    try:
        async with LocalCluster(bookies=3, data_dir=tmp_path / "cluster",
                                bookie_config={"otel_exporter": "otlp"}) as cluster:
            bk = await cluster.client(tracer_provider=provider)
            lh = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2,
                                        password=b"pw")
            await lh.append(b"over otlp")
    finally:
        await runner.cleanup()
    (append,) = [s for s in exporter.get_finished_spans() if s.name == "asyncbk.append"]
    trace_id = append.get_span_context().trace_id  # type: ignore[union-attr]
    spans = [(rs.resource, span) for message in received for rs in message.resource_spans
             for ss in rs.scope_spans for span in ss.spans]
    adds = [span for _, span in spans if span.name == "asyncbk.bookie.add"
            and int.from_bytes(span.trace_id, "big") == trace_id]
    assert len(adds) == 3, [span.name for _, span in spans]
    services = {attr.value.string_value for resource, _ in spans
                for attr in resource.attributes if attr.key == "service.name"}
    assert services == {"asyncbk-bookie"}
    fsyncs = [span for _, span in spans if span.name == "asyncbk.journal.fsync"
              and span.parent_span_id in {add.span_id for add in adds}]
    assert len(fsyncs) == 3
