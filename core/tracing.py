"""OpenTelemetry traces (issue 39): one trace holds a whole delegation chain, across agents and processes.

Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` is set: then `configure` installs the SDK's tracer provider with
the OTLP/HTTP exporter (spans go in batches to `<endpoint>/v1/traces`, off the event loop). Until then
every `span` is the OpenTelemetry API's no-op: one function call, nothing recorded, nothing imported past
the API.

The spans (docs/ARCHITECTURE.md, "Traces"): a turn of an agent (`chat.turn`, `delegated.turn`), each model
call (`llm.call`, with the GenAI attributes), each tool call (`tool.call`), each delegated task
(`delegation.task`), an A2A request the app answers (`a2a.serve`, a server span continuing the caller's
trace) and a broker task (`broker.task`). The W3C `traceparent` goes out with every A2A HTTP call, every
forward between replicas and every task the broker sends an agent over its WebSocket (the message's
`metadata.traceparent`), and is read back on the way in, so a remote agent that propagates it joins the
trace too.

This module sits at the bottom of `core` (pyproject.toml's layers): any part may make spans.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

__all__ = [
    "SpanKind",
    "Status",
    "StatusCode",
    "carrier",
    "configure",
    "continued",
    "inject",
    "span",
    "start_span",
    "traces_url",
]

log = logging.getLogger(__name__)

TRACER_NAME = "a2a_delegation_chat"
TRACEPARENT = "traceparent"


def _tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def traces_url(endpoint: str) -> str:
    """Where the OTLP/HTTP exporter posts spans: `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces` (the spec's rule)."""
    return endpoint.rstrip("/") + "/v1/traces"


def configure(endpoint: str, *, service_name: str, instance_id: str) -> Callable[[], None]:
    """Send this process's spans to `endpoint` (OTLP over HTTP, protobuf); returns the shutdown (flushes).

    Imports the SDK and the exporter only here: a process without traces never loads them.
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": service_name, "service.instance.id": instance_id})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint)), schedule_delay_millis=1000)
    )
    trace.set_tracer_provider(provider)
    log.info("traces go to %s as %s", traces_url(endpoint), service_name)
    return provider.shutdown


@contextmanager
def span(
    name: str, *, kind: SpanKind = SpanKind.INTERNAL, attributes: Mapping[str, Any] | None = None
) -> Iterator[Span]:
    """A span around the block, current inside it (child spans and outgoing `traceparent` hang from it).

    An exception that leaves the block marks the span as an error; a cancellation (Stop, a timeout) ends
    it with the `cancelled` attribute instead, since a stopped turn is not a failure of the app.
    """
    with _tracer().start_as_current_span(
        name, kind=kind, attributes=_clean(attributes), record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except BaseException as exc:
            if type(exc).__name__ == "CancelledError":
                current.set_attribute("cancelled", True)
            else:
                current.record_exception(exc)
                current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


def start_span(name: str, *, kind: SpanKind = SpanKind.INTERNAL, attributes: Mapping[str, Any] | None = None) -> Span:
    """A span that is not made current: for an async generator, which may not hold a context across yields.

    Its parent is the current span; the caller ends it (`span.end()`).
    """
    return _tracer().start_span(name, kind=kind, attributes=_clean(attributes))


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current trace's `traceparent` (and `tracestate`) to outgoing headers; nothing without a trace."""
    propagate.inject(headers)


def carrier() -> dict[str, str]:
    """The current trace's context as a dict (`{"traceparent": ...}`), empty without one: for message metadata."""
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


@contextmanager
def continued(headers: Mapping[str, str] | None) -> Iterator[None]:
    """Run the block in the trace the incoming `headers` (or message metadata) name, if any."""
    if not headers or TRACEPARENT not in {k.lower() for k in headers}:
        yield
        return
    lowered = {k.lower(): v for k, v in headers.items() if isinstance(v, str)}
    token = otel_context.attach(propagate.extract(lowered))
    try:
        yield
    finally:
        otel_context.detach(token)


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Attributes without None values (OpenTelemetry refuses them)."""
    if not attributes:
        return None
    return {k: v for k, v in attributes.items() if v is not None}
