"""Issue 36, item 6: every agent served over HTTP+JSON too, through the SDK's REST routes, declared in its card.

Driven over real HTTP on 127.0.0.1 by the stock a2a-sdk 1.x client with the REST transport preferred
(and its v0.3 REST transport), and by raw requests for the errors: the spec's HTTP statuses and its
`{"error": {code, status, message, details}}` body. Two users (alice, bob) for "not yours".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types import (
    CancelTaskRequest,
    GetExtendedAgentCardRequest,
    GetTaskRequest,
    ListTasksRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError

from core.chat.demo_model import plan_reply
from tests.test_a2a_conformance import TwoUsers, two_users
from tests.utils.a2a_live import user_message

ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


@pytest.fixture
def app(tmp_path: Path) -> Iterator[TwoUsers]:
    """The app with alice and bob, demo model at 2 ms per token."""
    with two_users(tmp_path) as live:
        yield live


def lorem(count: int) -> str:
    """Exactly what the demo model answers to `/lorem <count>`."""
    return "".join(plan_reply([{"role": "user", "content": f"/lorem {count}"}], tools=None).tokens)


def rest_url(app: TwoUsers, agent_id: str = "coding-assistant") -> str:
    return f"{app.agent_url(agent_id)}/rest"


@asynccontextmanager
async def rest_client(
    agent_url: str, key: str, *, streaming: bool = True, version: str = "1.0", sent: list[str] | None = None
) -> AsyncIterator[Client]:
    """The stock client from the agent's card, with HTTP+JSON preferred (and only that card interface's version)."""

    async def record(request: httpx.Request) -> None:
        if sent is not None and not request.url.path.endswith("/agent-card.json"):
            sent.append(f"{request.method} {request.url.path}")

    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(headers=headers, timeout=30, event_hooks={"request": [record]}) as http:
        card = await A2ACardResolver(http, agent_url).get_agent_card()
        keep = [i for i in card.supported_interfaces if i.protocol_version == version]
        del card.supported_interfaces[:]
        card.supported_interfaces.extend(keep)
        config = ClientConfig(
            httpx_client=http,
            streaming=streaming,
            supported_protocol_bindings=["HTTP+JSON", "JSONRPC"],
            use_client_preference=True,
        )
        client = ClientFactory(config).create(card)
        try:
            yield client
        finally:
            await client.close()


def status_texts(events) -> list[str]:
    return [
        "".join(p.text for p in e.status_update.status.message.parts)
        for e in events
        if e.WhichOneof("payload") == "status_update" and e.status_update.status.HasField("message")
    ]


def assert_rest_error(response: httpx.Response, status: int, grpc_status: str, reason: str) -> str:
    """The spec's error body (§11.6): its HTTP status, `google.rpc.Status` fields, an ErrorInfo with the reason."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert (error["code"], error["status"]) == (status, grpc_status), error
    [info] = [d for d in error["details"] if d["@type"] == ERROR_INFO]
    assert (info["reason"], info["domain"]) == (reason, "a2a-protocol.org"), info
    assert error["message"] and "Traceback" not in error["message"]
    return error["message"]


# -- the card ---------------------------------------------------------------------------------------


async def test_the_card_declares_http_json_next_to_json_rpc_in_both_versions(app: TwoUsers) -> None:
    agent, rest = app.agent_url("coding-assistant"), rest_url(app)
    card_url = f"{agent}/.well-known/agent-card.json"
    v1 = httpx.get(card_url, headers={"A2A-Version": "1.0"}, timeout=10).json()
    assert [(i["protocolBinding"], i["protocolVersion"], i["url"]) for i in v1["supportedInterfaces"]] == [
        ("JSONRPC", "1.0", agent),
        ("JSONRPC", "0.3", agent),
        ("HTTP+JSON", "1.0", rest),
        ("HTTP+JSON", "0.3", rest),
    ]
    for asked in ({"A2A-Version": "0.3"}, {}):  # the v0.3 card, and the one for a client that names no version
        v03 = httpx.get(card_url, headers=asked, timeout=10).json()
        assert (v03["url"], v03["preferredTransport"]) == (agent, "JSONRPC")
        assert v03["additionalInterfaces"] == [
            {"url": agent, "transport": "JSONRPC"},
            {"url": rest, "transport": "HTTP+JSON"},
        ]
    async with httpx.AsyncClient(timeout=10) as http:  # the stock 1.x resolver, no header
        card = await A2ACardResolver(http, agent).get_agent_card()
    assert ("HTTP+JSON", "1.0", rest) in {
        (i.protocol_binding, i.protocol_version, i.url) for i in card.supported_interfaces
    }
    # A client that takes the server's preference (the SDK's default) stays on JSON-RPC.
    assert card.supported_interfaces[0].protocol_binding == "JSONRPC"


# -- the stock client over HTTP+JSON -----------------------------------------------------------------


async def test_the_stock_client_streams_gets_lists_and_cancels_over_http_json(app: TwoUsers) -> None:
    sent: list[str] = []
    base = "/a2a/agents/coding-assistant/rest"
    async with rest_client(app.agent_url("coding-assistant"), app.alice, sent=sent) as client:
        events = [e async for e in client.send_message(user_message("/lorem 40"))]
        assert events[0].WhichOneof("payload") == "task"
        assert "".join(status_texts(events)) == lorem(40)
        assert [e.WhichOneof("payload") for e in events[-2:]] == ["artifact_update", "status_update"]
        assert events[-2].artifact_update.artifact.parts[0].text == lorem(40)
        assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
        task_id = events[0].task.id

        task = await client.get_task(GetTaskRequest(id=task_id))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED and task.artifacts[0].parts[0].text == lorem(40)
        assert [m.parts[0].text for m in task.history] == ["/lorem 40", lorem(40)]
        listed = await client.list_tasks(ListTasksRequest())
        assert [t.id for t in listed.tasks] == [task_id]
        with pytest.raises(TaskNotFoundError, match="no task"):
            await client.get_task(GetTaskRequest(id="0" * 32))

        stream = client.send_message(user_message("/lorem 5000"))
        running = (await anext(stream)).task.id
        await anext(stream)
        canceled = await client.cancel_task(CancelTaskRequest(id=running))
        assert canceled.status.state == TaskState.TASK_STATE_CANCELED
        rest = [e async for e in stream]
        assert rest[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED
        with pytest.raises(TaskNotCancelableError, match="already TASK_STATE_CANCELED"):
            await client.cancel_task(CancelTaskRequest(id=running))
        extended = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
        assert extended.name == "Coding Assistant" and extended.skills[0].id == "coding-assistant"
    assert sent[:2] == [f"POST {base}/message:stream", f"GET {base}/tasks/{task_id}"]
    assert f"POST {base}/tasks/{running}:cancel" in sent and f"GET {base}/extendedAgentCard" in sent
    assert not [s for s in sent if s.startswith("POST") and s.endswith("/coding-assistant")]  # no JSON-RPC call


async def test_send_waits_for_the_end_and_subscribe_follows_a_running_task(app: TwoUsers) -> None:
    async with rest_client(app.agent_url("coding-assistant"), app.alice, streaming=False) as client:
        [event] = [e async for e in client.send_message(user_message("/lorem 12"))]
        assert event.task.status.state == TaskState.TASK_STATE_COMPLETED
        assert event.task.artifacts[0].parts[0].text == lorem(12)

    headers = {"Authorization": f"Bearer {app.alice}", "A2A-Version": "1.0"}
    message = {"messageId": "m-rest-1", "role": "ROLE_USER", "parts": [{"text": "/lorem 300"}]}
    started = httpx.post(
        f"{rest_url(app)}/message:send",
        json={"message": message, "configuration": {"returnImmediately": True}},
        headers=headers,
        timeout=10,
    )
    assert started.status_code == 200, started.text
    task_id = started.json()["task"]["id"]
    await asyncio.sleep(0.1)
    async with rest_client(app.agent_url("coding-assistant"), app.alice) as client:
        events = [e async for e in client.subscribe(SubscribeToTaskRequest(id=task_id))]
    assert events[0].task.id == task_id and "".join(status_texts(events)) == lorem(300)
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_a_v03_client_uses_the_v03_rest_paths(app: TwoUsers) -> None:
    sent: list[str] = []
    async with rest_client(app.agent_url("coding-assistant"), app.alice, version="0.3", sent=sent) as client:
        events = [e async for e in client.send_message(user_message("/lorem 15"))]
        assert "".join(status_texts(events)) == lorem(15)
        assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
        task = await client.get_task(GetTaskRequest(id=events[0].task.id))
        assert task.artifacts[0].parts[0].text == lorem(15)
    base = "/a2a/agents/coding-assistant/rest/v1"
    assert sent == [f"POST {base}/message:stream", f"GET {base}/tasks/{task.id}"]


# -- errors -----------------------------------------------------------------------------------------


def test_errors_have_the_spec_status_and_body(app: TwoUsers) -> None:
    url = rest_url(app)
    alice = {"Authorization": f"Bearer {app.alice}", "A2A-Version": "1.0"}
    message = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "/lorem 3"}]}

    unknown = httpx.get(f"{url}/tasks/nope", headers=alice, timeout=10)
    assert "'nope'" in assert_rest_error(unknown, 404, "NOT_FOUND", "TASK_NOT_FOUND")
    assert_rest_error(
        httpx.post(f"{url}/tasks/nope:cancel", headers=alice, timeout=10), 404, "NOT_FOUND", "TASK_NOT_FOUND"
    )

    for bad in (b'{"message": ', b"[1, 2", b"\xff\xfe not utf-8", b"[" * 5000 + b"]" * 5000):
        response = httpx.post(f"{url}/message:send", content=bad, headers=alice, timeout=10)
        assert_rest_error(response, 400, "INVALID_ARGUMENT", "INVALID_REQUEST")
    no_text = httpx.post(f"{url}/message:send", json={"message": {**message, "parts": [{"text": " "}]}}, headers=alice)
    assert_rest_error(no_text, 400, "INVALID_ARGUMENT", "INVALID_PARAMS")
    no_version = httpx.get(f"{url}/tasks/nope", headers={"Authorization": alice["Authorization"]}, timeout=10)
    assert "Expected version '1.0'" in assert_rest_error(
        no_version, 400, "FAILED_PRECONDITION", "VERSION_NOT_SUPPORTED"
    )
    big = {"message": {**message, "parts": [{"text": "x" * 1_100_000}]}}
    too_large = httpx.post(f"{url}/message:send", content=json.dumps(big), headers=alice, timeout=10)
    assert "Payload too large" in assert_rest_error(too_large, 413, "INVALID_ARGUMENT", "PAYLOAD_TOO_LARGE")

    for key in (None, "a2ak_not-a-real-key"):
        headers = {"A2A-Version": "1.0"} | ({"Authorization": f"Bearer {key}"} if key else {})
        response = httpx.get(f"{url}/tasks", headers=headers, timeout=10)
        assert "Authorization: Bearer" in assert_rest_error(response, 401, "UNAUTHENTICATED", "UNAUTHENTICATED")
        assert response.headers["www-authenticate"].startswith("Bearer")

    missing_agent = httpx.get(f"{rest_url(app, 'nobody')}/tasks", headers=alice, timeout=10)
    assert_rest_error(missing_agent, 404, "NOT_FOUND", "AGENT_NOT_FOUND")
    no_such_path = httpx.get(f"{url}/message:send-it", headers=alice, timeout=10)
    assert "/message:send" in assert_rest_error(no_such_path, 404, "NOT_FOUND", "METHOD_NOT_FOUND")
    wrong_method = httpx.get(f"{url}/message:send", headers=alice, timeout=10)
    assert_rest_error(wrong_method, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED")
    assert "POST" in wrong_method.headers["allow"]

    # Done tasks cannot be canceled (400), nor followed (400); not yours looks exactly like unknown (404).
    done = httpx.post(f"{url}/message:send", json={"message": message}, headers=alice, timeout=30).json()["task"]
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    not_cancelable = httpx.post(f"{url}/tasks/{done['id']}:cancel", headers=alice, timeout=10)
    assert_rest_error(not_cancelable, 400, "FAILED_PRECONDITION", "TASK_NOT_CANCELABLE")
    ended = httpx.post(f"{url}/tasks/{done['id']}:subscribe", headers=alice, timeout=10)
    assert_rest_error(ended, 400, "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION")
    bob = {"Authorization": f"Bearer {app.bob}", "A2A-Version": "1.0"}
    for method, path in (("GET", ""), ("POST", ":cancel"), ("POST", ":subscribe")):
        foreign = httpx.request(method, f"{url}/tasks/{done['id']}{path}", headers=bob, timeout=10)
        never = httpx.request(method, f"{url}/tasks/{'0' * 32}{path}", headers=bob, timeout=10)
        assert_rest_error(foreign, 404, "NOT_FOUND", "TASK_NOT_FOUND")
        assert foreign.json()["error"]["message"].replace(done["id"], "ID") == never.json()["error"]["message"].replace(
            "0" * 32, "ID"
        )
    assert httpx.get(f"{url}/tasks", headers=bob, timeout=10).json()["tasks"] == []
    other_agent = httpx.get(f"{rest_url(app, 'general-assistant')}/tasks/{done['id']}", headers=alice, timeout=10)
    assert_rest_error(other_agent, 404, "NOT_FOUND", "TASK_NOT_FOUND")


def test_too_many_running_tasks_is_429_with_retry_after(tmp_path: Path) -> None:
    with two_users(tmp_path, max_running_tasks_per_user=1) as app:
        url = rest_url(app)
        headers = {"Authorization": f"Bearer {app.alice}", "A2A-Version": "1.0"}
        body = {
            "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "/hang"}]},
            "configuration": {"returnImmediately": True},
        }
        first = httpx.post(f"{url}/message:send", json=body, headers=headers, timeout=10)
        assert first.status_code == 200, first.text
        try:
            refused = httpx.post(f"{url}/message:send", json=body, headers=headers, timeout=10)
            message = assert_rest_error(refused, 429, "RESOURCE_EXHAUSTED", "TOO_MANY_RUNNING_TASKS")
            assert "already has 1 delegated task" in message
            assert int(refused.headers["retry-after"]) >= 1
            streamed = httpx.post(f"{url}/message:stream", json=body, headers=headers, timeout=10)
            assert_rest_error(streamed, 429, "RESOURCE_EXHAUSTED", "TOO_MANY_RUNNING_TASKS")  # before any event
        finally:
            task_id = first.json()["task"]["id"]
            httpx.post(f"{url}/tasks/{task_id}:cancel", headers=headers, timeout=10)


ODD_BODIES = [
    b"",
    b"null",
    b"[]",
    b'"text"',
    b"1" * 5000,
    b'{"message": null}',
    b'{"message": []}',
    b'{"message": {"role": "user", "parts": [{"kind": "text", "text": "hi"}]}}',
    b'{"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}, "configuration": 5}',
    b'{"message": {"messageId": "m", "role": "ROLE_USER", "taskId": "nope", "parts": [{"text": "hi"}]}}',
]
ODD_GETS = [
    "tasks?historyLength=abc",
    "tasks?pageSize=-1",
    "tasks?status=BOGUS",
    "tasks/x?historyLength=-5",
    "tasks/%00",
]


def test_odd_input_never_gets_a_5xx(app: TwoUsers) -> None:
    url = rest_url(app)
    headers = {"Authorization": f"Bearer {app.alice}", "A2A-Version": "1.0", "Content-Type": "application/json"}
    with httpx.Client(headers=headers, timeout=10) as http:
        for body in ODD_BODIES:
            for path in ("message:send", "message:stream", "tasks/x:subscribe", "tasks/x/pushNotificationConfigs"):
                response = http.post(f"{url}/{path}", content=body)
                assert 400 <= response.status_code < 500, (path, body[:80], response.text)
                assert response.json()["error"]["message"]
        for path in ODD_GETS:
            response = http.get(f"{url}/{path}")
            assert response.status_code < 500, (path, response.text)


def test_a_raw_stream_is_the_apps_sse_with_one_stream_response_per_event(app: TwoUsers) -> None:
    """`POST …/message:stream`: the SSE core's headers; each `data:` a StreamResponse, without a JSON-RPC envelope."""
    body = {"message": {"role": "ROLE_USER", "messageId": "m-raw-rest", "parts": [{"text": "/lorem 20"}]}}
    headers = {"Authorization": f"Bearer {app.alice}", "A2A-Version": "1.0"}
    with httpx.stream("POST", f"{rest_url(app)}/message:stream", json=body, headers=headers, timeout=20) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert (response.headers["cache-control"], response.headers["x-accel-buffering"]) == ("no-cache", "no")
        raw = b"".join(response.iter_bytes())
    frames = [f for f in raw.decode().replace("\r\n", "\n").split("\n\n") if f.strip() and not f.startswith(":")]
    payloads = [
        json.loads("".join(line[5:].strip() for line in f.splitlines() if line.startswith("data:"))) for f in frames
    ]
    assert [next(iter(p)) for p in payloads[:1] + payloads[-2:]] == ["task", "artifactUpdate", "statusUpdate"]
    texts = [
        p["statusUpdate"]["status"].get("message", {}).get("parts", [{}])[0].get("text", "") for p in payloads[1:-2]
    ]
    assert "".join(texts) == lorem(20)
    assert payloads[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
