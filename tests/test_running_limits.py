"""Per-user limits of running work (issue 34, item 5): turns and delegated tasks, over real HTTP.

With accounts, one user may have `MAX_RUNNING_TURNS_PER_USER` chat turns and `MAX_RUNNING_TASKS_PER_USER`
delegated tasks running at once: a send over it is HTTP 429 `too_many_running_turns` with `Retry-After`,
a delegation over it is a tool error the model reads, or JSON-RPC -32029 for an A2A caller. Another user
is not held up, and single-user mode has no limit. The demo model's `/hang` runs until it is stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import event

from core.services import Services
from core.web.errors import install_error_handlers
from tests.conftest import make_settings
from tests.utils.a2a_live import build_a2a_app
from tests.utils.accounts import ALICE, BOB, seed_accounts
from tests.utils.live_server import live_server


def _accounts_server(tmp_path: Path, database_url: str, **settings) -> Iterator[tuple[str, Services]]:
    seed_accounts(tmp_path, database_url)
    services = Services.build(make_settings(tmp_path, database_url=database_url, **settings))
    services.prepare()
    assert services.auth.multi_user
    with live_server(_app(services)) as url:
        yield url, services


def _app(services: Services):
    """The REST API and the A2A routes, answering errors with their `code` and in the caller's language, as app.py."""
    app = build_a2a_app(services)
    install_error_handlers(app)
    return app


@pytest.fixture
def limited_api(tmp_path: Path, database_url: str) -> Iterator[tuple[str, Services]]:
    """Alice and bob, each allowed 5 running turns and 3 running delegated tasks."""
    yield from _accounts_server(tmp_path, database_url, max_running_turns_per_user=5, max_running_tasks_per_user=3)


async def _new_chat(client: httpx.AsyncClient, agent_id: str = "general-assistant") -> str:
    created = await client.post("/api/sessions", json={"agentId": agent_id})
    assert created.status_code == 201, created.text
    return created.json()["id"]


async def _stop_all(client: httpx.AsyncClient, session_ids: list[str]) -> None:
    await asyncio.gather(*(client.post(f"/api/sessions/{sid}/stop") for sid in session_ids))


async def test_a_user_over_the_running_turns_limit_gets_429_while_another_user_still_sends(limited_api) -> None:
    url, services = limited_api
    async with (
        httpx.AsyncClient(base_url=url, auth=ALICE, timeout=30) as alice,
        httpx.AsyncClient(base_url=url, auth=BOB, timeout=30) as bob,
    ):
        chats = [await _new_chat(alice) for _ in range(30)]
        try:
            # All at once: racing sends must not let more than the limit through.
            sent = await asyncio.gather(
                *(alice.post(f"/api/sessions/{sid}/messages", json={"content": "/hang"}) for sid in chats)
            )
            accepted = [sid for sid, r in zip(chats, sent, strict=True) if r.status_code == 202]
            refused = [r for r in sent if r.status_code != 202]
            assert len(accepted) == 5 and len(refused) == 25, [r.status_code for r in sent]
            for response in refused:
                assert response.status_code == 429
                assert response.json()["code"] == "too_many_running_turns"
                assert response.headers["Retry-After"] == "10"
                assert "You already have 5 answers being written" in response.json()["detail"]
            assert [(await alice.get(f"/api/sessions/{sid}")).json()["running"] for sid in accepted] == [True] * 5
            # A refused send saved nothing.
            assert (await alice.get(f"/api/sessions/{refused_sid(chats, sent)}/messages")).json() == []

            # The limit is alice's: bob still sends.
            bobs = await _new_chat(bob)
            assert (await bob.post(f"/api/sessions/{bobs}/messages", json={"content": "/hang"})).status_code == 202
            await _stop_all(bob, [bobs])

            # Chinese for a person who asks for it.
            # (A refused chat: one of the accepted ones would be 409, its turn is already running.)
            zh = await alice.post(
                f"/api/sessions/{refused_sid(chats, sent)}/messages",
                json={"content": "/hang"},
                headers={"Accept-Language": "zh-CN"},
            )
            assert zh.status_code == 429 and "5" in zh.json()["detail"] and "You" not in zh.json()["detail"]

            # One of alice's turns stopped: she may send one more, not two.
            assert (await alice.post(f"/api/sessions/{accepted[0]}/stop")).json() == {"stopped": True}
            free = [sid for sid in chats if sid not in accepted]
            assert (await alice.post(f"/api/sessions/{free[0]}/messages", json={"content": "/hang"})).status_code == 202
            again = await alice.post(f"/api/sessions/{free[1]}/messages", json={"content": "/hang"})
            assert again.status_code == 429 and again.json()["code"] == "too_many_running_turns"
        finally:
            await _stop_all(alice, chats)


def refused_sid(chats: list[str], sent: list[httpx.Response]) -> str:
    return next(sid for sid, r in zip(chats, sent, strict=True) if r.status_code == 429)


async def test_single_user_mode_has_no_running_turns_limit(tmp_path: Path, database_url: str) -> None:
    services = Services.build(
        make_settings(tmp_path, database_url=database_url, max_running_turns_per_user=2, max_running_tasks_per_user=1)
    )
    services.prepare()
    assert not services.auth.multi_user
    with live_server(_app(services)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            chats = [await _new_chat(client) for _ in range(6)]
            try:
                sent = await asyncio.gather(
                    *(client.post(f"/api/sessions/{sid}/messages", json={"content": "/hang"}) for sid in chats)
                )
                assert [r.status_code for r in sent] == [202] * 6
            finally:
                await _stop_all(client, chats)


@pytest.mark.parametrize("with_accounts", [False, True], ids=["single-user", "accounts"])
async def test_the_turn_limit_costs_no_statement_outside_a_cluster(
    tmp_path: Path, database_url: str, with_accounts: bool
) -> None:
    """One process counts its turns in memory: a send runs the same statements with the limit as without it."""
    if with_accounts:
        server = _accounts_server(tmp_path, database_url, max_running_turns_per_user=5)
        url, services = next(server)
    else:
        services = Services.build(make_settings(tmp_path, database_url=database_url))
        services.prepare()
        server = None
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        statements.append(" ".join(statement.split()))

    async def send_and_count(client: httpx.AsyncClient) -> list[str]:
        sid = await _new_chat(client)
        statements.clear()
        event.listen(services.db.engine.sync_engine, "before_cursor_execute", record)
        try:
            assert (await client.post(f"/api/sessions/{sid}/messages", json={"content": "/hang"})).status_code == 202
        finally:
            event.remove(services.db.engine.sync_engine, "before_cursor_execute", record)
        await _stop_all(client, [sid])
        return list(statements)

    try:
        if server is None:
            with live_server(_app(services)) as url:
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    limited = await send_and_count(client)
        else:
            async with httpx.AsyncClient(base_url=url, auth=ALICE, timeout=30) as client:
                await send_and_count(client)  # warm: the agent and its tools are read once (`AgentCache`)
                limited = await send_and_count(client)
                services.chat.max_running_turns_per_user = None
                unlimited = await send_and_count(client)
            assert len(limited) == len(unlimited), (limited, unlimited)
        assert not [s for s in limited if "count(" in s.lower() or "advisory" in s.lower()], limited
    finally:
        if server is not None:
            server.close()


def _a2a_key(url: str, auth: tuple[str, str]) -> str:
    response = httpx.post(f"{url}/api/a2a/keys", json={"name": "limits"}, auth=auth, timeout=10)
    response.raise_for_status()
    return response.json()["key"]


def _send(url: str, key: str, text: str, method: str = "SendMessage") -> httpx.Response:
    return httpx.post(
        f"{url}/a2a/agents/coding-assistant",
        headers={"Authorization": f"Bearer {key}", "A2A-Version": "1.0"},
        json={
            "jsonrpc": "2.0",
            "id": "r1",
            "method": method,
            "params": {
                "message": {"messageId": f"m-{text}", "role": "ROLE_USER", "parts": [{"text": text}]},
                "configuration": {"returnImmediately": True},
            },
        },
        timeout=30,
    )


def _cancel(url: str, key: str, task_id: str) -> httpx.Response:
    return httpx.post(
        f"{url}/a2a/agents/coding-assistant",
        headers={"Authorization": f"Bearer {key}", "A2A-Version": "1.0"},
        json={"jsonrpc": "2.0", "id": "c1", "method": "CancelTask", "params": {"id": task_id}},
        timeout=30,
    )


async def test_a2a_callers_over_the_running_tasks_limit_get_a_json_rpc_error_and_a_chat_delegation_a_tool_error(
    limited_api,
) -> None:
    url, services = limited_api
    alice_key, bob_key = await asyncio.to_thread(_a2a_key, url, ALICE), await asyncio.to_thread(_a2a_key, url, BOB)
    started: list[str] = []
    try:
        for _ in range(3):
            answer = (await asyncio.to_thread(_send, url, alice_key, "/hang")).json()
            started.append(answer["result"]["task"]["id"])
        refused = (await asyncio.to_thread(_send, url, alice_key, "/hang")).json()
        assert refused["error"]["code"] == -32029
        assert "already has 3 delegated tasks running" in refused["error"]["message"]
        [info] = refused["error"]["data"]
        assert info["metadata"] == {"code": "too_many_running_tasks", "retryAfterSeconds": 10}

        streamed = await asyncio.to_thread(_send, url, alice_key, "/hang", "SendStreamingMessage")
        assert streamed.json()["error"]["code"] == -32029, streamed.text  # refused before the stream starts

        # Bob is not held up by alice's tasks.
        bobs = (await asyncio.to_thread(_send, url, bob_key, "/hang")).json()
        assert "result" in bobs, bobs
        assert "result" in (await asyncio.to_thread(_cancel, url, bob_key, bobs["result"]["task"]["id"])).json()

        # Inside a chat the model is told (a tool error), no task is started and the turn ends normally.
        async with httpx.AsyncClient(base_url=url, auth=ALICE, timeout=30) as alice:
            sid = await _new_chat(alice)
            posted = await alice.post(f"/api/sessions/{sid}/messages", json={"content": "@coding-assistant /hang"})
            assert posted.status_code == 202
            await services.chat.wait(sid, timeout=20)
            messages = (await alice.get(f"/api/sessions/{sid}/messages")).json()
            results = [r for m in messages for r in (m["toolResults"] or [])]
            assert any("already has 3 delegated tasks running" in str(r) for r in results), results
            assert len((await alice.get("/api/tasks")).json()) == 3  # the refused delegation started none

        # One task ends: the next one is accepted.
        cancel = await asyncio.to_thread(_cancel, url, alice_key, started.pop(0))
        assert "result" in cancel.json(), cancel.text
        again = (await asyncio.to_thread(_send, url, alice_key, "/hang")).json()
        assert "result" in again, again
        started.append(again["result"]["task"]["id"])
    finally:
        for task_id in started:
            await asyncio.to_thread(_cancel, url, alice_key, task_id)
