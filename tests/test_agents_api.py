"""`/api/agents` over real HTTP (issue 15): every route and rule, on SQLite and PostgreSQL.

Also: who may change agents (admins; `local` in single-user mode), a deleted agent's chats and
audit records, an edit applying to the next turn and never to a running one, and an agent's own
`apiBase`/`apiKey` used through LiteLLM (the OpenAI-compatible test server sees the agent's key).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlmodel import select

from core import cli
from core.chat import sessions as sessions_store
from core.delegation.agent_admin import AgentRuleError
from core.delegation.tool import InvokeLimits
from core.services import Services
from models import A2ATaskSession, Agent
from tests.conftest import make_settings
from tests.test_api import build_api_app, stream_events
from tests.test_delegation_api import kind
from tests.utils.accounts import ALICE, BOB, seed_accounts
from tests.utils.live_server import live_server
from tests.utils.openai_server import openai_server, text, tool_call  # noqa: F401  (fixture)


@pytest.fixture
def api(tmp_path: Path, database_url: str) -> Iterator[tuple[str, Services]]:
    """A live API server in single-user mode: `local` is the admin; agents' model servers may be on this machine."""
    services = Services.build(
        make_settings(tmp_path, database_url=database_url, demo_model_delay_ms=2, outbound_allow_hosts=["127.0.0.1"])
    )
    services.prepare()
    with live_server(build_api_app(services)) as url:
        yield url, services


@pytest.fixture
def accounts_api(tmp_path: Path, database_url: str) -> Iterator[tuple[str, Services]]:
    """A live API server with alice (the first account: admin) and bob (not an admin)."""
    seed_accounts(tmp_path, database_url)
    services = Services.build(make_settings(tmp_path, database_url=database_url))
    services.prepare()
    with live_server(build_api_app(services)) as url:
        yield url, services


async def chat(client: httpx.AsyncClient, agent_id: str, content: str, session_id: str | None = None) -> dict:
    """Send a message (in a new chat unless given) and wait for the turn's end; returns session and events."""
    if session_id is None:
        session_id = (await client.post("/api/sessions", json={"agentId": agent_id})).json()["id"]
    posted = await client.post(f"/api/sessions/{session_id}/messages", json={"content": content})
    assert posted.status_code == 202, posted.text
    _, events = await stream_events(client, posted.json()["streamUrl"])
    return {"sessionId": session_id, "events": events}


def field_error(response: httpx.Response) -> tuple[list, str]:
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    return error["loc"], error["msg"]


async def test_read_agents_lists_every_agent_with_its_kind_and_tools(api) -> None:
    url, _ = api
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:  # the first model check imports LiteLLM
        agents = {a["id"]: a for a in (await client.get("/api/agents")).json()}
        assert {"general-assistant", "coding-assistant", "planner"} <= set(agents)
        planner = agents["planner"]
        assert planner["kind"] == "local" and planner["online"] is None and planner["model"] == "local/demo"
        assert planner["description"].startswith("Breaks a job into steps") and planner["canDelegate"] is True
        one = (await client.get("/api/agents/planner")).json()
        [invoke] = one["tools"]
        assert invoke == {
            "type": "agent-invoke",
            "config": {"maxRecursionDepth": 3, "timeoutMs": 120000, "maxOutputTokens": 4096, "allowedAgents": None},
        }
        assert one["hasApiKey"] is False and "apiKey" not in one
        missing = await client.get("/api/agents/nobody")
        assert missing.status_code == 404 and "nobody" in missing.json()["detail"]


async def test_create_read_update_delete_an_agent(api) -> None:
    url, services = api
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:  # the first model check imports LiteLLM
        created = await client.post(
            "/api/agents",
            json={
                "id": "reviewer",
                "name": "Reviewer",
                "description": "Reviews code",
                "systemPrompt": "Review.",
                "model": "openai/gpt-4o-mini",
                "apiKey": "sk-secret-1",
                "temperature": 0.2,
                "maxOutputTokens": 300,
                "tools": [
                    {"type": "agent-invoke", "config": {"maxRecursionDepth": 2, "allowedAgents": ["coding-assistant"]}},
                    {"type": "a2a-dispatch"},
                ],
            },
        )
        assert created.status_code == 201, created.text
        body = created.json()
        assert body["hasApiKey"] is True and "sk-secret-1" not in created.text
        assert body["temperature"] == 0.2 and body["maxOutputTokens"] == 300 and body["kind"] == "local"
        assert {t["type"]: t["config"] for t in body["tools"]} == {
            "a2a-dispatch": {},
            "agent-invoke": {
                "maxRecursionDepth": 2,
                "timeoutMs": 120000,
                "maxOutputTokens": 4096,
                "allowedAgents": ["coding-assistant"],
            },
        }
        async with services.db.session() as s:
            row = (await s.exec(select(Agent).where(Agent.slug == "reviewer"))).one()
        assert row.api_key.startswith("fernet:") and "sk-secret-1" not in row.api_key  # encrypted at rest

        patched = await client.patch("/api/agents/reviewer", json={"description": "Reviews code, kindly"})
        assert patched.status_code == 200
        assert patched.json()["description"] == "Reviews code, kindly"
        assert patched.json()["systemPrompt"] == "Review." and patched.json()["hasApiKey"] is True  # the rest stays
        cleared = await client.patch("/api/agents/reviewer", json={"apiKey": None, "tools": [], "id": "reviewer"})
        assert cleared.json()["hasApiKey"] is False and cleared.json()["tools"] == []
        assert cleared.json()["canDelegate"] is False

        await client.patch(
            "/api/agents/planner",
            json={"tools": [{"type": "agent-invoke", "config": {"allowedAgents": ["reviewer", "coding-assistant"]}}]},
        )
        deleted = await client.delete("/api/agents/reviewer")
        assert deleted.status_code == 200
        assert deleted.json() == {"id": "reviewer", "deleted": True, "removedFromAllowedAgents": ["planner"]}
        assert (await client.get("/api/agents/reviewer")).status_code == 404
        assert "reviewer" not in {a["id"] for a in (await client.get("/api/agents")).json()}
        planner = (await client.get("/api/agents/planner")).json()
        assert planner["tools"][0]["config"]["allowedAgents"] == ["coding-assistant"]
        assert (await client.delete("/api/agents/reviewer")).status_code == 404
        assert (await client.patch("/api/agents/reviewer", json={"name": "x"})).status_code == 404


async def test_can_delegate_stays_a_short_form(api) -> None:
    url, _ = api
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:  # the first model check imports LiteLLM
        created = await client.post(
            "/api/agents",
            json={"id": "architect", "name": "Architect", "canDelegate": True, "delegation": {"timeoutMs": 5000}},
        )
        assert created.status_code == 201
        [tool] = created.json()["tools"]
        assert tool["type"] == "agent-invoke" and tool["config"]["timeoutMs"] == 5000


INVOKE_MAXIMA = {"maxRecursionDepth": 20, "timeoutMs": 3_600_000, "maxOutputTokens": 1_000_000}  # as documented


@pytest.mark.parametrize(
    ("name", "too_large"),
    [("timeoutMs", 10**12), ("timeoutMs", 3_600_001), ("maxOutputTokens", 10**7), ("maxRecursionDepth", 21)],
)
async def test_each_agent_invoke_limit_has_a_maximum(api, name: str, too_large: int) -> None:
    """Over the API (POST, PATCH, `delegation`) and through `AgentAdmin` (the page's way): 422 on its loc."""
    url, services = api
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:  # the first model check imports LiteLLM
        created = await client.post(
            "/api/agents",
            json={
                "id": "limits",
                "name": "L",
                "tools": [{"type": "agent-invoke", "config": {name: INVOKE_MAXIMA[name]}}],
            },
        )
        assert created.status_code == 201, created.text
        assert created.json()["tools"][0]["config"][name] == INVOKE_MAXIMA[name]
        config = {"tools": [{"type": "a2a-dispatch"}, {"type": "agent-invoke", "config": {name: too_large}}]}
        loc, msg = field_error(await client.post("/api/agents", json={"id": "over", "name": "O", **config}))
        assert loc == ["body", "tools", 1, "config", name] and f"{INVOKE_MAXIMA[name]}" in msg
        loc, _ = field_error(await client.patch("/api/agents/limits", json=config))
        assert loc == ["body", "tools", 1, "config", name]
        loc, _ = field_error(
            await client.post(
                "/api/agents", json={"id": "over", "name": "O", "canDelegate": True, "delegation": {name: too_large}}
            )
        )
        assert loc == ["body", "delegation", name]
        assert (await client.get("/api/agents/over")).status_code == 404
        assert (await client.get("/api/agents/limits")).json()["tools"][0]["config"][name] == INVOKE_MAXIMA[name]
    with pytest.raises(AgentRuleError) as refused:
        await services.agent_admin.update("limits", {"tools": config["tools"]})
    assert refused.value.loc == ("tools", 1, "config", name)
    assert str(refused.value) == f"{name} is a whole number from 1 to {INVOKE_MAXIMA[name]}."
    # A config saved before the maxima is read as the maximum.
    assert InvokeLimits.from_config(
        {"timeoutMs": 10**12, "maxOutputTokens": 10**9, "maxRecursionDepth": 99}
    ) == InvokeLimits(max_recursion_depth=20, timeout_s=3600.0, max_output_tokens=1_000_000, allowed_agents=None)


async def test_the_rules_answer_with_clear_errors(api) -> None:
    url, services = api
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:  # the first model check imports LiteLLM
        base = {"name": "X"}
        assert field_error(await client.post("/api/agents", json={**base, "id": "Bad Id"}))[0] == ["body", "id"]
        taken = await client.post("/api/agents", json={**base, "id": "planner"})
        assert taken.status_code == 409 and "already exists" in taken.json()["detail"]

        class Remote:
            id, name, description, kind = "weather", "Weather", "", "ws"

            def visible_to(self, agent_id) -> bool:
                return True

        await services.registry.claim(Remote())
        remote = await client.post("/api/agents", json={**base, "id": "weather"})
        assert remote.status_code == 409 and "broker agent" in remote.json()["detail"]

        loc, msg = field_error(
            await client.post(
                "/api/agents",
                json={
                    **base,
                    "id": "x1",
                    "tools": [{"type": "agent-invoke", "config": {"allowedAgents": ["coding-assistant", "ghost"]}}],
                },
            )
        )
        assert loc == ["body", "tools", 0, "config", "allowedAgents"] and "ghost" in msg
        loc, msg = field_error(
            await client.post(
                "/api/agents",
                json={
                    **base,
                    "id": "x2",
                    "tools": [{"type": "a2a-dispatch"}, {"type": "agent-invoke", "config": {"allowedAgents": ["x2"]}}],
                },
            )
        )
        assert loc == ["body", "tools", 1, "config", "allowedAgents"] and "itself" in msg
        remote_callee = await client.post(
            "/api/agents",
            json={**base, "id": "x3", "tools": [{"type": "agent-invoke", "config": {"allowedAgents": ["weather"]}}]},
        )
        assert remote_callee.status_code == 201  # remote agents count

        loc, msg = field_error(await client.post("/api/agents", json={**base, "id": "x4", "model": "no-such-model"}))
        assert loc == ["body", "model"] and "LiteLLM does not know the model 'no-such-model'" in msg
        with_base = await client.post(
            "/api/agents", json={**base, "id": "x5", "model": "no-such-model", "apiBase": "http://127.0.0.1:9/v1"}
        )
        assert with_base.status_code == 201 and with_base.json()["apiBase"] == "http://127.0.0.1:9/v1"
        loc, _ = field_error(await client.patch("/api/agents/x5", json={"apiBase": None}))
        assert loc == ["body", "model"]  # without its base URL the model is unknown again
        assert (await client.post("/api/agents", json={**base, "id": "x6", "model": "gpt-4o-mini"})).status_code == 201
        loc, _ = field_error(await client.post("/api/agents", json={**base, "id": "x7", "apiBase": "ftp://x"}))
        assert loc == ["body", "apiBase"]

        loc, msg = field_error(await client.patch("/api/agents/x5", json={"id": "renamed"}))
        assert loc == ["body", "id"] and "cannot be changed" in msg
        unknown = field_error(await client.patch("/api/agents/x5", json={"prompt": "x"}))
        assert unknown[0] == ["body", "prompt"]
        loc, _ = field_error(
            await client.patch("/api/agents/x5", json={"tools": [{"type": "agent-invoke", "config": {"depth": 1}}]})
        )
        assert loc == ["body", "tools", 0, "config", "depth"]
        loc, _ = field_error(await client.patch("/api/agents/x5", json={"tools": [{"type": "web-search"}]}))
        assert loc[:3] == ["body", "tools", 0]
        loc, _ = field_error(await client.patch("/api/agents/x5", json={"temperature": 3}))
        assert loc == ["body", "temperature"]

        assert (await client.delete("/api/agents/x3")).status_code == 200
        reused = await client.post("/api/agents", json={**base, "id": "x3"})
        assert reused.status_code == 409 and "deleted agent" in reused.json()["detail"]


async def test_an_agent_with_running_tasks_cannot_be_deleted(api) -> None:
    url, services = api
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:  # the first model check imports LiteLLM
        await client.post("/api/agents", json={"id": "busy", "name": "Busy"})
        async with services.db.session() as s:
            agent = (await s.exec(select(Agent).where(Agent.slug == "busy"))).one()
            session = await sessions_store.create_session(s, user_id=services.auth.local_user_id, agent_id=agent.id)
            s.add(
                A2ATaskSession(
                    id="task-running-1",
                    session_id=session.id,
                    callee_agent_id=agent.id,
                    callee_agent_slug="busy",
                    state="working",
                )
            )
            await s.commit()
        refused = await client.delete("/api/agents/busy")
        assert refused.status_code == 409 and "task-running-1" in refused.json()["detail"]
        assert (await client.get("/api/agents/busy")).status_code == 200


async def test_an_agent_answering_in_a_chat_cannot_be_deleted(api) -> None:
    """Issue 34: deleting the agent of a running turn is refused (409 `agent_conflict`) until the turn ends."""
    url, services = api
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:  # the first model check imports LiteLLM
        await client.post("/api/agents", json={"id": "busy", "name": "Busy"})
        sid = (await client.post("/api/sessions", json={"agentId": "busy"})).json()["id"]
        assert (await client.post(f"/api/sessions/{sid}/messages", json={"content": "/hang"})).status_code == 202
        try:
            refused = await client.delete("/api/agents/busy")
            assert refused.status_code == 409  # `agent_conflict` (core/delegation/agent_routes.py)
            assert "Busy is answering in chats right now (running answers: 1)" in refused.json()["detail"]
            assert (await client.get("/api/agents/busy")).status_code == 200
            assert services.chat.is_running(sid)
        finally:
            assert (await client.post(f"/api/sessions/{sid}/stop")).json() == {"stopped": True}
        assert (await client.delete("/api/agents/busy")).status_code == 200


async def test_a_deleted_agents_chats_and_audit_records_stay_readable(api) -> None:
    url, _ = api
    async with httpx.AsyncClient(base_url=url, timeout=20) as client:
        await client.post("/api/agents", json={"id": "helper", "name": "Helper"})
        own = await chat(client, "helper", "hello there")
        delegated = await chat(client, "general-assistant", "@helper say hi")
        assert any(kind(e) == "a2a-task-started" for e in delegated["events"])
        assert (await client.delete("/api/agents/helper")).status_code == 200

        session = (await client.get(f"/api/sessions/{own['sessionId']}")).json()
        assert session["agentDeleted"] is True and session["agentId"] == "helper"
        messages = (await client.get(f"/api/sessions/{own['sessionId']}/messages")).json()
        assert [m["role"] for m in messages] == ["user", "assistant"]
        refused = await client.post(f"/api/sessions/{own['sessionId']}/messages", json={"content": "again"})
        assert refused.status_code == 404 and "deleted" in refused.json()["detail"]
        [task] = (await client.get("/api/tasks")).json()
        assert task["calleeAgentId"] == "helper" and task["calleeAgentName"] == "Helper (agent deleted)"
        assert (await client.get(f"/api/tasks/{task['id']}")).status_code == 200
        assert (await client.get(f"/api/sessions/{delegated['sessionId']}")).json()["agentDeleted"] is False


async def test_only_admins_change_agents_and_everyone_uses_them(accounts_api) -> None:
    url, services = accounts_api
    async with (
        httpx.AsyncClient(base_url=url, auth=ALICE, timeout=20) as alice,
        httpx.AsyncClient(base_url=url, auth=BOB, timeout=20) as bob,
    ):
        assert (await alice.get("/api/me")).json()["admin"] is True
        assert (await bob.get("/api/me")).json()["admin"] is False
        assert (await alice.post("/api/agents", json={"id": "helper", "name": "Helper"})).status_code == 201
        for method, path, body in [
            ("POST", "/api/agents", {"id": "mine", "name": "Mine"}),
            ("PATCH", "/api/agents/helper", {"name": "Changed"}),
            ("DELETE", "/api/agents/helper", None),
        ]:
            refused = await bob.request(method, path, json=body)
            assert refused.status_code == 403, (method, path)
            assert "Only admins" in refused.json()["detail"]
        assert (await bob.get("/api/agents/helper")).json()["name"] == "Helper"
        used = await chat(bob, "helper", "hello")
        assert any(kind(e) == "finish" for e in used["events"])

        # Promoted as the 403 advises, on the command line (another process): seen at bob's next request.
        promote = cli.parse_args(["users", "promote", BOB[0]])
        assert await asyncio.to_thread(cli.run_command, services.settings, promote) == 0
        assert (await bob.patch("/api/agents/helper", json={"name": "Changed"})).status_code == 200


async def test_an_edit_applies_to_the_next_turn_and_a_refusal_names_the_rule(api) -> None:
    url, _ = api
    async with httpx.AsyncClient(base_url=url, timeout=20) as client:
        await client.post(
            "/api/agents",
            json={
                "id": "relay",
                "name": "Relay",
                "tools": [{"type": "agent-invoke", "config": {"allowedAgents": ["coding-assistant"]}}],
            },
        )
        first = await chat(client, "relay", "@planner make a plan")
        assert not any(kind(e) == "a2a-task-started" for e in first["events"])
        [output] = [e["data"] for e in first["events"] if kind(e) == "tool-output-available"]
        assert output["isError"] and "is not one of the agents this agent may call (coding-assistant)" in str(output)

        await client.patch(
            "/api/agents/relay", json={"tools": [{"type": "agent-invoke", "config": {"allowedAgents": ["planner"]}}]}
        )
        second = await chat(client, "relay", "@planner make a plan", first["sessionId"])
        [started] = [e["data"] for e in second["events"] if kind(e) == "a2a-task-started"]
        assert started["calleeAgentSlug"] == "planner"


async def test_the_agents_api_base_and_key_are_used_and_edits_wait_for_the_next_turn(api, openai_server) -> None:  # noqa: F811
    url, _ = api
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        created = await client.post(
            "/api/agents",
            json={
                "id": "remote-llm",
                "name": "Remote LLM",
                "model": "openai/test-model",
                "systemPrompt": "Prompt one.",
                "apiBase": openai_server.api_base,
                "apiKey": "sk-agent-one",
                "temperature": 0.5,
                "tools": [{"type": "agent-invoke", "config": {"allowedAgents": ["coding-assistant"]}}],
            },
        )
        assert created.status_code == 201, created.text
        openai_server.script(text("Hello", " from the agent's server"))
        first = await chat(client, "remote-llm", "hi")
        assert (
            "".join(e["data"].get("delta", "") for e in first["events"] if kind(e) == "text-delta")
            == "Hello from the agent's server"
        )
        [request] = openai_server.requests
        assert request.headers["authorization"] == "Bearer sk-agent-one"
        assert request.body["model"] == "test-model" and request.body["temperature"] == 0.5
        assert request.body["messages"][0] == {"role": "system", "content": "Prompt one."}

        # A turn that is running when the agent is changed finishes as it started.
        openai_server.script(
            tool_call("agent_invoke", '{"agentSlug": "coding-assistant", "input": "/lorem 400"}'),
            text("done"),
            text("second turn"),
        )
        session_id = first["sessionId"]
        posted = await client.post(f"/api/sessions/{session_id}/messages", json={"content": "delegate"})
        for _ in range(500):
            tasks = (await client.get("/api/tasks")).json()
            if tasks and tasks[0]["state"] == "working":
                break
            await asyncio.sleep(0.02)
        patched = await client.patch(
            "/api/agents/remote-llm", json={"systemPrompt": "Prompt two.", "apiKey": "sk-agent-two"}
        )
        assert patched.status_code == 200
        await stream_events(client, posted.json()["streamUrl"])
        during = openai_server.requests[1:3]
        assert [r.headers["authorization"] for r in during] == ["Bearer sk-agent-one"] * 2
        assert all(r.body["messages"][0]["content"] == "Prompt one." for r in during)

        await chat(client, "remote-llm", "again", session_id)
        after = openai_server.requests[3]
        assert after.headers["authorization"] == "Bearer sk-agent-two"
        assert after.body["messages"][0]["content"] == "Prompt two."


async def test_a_stored_key_does_not_follow_a_model_to_another_provider(api) -> None:
    """Without an apiBase an agent's key goes to its model's provider: a new provider needs the key again."""
    url, services = api
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:  # the first model check imports LiteLLM
        created = await client.post(
            "/api/agents",
            json={"id": "gpt-keyed", "name": "GPT", "model": "openai/gpt-4o-mini", "apiKey": "sk-for-openai-only"},
        )
        assert created.status_code == 201, created.text
        moved = await client.patch("/api/agents/gpt-keyed", json={"model": "anthropic/claude-3-5-haiku-latest"})
        assert moved.status_code == 422, moved.text
        [error] = moved.json()["detail"]
        assert error["loc"] == ["body", "apiKey"] and "provider of openai/gpt-4o-mini" in error["msg"]
        assert (await client.get("/api/agents/gpt-keyed")).json()["model"] == "openai/gpt-4o-mini"
        # Another model of the same provider keeps the key; so does a move with the key given again.
        same_provider = await client.patch("/api/agents/gpt-keyed", json={"model": "openai/gpt-4o"})
        assert same_provider.status_code == 200 and same_provider.json()["hasApiKey"]
        rekeyed = await client.patch(
            "/api/agents/gpt-keyed",
            json={"model": "anthropic/claude-3-5-haiku-latest", "apiKey": "sk-ant-for-anthropic"},
        )
        assert rekeyed.status_code == 200 and rekeyed.json()["hasApiKey"]
    # Try it (the page's way, as the admin `local`): the stored key is not sent to another provider either.
    tried = await services.agent_admin.try_model(
        {"model": "openai/gpt-4o-mini"}, "gpt-keyed", user_id=None, multi_user=False
    )
    assert not tried.ok and tried.field == "apiKey" and "provider of anthropic/claude-3-5-haiku-latest" in tried.text
