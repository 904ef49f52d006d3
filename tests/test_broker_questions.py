"""A broker (WebSocket) agent that asks back (issue 36): its question waits for the answer, which goes on in its task.

A real WebSocket client plays the agent (`tests.utils.broker.FakeAgent`); the chat delegates to it
with `agent_invoke` (`@travel …`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlmodel import select

from core.delegation.tasks import INPUT_REQUIRED
from models import A2ATaskSession
from tests.test_broker_chat import chat_with_travel, saved
from tests.utils.broker import artifact_update, status_update, task_event, wait_for


async def _waiting_task(services) -> A2ATaskSession:
    async def asked() -> bool:
        async with services.db.session() as s:
            rows = (await s.exec(select(A2ATaskSession))).all()
        return bool(rows) and rows[0].state == INPUT_REQUIRED

    deadline = asyncio.get_running_loop().time() + 10
    while not await asked():
        assert asyncio.get_running_loop().time() < deadline, "the task did not ask"
        await asyncio.sleep(0.02)
    async with services.db.session() as s:
        return (await s.exec(select(A2ATaskSession))).one()


async def test_a_broker_agents_question_is_answered_into_the_same_task(tmp_path: Path) -> None:
    async with chat_with_travel(tmp_path) as (services, agent, chat, _http):
        await services.chat.start_turn(session_id=chat.id, user_id=services.auth.local_user_id, text="@travel 去上海")
        first = await agent.next_request("message/stream", timeout=30)
        await agent.result(first["id"], task_event("t7", "working"))
        await agent.result(first["id"], status_update("t7", "input-required", "哪一天？", final=True))
        task = await _waiting_task(services)
        assert services.delegation.questions.pending(task.id).text == "哪一天？"
        assert services.chat.is_running(chat.id)  # the caller's turn waits
        await services.delegation.questions.answer(task.id, "明天")
        second = await agent.next_request("message/stream", timeout=10)
        message = second["params"]["message"]
        assert (message["taskId"], message["contextId"], message["parts"][0]["text"]) == ("t7", "c1", "明天")
        await agent.result(second["id"], artifact_update("t7", "G1 次 08:00"))
        await agent.result(second["id"], status_update("t7", "completed", final=True))
        await services.chat.wait(chat.id, timeout=30)
        async with services.db.session() as s:
            ended = (await s.exec(select(A2ATaskSession))).one()
        assert ended.state == "completed"
        assert "G1 次 08:00" in (await saved(services, chat.id))[-1].content


async def test_stopping_a_waiting_broker_task_cancels_the_agents_task(tmp_path: Path) -> None:
    async with chat_with_travel(tmp_path) as (services, agent, chat, _http):
        await services.chat.start_turn(session_id=chat.id, user_id=services.auth.local_user_id, text="@travel 去上海")
        first = await agent.next_request("message/stream", timeout=30)
        await agent.result(first["id"], status_update("t8", "input-required", "哪一天？", final=True))
        task = await _waiting_task(services)
        assert await services.chat.cancel(chat.id)
        assert (await agent.next_request("tasks/cancel", timeout=10))["params"] == {"id": "t8"}
        await wait_for(lambda: services.delegation.questions.pending(task.id) is None, timeout=10)
        async with services.db.session() as s:
            assert (await s.exec(select(A2ATaskSession))).one().state == "canceled"
