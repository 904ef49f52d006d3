"""OpenTelemetry traces (issue 39, item 2): one trace holds a whole delegation chain, across two app processes.

Two real `python app.py` processes send their spans over OTLP/HTTP to an in-process receiver (protobuf,
decoded with the OpenTelemetry protocol's own messages). App A's chat delegates to its own coding
assistant and to app B's (registered by card URL, called over A2A with an API key): each delegation's
spans (the caller's turn, the tool call, the delegated task, the callee's turn and its model call, and
app B's `a2a.serve`) share one trace id and nest as the calls do. Without the setting no span is sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from core.tracing import traces_url
from tests.utils.app_process import AppProcess, app_process


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, object]


class OtlpReceiver:
    """An OTLP/HTTP collector on 127.0.0.1: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                receiver.take(self.path, body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._lock = threading.Lock()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, path: str, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self._lock:
            self.paths.append(path)
            for resource_spans in request.resource_spans:
                service = next(
                    (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), ""
                )
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        attributes = {a.key: _value(a.value) for a in span.attributes}
                        self.spans.append(
                            ReceivedSpan(
                                service,
                                span.name,
                                span.trace_id.hex(),
                                span.span_id.hex(),
                                span.parent_span_id.hex(),
                                attributes,
                            )
                        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    collector = OtlpReceiver()
    yield collector
    collector.close()


def test_traces_url_follows_the_otlp_rule() -> None:
    assert traces_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"


def traced_app(tmp_path: Path, name: str, receiver: OtlpReceiver):
    return app_process(
        tmp_path / name,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_SERVICE_NAME=name,
        OUTBOUND_ALLOW_HOSTS="127.0.0.1",
        DEMO_MODEL_DELAY_MS="2",
    )


def chat(app: AppProcess, text: str) -> str:
    """One turn of A's general assistant, to its end; returns the session id."""
    with httpx.Client(base_url=app.base_url, timeout=60) as client:
        session_id = client.post("/api/sessions", json={"agentId": "general-assistant"}).json()["id"]
        posted = client.post(f"/api/sessions/{session_id}/messages", json={"content": text})
        assert posted.status_code == 202, posted.text
        with client.stream("GET", posted.json()["streamUrl"]) as stream:
            for _ in stream.iter_lines():
                pass
    return session_id


def wait_for(receiver: OtlpReceiver, check, timeout_s: float = 20.0) -> list[ReceivedSpan]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check(list(receiver.spans))
        if found:
            return found
        time.sleep(0.2)
    names = sorted({(s.service, s.name) for s in receiver.spans})
    raise AssertionError(f"the spans never arrived; received: {names}")


def chain_of(spans: list[ReceivedSpan], task_id: str) -> list[ReceivedSpan] | None:
    """Every span of the trace that holds the delegated task `task_id`, once its callee's model call is in."""
    task = next((s for s in spans if s.name == "delegation.task" and s.attributes.get("a2a.task.id") == task_id), None)
    if task is None:
        return None
    trace = [s for s in spans if s.trace_id == task.trace_id]
    turns = [s for s in trace if s.name == "delegated.turn"]
    whole = turns and any(s.name == "chat.turn" for s in trace)
    return trace if whole and any(s.name == "llm.call" and s.parent_id == turns[0].span_id for s in trace) else None


def parent_of(trace: list[ReceivedSpan], span: ReceivedSpan) -> ReceivedSpan:
    return next(s for s in trace if s.span_id == span.parent_id)


def test_one_trace_holds_a_delegation_chain_also_across_two_app_processes(tmp_path: Path, receiver) -> None:
    with traced_app(tmp_path, "app-a", receiver) as a, traced_app(tmp_path, "app-b", receiver) as b:
        a.wait_until_serving()
        b.wait_until_serving()
        key = httpx.post(f"{b.base_url}/api/a2a/keys", json={"name": "app-a"}, timeout=10).json()["key"]
        card_url = f"{b.base_url}/a2a/agents/coding-assistant/.well-known/agent-card.json"
        registered = httpx.post(
            f"{a.base_url}/api/a2a/remote-agents",
            json={"cardUrl": card_url, "id": "far-coder", "bearerToken": key},
            timeout=30,
        )
        assert registered.status_code == 201, registered.text

        # Within app A: the caller's turn → tool call → delegated task → the callee's turn → its model call.
        session_id = chat(a, "@coding-assistant write a greeting")
        tasks = httpx.get(f"{a.base_url}/api/tasks", timeout=10).json()
        local_task = next(t["id"] for t in tasks if t["callerSessionId"] == session_id)
        trace = wait_for(receiver, lambda spans: chain_of(spans, local_task))
        assert {s.service for s in trace} == {"app-a"}
        task_span = next(s for s in trace if s.name == "delegation.task")
        tool = parent_of(trace, task_span)
        assert tool.name == "tool.call" and tool.attributes["tool.name"] == "agent_invoke"
        caller_turn = parent_of(trace, tool)
        assert caller_turn.name == "chat.turn" and caller_turn.attributes["session.id"] == session_id
        callee_turn = next(s for s in trace if s.name == "delegated.turn")
        assert parent_of(trace, callee_turn).span_id == task_span.span_id
        assert callee_turn.attributes["agent.id"] == "coding-assistant"
        model_calls = [s for s in trace if s.name == "llm.call"]
        assert {parent_of(trace, s).name for s in model_calls} == {"chat.turn", "delegated.turn"}
        assert all(s.attributes["gen_ai.request.model"] == "local/demo" for s in model_calls)

        # Across processes: A's delegated task is the parent of B's `a2a.serve`, under which B's turn runs.
        session_id = chat(a, "@far-coder write a greeting")
        tasks = httpx.get(f"{a.base_url}/api/tasks", timeout=10).json()
        remote_task = next(t["id"] for t in tasks if t["callerSessionId"] == session_id)

        def remote_chain(spans: list[ReceivedSpan]) -> list[ReceivedSpan] | None:
            task = next(
                (s for s in spans if s.name == "delegation.task" and s.attributes.get("a2a.task.id") == remote_task),
                None,
            )
            if task is None:
                return None
            trace = [s for s in spans if s.trace_id == task.trace_id]
            served = [s for s in trace if s.service == "app-b" and s.name == "llm.call"]
            root = [s for s in trace if s.service == "app-a" and s.name == "chat.turn"]
            return trace if served and root else None

        trace = wait_for(receiver, remote_chain)
        assert {s.service for s in trace} == {"app-a", "app-b"}
        task_span = next(
            s for s in trace if s.name == "delegation.task" and s.attributes.get("a2a.task.id") == remote_task
        )
        serve = next(s for s in trace if s.name == "a2a.serve")
        assert serve.service == "app-b" and serve.attributes["agent.id"] == "coding-assistant"
        assert parent_of(trace, serve).span_id == task_span.span_id  # the traceparent went with the A2A call
        b_turn = next(s for s in trace if s.service == "app-b" and s.name == "delegated.turn")
        b_model = next(s for s in trace if s.service == "app-b" and s.name == "llm.call")
        assert parent_of(trace, b_model).span_id == b_turn.span_id
        ancestors, current = [], b_turn
        while current.parent_id:
            current = parent_of(trace, current)
            ancestors.append((current.service, current.name))
        # B's turn ← B's task ← B's a2a.serve ← A's task ← A's tool call ← A's turn; the libraries' own spans
        # (the a2a-sdk's dispatcher, FastAPI's request span) sit between them and are left out here.
        ours = {"delegation.task", "a2a.serve", "tool.call", "chat.turn"}
        assert [a for a in ancestors if a[1] in ours] == [
            ("app-b", "delegation.task"),
            ("app-b", "a2a.serve"),
            ("app-a", "delegation.task"),
            ("app-a", "tool.call"),
            ("app-a", "chat.turn"),
        ]
        assert all(path == "/v1/traces" for path in receiver.paths)


def test_without_the_setting_no_span_is_sent(tmp_path: Path, receiver) -> None:
    with app_process(tmp_path / "plain", OUTBOUND_ALLOW_HOSTS="127.0.0.1", DEMO_MODEL_DELAY_MS="2") as app:
        app.wait_until_serving()
        chat(app, "@coding-assistant write a greeting")
        time.sleep(2.0)  # past the exporter's batch delay, had it been on
    assert receiver.spans == [] and receiver.paths == []
