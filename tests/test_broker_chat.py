"""The app's own chat as a chat system of the broker (issue 5, item 6), against a live server.

The general assistant dispatches to a WebSocket agent in the background with its
`a2a_<id>` tool; the task's injects come back into the same chat: `delay`
progress as a quiet note without a reply, the `auto` result as a note that the
agent then announces, never in the middle of a running turn. A real WebSocket
client plays the remote agent; a real Redis subscriber sees the same injects.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from sqlmodel import select

from core.broker.tools import BrokerDispatchTools
from core.chat import agents as agents_store
from core.chat import sessions as sessions_store
from core.chat.tools import ToolContext
from core.delegation import task_stream_key
from core.services import Services
from models import A2ATaskSession, AgentMessage, AgentSession
from tests.test_broker import (
    dispatch,
    redis_url,  # noqa: F401 - a fixture
    running,
)
from tests.utils.broker import (
    FakeAgent,
    RedisListener,
    artifact_update,
    status_update,
    task_event,
    travel_card,
    wait_for,
)
from tests.utils.openai_server import (
    OpenAIServer,
    openai_server,  # noqa: F401 - a fixture
    text,
    tool_call,
)


async def new_chat(services: Services, slug: str = "general-assistant") -> AgentSession:
    async with services.db.session() as s:
        agent = await agents_store.get_agent_by_slug(s, slug)
        return await sessions_store.create_session(s, user_id=services.auth.local_user_id, agent_id=agent.id)


async def saved(services: Services, session_id: str) -> list[AgentMessage]:
    async with services.db.session() as s:
        return await sessions_store.list_messages(s, session_id=session_id)


async def turn_events(services: Services, turn) -> list:
    return [e async for e in services.hub.subscribe(turn.stream_key, after=turn.after_event_id)]


@asynccontextmanager
async def chat_with_travel(
    tmp_path: Path, **overrides
) -> AsyncIterator[tuple[Services, FakeAgent, AgentSession, httpx.AsyncClient]]:
    async with running(tmp_path, with_api=True, **overrides) as (host, services, broker, http):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        try:
            yield services, agent, await new_chat(services), http
        finally:
            await agent.close()


async def test_a_background_dispatch_comes_back_as_notes_and_an_announcement(tmp_path: Path, redis_url: str) -> None:  # noqa: F811
    async with chat_with_travel(tmp_path, redis={"url": redis_url}, inject_min_interval=0) as (
        services,
        agent,
        chat,
        http,
    ):
        user_id = services.auth.local_user_id
        async with services.db.session() as s:
            general = await agents_store.get_agent_by_slug(s, "general-assistant")
        async with RedisListener(redis_url, general.id) as listener:
            turn = await services.chat.start_turn(
                session_id=chat.id, user_id=user_id, text="/background @travel 明天去上海的高铁"
            )
            events = await turn_events(services, turn)
            # The tool call returns at once: the turn is over before the agent has said anything.
            [call] = [e.data for e in events if e.type == "tool-input-available"]
            assert call["toolName"] == "a2a_travel" and call["input"] == {"task": "明天去上海的高铁"}
            [started] = [e.data for e in events if e.type == "a2a-task-started"]
            assert started["calleeAgentSlug"] == "travel" and started["calleeAgentName"] == "出行助手"
            task_id = started["taskId"]
            [output] = [e.data for e in events if e.type == "tool-output-available"]
            assert output["isError"] is False and output["output"]["background"] is True
            assert output["output"]["taskId"] == task_id
            answer = "".join(e.data["delta"] for e in events if e.type == "text-delta")
            assert "正在后台处理" in answer  # a Chinese request: the demo model answers in Chinese
            assert not services.chat.is_running(chat.id)

            request = await agent.next_request("message/stream", timeout=30)
            assert request["params"]["message"]["parts"][0]["text"] == "明天去上海的高铁"
            rid = request["id"]
            await agent.result(rid, task_event("t1", "working"))
            await agent.working(rid, "已查到 6 个车次…")
            # `delay`: a quiet note, and no reply.
            await wait_for(lambda: services.inbox.delivered == 1)
            notes = [m for m in await saved(services, chat.id) if m.role == "system"]
            assert [(m.content, m.inject_mode, m.a2a_task_id) for m in notes] == [
                ("[出行助手] 已查到 6 个车次…", "delay", task_id)
            ]
            assert not services.chat.is_running(chat.id) and services.inbox.announced == 0

            await agent.result(rid, artifact_update("t1", "已订好备选，最优 G1234。"))
            await agent.result(rid, status_update("t1", "completed", final=True))
            # `auto`: a note, then the agent announces it in a turn of its own.
            await wait_for(lambda: services.inbox.announced == 1, timeout=10)
            await services.chat.wait(chat.id, timeout=10)
            rows = await saved(services, chat.id)
            assert [(m.role, m.inject_mode) for m in rows] == [
                ("user", None),
                ("assistant", None),
                ("assistant", None),  # the call, then the answer to it
                ("system", "delay"),
                ("system", "delay"),
                ("system", "auto"),
                ("assistant", None),
            ]
            assert rows[4].content == rows[5].content == "[出行助手] 已订好备选，最优 G1234。"  # artifact, then result
            assert rows[-1].content == "来自 **出行助手** 的结果：\n\n> 已订好备选，最优 G1234。"
            api = (await http.get(f"/api/sessions/{chat.id}/messages")).json()
            assert [(m["role"], m["injectMode"], m["a2aTaskId"]) for m in api[3:6]] == [
                ("system", "delay", task_id),
                ("system", "delay", task_id),
                ("system", "auto", task_id),
            ]

            # The same injects went to Redis, as for any chat system.
            messages = await listener.wait(lambda m: sum(x["chatId"] == chat.id for x in m) == 3)
            assert [(m["agentId"], m["text"], m["mode"]) for m in messages if m["chatId"] == chat.id] == [
                (general.id, "[出行助手] 已查到 6 个车次…", "delay"),
                (general.id, "[出行助手] 已订好备选，最优 G1234。", "delay"),  # the artifact-update (seed 003)
                (general.id, "[出行助手] 已订好备选，最优 G1234。", "auto"),
            ]

        # It is a delegation like any other: the side panel's stream and the saved task.
        deltas = [
            e.data["delta"] async for e in services.hub.subscribe(task_stream_key(task_id)) if e.type == "text-delta"
        ]
        assert deltas == ["已查到 6 个车次…\n\n", "已订好备选，最优 G1234。"]  # progress is a paragraph of its own
        async with services.db.session() as s:
            task = await s.get(A2ATaskSession, task_id)
            callee_rows = await sessions_store.list_messages(s, session_id=task.session_id)
        assert (task.state, task.caller_session_id, task.callee_agent_slug) == ("completed", chat.id, "travel")
        assert [(m.role, m.source) for m in callee_rows] == [("user", "a2a"), ("assistant", "a2a")]
        assert services.broker.running_tasks() == []


async def test_a_result_that_arrives_during_a_turn_waits_for_its_end(tmp_path: Path) -> None:
    async with chat_with_travel(tmp_path, demo_model_delay_ms=5) as (services, agent, chat, http):
        user_id = services.auth.local_user_id
        first = await services.chat.start_turn(session_id=chat.id, user_id=user_id, text="/background @travel go")
        await services.chat.wait(chat.id, timeout=30)
        request = await agent.next_request("message/stream", timeout=30)
        # The user asks for something long; the agent finishes in the middle of it.
        busy = await services.chat.start_turn(session_id=chat.id, user_id=user_id, text="/lorem 300")
        await wait_for(lambda: services.hub.get(busy.stream_key).last_id > busy.after_event_id + 5, timeout=10)
        await agent.result(request["id"], status_update("t2", "completed", "done: G1234", final=True))
        await asyncio.sleep(0.3)
        assert services.chat.is_running(chat.id), "the long turn should still be running"
        assert not [m for m in await saved(services, chat.id) if m.role == "system"]  # nothing saved mid-turn
        await wait_for(lambda: services.inbox.announced == 1, timeout=20)
        await services.chat.wait(chat.id, timeout=10)
        rows = await saved(services, chat.id)
        lorem = next(i for i, m in enumerate(rows) if m.role == "user" and m.content == "/lorem 300")
        note = next(i for i, m in enumerate(rows) if m.inject_mode == "auto")
        assert rows[lorem + 1].role == "assistant" and rows[lorem + 1].content.startswith("lorem ipsum")
        assert note == lorem + 2 and rows[note].content == "[出行助手] done: G1234"
        assert rows[note + 1].role == "assistant" and "done: G1234" in rows[note + 1].content
        assert first.session_id == chat.id


async def test_only_the_apps_own_tasks_reach_its_chats(tmp_path: Path) -> None:
    async with running(tmp_path) as (host, services, broker, http):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        chat = await new_chat(services)
        # An outside chat system dispatches with our session id as its chatId: no notes appear here.
        await dispatch(http, "spoof", chat_id=chat.id, agent_id=1)
        request = await agent.next_request("message/stream")
        async with broker.injects.bus.subscribe() as injects:
            await agent.result(request["id"], status_update("t3", "completed", "spoofed result", final=True))
            inject = await asyncio.wait_for(injects.get(), 5)
        assert inject.chat_id == chat.id and inject.mode == "auto"
        await asyncio.sleep(0.2)
        assert await saved(services, chat.id) == [] and services.inbox.delivered == 0
        await agent.close()


async def test_dispatch_tools_follow_bindings_and_refuse_what_they_cannot_do(tmp_path: Path) -> None:
    async with running(tmp_path) as (host, services, broker, http):
        async with services.db.session() as s:
            general = await agents_store.get_agent_by_slug(s, "general-assistant")
        glob = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        by_id = await FakeAgent.connect(
            host, card=travel_card("Mine"), a2a_id="mine", agent_id=str(general.id), wait_registered=broker
        )
        by_slug = await FakeAgent.connect(
            host, card=travel_card("Slug"), a2a_id="slugged", agent_id="general-assistant", wait_registered=broker
        )
        other = await FakeAgent.connect(
            host, card=travel_card("Other"), a2a_id="other", agent_id="999", wait_registered=broker
        )
        family = next(f for f in services.tools._families.values() if isinstance(f, BrokerDispatchTools))
        assert [t.name for t in family.tools_for(general.id, "general-assistant")] == [
            "a2a_mine",
            "a2a_slugged",
            "a2a_travel",
        ]
        async with services.db.session() as s:
            rows = await agents_store.agent_tool_rows(s, general.id)
        bound = services.tools.bind(rows, agent_id=general.id, agent_slug="general-assistant")
        assert set(bound) == {"agent_invoke", "a2a_mine", "a2a_slugged", "a2a_travel"}
        definition = bound["a2a_travel"].definition()["function"]
        assert definition["parameters"]["required"] == ["task"] and "background" in definition["description"]
        # The coding assistant has no a2a-dispatch tool: none are offered to it.
        async with services.db.session() as s:
            coder = await agents_store.get_agent_by_slug(s, "coding-assistant")
            assert (
                services.tools.bind(
                    await agents_store.agent_tool_rows(s, coder.id), agent_id=coder.id, agent_slug=coder.slug
                )
                == {}
            )

        chat = await new_chat(services)
        ctx = ToolContext(
            user_id=services.auth.local_user_id, agent_id=general.id, agent_slug="general-assistant", session_id=chat.id
        )
        tool = bound["a2a_travel"].tool
        bad = await tool.execute({"task": "  "}, {}, ctx)
        assert not bad.success and "'task' must be a non-empty string" in bad.error
        nested = await tool.execute({"task": "go"}, {}, replace(ctx, recursion_depth=1, task_id="parent"))
        assert not nested.success and "only be started from a user's own chat" in nested.error
        await glob.close()
        await wait_for(lambda: broker.connection("travel") is None)
        gone = await tool.execute({"task": "go"}, {}, ctx)
        assert not gone.success and "no longer connected" in gone.error
        async with services.db.session() as s:
            assert (await s.exec(select(A2ATaskSession))).all() == []  # refusals create no task
        for agent in (by_id, by_slug, other):
            await agent.close()


@pytest.mark.parametrize("final", ["canceled", "timeout"])
async def test_a_task_that_does_not_complete_is_announced_and_recorded_as_such(tmp_path: Path, final: str) -> None:
    async with chat_with_travel(tmp_path, task_idle_timeout=1000 if final == "timeout" else 120_000) as (
        services,
        agent,
        chat,
        http,
    ):
        await services.chat.start_turn(
            session_id=chat.id, user_id=services.auth.local_user_id, text="/background @travel go"
        )
        request = await agent.next_request("message/stream", timeout=30)
        await agent.result(request["id"], task_event("t4", "working"))
        await services.chat.wait(chat.id, timeout=30)
        if final == "canceled":
            assert await services.broker.cancel_chat(chat.id) == 1
            assert (await agent.next_request("tasks/cancel"))["params"] == {"id": "t4"}
        # else: nothing more from the agent; the idle timeout ends the task.
        await wait_for(lambda: services.inbox.announced == 1, timeout=10)
        await services.chat.wait(chat.id, timeout=10)
        rows = await saved(services, chat.id)
        [note] = [m for m in rows if m.inject_mode == "auto"]
        expected = "canceled" if final == "canceled" else "timed out"
        assert expected in note.content and expected in rows[-1].content
        async with services.db.session() as s:
            task = (await s.exec(select(A2ATaskSession))).one()
        assert task.state == ("canceled" if final == "canceled" else "failed") and expected in (task.error or "")


async def test_an_agent_bound_to_another_chat_agent_cannot_be_delegated_to(tmp_path: Path) -> None:
    async with running(tmp_path) as (host, services, broker, http):
        other = await FakeAgent.connect(host, a2a_id="travel", agent_id="999", wait_registered=broker)
        chat = await new_chat(services)
        turn = await services.chat.start_turn(
            session_id=chat.id, user_id=services.auth.local_user_id, text="@travel 明天去上海的高铁"
        )
        events = await turn_events(services, turn)
        [output] = [e.data for e in events if e.type == "tool-output-available"]
        assert output["isError"] is True and "bound to another agent" in output["output"]["error"]
        assert not [e for e in events if e.type == "a2a-task-started"] and other.requests.empty()
        await other.close()


async def test_a_real_provider_gets_the_broker_tools_and_the_result_to_announce(
    tmp_path: Path, openai_server: OpenAIServer
) -> None:  # noqa: F811
    """Through LiteLLM to an OpenAI-compatible server: the broker tool goes out, the result comes back to announce.

    The `a2a_<id>` definition is sent with the request, the call dispatches, and the announcement turn
    sends the result as the conversation's last (system) message.
    """
    openai_server.script(
        tool_call("a2a_travel", {"task": "trains to Shanghai"}, id="call_bg_1", text_chunks=["Asking."]),
        text("The travel agent is on it."),
        text("Your train: ", "G1234."),
    )
    async with chat_with_travel(
        tmp_path,
        default_model="openai/test-model",
        llm_api_base=openai_server.api_base,
        llm_api_key="sk-test",
        llm_timeout_s=5,
    ) as (services, agent, chat, http):
        await services.chat.start_turn(
            session_id=chat.id, user_id=services.auth.local_user_id, text="find me a train, take your time"
        )
        request = await agent.next_request("message/stream", timeout=30)
        assert request["params"]["message"]["parts"][0]["text"] == "trains to Shanghai"
        await agent.result(request["id"], status_update("t5", "completed", "G1234 at 08:00", final=True))
        await wait_for(lambda: services.inbox.announced == 1, timeout=10)
        await services.chat.wait(chat.id, timeout=10)
        rows = await saved(services, chat.id)
    first, second, third = openai_server.requests
    [definition] = [t["function"] for t in first.body["tools"] if t["function"]["name"] == "a2a_travel"]
    assert definition["parameters"] == {
        "type": "object",
        "properties": {"task": {"type": "string", "description": "The complete task for 出行助手"}},
        "required": ["task"],
    }
    assert "[出行助手]" in definition["description"] and "background" in definition["description"]
    assert sorted(first.tool_names) == ["a2a_travel", "agent_invoke"]
    assert json.loads(second.messages[-1]["content"])["background"] is True
    assert third.messages[-1] == {
        "role": "system",
        "content": "Background task result (tell the user now): [出行助手] G1234 at 08:00",
    }
    assert rows[-1].role == "assistant" and rows[-1].content == "Your train: G1234."
