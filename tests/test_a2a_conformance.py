"""Issue 16: the A2A specification's rules a compliance run found broken, over real HTTP.

Each rule is checked with the official a2a-sdk client (v1.0, and v0.3 through its compat
transport where the method exists in v0.3) and, for every -32602 case, with a raw JSON-RPC
request. Two users (alice, bob) each have an API key, for the scoping rules.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from a2a.types import CancelTaskRequest, GetTaskRequest, ListTasksRequest, TaskState

from core.auth import accounts
from core.services import Services
from tests.conftest import make_settings
from tests.utils.a2a_live import build_a2a_app, rpc, sdk_client, user_message
from tests.utils.live_server import live_server
from tests.utils.ports import free_port
from tests.utils.sync import run_sync

ALICE, BOB = ("alice", "alice-password"), ("bob", "bob-password")


@dataclass(slots=True)
class TwoUsers:
    """A running app with accounts: alice's and bob's API keys."""

    url: str
    services: Services
    alice: str
    bob: str

    def agent_url(self, agent_id: str) -> str:
        """The agent's A2A base URL."""
        return f"{self.url}/a2a/agents/{agent_id}"


@contextmanager
def two_users(tmp_path: Path, **settings) -> Iterator[TwoUsers]:
    """The app on a free port with two accounts, each with an API key made through the API."""
    port = free_port()
    values = {"public_base_url": f"http://127.0.0.1:{port}", "port": port, "demo_model_delay_ms": 2, **settings}
    seed = Services.build(make_settings(tmp_path, **values))
    seed.db.migrate()

    async def create_users() -> None:
        async with seed.db.session() as s:
            for name, password in (ALICE, BOB):
                await accounts.create_user(s, username=name, password=password)
        await seed.db.close()

    run_sync(create_users())
    services = Services.build(make_settings(tmp_path, **values))
    services.prepare()
    with live_server(build_a2a_app(services), port=port) as url:
        keys = [
            httpx.post(f"{url}/api/a2a/keys", json={"name": "tests"}, auth=who, timeout=10).json()["key"]
            for who in (ALICE, BOB)
        ]
        yield TwoUsers(url=url, services=services, alice=keys[0], bob=keys[1])


@pytest.fixture
def app(tmp_path: Path) -> Iterator[TwoUsers]:
    """The app with alice and bob, demo model at 2 ms per token."""
    with two_users(tmp_path) as live:
        yield live


@pytest.fixture
def app_on_each_db(tmp_path: Path, database_url: str) -> Iterator[TwoUsers]:
    """The same on SQLite, then on PostgreSQL (the queries of ListTasks and contexts)."""
    with two_users(tmp_path, database_url=database_url) as live:
        yield live


def send(url: str, key: str, text: str, *, wait: bool = True, **message) -> dict:
    """A raw `SendMessage`; the task of its answer."""
    body = {
        "message": {"messageId": f"m-{time.monotonic_ns()}", "role": "ROLE_USER", "parts": [{"text": text}], **message}
    }
    if not wait:
        body["configuration"] = {"returnImmediately": True}
    response = httpx.post(
        url,
        json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": body},
        headers={"Authorization": f"Bearer {key}", "A2A-Version": "1.0"},
        timeout=60,
    )
    answer = response.json()
    assert "result" in answer, answer
    return answer["result"]["task"]


def error(response: httpx.Response) -> dict:
    """The JSON-RPC error of an answer (always HTTP 200)."""
    assert response.status_code == 200, response.text
    return response.json()["error"]


# -- ListTasks (§3.1.4) and GetTask's historyLength ----------------------------------------------


async def test_list_tasks_filters_sorts_by_last_update_counts_and_pages(app_on_each_db: TwoUsers) -> None:
    """contextId, status, statusTimestampAfter, includeArtifacts, totalSize, cursor pages, caller scope."""
    app = app_on_each_db
    url = app.agent_url("coding-assistant")
    slow = send(url, app.alice, "/lorem 1500", wait=False)  # created first, ends after `quick`
    quick = send(url, app.alice, "/lorem 2")
    running = send(url, app.alice, "/lorem 5000", wait=False)
    send(app.agent_url("planner"), app.alice, "/lorem 2")  # another agent: not listed here
    send(url, app.bob, "/lorem 2")  # another caller: not listed for alice

    async with sdk_client(url, app.alice) as (client, _):
        working = await client.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_WORKING))
        assert running["id"] in [t.id for t in working.tasks]
        assert all(t.status.state == TaskState.TASK_STATE_WORKING for t in working.tasks)
        await client.cancel_task(CancelTaskRequest(id=running["id"]))
        deadline = time.monotonic() + 30
        while (await client.get_task(GetTaskRequest(id=slow["id"]))).status.state != TaskState.TASK_STATE_COMPLETED:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)

        listed = await client.list_tasks(ListTasksRequest())
        assert {t.id for t in listed.tasks} == {slow["id"], running["id"], quick["id"]}
        times = [t.status.timestamp.ToDatetime() for t in listed.tasks]
        assert times == sorted(times, reverse=True)  # last update first...
        order = [t.id for t in listed.tasks]
        assert order.index(slow["id"]) < order.index(quick["id"])  # ...not creation
        assert (listed.total_size, listed.page_size, listed.next_page_token) == (3, 50, "")
        assert all(not t.artifacts for t in listed.tasks)  # includeArtifacts defaults to false
        with_artifacts = await client.list_tasks(ListTasksRequest(include_artifacts=True, history_length=0))
        [artifact] = [t for t in with_artifacts.tasks if t.id == quick["id"]][0].artifacts
        assert artifact.parts[0].text == "lorem ipsum"
        assert all(not t.history for t in with_artifacts.tasks)

        first = await client.list_tasks(ListTasksRequest(page_size=2))
        assert [t.id for t in first.tasks] == order[:2] and first.total_size == 3
        second = await client.list_tasks(ListTasksRequest(page_size=2, page_token=first.next_page_token))
        assert [t.id for t in second.tasks] == order[2:] and second.next_page_token == ""

        canceled = await client.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_CANCELED))
        assert [t.id for t in canceled.tasks] == [running["id"]] and canceled.total_size == 1
        in_context = await client.list_tasks(ListTasksRequest(context_id=quick["contextId"]))
        assert [t.id for t in in_context.tasks] == [quick["id"]]
        request = ListTasksRequest()
        request.status_timestamp_after.FromJsonString(listed.tasks[0].status.timestamp.ToJsonString())
        assert [t.id for t in (await client.list_tasks(request)).tasks] == order[:1]  # at or after

    raw = rpc(url, app.alice, "ListTasks", {"statusTimestampAfter": "2099-01-01T00:00:00Z"}).json()["result"]
    assert raw == {"tasks": [], "nextPageToken": "", "pageSize": 50, "totalSize": 0}  # REQUIRED fields, always
    bobs = rpc(url, app.bob, "ListTasks", {}).json()["result"]
    assert bobs["totalSize"] == 1 and slow["id"] not in json.dumps(bobs)


def test_out_of_range_list_and_get_parameters_are_invalid_params(app: TwoUsers) -> None:
    """A pageSize outside 1-100, a negative historyLength, a foreign pageToken, an unknown status: -32602."""
    url = app.agent_url("coding-assistant")
    task = send(url, app.alice, "/lorem 2")
    cases = [
        ("ListTasks", {"pageSize": -1}, "pageSize must be between 1 and 100 (got -1)"),
        ("ListTasks", {"pageSize": 0}, "pageSize must be between 1 and 100 (got 0)"),
        ("ListTasks", {"pageSize": 101}, "pageSize must be between 1 and 100 (got 101)"),
        ("ListTasks", {"historyLength": -1}, "historyLength must be 0 or more (got -1)"),
        ("ListTasks", {"pageToken": "garbage"}, "is not one this server handed out"),
        ("ListTasks", {"pageToken": "-1"}, "is not one this server handed out"),
        ("ListTasks", {"status": "DONE"}, "'DONE' is not a task state"),
        (
            "ListTasks",
            {"statusTimestampAfter": "yesterday"},
            "Invalid params for ListTasks: Failed to parse statusTimestampAfter field",
        ),
        ("ListTasks", {"pageSize": "many"}, "Invalid params for ListTasks: Failed to parse pageSize field"),
        ("GetTask", {"id": {"nested": 1}}, "Invalid params for GetTask: Failed to parse id field"),
        (
            "SendMessage",
            {"message": {"messageId": "m", "role": "ROLE_USER", "parts": "hi"}},
            "Invalid params for SendMessage: Failed to parse message field",
        ),
        ("GetTask", {"id": task["id"], "historyLength": -1}, "historyLength must be 0 or more (got -1)"),
        ("GetTask", {"id": "unknown", "historyLength": -3}, "historyLength must be 0 or more (got -3)"),
        (
            "SendMessage",
            {
                "message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]},
                "configuration": {"historyLength": -1},
            },
            "historyLength must be 0 or more",
        ),
    ]
    for method, params, says in cases:
        answer = error(rpc(url, app.alice, method, params))
        assert (answer["code"], says in answer["message"]) == (-32602, True), (method, params, answer)
    assert len(rpc(url, app.alice, "ListTasks", {"pageSize": 100}).json()["result"]["tasks"]) == 1
    assert (
        rpc(url, app.alice, "GetTask", {"id": task["id"], "historyLength": 1}).json()["result"]["history"][0]["role"]
        == "ROLE_AGENT"
    )


# -- v0.3 invalid params: -32602, not the compat layer's -32600 ---------------------------------


async def test_v03_invalid_params_answer_32602_and_the_v03_client_still_works(app: TwoUsers) -> None:
    """JSON-RPC 2.0 §5.1 on the v0.3 methods, corrected in front of the SDK's compat layer."""
    url = app.agent_url("coding-assistant")
    cases = [
        ("tasks/get", {}, "params.id: Field required"),
        ("tasks/get", {"id": 5}, "params.id: Input should be a valid string"),
        ("tasks/get", {"id": "x", "historyLength": -1}, "historyLength must be 0 or more"),
        ("tasks/cancel", {"taskId": "x"}, "params.id: Field required"),
        ("tasks/resubscribe", {}, "params.id: Field required"),
        ("message/send", {"message": {"role": "user"}}, "params.message.messageId: Field required"),
        (
            "message/stream",
            {"message": {"role": "robot", "parts": [], "messageId": "m", "kind": "message"}},
            "params.message.role",
        ),
    ]
    for method, params, says in cases:
        answer = error(rpc(url, app.alice, method, params, version=None))
        assert answer["code"] == -32602 and says in answer["message"], (method, answer)
    envelope = error(
        httpx.post(
            url,
            json={"jsonrpc": "1.0", "id": 1, "method": "tasks/get", "params": {"id": "x"}},
            headers={"Authorization": f"Bearer {app.alice}"},
            timeout=10,
        )
    )
    assert envelope["code"] == -32600  # a bad envelope is still an invalid request

    async with sdk_client(url, app.alice, only_v03=True) as (client, _):
        events = [e async for e in client.send_message(user_message("/lorem 3"))]
        assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
        task = await client.get_task(GetTaskRequest(id=events[0].task.id, history_length=1))
        assert len(task.history) == 1


# -- the card: strict v1.0 when asked, v0.3 when asked, and one both read when nothing is asked -------


async def test_the_card_is_strict_v1_or_v03_as_asked_and_both_stock_resolvers_read_it_unasked(app: TwoUsers) -> None:
    """`A2A-Version: 1.0` gets strict ProtoJSON, `0.3` the v0.3 card; no header (§3.6.2: 0.3) a card both read.

    Neither stock resolver sends a version: the 0.3.x SDK's model reads the header-less card (with `url`),
    and the 1.x resolver (`parse_agent_card`) finds the v1.0 interface first in it.
    """
    from a2a.client.card_resolver import parse_agent_card
    from a2a.compat.v0_3.types import AgentCard as AgentCardV03
    from a2a.types import AgentCard
    from google.protobuf.json_format import Parse

    agent = app.agent_url("coding-assistant")
    card_url = f"{agent}/.well-known/agent-card.json"
    response = httpx.get(card_url, timeout=10, headers={"A2A-Version": "1.0"})
    strict = Parse(response.text, AgentCard(), ignore_unknown_fields=False)  # raises on any v0.3 field
    assert strict.name == "Coding Assistant" and response.headers["vary"] == "A2A-Version"
    assert {"url", "protocolVersion", "preferredTransport", "security"}.isdisjoint(response.json())
    assert "type" not in response.json()["securitySchemes"]["apiKey"]

    for asked in ({"headers": {"A2A-Version": "0.3"}}, {"params": {"A2A-Version": "0.3"}}):
        legacy = httpx.get(card_url, timeout=10, **asked).json()
        card03 = AgentCardV03.model_validate(legacy)  # the 0.3.x SDK client's own model
        assert (card03.url, card03.protocol_version, card03.preferred_transport) == (agent, "0.3", "JSONRPC")
        assert legacy["securitySchemes"]["apiKey"]["type"] == "http" and "supportedInterfaces" not in legacy

    unasked = httpx.get(card_url, timeout=10)
    card03 = AgentCardV03.model_validate(unasked.json())
    assert (card03.url, card03.protocol_version) == (agent, "0.3")
    card10 = parse_agent_card(unasked.json())
    assert [(i.url, i.protocol_version) for i in card10.supported_interfaces] == [
        (agent, "1.0"),
        (agent, "0.3"),
        (f"{agent}/rest", "1.0"),
        (f"{agent}/rest", "0.3"),
    ]
    assert card10.security_requirements and card10.security_schemes["apiKey"].http_auth_security_scheme.scheme
    etags = {httpx.get(card_url, timeout=10, headers=h).headers["etag"] for h in ({}, {"A2A-Version": "0.3"})}
    assert len(etags | {response.headers["etag"]}) == 3  # three documents, three validators

    root = httpx.get(f"{app.url}/.well-known/agent-card.json", timeout=10, headers={"A2A-Version": "1.0"})
    assert root.status_code == 200
    root_card = Parse(root.text, AgentCard(), ignore_unknown_fields=False)
    assert root_card.name == "General Assistant"
    general = app.agent_url("general-assistant")
    assert [i.url for i in root_card.supported_interfaces] == [general, general, f"{general}/rest", f"{general}/rest"]
    async with sdk_client(app.url, app.alice) as (client, card):  # a generic client given the server's root
        assert card.name == "General Assistant"
        events = [e async for e in client.send_message(user_message("/lorem 2"))]
        assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


def test_the_root_card_follows_default_agent(tmp_path: Path) -> None:
    """`DEFAULT_AGENT` chooses which agent's card is at the server root."""
    with two_users(tmp_path, default_agent="planner") as app:
        assert httpx.get(f"{app.url}/.well-known/agent-card.json", timeout=10).json()["name"] == "Planner"


# -- contextId (§3.4.1, §3.4.2): multi-turn conversations, never a silently new context ------------


async def test_a_second_message_in_a_context_is_a_new_task_that_sees_the_first_exchange(
    app_on_each_db: TwoUsers,
) -> None:
    """Two turns through one contextId with the 1.x client: the second answer quotes the first exchange."""
    app = app_on_each_db
    url = app.agent_url("coding-assistant")
    async with sdk_client(url, app.alice, streaming=False) as (client, _):
        [first] = [e.task async for e in client.send_message(user_message("my name is Ada"))]
        second_request = user_message("/history")
        second_request.message.context_id = first.context_id
        [second] = [e.task async for e in client.send_message(second_request)]
    assert second.context_id == first.context_id and second.id != first.id
    answer = second.artifacts[0].parts[0].text
    assert answer.startswith("Earlier in our conversation:\n\n- you: my name is Ada\n- me: You wrote 4 words: > my")
    assert [m.parts[0].text for m in second.history] == ["/history", answer]  # the task's own exchange

    # The same through the v0.3 compat transport, streaming: a third turn sees both earlier ones.
    async with sdk_client(url, app.alice, only_v03=True) as (client, _):
        third_request = user_message("/history")
        third_request.message.context_id = first.context_id
        events = [e async for e in client.send_message(third_request)]
    assert {e.task.context_id for e in events if e.WhichOneof("payload") == "task"} == {first.context_id}
    third = events[-2].artifact_update.artifact.parts[0].text
    assert [line for line in third.splitlines() if line.startswith("- you: ")] == [
        "- you: my name is Ada",
        "- you: /history",
    ]
    listed = rpc(url, app.alice, "ListTasks", {"contextId": first.context_id}).json()["result"]
    assert listed["totalSize"] == 3


def test_an_unknown_or_foreign_context_is_refused_never_replaced(app: TwoUsers) -> None:
    """Unknown, another caller's, another agent's contextId: the same -32602; a mismatching taskId too."""
    url = app.agent_url("coding-assistant")
    alices = send(url, app.alice, "hello")
    other_agent = send(app.agent_url("planner"), app.alice, "hello")
    refusals = [
        (app.alice, "as_000000000000000000000000"),
        (app.alice, "a-context-id-the-client-made-up"),
        (app.bob, alices["contextId"]),  # another caller's: the same answer as unknown
        (app.alice, other_agent["contextId"]),  # another agent's conversation
    ]
    for key, context_id in refusals:
        for method in ("SendMessage", "SendStreamingMessage"):
            answer = error(
                rpc(
                    url,
                    key,
                    method,
                    {
                        "message": {
                            "messageId": "m1",
                            "role": "ROLE_USER",
                            "parts": [{"text": "hi"}],
                            "contextId": context_id,
                        }
                    },
                )
            )
            assert answer["code"] == -32602, answer
            assert answer["message"] == (
                f"There is no context {context_id!r} for this agent and key: send the contextId of one of your "
                "earlier tasks with this agent to continue that conversation, or none to start a new one."
            )
    assert rpc(url, app.bob, "ListTasks", {}).json()["result"]["totalSize"] == 0  # nothing was started

    mismatch = error(
        rpc(
            url,
            app.alice,
            "SendMessage",
            {
                "message": {
                    "messageId": "m2",
                    "role": "ROLE_USER",
                    "parts": [{"text": "hi"}],
                    "taskId": alices["id"],
                    "contextId": other_agent["contextId"],
                }
            },
        )
    )
    assert mismatch["code"] == -32602 and f"belongs to context {alices['contextId']!r}" in mismatch["message"]
    v03 = error(
        rpc(
            url,
            app.alice,
            "message/send",
            {
                "message": {
                    "kind": "message",
                    "messageId": "m3",
                    "role": "user",
                    "parts": [{"kind": "text", "text": "hi"}],
                    "contextId": "unknown-context",
                }
            },
            version=None,
        )
    )
    assert v03["code"] == -32602 and "There is no context 'unknown-context'" in v03["message"]

    card = httpx.get(f"{url}/.well-known/agent-card.json", timeout=10).json()
    assert "an unknown contextId is refused (-32602)" in card["description"]


async def test_the_sdk_clients_see_the_context_refusal_as_invalid_params(app: TwoUsers) -> None:
    """The 1.x client and the v0.3 compat transport both raise the SDK's InvalidParamsError, with the message."""
    from a2a.utils.errors import InvalidParamsError

    for only_v03 in (False, True):
        async with sdk_client(app.agent_url("coding-assistant"), app.bob, only_v03=only_v03) as (client, _):
            request = user_message("hi")
            request.message.context_id = "not-a-context-of-bobs"
            with pytest.raises(InvalidParamsError, match="There is no context 'not-a-context-of-bobs'"):
                async for _ in client.send_message(request):
                    pass


def test_a_context_with_a_running_task_takes_no_second_message(app: TwoUsers) -> None:
    """One task at a time per context: the next message waits for the running one's end."""
    url = app.agent_url("coding-assistant")
    running = send(url, app.alice, "/lorem 5000", wait=False)
    busy = error(
        rpc(
            url,
            app.alice,
            "SendMessage",
            {
                "message": {
                    "messageId": "m1",
                    "role": "ROLE_USER",
                    "parts": [{"text": "hi"}],
                    "contextId": running["contextId"],
                }
            },
        )
    )
    assert busy["code"] == -32004 and f"Task {running['id']}" in busy["message"]
    assert "result" in rpc(url, app.alice, "CancelTask", {"id": running["id"]}).json()
    assert send(url, app.alice, "again", contextId=running["contextId"])["contextId"] == running["contextId"]


# -- the client's messageId is kept ------------------------------------------------------------


async def test_the_clients_message_id_is_kept_in_the_tasks_history(app: TwoUsers) -> None:
    """SendMessage, SendStreamingMessage, GetTask, ListTasks, v0.3: the history shows the client's messageId."""
    url = app.agent_url("coding-assistant")
    async with sdk_client(url, app.alice) as (client, _):
        request = user_message("/lorem 3")
        request.message.message_id = "client-message-0001"
        events = [e async for e in client.send_message(request)]
        assert events[0].task.history[0].message_id == "client-message-0001"
        task = await client.get_task(GetTaskRequest(id=events[0].task.id))
        assert task.history[0].message_id == "client-message-0001"
    assert (
        rpc(url, app.alice, "ListTasks", {}).json()["result"]["tasks"][0]["history"][0]["messageId"]
        == "client-message-0001"
    )
    v03 = rpc(
        url,
        app.alice,
        "message/send",
        {
            "message": {
                "kind": "message",
                "messageId": "v03-message-id",
                "role": "user",
                "parts": [{"kind": "text", "text": "/lorem 2"}],
            }
        },
        version=None,
    ).json()["result"]
    assert v03["history"][0]["messageId"] == "v03-message-id"
    async with sdk_client(url, app.alice, only_v03=True) as (client, _):
        request = user_message("/lorem 2")
        request.message.message_id = "compat-client-message"
        events = [e async for e in client.send_message(request)]
        task = await client.get_task(GetTaskRequest(id=events[0].task.id))
    assert events[0].task.history[0].message_id == task.history[0].message_id == "compat-client-message"
    too_long = error(
        rpc(
            url,
            app.alice,
            "SendMessage",
            {"message": {"messageId": "m" * 256, "role": "ROLE_USER", "parts": [{"text": "hi"}]}},
        )
    )
    assert too_long["code"] == -32602 and "messageId is 256 characters long; the limit is 255" in too_long["message"]
