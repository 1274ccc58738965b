"""Optional OpenTelemetry tracing (the ``otel`` extra: ``pip install 'asyncbk[otel]'``).

Spans, when tracing is on:

* ``asyncbk.append`` (client): from ``append()`` to the entry's acknowledgement;
* ``asyncbk.bookie.add`` (bookie): from an add's arrival to its answer, a child of the
  client's append span; its child ``asyncbk.journal.fsync`` is the group commit that
  made the entry durable (write and ``fdatasync`` of the batch);
* ``asyncbk.read`` (client) and ``asyncbk.bookie.read`` (bookie);
* ``asyncbk.recovery`` (client): fencing and closing a ledger;
* ``asyncbk.spark.read`` (a Spark task reading one partition).

A client span's context crosses to the bookie in the request itself, in an optional
field of ADD, ADD_BATCH, READ and READ_BATCH (:data:`TRACE_CONTEXT_BYTES` bytes: the
W3C trace context in binary, see :func:`encode_context`).  Requests without it are
byte for byte what they were without tracing.

Off by default.  A client traces with ``ClientConfig(tracing=True)``, through the
tracer provider the application configured (OpenTelemetry's global one).  A process
of asyncbk's own (a bookie, auto-recovery, a Spark worker) configures its provider
with :func:`configure` (``--otel-exporter`` / ``ASYNCBK_OTEL_EXPORTER``).  With
tracing off, the hot paths test one attribute for ``None`` and nothing more.

This module sits at the bottom of the layers: it imports OpenTelemetry only when
tracing is switched on.
"""

from __future__ import annotations

import contextvars
import json
import os
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from .errors import ConfigError, MissingExtraError

TRACE_CONTEXT_BYTES = 26
"""A span context on the wire: version 0, trace id (16 bytes), span id (8), flags (1)."""
_CONTEXT = struct.Struct(">B16s8sB")
ENV_EXPORTER = "ASYNCBK_OTEL_EXPORTER"
"""Where a process of asyncbk's own sends its spans: ``otlp`` or ``jsonl:FILE``."""

Span = Any
"""An OpenTelemetry span (``opentelemetry.trace.Span``)."""


def encode_context(trace_id: int, span_id: int, flags: int) -> bytes:
    """The wire form of a span context (:data:`TRACE_CONTEXT_BYTES` bytes)."""
    return _CONTEXT.pack(0, trace_id.to_bytes(16, "big"), span_id.to_bytes(8, "big"),
                         flags & 0xFF)


def decode_context(data: bytes) -> tuple[int, int, int] | None:
    """``(trace_id, span_id, flags)`` of a wire context, or None if it is not one (a
    wrong length, version or a zero id: the request is served untraced)."""
    if len(data) != TRACE_CONTEXT_BYTES:
        return None
    version, trace_id, span_id, flags = _CONTEXT.unpack(data)
    tid, sid = int.from_bytes(trace_id, "big"), int.from_bytes(span_id, "big")
    if version != 0 or not tid or not sid:
        return None
    return tid, sid, flags


def _otel(feature: str) -> Any:
    try:
        from opentelemetry import trace
    except ImportError:
        raise MissingExtraError.of(feature, "opentelemetry-api", "otel") from None
    return trace


class Tracing:
    """What a component traces with: a tracer, and the helpers the hot paths call only
    once they found their ``Tracing`` is not None."""

    __slots__ = ("_trace", "tracer")

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer
        self._trace = _otel("tracing")

    @classmethod
    def from_global(cls, name: str = "asyncbk") -> Tracing:
        """Through the application's (global) tracer provider; MissingExtraError without
        the ``otel`` extra."""
        from ._version import __version__

        return cls(_otel("tracing (ClientConfig.tracing)").get_tracer(name, __version__))

    @classmethod
    def from_provider(cls, provider: Any, name: str = "asyncbk") -> Tracing:
        """Through ``provider`` (an OpenTelemetry ``TracerProvider``)."""
        from ._version import __version__

        _otel("tracing (tracer_provider)")
        return cls(provider.get_tracer(name, __version__))

    def start(self, name: str, attributes: Mapping[str, Any] | None = None,
              parent: bytes = b"", start_ns: int | None = None) -> Span:
        """A new span: a child of the wire context ``parent`` if given (a request's),
        else of the current context."""
        context = None
        if parent:
            ids = decode_context(parent)
            if ids is not None:
                trace = self._trace
                remote = trace.SpanContext(ids[0], ids[1], is_remote=True,
                                           trace_flags=trace.TraceFlags(ids[2]))
                context = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        return self.tracer.start_span(name, context=context, attributes=attributes,
                                      start_time=start_ns)

    def child(self, parent: Span, name: str, start_ns: int, end_ns: int,
              attributes: Mapping[str, Any] | None = None) -> None:
        """A finished child span of ``parent`` that ran from ``start_ns`` to ``end_ns``
        (wall clock, ns): e.g. the journal's group commit under a bookie's add."""
        context = self._trace.set_span_in_context(parent)
        span = self.tracer.start_span(name, context=context, attributes=attributes,
                                      start_time=start_ns)
        span.end(end_time=end_ns)

    @staticmethod
    def wire(span: Span) -> bytes:
        """``span``'s context for a request (b"" if it is not valid: not sampled in)."""
        ctx = span.get_span_context()
        if not ctx.is_valid or not ctx.trace_flags.sampled:
            return b""
        return encode_context(ctx.trace_id, ctx.span_id, int(ctx.trace_flags))

    def context_of(self, span: Span) -> contextvars.Context:
        """A copy of the current context with ``span`` current in it: for tasks that
        run on another thread's loop (``loop.create_task(coro, context=...)``)."""
        from opentelemetry import context as otel_context

        ctx = contextvars.copy_context()
        ctx.run(otel_context.attach, self._trace.set_span_in_context(span))
        return ctx

    def current_wire(self) -> bytes:
        """The context of the current span (:meth:`current`), for a request; b"" if
        there is none."""
        return self.wire(self._trace.get_current_span())

    def failed(self, span: Span, exc: BaseException) -> None:
        """End ``span`` as failed by ``exc`` (its type and message, nothing else)."""
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR,
                                           f"{type(exc).__name__}: {exc}"))
        span.end()

    @contextmanager
    def current(self, name: str, attributes: Mapping[str, Any] | None = None,
                ) -> Iterator[Span]:
        """A span that is the current one inside the block (the spans started there,
        and the requests they send, are its children); failed if the block raises."""
        with self.tracer.start_as_current_span(name, attributes=attributes,
                                               record_exception=False,
                                               set_status_on_exception=False) as span:
            try:
                yield span
            except BaseException as exc:
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR,
                                                   f"{type(exc).__name__}: {exc}"))
                raise


# ---------------------------------------------------------------- a process's provider

_configured: Any = None
_configured_lock = threading.Lock()


def configure(exporter: str, service_name: str) -> Any:
    """Give this process an OpenTelemetry tracer provider (the global one) that exports
    to ``exporter``: ``otlp`` (OTLP over HTTP; the standard ``OTEL_EXPORTER_OTLP_*``
    variables say where) or ``jsonl:FILE`` (one JSON object a span, appended to FILE:
    for a look without a collector).  Spans are exported from a background thread in
    batches; :func:`shutdown` exports the rest.  Once per process (later calls return
    the first provider).  MissingExtraError without the ``otel`` extra; ConfigError
    for an exporter it does not know."""
    global _configured
    kind, _, arg = check_exporter(exporter)
    with _configured_lock:
        if _configured is not None:
            return _configured
        trace = _otel(f"the otel exporter {kind}")
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            raise MissingExtraError.of(f"the otel exporter {kind}", "opentelemetry-sdk",
                                       "otel") from None
        if kind == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError:
                raise MissingExtraError.of("the otel exporter otlp",
                                           "opentelemetry-exporter-otlp-proto-http",
                                           "otel") from None
            span_exporter: Any = OTLPSpanExporter()
        else:
            span_exporter = JsonLinesExporter(arg)
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        provider.add_span_processor(BatchSpanProcessor(span_exporter))
        trace.set_tracer_provider(provider)
        _configured = provider
        return provider


def check_exporter(exporter: str) -> tuple[str, str, str]:
    """``exporter`` split as ``(kind, ":", argument)``, once it is one :func:`configure`
    takes and the ``otel`` extra is installed (ConfigError, MissingExtraError)."""
    kind, sep, arg = exporter.partition(":")
    if kind not in ("otlp", "jsonl") or (kind == "jsonl") != bool(arg) \
            or kind == "otlp" and sep:
        raise ConfigError(f"otel_exporter {exporter!r}: use otlp or jsonl:FILE")
    _otel(f"otel_exporter {kind}")
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise MissingExtraError.of(f"otel_exporter {kind}", "opentelemetry-sdk",
                                   "otel") from None
    return kind, sep, arg


def configure_from_env(service_name: str) -> Any:
    """:func:`configure` as ``ASYNCBK_OTEL_EXPORTER`` says; None when it is unset."""
    exporter = os.environ.get(ENV_EXPORTER, "")
    return configure(exporter, service_name) if exporter else None


def shutdown() -> None:
    """Export what is left and stop the provider :func:`configure` made (blocks: call
    it off the event loop, or at exit)."""
    global _configured
    with _configured_lock:
        provider, _configured = _configured, None
    if provider is not None:
        provider.shutdown()


class JsonLinesExporter:
    """An OpenTelemetry span exporter that appends one JSON object a span to a file
    (runs in the batch processor's thread, never on the event loop)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        data = "".join(json.dumps(span_record(s), sort_keys=True) + "\n" for s in spans)
        # one write of whole lines, O_APPEND: processes sharing the file never interleave
        # (and the batch processor calls export from its one thread)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def span_record(span: Any) -> dict[str, Any]:
    """A finished span as a JSON-able dict: names, ids (hex), times (ns), attributes."""
    ctx = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "remote_parent": bool(parent is not None and parent.is_remote),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "service": (span.resource.attributes or {}).get("service.name"),
    }


__all__ = ["ENV_EXPORTER", "TRACE_CONTEXT_BYTES", "JsonLinesExporter", "Tracing",
           "check_exporter", "configure", "configure_from_env", "decode_context",
           "encode_context", "shutdown", "span_record"]
