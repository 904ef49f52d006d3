"""The REST API over real HTTP on 127.0.0.1: sessions, messages, SSE resume, auth, bad input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import event

from core.auth import accounts
from core.routes import api_router
from core.services import Services
from tests.conftest import make_settings
from tests.utils.live_server import live_server, services_app
from tests.utils.sync import run_sync


def build_api_app(services: Services) -> FastAPI:
    return services_app(services, api_router())


@pytest.fixture
def api(tmp_path: Path, database_url: str) -> Iterator[tuple[str, Services]]:
    """A live API server in single-user mode (demo model, 5 ms per token)."""
    services = Services.build(
        make_settings(tmp_path, database_url=database_url, demo_model_delay_ms=5, max_message_chars=500)
    )
    services.prepare()
    with live_server(build_api_app(services)) as url:
        yield url, services


def read_sse(lines: list[str]) -> list[dict]:
    """Parse SSE text lines into events with `id`, `event` and decoded `data`."""
    events, current = [], {}
    for line in lines:
        if not line:
            if current:
                events.append(current)
            current = {}
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                current["data"] = json.loads(value)
            elif field in {"id", "event", "retry"}:
                current[field] = value
    if current:
        events.append(current)
    return events


async def stream_events(client: httpx.AsyncClient, url: str, **kwargs) -> tuple[httpx.Response, list[dict]]:
    async with client.stream("GET", url, **kwargs) as response:
        if response.status_code != 200:
            await response.aread()
            return response, []
        lines = [line async for line in response.aiter_lines()]
    return response, read_sse(lines)


async def test_post_a_message_and_follow_the_stream(api) -> None:
    url, services = api
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        created = await client.post("/api/sessions", json={"agentId": "coding-assistant"})
        assert created.status_code == 201
        session = created.json()
        assert session["agentId"] == "coding-assistant" and session["id"].startswith("as_")

        posted = await client.post(f"/api/sessions/{session['id']}/messages", json={"content": "/lorem 120"})
        assert posted.status_code == 202
        turn = posted.json()
        assert turn["sessionId"] == session["id"] and turn["userMessageId"] > 0

        seen_running = False
        async with client.stream("GET", turn["streamUrl"]) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["cache-control"] == "no-cache"
            assert response.headers["x-accel-buffering"] == "no"
            lines = []
            async for line in response.aiter_lines():
                lines.append(line)
                if line.startswith("data:") and not seen_running:
                    seen_running = services.chat.is_running(session["id"])
        events = read_sse(lines)
        assert seen_running, "the first events must arrive while the turn is still running"
        types = [e["data"]["type"] for e in events]
        assert types[0] == "start" and types[-1] == "finish"
        ids = [int(e["id"]) for e in events]
        assert ids == list(range(ids[0], ids[0] + len(ids)))
        text = "".join(e["data"]["delta"] for e in events if e["data"]["type"] == "text-delta")
        assert len(text.split()) == 120

        messages = (await client.get(f"/api/sessions/{session['id']}/messages")).json()
        assert [m["role"] for m in messages] == ["user", "assistant"]
        assert messages[1]["content"] == text and messages[1]["modelId"] == "local/demo"
        listed = (await client.get("/api/sessions")).json()
        assert [s["id"] for s in listed] == [session["id"]] and listed[0]["title"] == "/lorem 120"


async def test_resume_with_last_event_id_loses_and_repeats_nothing(api) -> None:
    url, services = api
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        session = (await client.post("/api/sessions", json={})).json()
        await client.post(f"/api/sessions/{session['id']}/messages", json={"content": "/lorem 40"})
        _, everything = await stream_events(client, f"/api/sessions/{session['id']}/stream")  # ends with the turn
        cut = int(everything[10]["id"])

        _, by_header = await stream_events(
            client, f"/api/sessions/{session['id']}/stream", headers={"Last-Event-ID": str(cut)}
        )
        assert [e["id"] for e in by_header] == [e["id"] for e in everything[11:]]
        _, by_query = await stream_events(client, f"/api/sessions/{session['id']}/stream?lastEventId={cut}")
        assert by_query == by_header


@pytest.mark.parametrize(("last_id", "reason"), [("abc", "not a number"), ("99999", "does not belong")])
async def test_an_unusable_last_event_id_gets_a_reset_then_everything(api, last_id: str, reason: str) -> None:
    url, services = api
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        session = (await client.post("/api/sessions", json={})).json()
        await client.post(f"/api/sessions/{session['id']}/messages", json={"content": "hi"})
        await stream_events(client, f"/api/sessions/{session['id']}/stream")  # wait for the turn to end
        _, events = await stream_events(
            client, f"/api/sessions/{session['id']}/stream", headers={"Last-Event-ID": last_id}
        )
    assert events[0]["event"] == "reset" and reason in events[0]["data"]["reason"]
    assert events[1]["data"]["type"] == "start" and events[-1]["data"]["type"] == "finish"


async def test_stream_without_a_turn_says_no_buffer(api) -> None:
    url, _ = api
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        session = (await client.post("/api/sessions", json={})).json()
        response = await client.get(f"/api/sessions/{session['id']}/stream")
    assert response.status_code == 200
    assert response.json() == {"active": False, "reason": "no-buffer"}


async def test_bad_input_gets_clear_errors(api) -> None:
    url, _ = api
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        session = (await client.post("/api/sessions", json={})).json()
        sid = session["id"]

        missing = await client.post(f"/api/sessions/{sid}/messages", json={})
        assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["body", "content"]
        blank = await client.post(f"/api/sessions/{sid}/messages", json={"content": "   "})
        assert blank.status_code == 422 and "empty" in blank.json()["detail"]
        too_long = await client.post(f"/api/sessions/{sid}/messages", json={"content": "x" * 501})
        assert too_long.status_code == 422 and "limit is 500" in too_long.json()["detail"]
        not_json = await client.post(
            f"/api/sessions/{sid}/messages", content=b"{nope", headers={"content-type": "application/json"}
        )
        assert not_json.status_code == 422

        for method, path in [
            ("GET", "/api/sessions/as_nope"),
            ("GET", "/api/sessions/as_nope/messages"),
            ("POST", "/api/sessions/as_nope/messages"),
            ("GET", "/api/sessions/as_nope/stream"),
            ("POST", "/api/sessions/as_nope/stop"),
        ]:
            response = await client.request(method, path, json={"content": "hi"})
            assert response.status_code == 404, path
            assert response.json()["detail"] == "There is no such chat session."
        unknown_agent = await client.post("/api/sessions", json={"agentId": "no-such-agent"})
        assert unknown_agent.status_code == 404 and "no-such-agent" in unknown_agent.json()["detail"]

        await client.post(f"/api/sessions/{sid}/messages", json={"content": "/lorem 400"})
        busy = await client.post(f"/api/sessions/{sid}/messages", json={"content": "again"})
        assert busy.status_code == 409 and "still answering" in busy.json()["detail"]
        stopped = await client.post(f"/api/sessions/{sid}/stop")
        assert stopped.json() == {"stopped": True}
        messages = (await client.get(f"/api/sessions/{sid}/messages")).json()
        assert [m["status"] for m in messages] == ["complete", "canceled"]


async def test_simultaneous_sends_start_one_turn_and_save_only_its_message(api) -> None:
    url, _ = api
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        sid = (await client.post("/api/sessions", json={})).json()["id"]
        responses = await asyncio.gather(
            *(client.post(f"/api/sessions/{sid}/messages", json={"content": f"/lorem {20 + i}"}) for i in range(10))
        )
        codes = sorted(r.status_code for r in responses)
        assert codes == [202] + [409] * 9
        assert all("still answering" in r.json()["detail"] for r in responses if r.status_code == 409)
        [accepted] = [r for r in responses if r.status_code == 202]
        await stream_events(client, accepted.json()["streamUrl"])  # until the turn ends
        messages = (await client.get(f"/api/sessions/{sid}/messages")).json()
    # A refused send saved nothing: one question, one answer.
    assert [(m["role"], m["status"]) for m in messages] == [("user", "complete"), ("assistant", "complete")]
    assert messages[0]["id"] == accepted.json()["userMessageId"]
    words = int(messages[0]["content"].split()[1])
    assert len(messages[1]["content"].split()) == words


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/sessions", {"agentSlug": "general-assistant"}, ["body", "agentSlug"]),
        ("/api/sessions", {"agentId": "coding-assistant", "model": "x"}, ["body", "model"]),
        ("/api/agents", {"id": "critic", "name": "Critic", "system_prompt": "x"}, ["body", "system_prompt"]),
        (
            "/api/agents",
            {"id": "critic", "name": "Critic", "canDelegate": True, "delegation": {"depth": 1}},
            ["body", "delegation", "depth"],
        ),
        ("/api/sessions/{sid}/messages", {"content": "hi", "role": "system"}, ["body", "role"]),
    ],
)
async def test_a_field_the_endpoint_does_not_know_is_refused_with_its_name(api, path, body, field) -> None:
    url, _ = api
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        before = (await client.get("/api/sessions")).json()
        sid = (await client.post("/api/sessions", json={})).json()["id"]
        response = await client.post(path.format(sid=sid), json=body)
        assert response.status_code == 422
        [error] = response.json()["detail"]
        assert error["loc"] == field and error["type"] == "extra_forbidden"
        # Nothing was created or said on the way.
        assert len((await client.get("/api/sessions")).json()) == len(before) + 1
        assert (await client.get(f"/api/sessions/{sid}/messages")).json() == []
        assert "critic" not in {a["id"] for a in (await client.get("/api/agents")).json()}


@pytest.mark.parametrize(
    ("setting", "agent_id"),
    [
        ({}, "general-assistant"),  # "Coding Assistant" sorts first by name; that does not make it the default
        ({"default_agent": "planner"}, "planner"),
        ({"default_agent": "gone"}, None),
    ],
)
async def test_a_new_session_without_an_agent_gets_the_default_agent(tmp_path: Path, setting, agent_id) -> None:
    services = Services.build(make_settings(tmp_path, **setting))
    services.prepare()
    with live_server(build_api_app(services)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            response = await client.post("/api/sessions", json={})
    default = await services.workspace.default_agent()  # what the chat page's picker starts with
    if agent_id is None:
        assert response.status_code == 404 and default is None
        detail = response.json()["detail"]
        assert "default agent 'gone' does not exist" in detail and "agentId" in detail and "DEFAULT_AGENT" in detail
    else:
        assert response.status_code == 201 and response.json()["agentId"] == agent_id
        assert default.slug == agent_id


def test_the_default_agent_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEFAULT_AGENT", "coding-assistant")
    from core.settings import load_settings

    assert load_settings().default_agent == "coding-assistant"


async def test_delete_hides_the_session(api) -> None:
    url, _ = api
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        sid = (await client.post("/api/sessions", json={})).json()["id"]
        assert (await client.delete(f"/api/sessions/{sid}")).status_code == 204
        assert (await client.get(f"/api/sessions/{sid}")).status_code == 404
        assert (await client.get("/api/sessions")).json() == []


@pytest.fixture
def multi_user_api(tmp_path: Path, database_url: str) -> Iterator[tuple[str, Services]]:
    """A live API server with two accounts (alice, bob)."""
    yield from _multi_user_server(tmp_path, database_url)


@pytest.fixture
def slow_multi_user_api(tmp_path: Path, database_url: str) -> Iterator[tuple[str, Services]]:
    """The same, with a demo model slow enough (20 ms per token) that a long answer is still running."""
    yield from _multi_user_server(tmp_path, database_url, demo_model_delay_ms=20)


def _multi_user_server(tmp_path: Path, database_url: str, **settings) -> Iterator[tuple[str, Services]]:
    seed = Services.build(make_settings(tmp_path, database_url=database_url))
    seed.db.migrate()

    async def create_users() -> None:
        async with seed.db.session() as s:
            await accounts.create_user(s, username="alice", password="alice-password")
            await accounts.create_user(s, username="bob", password="bob-password")
        await seed.db.close()

    run_sync(create_users())
    services = Services.build(make_settings(tmp_path, database_url=database_url, **settings))
    services.prepare()
    assert services.auth.multi_user
    with live_server(build_api_app(services)) as url:
        yield url, services


async def test_accounts_see_only_their_own_sessions(multi_user_api) -> None:
    url, _ = multi_user_api
    alice = httpx.AsyncClient(base_url=url, auth=("alice", "alice-password"), timeout=10)
    bob = httpx.AsyncClient(base_url=url, auth=("bob", "bob-password"), timeout=10)
    async with alice, bob:
        assert (await alice.get("/api/me")).json()["username"] == "alice"
        sid = (await alice.post("/api/sessions", json={})).json()["id"]
        await alice.post(f"/api/sessions/{sid}/messages", json={"content": "secret plans"})
        for path in (f"/api/sessions/{sid}", f"/api/sessions/{sid}/messages", f"/api/sessions/{sid}/stream"):
            response = await bob.get(path)
            assert response.status_code == 404, path
            assert response.json()["detail"] == "There is no such chat session."  # same as a missing one
        assert (await bob.post(f"/api/sessions/{sid}/messages", json={"content": "x"})).status_code == 404
        assert (await bob.get("/api/sessions")).json() == []
        assert [s["id"] for s in (await alice.get("/api/sessions")).json()] == [sid]


async def test_sending_a_message_reads_the_chat_once(api) -> None:
    """Whose chat it is and what it holds come from one read: the route leaves the check to the engine."""
    url, services = api
    reads: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        statement = " ".join(statement.split())
        if " FROM agent_sessions" in statement and not statement.endswith("FOR UPDATE"):
            reads.append(statement)

    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        sid = (await client.post("/api/sessions", json={})).json()["id"]
        event.listen(services.db.engine.sync_engine, "before_cursor_execute", record)
        try:
            posted = await client.post(f"/api/sessions/{sid}/messages", json={"content": "hello"})
        finally:
            event.remove(services.db.engine.sync_engine, "before_cursor_execute", record)
        assert posted.status_code == 202
        assert len(reads) == 1, reads
        _, events = await stream_events(client, posted.json()["streamUrl"])
        assert events[-1]["data"]["type"] == "finish"


async def test_another_users_chat_looks_exactly_like_an_unknown_one_even_while_it_answers(slow_multi_user_api) -> None:
    url, _ = slow_multi_user_api
    async with (
        httpx.AsyncClient(base_url=url, auth=("alice", "alice-password"), timeout=10) as alice,
        httpx.AsyncClient(base_url=url, auth=("bob", "bob-password"), timeout=10) as bob,
    ):
        sid = (await alice.post("/api/sessions", json={})).json()["id"]
        assert (await alice.post(f"/api/sessions/{sid}/messages", json={"content": "/lorem 3000"})).status_code == 202
        unknown = "as_000000000000000000000000"
        for method, path, body in [
            ("GET", "/api/sessions/{}", None),
            ("GET", "/api/sessions/{}/messages", None),
            ("POST", "/api/sessions/{}/messages", {"content": "hi"}),
            ("GET", "/api/sessions/{}/stream", None),
            ("POST", "/api/sessions/{}/stop", None),
            ("DELETE", "/api/sessions/{}", None),
        ]:
            theirs = await bob.request(method, path.format(sid), json=body)
            nothing = await bob.request(method, path.format(unknown), json=body)
            assert (theirs.status_code, theirs.json()) == (nothing.status_code, nothing.json()), (method, path)
            assert theirs.status_code == 404
        # Alice's turn was not touched, and bob's message was not saved anywhere.
        assert (await alice.get(f"/api/sessions/{sid}")).json()["running"] is True
        assert [m["role"] for m in (await alice.get(f"/api/sessions/{sid}/messages")).json()] == ["user"]
        await alice.post(f"/api/sessions/{sid}/stop")


async def test_requests_without_valid_credentials_get_401(multi_user_api) -> None:
    url, _ = multi_user_api
    async with httpx.AsyncClient(base_url=url, timeout=10) as anonymous:
        response = await anonymous.get("/api/sessions")
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Basic"
        assert "Log in" in response.json()["detail"]
        wrong = await anonymous.get("/api/sessions", auth=("alice", "wrong-password"))
        assert wrong.status_code == 401
        nobody = await anonymous.get("/api/sessions", auth=("nobody", "whatever-password"))
        assert nobody.status_code == 401 and nobody.json() == wrong.json()
