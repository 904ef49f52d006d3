"""The `/broker` page through NiceGUI's simulated `User`: counters, agents and tasks, refreshed live."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nicegui import ElementFilter, app, ui
from nicegui.testing import User

from core.broker import wire
from core.broker.auth import Identity
from core.broker.connection import AgentConnection
from core.broker.service import DISPATCH_TOKEN_OWNER, BrokerTask, user_owner
from tests.utils.broker import travel_card
from tests.utils.simulated_user import simulated_app_user
from ui.broker_page import age


@pytest.fixture
async def user(
    isolated_env: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> AsyncIterator[User]:
    monkeypatch.setenv("NICEGUI_STORAGE_PATH", str(isolated_env / "nicegui-storage"))
    async with simulated_app_user(request) as simulated:
        yield simulated


def table(user: User, marker: str) -> ui.table:
    with user:
        [found] = list(ElementFilter(marker=marker, local_scope=False))
    return found


async def test_the_broker_page_shows_agents_and_tasks_live(user: User) -> None:
    broker = app.state.services.broker
    await user.open("/broker")
    await user.should_see("Online agents")
    await user.should_see("Agents online")
    assert table(user, "broker-agents").rows == [] and table(user, "broker-running").rows == []

    async def send(_line: str) -> None:
        return None

    conn = AgentConnection(
        Identity("travel", agent_id="123"), send=send, settings=broker.settings, remote_addr="127.0.0.1:5000"
    )
    conn.set_card(wire.parse_card(travel_card()))
    conn.connected_at = time.time() - 75
    broker._connections["travel"] = conn  # as `serve` does once the card is in
    viewer = user_owner(app.state.services.auth.local_user_id)  # single-user mode: the `local` user
    task = BrokerTask(
        id="task-1",
        agent=conn,
        chat_agent_id=123,
        chat_id="abc",
        text="帮我查明天到上海的高铁",
        owner=viewer,
        state="working",
        last_text="已查到 6 个车次…",
        events=3,
        injects=1,
        throttled=1,
    )
    broker._tasks[task.id] = task
    # Another owner's task (a chat system with the dispatch token): its text and chat id are not shown.
    other = BrokerTask(
        id="task-2",
        agent=conn,
        chat_agent_id=456,
        chat_id="their-chat",
        text="a private request",
        owner=DISPATCH_TOKEN_OWNER,
        state="working",
        last_text="their progress",
        created_at=time.time() + 1,
    )
    broker._tasks[other.id] = other

    for _ in range(40):  # the page's timer refreshes once a second
        if table(user, "broker-agents").rows:
            break
        await asyncio.sleep(0.05)
    [agent_row] = table(user, "broker-agents").rows
    assert agent_row["id"] == "travel" and agent_row["name"] == "出行助手" and agent_row["binding"] == "123"
    assert agent_row["skills"] == "火车票查询" and agent_row["age"].startswith("1 min 1")
    [task_row, other_row] = table(user, "broker-running").rows
    assert task_row["progress"] == "已查到 6 个车次…" and task_row["chat"] == "123 / abc"
    assert task_row["task"] == "帮我查明天到上海的高铁"
    assert (other_row["task"], other_row["chat"], other_row["progress"]) == ("(not yours)", "—", "—")
    assert other_row["state"] == "working" and other_row["agent"] == "出行助手"
    assert task_row["injects"] == "1 (1)" and task_row["state"] == "working"
    await user.should_see("Tasks running")

    broker._tasks.clear()
    broker._connections.clear()
    for _ in range(40):
        if not table(user, "broker-agents").rows:
            break
        await asyncio.sleep(0.05)
    assert table(user, "broker-agents").rows == [] and table(user, "broker-running").rows == []


def test_ages_read_naturally() -> None:
    assert [age(s) for s in (0, 42, 185, 7800)] == ["0 s", "42 s", "3 min 5 s", "2 h 10 min"]
