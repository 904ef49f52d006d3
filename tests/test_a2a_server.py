"""Standard A2A served by the app, driven over real HTTP by the official a2a-sdk client (issue 6).

Local agents run on the demo model, so what they answer is known exactly:
`/lorem N` is N words of lorem ipsum (`core/chat/demo_model.py`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from a2a.client import A2AClientError
from a2a.types import (
    CancelTaskRequest,
    GetExtendedAgentCardRequest,
    GetTaskRequest,
    Role,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError, UnsupportedOperationError

from core.a2a import protocol as wire
from core.chat.demo_model import plan_reply
from tests.utils.a2a_live import LiveApp, live_a2a_app, rpc, sdk_client, user_message


@pytest.fixture
def app(tmp_path: Path) -> Iterator[LiveApp]:
    """The app on a live port, demo model at 2 ms per token."""
    with live_a2a_app(tmp_path, demo_model_delay_ms=2) as live:
        yield live


def lorem(count: int) -> str:
    """Exactly what the demo model answers to `/lorem <count>`."""
    return "".join(plan_reply([{"role": "user", "content": f"/lorem {count}"}], tools=None).tokens)


def tokens(count: int) -> list[str]:
    """The demo model's tokens for `/lorem <count>`."""
    return plan_reply([{"role": "user", "content": f"/lorem {count}"}], tools=None).tokens


def kinds(events) -> list[str]:
    return [e.WhichOneof("payload") for e in events]


def status_texts(events) -> list[str]:
    return [
        "".join(p.text for p in e.status_update.status.message.parts)
        for e in events
        if e.WhichOneof("payload") == "status_update" and e.status_update.status.HasField("message")
    ]


# -- cards and keys ---------------------------------------------------------------------------


async def test_card_is_public_and_advertises_v1_and_v03_on_one_absolute_url(app: LiveApp) -> None:
    async with sdk_client(app.agent_url("coding-assistant"), key=None) as (_, card):
        assert card.name == "Coding Assistant"
        assert {(i.protocol_binding, i.protocol_version, i.url) for i in card.supported_interfaces} == {
            ("JSONRPC", "1.0", app.agent_url("coding-assistant")),
            ("JSONRPC", "0.3", app.agent_url("coding-assistant")),
            ("HTTP+JSON", "1.0", app.agent_url("coding-assistant") + "/rest"),
            ("HTTP+JSON", "0.3", app.agent_url("coding-assistant") + "/rest"),
        }
        assert card.capabilities.streaming and card.capabilities.extended_agent_card
        scheme = card.security_schemes["apiKey"].http_auth_security_scheme
        assert scheme.scheme == "bearer"
        assert [list(r.schemes) for r in card.security_requirements] == [["apiKey"]]
    card_url = f"{app.agent_url('coding-assistant')}/.well-known/agent-card.json"
    raw = httpx.get(card_url, headers={"A2A-Version": "1.0"}).json()
    assert "url" not in raw and raw["supportedInterfaces"][0]["protocolVersion"] == "1.0"  # strict v1.0
    unasked = httpx.get(card_url).json()  # what the resolver above read: a 0.3 client's card too
    assert (
        unasked["url"] == app.agent_url("coding-assistant")
        and unasked["supportedInterfaces"] == raw["supportedInterfaces"]
    )
    missing = httpx.get(f"{app.agent_url('nobody')}/.well-known/agent-card.json")
    assert missing.status_code == 404 and "nobody" in missing.json()["detail"]


async def test_jsonrpc_needs_a_valid_api_key_and_the_extended_card_too(app: LiveApp) -> None:
    url = app.agent_url("general-assistant")
    for key in (None, "a2ak_not-a-real-key", "garbage"):
        response = rpc(url, key, "GetTask", {"id": "x"})
        assert response.status_code == 401, key
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert "Authorization: Bearer" in response.json()["error"]["message"]
    async with sdk_client(url, key=None) as (client, _):
        with pytest.raises(A2AClientError, match="401"):
            await client.get_extended_agent_card(GetExtendedAgentCardRequest())
    async with sdk_client(url, key=app.key) as (client, _):
        extended = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
    assert "delegate" in [s.id for s in extended.skills]  # only key holders learn that it delegates

    revoked = httpx.get(f"{app.url}/api/a2a/keys").json()[0]
    assert "key" not in revoked and revoked["prefix"] == app.key[:12]
    assert httpx.delete(f"{app.url}/api/a2a/keys/{revoked['id']}").status_code == 204
    assert rpc(url, app.key, "GetTask", {"id": "x"}).status_code == 401


# -- sending ----------------------------------------------------------------------------------


async def test_streaming_send_gives_text_as_generated_then_the_artifact_then_completed(app: LiveApp) -> None:
    async with sdk_client(app.agent_url("coding-assistant"), app.key) as (client, _):
        events = [e async for e in client.send_message(user_message("/lorem 40"))]
    assert kinds(events)[0] == "task"
    assert kinds(events)[-2:] == ["artifact_update", "status_update"]
    texts = status_texts(events)
    # In pieces as generated: whole tokens, in order; the tokens that were ready together share an update.
    assert len(texts) > 1 and "".join(texts) == lorem(40)
    token_ends = set(itertools.accumulate(len(t) for t in tokens(40)))
    assert set(itertools.accumulate(len(t) for t in texts)) <= token_ends
    artifact = events[-2].artifact_update.artifact
    assert "".join(p.text for p in artifact.parts) == lorem(40)
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED

    # A delegation like any other: saved with source='a2a', in the local user's audit data.
    task_id = events[0].task.id
    [task] = [t for t in httpx.get(f"{app.url}/api/tasks").json() if t["id"] == task_id]
    assert (task["calleeAgentId"], task["callerAgentId"], task["callerSessionId"]) == ("coding-assistant", None, None)
    assert task["state"] == "completed" and task["input"] == "/lorem 40"
    detail = httpx.get(f"{app.url}/api/tasks/{task_id}").json()
    assert [(m["role"], m["source"]) for m in detail["messages"]] == [("user", "a2a"), ("assistant", "a2a")]
    assert detail["messages"][1]["content"] == lorem(40)


async def test_non_streaming_send_waits_for_the_end_and_get_task_reads_it_back(app: LiveApp) -> None:
    async with sdk_client(app.agent_url("coding-assistant"), app.key, streaming=False) as (client, _):
        [event] = [e async for e in client.send_message(user_message("/lorem 12"))]
        task = event.task
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert task.artifacts[0].parts[0].text == lorem(12)
        assert [m.role for m in task.history] == [Role.ROLE_USER, Role.ROLE_AGENT]
        again = await client.get_task(GetTaskRequest(id=task.id))
        assert again.status.state == TaskState.TASK_STATE_COMPLETED and again.artifacts == task.artifacts
        assert again.context_id == task.context_id
        assert list((await client.get_task(GetTaskRequest(id=task.id, history_length=0))).history) == []
        with pytest.raises(TaskNotFoundError, match="no task"):
            await client.get_task(GetTaskRequest(id="0" * 32))
    # Another agent's URL does not see the task either.
    response = rpc(app.agent_url("general-assistant"), app.key, "GetTask", {"id": task.id})
    assert response.json()["error"]["code"] == -32001
    listed = rpc(app.agent_url("coding-assistant"), app.key, "ListTasks", {"pageSize": 10}).json()["result"]
    assert [t["id"] for t in listed["tasks"]] == [task.id]
    assert rpc(app.agent_url("general-assistant"), app.key, "ListTasks", {}).json()["result"]["tasks"] == []


async def test_cancel_a_running_task_ends_its_stream_canceled(app: LiveApp) -> None:
    async with sdk_client(app.agent_url("coding-assistant"), app.key) as (client, _):
        stream = client.send_message(user_message("/lorem 5000"))
        first = await anext(stream)
        task_id = first.task.id
        seen = [first]
        async for event in stream:
            seen.append(event)
            if len(status_texts(seen)) >= 5:
                break
        canceled = await client.cancel_task(CancelTaskRequest(id=task_id))
        assert canceled.status.state == TaskState.TASK_STATE_CANCELED
        rest = [e async for e in stream]
        assert rest[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED
        assert (await client.get_task(GetTaskRequest(id=task_id))).status.state == TaskState.TASK_STATE_CANCELED
        with pytest.raises(TaskNotCancelableError, match="already TASK_STATE_CANCELED"):
            await client.cancel_task(CancelTaskRequest(id=task_id))


async def test_a_client_that_goes_away_mid_stream_does_not_stop_the_task(app: LiveApp) -> None:
    async with sdk_client(app.agent_url("coding-assistant"), app.key) as (client, _):
        stream = client.send_message(user_message("/lorem 400"))
        task_id = (await anext(stream)).task.id
        await anext(stream)
        await stream.aclose()
    async with sdk_client(app.agent_url("coding-assistant"), app.key) as (client, _):
        deadline = asyncio.get_running_loop().time() + 20
        task = await client.get_task(GetTaskRequest(id=task_id))
        while task.status.state != TaskState.TASK_STATE_COMPLETED:
            assert asyncio.get_running_loop().time() < deadline, task.status
            await asyncio.sleep(0.05)
            task = await client.get_task(GetTaskRequest(id=task_id))
    assert task.artifacts[0].parts[0].text == lorem(400)


async def test_subscribe_to_a_running_task_replays_and_follows_it_to_the_end(app: LiveApp) -> None:
    started = rpc(
        app.agent_url("coding-assistant"),
        app.key,
        "SendMessage",
        {
            "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "/lorem 300"}]},
            "configuration": {"returnImmediately": True},
        },
    ).json()["result"]["task"]
    assert started["status"]["state"] in {"TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"}
    await asyncio.sleep(0.1)  # it has streamed some already: the subscriber gets those too
    async with sdk_client(app.agent_url("coding-assistant"), app.key) as (client, _):
        events = [e async for e in client.subscribe(SubscribeToTaskRequest(id=started["id"]))]
        assert kinds(events)[0] == "task" and events[0].task.id == started["id"]
        assert "".join(status_texts(events)) == lorem(300)
        assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
        with pytest.raises(UnsupportedOperationError, match="terminal state: TASK_STATE_COMPLETED"):
            async for _ in client.subscribe(SubscribeToTaskRequest(id=started["id"])):
                pass


async def test_deltas_that_are_ready_together_go_out_as_one_status_update(app: LiveApp) -> None:
    # A subscriber that joins after 20 tokens gets those 20 at once: one update, not 20.
    async with sdk_client(app.agent_url("coding-assistant"), app.key) as (client, _):
        stream = client.send_message(user_message("/lorem 300"))
        seen = [await anext(stream)]
        while len(status_texts(seen)) < 20:
            seen.append(await anext(stream))
        joined = [e async for e in client.subscribe(SubscribeToTaskRequest(id=seen[0].task.id))]
        seen += [e async for e in stream]
    late = status_texts(joined)
    assert len(late[0]) >= len("".join(tokens(300)[:20])) and lorem(300).startswith(late[0])
    assert "".join(late) == lorem(300) and "".join(status_texts(seen)) == lorem(300)
    # Message ids stay unique within the task.
    ids = [
        e.status_update.status.message.message_id
        for e in joined
        if e.WhichOneof("payload") == "status_update" and e.status_update.status.HasField("message")
    ]
    assert len(set(ids)) == len(ids)


async def test_v03_client_through_the_compat_transport(app: LiveApp) -> None:
    sent: list[tuple[str, str]] = []
    async with sdk_client(
        app.agent_url("coding-assistant"),
        app.key,
        only_v03=True,
        on_request=lambda r: sent.append((r.headers.get("a2a-version"), json.loads(r.content)["method"])),
    ) as (client, _):
        events = [e async for e in client.send_message(user_message("/lorem 15"))]
        assert "".join(status_texts(events)) == lorem(15)
        assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
        task = await client.get_task(GetTaskRequest(id=events[0].task.id))
        assert task.artifacts[0].parts[0].text == lorem(15)
    assert sent == [("0.3", "message/stream"), ("0.3", "tasks/get")]


async def test_only_the_v03_stream_builds_its_tokens_as_protobuf(app: LiveApp, monkeypatch) -> None:
    """v1.0 streams write each token's update from plain values (Divergence #4); the v0.3 layer converts protobuf."""
    built: list[str] = []
    as_protobuf = wire.TaskEvents.text

    def counted(self, delta: str):
        built.append(delta)
        return as_protobuf(self, delta)

    monkeypatch.setattr(wire.TaskEvents, "text", counted)
    for only_v03 in (False, True):
        async with sdk_client(app.agent_url("coding-assistant"), app.key, only_v03=only_v03) as (client, _):
            events = [e async for e in client.send_message(user_message("/lorem 15"))]
        assert "".join(status_texts(events)) == lorem(15)
        assert "".join(built) == (lorem(15) if only_v03 else ""), only_v03


async def test_an_agent_added_at_run_time_is_served_at_once(app: LiveApp) -> None:
    created = httpx.post(f"{app.url}/api/agents", json={"id": "poet", "name": "Poet", "description": "Writes verse"})
    assert created.status_code == 201
    async with sdk_client(app.agent_url("poet"), app.key) as (client, card):
        assert card.name == "Poet" and card.description.startswith("Writes verse\n\nConversations: ")
        events = [e async for e in client.send_message(user_message("/lorem 5"))]
    assert events[-2].artifact_update.artifact.parts[0].text == lorem(5)


async def test_a_data_part_reaches_the_agent_with_its_json_types_and_the_card_says_it_takes_json(app: LiveApp) -> None:
    """`{"days": 3}` arrives as 3, not 3.0 (the wire's numbers are doubles); fractions stay fractions."""
    url = app.agent_url("coding-assistant")
    data = {"days": 3, "budget": -1200, "ratio": 0.5, "stops": [1, 2.5, {"n": 10}], "ok": True, "none": None}
    message = {"messageId": "m-data", "role": "ROLE_USER", "parts": [{"text": "Plan this"}, {"data": data}]}
    response = rpc(url, app.key, "SendMessage", {"message": message, "configuration": {"returnImmediately": False}})
    assert response.status_code == 200, response.text
    task = response.json()["result"]["task"]
    [asked] = [m for m in task["history"] if m["role"] == "ROLE_USER"]
    first, sent = "".join(p.get("text", "") for p in asked["parts"]).split("\n", 1)
    assert first == "Plan this"
    assert json.dumps(json.loads(sent), sort_keys=True) == json.dumps(data, sort_keys=True)  # 3 stays 3, not 3.0
    card = httpx.get(f"{url}/.well-known/agent-card.json", headers={"A2A-Version": "1.0"}).json()
    assert "application/json" in card["defaultInputModes"]
    # The demo model's agents answer `/data` with a data part and `/file x.png` with a PNG (issue 36).
    assert {"application/json", "image/png"} <= set(card["defaultOutputModes"])


# -- bad input ---------------------------------------------------------------------------------


async def test_bad_input_gets_the_a2a_error_codes_with_readable_messages(app: LiveApp) -> None:
    url = app.agent_url("coding-assistant")
    message = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}

    def error(response: httpx.Response) -> dict:
        assert response.status_code == 200, response.text
        return response.json()["error"]

    assert error(rpc(url, app.key, "GetTask", {"id": "x"}, version=None))["code"] == -32009  # no A2A-Version: 0.3
    assert "Expected version '1.0'" in error(rpc(url, app.key, "GetTask", {"id": "x"}, version="2.0"))["message"]
    assert error(rpc(url, app.key, "SendTheMessage"))["code"] == -32601
    assert error(rpc(url, app.key, "SendMessage", {}))["code"] == -32602  # no message
    bad_role = error(rpc(url, app.key, "SendMessage", {"message": {**message, "role": "user"}}))
    assert bad_role["code"] == -32602
    empty = error(rpc(url, app.key, "SendMessage", {"message": {**message, "parts": [{"text": "  "}]}}))
    assert empty["code"] == -32602
    assert empty["message"] == "The message has no text: send at least one non-empty text part."
    # Files are taken as uploads are (issue 36): a type UPLOAD_ALLOWED_TYPES does not list is refused.
    program = {"raw": "TVo=", "filename": "run.exe", "mediaType": "application/x-msdownload"}
    file_part = error(rpc(url, app.key, "SendMessage", {"message": {**message, "parts": [program]}}))
    assert file_part["code"] == -32005 and "application/x-msdownload" in file_part["message"]
    unknown = error(rpc(url, app.key, "GetTask", {"id": "nope"}))
    assert unknown["code"] == -32001 and "'nope'" in unknown["message"]
    assert error(rpc(url, app.key, "CancelTask", {"id": "nope"}))["code"] == -32001
    assert (  # push notifications are served (tests/test_a2a_push.py): a config of an unknown task is -32001
        error(
            rpc(url, app.key, "CreateTaskPushNotificationConfig", {"taskId": "x", "url": "https://example.com/hook"})
        )["code"]
        == -32001
    )

    headers = {"Authorization": f"Bearer {app.key}", "A2A-Version": "1.0", "Content-Type": "application/json"}
    parse = error(httpx.post(url, content=b'{"jsonrpc": "2.0", "method": ', headers=headers))
    assert parse["code"] == -32700
    big = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": {**message, "parts": [{"text": "x" * 1_100_000}]}},
    }
    too_large = error(httpx.post(url, content=json.dumps(big), headers=headers))
    assert too_large["code"] == -32600 and "Payload too large" in too_large["message"]

    done = rpc(url, app.key, "SendMessage", {"message": {**message, "parts": [{"text": "/lorem 3"}]}}).json()
    task_id = done["result"]["task"]["id"]
    not_cancelable = error(rpc(url, app.key, "CancelTask", {"id": task_id}))
    assert not_cancelable["code"] == -32002 and "already TASK_STATE_COMPLETED" in not_cancelable["message"]
    follow_up = error(rpc(url, app.key, "SendMessage", {"message": {**message, "taskId": task_id}}))
    assert follow_up["code"] == -32004 and "without taskId" in follow_up["message"]

    v03 = rpc(url, app.key, "tasks/get", {"id": "nope"}, version=None).json()["error"]
    assert v03["code"] == -32001  # the same URL answers v0.3 too


# -- the task store is the database -----------------------------------------------------------


async def test_tasks_are_read_from_the_database_after_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "kept"
    with live_a2a_app(tmp_path, data_dir=data, demo_model_delay_ms=0) as first:
        key = first.key
        async with sdk_client(first.agent_url("coding-assistant"), key) as (client, _):
            events = [e async for e in client.send_message(user_message("/lorem 8"))]
        task_id = events[0].task.id
        assert "".join(status_texts(events)) == lorem(8)
    with live_a2a_app(tmp_path, data_dir=data, demo_model_delay_ms=0) as second:
        async with sdk_client(second.agent_url("coding-assistant"), key) as (client, _):
            task = await client.get_task(GetTaskRequest(id=task_id))
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            assert task.artifacts[0].parts[0].text == lorem(8)
            assert [m.parts[0].text for m in task.history] == ["/lorem 8", lorem(8)]
            with pytest.raises(UnsupportedOperationError, match="terminal state"):
                async for _ in client.subscribe(SubscribeToTaskRequest(id=task_id)):
                    pass


def test_streams_are_served_through_the_apps_sse_module(app: LiveApp) -> None:
    """A raw `SendStreamingMessage`: the SSE core's headers, and every event a well-formed `data:` frame."""
    body = {
        "jsonrpc": "2.0",
        "id": "s1",
        "method": "SendStreamingMessage",
        "params": {"message": {"role": "ROLE_USER", "messageId": "m-raw-1", "parts": [{"text": "/lorem 20"}]}},
    }
    headers = {"Authorization": f"Bearer {app.key}", "A2A-Version": "1.0"}
    with httpx.stream("POST", app.agent_url("coding-assistant"), json=body, headers=headers, timeout=20) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        raw = b"".join(response.iter_bytes())
    frames = [f for f in raw.decode().replace("\r\n", "\n").split("\n\n") if f.strip() and not f.startswith(":")]
    assert len(frames) >= 20
    payloads = [
        json.loads("".join(line[5:].strip() for line in f.splitlines() if line.startswith("data:"))) for f in frames
    ]
    assert all(p.get("id") == "s1" and "result" in p for p in payloads)
