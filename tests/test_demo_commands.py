"""The demo model's commands that put the side panel in each of its states on demand (docs/TESTING.md).

Each runs through the real engine, LiteLLM's `local/` provider and the delegation service, on SQLite
and PostgreSQL: a slow stream, a failure after N words, a callee that hangs until Stop, a call whose
own timeout expires, N parallel delegations. Deterministic: the same input gives the same events.
"""

from __future__ import annotations

import asyncio
import json
import time

from core.chat.demo_model import HANG_LINE, PARALLEL_MAX, plan_reply
from core.chat.llm import LLMGateway, TextDelta
from core.delegation import task_stream_key
from core.services import Services
from tests.test_delegation import all_tasks, chat_with, messages_of, run_turn, tool_outputs

INVOKE = [{"type": "function", "function": {"name": "agent_invoke", "parameters": {}}}]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_the_same_command_plans_the_same_reply() -> None:
    for text in (
        "/slow 5 20",
        "/fail 3",
        "/hang",
        "/timeout 300 @coding-assistant /hang",
        "/parallel 3 @coding-assistant write tests",
    ):
        assert plan_reply(user(text), INVOKE) == plan_reply(user(text), INVOKE)


def test_slow_sets_its_own_pace_and_fail_fails_after_n_words() -> None:
    slow = plan_reply(user("/slow 5 250"), None)
    assert slow.delay_s == 0.25 and len("".join(slow.tokens).split()) == 5
    assert plan_reply(user("/slow 1 999999"), None).delay_s == 10.0  # capped
    fail = plan_reply(user("/fail 3"), None)
    assert fail.fail_after_tokens == 3 and len(fail.tokens) > 3  # it cannot end before it fails
    assert plan_reply(user("/fail 0"), None).fail_after_tokens == 0
    hang = plan_reply(user("/hang"), None)
    assert hang.hang and "".join(hang.tokens) == HANG_LINE


def test_timeout_and_parallel_shape_the_agent_invoke_calls() -> None:
    [call] = plan_reply(user("/timeout 300 @coding-assistant /hang"), INVOKE).tool_calls
    assert json.loads(call.arguments) == {"agentSlug": "coding-assistant", "input": "/hang", "timeoutMs": 300}
    calls = plan_reply(user("/parallel 3 @coding-assistant write tests"), INVOKE).tool_calls
    assert [json.loads(c.arguments)["input"] for c in calls] == [f"write tests ({i}/3)" for i in (1, 2, 3)]
    assert len({c.id for c in calls}) == 3
    assert len(plan_reply(user("/parallel 99 @coding-assistant x"), INVOKE).tool_calls) == PARALLEL_MAX


async def test_slow_streams_at_its_own_pace_whatever_the_servers_delay() -> None:
    gateway = LLMGateway(demo_delay_s=0)
    started = time.monotonic()
    deltas = [e async for e in gateway.stream("local/demo", user("/slow 5 60")) if isinstance(e, TextDelta)]
    assert len(deltas) == 5 and time.monotonic() - started >= 0.28


async def test_a_failure_after_n_words_keeps_them_and_says_why(services: Services) -> None:
    chat = await chat_with(services)
    events = await run_turn(services, chat, "/fail 3")
    deltas = "".join(e.data["delta"] for e in events if e.type == "text-delta")
    assert len(deltas.split()) == 3
    [error] = [e.data for e in events if e.type == "error"]
    assert "after 3 words" in error["errorText"]


async def test_a_callee_that_hangs_runs_until_stop_and_ends_canceled(services: Services) -> None:
    chat = await chat_with(services)
    await services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text="@coding-assistant /hang")
    for _ in range(500):
        tasks = await all_tasks(services)
        if tasks and (info := services.hub.get(task_stream_key(tasks[0].id))) is not None and info.last_id > 3:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    assert services.chat.is_running(chat)  # it waits; nothing ends it but a stop
    assert await services.chat.cancel(chat)
    await services.chat.wait(chat, timeout=5)
    [task] = await all_tasks(services)
    assert task.state == "canceled"
    [callee_reply] = [m for m in await messages_of(services, task.session_id) if m.role == "assistant"]
    assert callee_reply.content == HANG_LINE and callee_reply.status == "canceled"


async def test_a_call_with_its_own_timeout_fails_when_the_callee_hangs(services: Services) -> None:
    chat = await chat_with(services)
    events = await run_turn(services, chat, "/timeout 300 @coding-assistant /hang")
    [output] = tool_outputs(events)
    assert output["isError"] is True and "did not finish within 0.3 s" in output["output"]["error"]
    [task] = await all_tasks(services)
    assert task.state == "failed"


async def test_a_call_cannot_ask_for_more_time_than_the_agent_allows(services: Services) -> None:
    from tests.test_delegation import set_invoke_config

    await set_invoke_config(services, "general-assistant", timeoutMs=300)
    chat = await chat_with(services)
    events = await run_turn(services, chat, "/timeout 60000 @coding-assistant /hang")
    [output] = tool_outputs(events)
    assert "did not finish within 0.3 s" in output["output"]["error"]


async def test_parallel_delegations_are_that_many_tasks_with_their_own_inputs(services: Services) -> None:
    chat = await chat_with(services)
    events = await run_turn(services, chat, "/parallel 3 @coding-assistant write tests")
    assert len(tool_outputs(events)) == 3
    tasks = await all_tasks(services)
    assert sorted(t.input for t in tasks) == [f"write tests ({i}/3)" for i in (1, 2, 3)]
    assert {t.state for t in tasks} == {"completed"}
