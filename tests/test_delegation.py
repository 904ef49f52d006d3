"""Delegation (seed 000 §3.5.1): the agent_invoke tool, tasks, limits, cancel cascade, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlmodel import select

from core.chat import agents as agents_store
from core.chat import sessions as sessions_store
from core.chat.agents import AGENT_INVOKE, DEFAULT_AGENT_INVOKE_CONFIG
from core.chat.demo_model import _echo, find_mentions
from core.chat.tools import ToolContext
from core.delegation import parse_invoke_arguments, task_stream_key
from core.delegation.tasks import SUBMITTED
from core.services import Services
from core.streaming.events import NO_PREVIOUS_STATE, Event, TaskStarted, TaskState, from_stream
from core.streaming.hub import StreamEvent
from models import A2ATaskSession, AgentMessage, AgentTool
from tests.conftest import make_settings


async def chat_with(services: Services, slug: str = "general-assistant") -> str:
    async with services.db.session() as s:
        agent = await agents_store.get_agent_by_slug(s, slug)
        chat = await sessions_store.create_session(s, user_id=services.auth.local_user_id, agent_id=agent.id)
    return chat.id


async def run_turn(services: Services, session_id: str, text: str) -> list[StreamEvent]:
    turn = await services.chat.start_turn(session_id=session_id, user_id=services.auth.local_user_id, text=text)
    events = [e async for e in services.hub.subscribe(turn.stream_key, after=turn.after_event_id)]
    await services.chat.wait(session_id, timeout=10)
    return events


async def all_tasks(services: Services) -> list[A2ATaskSession]:
    async with services.db.session() as s:
        return list((await s.exec(select(A2ATaskSession).order_by(A2ATaskSession.created_at))).all())


async def messages_of(services: Services, session_id: str) -> list[AgentMessage]:
    async with services.db.session() as s:
        return await sessions_store.list_messages(s, session_id=session_id)


async def set_invoke_config(services: Services, slug: str, **config) -> None:
    async with services.db.session() as s:
        agent = await agents_store.get_agent_by_slug(s, slug)
        row = (
            await s.exec(select(AgentTool).where(AgentTool.agent_id == agent.id, AgentTool.tool_type == AGENT_INVOKE))
        ).one()
        row.config = {**row.config, **config}
        s.add(row)
        await s.commit()


def tool_outputs(events: list[StreamEvent]) -> list[dict]:
    return [e.data for e in events if e.type == "tool-output-available"]


# -- the happy path --------------------------------------------------------------------------


async def test_a_mention_runs_the_callee_into_its_buffer_and_saves_its_messages(services: Services) -> None:
    chat = await chat_with(services)
    events = await run_turn(services, chat, "@coding-assistant write hello")
    types = [e.type for e in events]
    started = [e for e in events if e.type == "a2a-task-started"]
    assert len(started) == 1
    task_id = started[0].data["taskId"]
    assert started[0].data["calleeAgentSlug"] == "coding-assistant"
    assert started[0].data["calleeAgentName"] == "Coding Assistant"
    call_id = next(e.data["toolCallId"] for e in events if e.type == "tool-input-available")
    assert started[0].data["toolCallId"] == call_id
    # Announced before its output, and the caller's answer continues after it.
    assert types.index("a2a-task-started") < types.index("tool-output-available") < len(types) - 1
    [output] = tool_outputs(events)
    expected = _echo("write hello", wants_code=True)
    assert output["isError"] is False and output["output"]["output"] == expected
    metadata = output["metadata"]
    assert metadata["taskId"] == task_id and metadata["agentSlug"] == "coding-assistant"
    assert metadata["recursionDepth"] == 1 and isinstance(metadata["durationMs"], int)
    final_text = "".join(e.data["delta"] for e in events if e.type == "text-delta" and e.data["id"] == "text-1")
    assert expected.splitlines()[0] in final_text  # the caller's model quoted the callee

    # The task buffer: submitted, working, the callee's stream, completed, done.
    task_events = [e async for e in services.hub.subscribe(task_stream_key(task_id))]
    kinds = [e.type for e in task_events]
    assert kinds[:2] == ["state", "state"] and kinds[-2:] == ["state", "done"]
    assert [e.data["state"] for e in task_events if e.type == "state"] == ["submitted", "working", "completed"]
    streamed = [e.data["delta"] for e in task_events if e.type == "text-delta"]
    assert len(streamed) > 10 and "".join(streamed) == expected
    assert task_events[-1].data["state"] == "completed"

    [task] = await all_tasks(services)
    assert (task.id, task.state, task.visible_in_sidebar, task.recursion_depth) == (task_id, "completed", 0, 1)
    assert task.caller_session_id == chat and task.callee_agent_slug == "coding-assistant"
    assert task.input == "write hello" and task.tool_call_id == call_id and task.finished_at is not None
    assert task.output_tokens == len(streamed) and task.input_tokens > 0
    user, answer = await messages_of(services, task.session_id)
    async with services.db.session() as s:
        general = await agents_store.get_agent_by_slug(s, "general-assistant")
    for row in (user, answer):
        assert (row.source, row.a2a_task_id, row.caller_session_id) == ("a2a", task_id, chat)
        assert row.caller_agent_id == general.id
    assert (user.role, user.content) == ("user", "write hello")
    assert (answer.role, answer.content, answer.model_id) == ("assistant", expected, "local/demo")
    assert answer.output_tokens == len(streamed)


async def external_task_watched(services: Services, event_name: str, listener) -> A2ATaskSession:
    """Run an A2A caller's task ("write hello" to coding-assistant) to its end with `listener` on the engine."""
    event.listen(services.db.engine.sync_engine, event_name, listener)
    try:
        started = await services.delegation.start_external_task(
            "coding-assistant", "write hello", user_id=services.auth.local_user_id
        )
        await services.delegation.wait_external_task(started.id, timeout=10)
    finally:
        event.remove(services.db.engine.sync_engine, event_name, listener)
    return started


async def test_a_tasks_records_are_written_in_three_units_of_work(services: Services) -> None:
    # Every task's start and end pay for their transactions: the start, `working`, the end.
    commits: list[object] = []

    def count(connection) -> None:
        commits.append(connection)

    started = await external_task_watched(services, "commit", count)
    task_id = started.id
    assert len(commits) == 3
    [task] = await all_tasks(services)
    assert (task.id, task.state, task.error) == (task_id, "completed", None)
    assert task.finished_at is not None and task.output_tokens > 0 and task.input_tokens > 0
    user, answer = await messages_of(services, task.session_id)
    assert (user.role, user.content, answer.role) == ("user", "write hello", "assistant")
    assert answer.content == _echo("write hello", wants_code=True)


async def test_a_tasks_records_do_not_read_back_the_session_they_write(services: Services) -> None:
    # The start inserts the hidden session, the task and the input: a session made in the same
    # transaction has no messages to number after and needs no second write of its time. The end
    # bumps that time with one UPDATE and reads nothing of the session row.
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        statements.append(" ".join(statement.split()))

    started = await external_task_watched(services, "before_cursor_execute", record)

    def count(prefix: str) -> int:  # PostgreSQL's row lock before an append is not a read of the row
        return sum(1 for s in statements if s.startswith(prefix) and not s.endswith("FOR UPDATE"))

    assert count("INSERT INTO agent_sessions") == 1
    assert count("SELECT agent_sessions.") == 0
    assert count("UPDATE agent_sessions") == 1  # the end's
    # The end's answer goes after the input: its INSERT numbers it after the highest position itself (issue 41).
    assert count("SELECT max(agent_messages.sort_order)") == 0
    assert sum(1 for s in statements if s.startswith("INSERT INTO agent_messages") and "max(" in s) == 1
    [task] = await all_tasks(services)
    # What the A2A server answers with at once (the first Task of a stream): the row as the task started.
    assert (started.id, started.state, started.session_id, started.input) == (
        task.id,
        "submitted",
        task.session_id,
        "write hello",
    )
    user, answer = await messages_of(services, task.session_id)
    assert (user.sort_order, answer.sort_order) == (1, 2)
    async with services.db.session() as s:
        hidden = await sessions_store.get_session(s, task.session_id)
    assert hidden.title == "Task: write hello" and hidden.updated_at > hidden.created_at


async def test_task_sessions_stay_out_of_the_session_list(services: Services) -> None:
    chat = await chat_with(services)
    await run_turn(services, chat, "@coding-assistant one @coding-assistant two")
    tasks = await all_tasks(services)
    assert len(tasks) == 2
    listed = [s.id for s in await services.workspace.sessions(services.auth.local_user_id)]
    assert listed == [chat]
    audited = await services.delegation.list_tasks(services.auth.local_user_id)
    assert {t.id for t in audited} == {t.id for t in tasks}


async def test_two_mentions_are_two_tasks_in_order(services: Services) -> None:
    chat = await chat_with(services)
    events = await run_turn(services, chat, "@coding-assistant first @coding-assistant second")
    started = [e.data for e in events if e.type == "a2a-task-started"]
    views = await services.delegation.tasks_of_session(services.auth.local_user_id, chat)
    assert [v.input for v in views] == ["first", "second"]
    assert [s["taskId"] for s in started] == [v.id for v in views]
    assert all(v.state == "completed" for v in views)


async def test_a_nested_delegation_is_a_child_task(services: Services) -> None:
    chat = await chat_with(services)
    events = await run_turn(services, chat, "@planner plan it @@coding-assistant code it")
    [outer] = [e.data for e in events if e.type == "a2a-task-started"]
    views = await services.delegation.tasks_of_session(services.auth.local_user_id, chat)
    assert [(v.callee_agent_slug, v.recursion_depth) for v in views] == [("planner", 1), ("coding-assistant", 2)]
    parent, child = views
    assert parent.id == outer["taskId"] and child.parent_task_id == parent.id
    assert parent.input == "plan it @coding-assistant code it" and child.input == "code it"
    assert child.caller_session_id == parent.session_id and child.caller_agent_slug == "planner"
    # The child is announced in its parent's buffer, which is how the panel nests it.
    parent_events = [e async for e in services.hub.subscribe(task_stream_key(parent.id))]
    [nested] = [e.data for e in parent_events if e.type == "a2a-task-started"]
    assert nested["taskId"] == child.id and nested["parentTaskId"] == parent.id and nested["recursionDepth"] == 2
    detail = await services.delegation.task_detail(services.auth.local_user_id, parent.id)
    assert [c.id for c in detail.children] == [child.id]


# -- refusals: a tool error for the model, no task, no panel --------------------------------


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ("not json at all", "JSON object"),
        ([1, 2], "JSON object"),
        ({"input": "hi"}, '"agentSlug" is required'),
        ({"agentSlug": 7, "input": "hi"}, '"agentSlug" is required'),
        ({"agentSlug": "coding-assistant"}, '"input" is required'),
        ({"agentSlug": "coding-assistant", "input": ["a"]}, '"input" is required'),
        ({"agentSlug": "coding-assistant", "input": "   "}, '"input" is required'),
    ],
)
def test_malformed_arguments_are_explained(arguments, says) -> None:
    with pytest.raises(ValueError, match=says):
        parse_invoke_arguments(arguments)


async def invoke(services: Services, arguments, *, chain=("general-assistant",), depth=0, **config):
    async with services.db.session() as s:
        general = await agents_store.get_agent_by_slug(s, "general-assistant")
    emitted: list[Event] = []

    async def emit(event: Event) -> None:
        emitted.append(event)

    chat = await chat_with(services)
    ctx = ToolContext(
        user_id=services.auth.local_user_id,
        agent_id=general.id,
        agent_slug="general-assistant",
        session_id=chat,
        recursion_depth=depth,
        tool_call_id="call_1",
        chain=chain,
        emit=emit,
    )
    result = await services.delegation.invoke(arguments, {**DEFAULT_AGENT_INVOKE_CONFIG, **config}, ctx)
    return result, emitted


@pytest.mark.parametrize(
    ("arguments", "config", "depth", "chain", "says"),
    [
        ("{oops", {}, 0, ("general-assistant",), "Invalid agent_invoke call"),
        ({"agentSlug": "nobody", "input": "hi"}, {}, 0, ("general-assistant",), "There is no agent 'nobody'"),
        ({"agentSlug": "coding-assistant", "input": "hi"}, {"maxRecursionDepth": 2}, 2, ("a", "b", "c"), "limit is 2"),
        ({"agentSlug": "general-assistant", "input": "hi"}, {}, 0, ("general-assistant",), "would loop"),
        (
            {"agentSlug": "coding-assistant", "input": "hi"},
            {"allowedAgents": ["planner"]},
            0,
            ("general-assistant",),
            "not one of the agents this agent may call (planner)",
        ),
    ],
    ids=["not-json", "unknown-callee", "too-deep", "cycle", "not-allowed"],
)
async def test_refusals_are_tool_errors_without_a_task(services, arguments, config, depth, chain, says) -> None:
    result, emitted = await invoke(services, arguments, chain=chain, depth=depth, **config)
    assert result.success is False and says in result.error
    assert emitted == []  # no a2a-task-started: no panel opens
    assert await all_tasks(services) == []


async def test_a_started_task_is_told_to_the_caller_as_a_typed_event(services: Services) -> None:
    """The caller's `ToolContext.emit` gets one `TaskStarted` for the task; its stream starts from "unknown"."""
    result, emitted = await invoke(services, {"agentSlug": "coding-assistant", "input": "write hello"})
    [task] = await all_tasks(services)
    assert result.success is True
    assert emitted == [TaskStarted(task.id, "coding-assistant", result.metadata["calleeAgentName"], "call_1", None, 1)]
    subscription = services.hub.subscribe(task_stream_key(task.id))
    try:
        first = await anext(aiter(subscription))
    finally:
        subscription.close()
    assert from_stream(first.type, first.data) == TaskState(SUBMITTED, NO_PREVIOUS_STATE, first.data["timestamp"])


async def test_unknown_callee_error_lists_the_agents_one_may_call(services: Services) -> None:
    result, _ = await invoke(services, {"agentSlug": "nobody", "input": "hi"})
    assert "coding-assistant" in result.error and "general-assistant" not in result.error


async def test_a_callee_that_calls_back_up_the_chain_is_refused(services: Services) -> None:
    """General → planner → general would be a cycle: planner's call is refused, the outer task completes."""
    chat = await chat_with(services)
    await run_turn(services, chat, "@planner ask @@general-assistant to help")
    [task] = await all_tasks(services)  # no second task was created
    assert task.callee_agent_slug == "planner" and task.state == "completed"
    answer = (await messages_of(services, task.session_id))[1]
    [result] = answer.tool_results
    assert result["isError"] is True and "would loop" in result["output"]["error"]


async def test_the_model_reads_a_refusal_and_answers_anyway(services: Services) -> None:
    chat = await chat_with(services)
    events = await run_turn(services, chat, "@nobody do this")
    [output] = tool_outputs(events)
    assert output["isError"] is True and "There is no agent 'nobody'" in output["output"]["error"]
    assert not [e for e in events if e.type == "a2a-task-started"]
    assert events[-1].type == "finish" and events[-1].data["finishReason"] == "stop"


# -- failures, timeouts, cancellation -----------------------------------------------------------


async def test_a_callee_failing_mid_stream_fails_the_task_and_keeps_its_text(services: Services) -> None:
    chat = await chat_with(services)
    events = await run_turn(services, chat, "@coding-assistant /error")
    [output] = tool_outputs(events)
    assert output["isError"] is True and "failed" in output["output"]["error"]
    [task] = await all_tasks(services)
    assert task.state == "failed" and task.error
    task_events = [e async for e in services.hub.subscribe(task_stream_key(task.id))]
    assert "error" in [e.type for e in task_events]
    assert task_events[-1].type == "done" and task_events[-1].data["state"] == "failed"
    partial = "".join(e.data["delta"] for e in task_events if e.type == "text-delta")
    saved = await messages_of(services, task.session_id)
    assert saved[-1].role == "assistant" and saved[-1].content == partial and partial
    assert saved[-1].status == "error"


@pytest.fixture
async def slow_services(tmp_path: Path, database_url: str):
    """Services whose demo model takes 10 ms per token (long enough to stop things midway)."""
    built = Services.build(make_settings(tmp_path, database_url=database_url, demo_model_delay_ms=10))
    built.prepare()
    await built.start()
    try:
        yield built
    finally:
        await built.stop()


async def test_a_callee_past_its_timeout_is_stopped_and_the_task_fails(slow_services: Services) -> None:
    services = slow_services
    await set_invoke_config(services, "general-assistant", timeoutMs=400)
    chat = await chat_with(services)
    events = await run_turn(services, chat, "@coding-assistant /lorem 500")
    [output] = tool_outputs(events)
    assert output["isError"] is True and "did not finish within 0.4 s" in output["output"]["error"]
    [task] = await all_tasks(services)
    assert task.state == "failed" and "did not finish within 0.4 s" in task.error
    task_events = [e async for e in services.hub.subscribe(task_stream_key(task.id))]
    errors = [e.data["errorText"] for e in task_events if e.type == "error"]
    assert errors and "did not finish" in errors[0]
    saved = await messages_of(services, task.session_id)
    assert saved[-1].status == "error" and 0 < len(saved[-1].content.split()) < 500


async def test_a_timeout_says_once_that_the_callee_failed(services: Services) -> None:
    """Issue 40: "…failed: Coding Assistant failed: Coding Assistant did not finish…" said it twice."""
    chat = await chat_with(services)
    events = await run_turn(services, chat, "/timeout 300 @coding-assistant /hang")
    [output] = tool_outputs(events)
    error = output["output"]["error"]
    assert error.startswith("Coding Assistant did not finish within 0.3 s and was stopped."), error
    assert error.count("Coding Assistant") == 1, error
    reply = "".join(e.data["delta"] for e in events if e.type == "text-delta")
    assert "did not finish within 0.3 s" in reply
    assert reply.count("failed") == 1 and reply.count("Coding Assistant") == 1, reply


async def test_stopping_the_caller_cancels_the_delegations_down_the_chain(slow_services: Services) -> None:
    services = slow_services
    chat = await chat_with(services)
    await services.chat.start_turn(
        session_id=chat, user_id=services.auth.local_user_id, text="@planner go @@coding-assistant /lorem 2000"
    )
    for _ in range(500):  # until the grandchild streams
        tasks = await all_tasks(services)
        if len(tasks) == 2 and tasks[1].state == "working":
            info = services.hub.get(task_stream_key(tasks[1].id))
            if info is not None and info.last_id > 20:
                break
        await asyncio.sleep(0.01)
    else:
        pytest.fail("the nested delegation never started streaming")
    assert await services.chat.cancel(chat)
    await services.chat.wait(chat, timeout=5)
    tasks = await all_tasks(services)
    assert [t.state for t in tasks] == ["canceled", "canceled"]
    for task in tasks:
        info = services.hub.get(task_stream_key(task.id))
        assert info is not None and info.state != "open"
        last = [e async for e in services.hub.subscribe(task_stream_key(task.id))][-1]
        assert last.type == "done" and last.data["state"] == "canceled"
    grandchild = await messages_of(services, tasks[1].session_id)
    assert grandchild[-1].status == "canceled" and 0 < len(grandchild[-1].content.split()) < 2000


def test_double_at_passes_a_mention_on_to_the_callee() -> None:
    assert find_mentions("@planner ask @@coding-assistant for code") == [("planner", "ask @coding-assistant for code")]


# -- remote callees through the registry ------------------------------------------------------


class ScriptedRemoteAgent:
    """A remote agent adapter that replays a script of events (the real adapters have their own tests)."""

    kind = "test"

    def __init__(self, agent_id: str, events: list, *, pause_s: float = 0.0) -> None:
        self.id, self.name, self.description = agent_id, agent_id.title(), "scripted"
        self.events, self.pause_s = events, pause_s
        self.requests: list[tuple[str, str]] = []
        self.cancelled = False

    def card(self) -> dict:
        return {"name": self.name, "description": self.description, "skills": []}

    def visible_to(self, agent_id) -> bool:
        return True

    async def stream(self, text: str, *, task_id: str, context_id: str | None = None, ask: Any = None):
        self.requests.append((text, task_id))
        try:
            for event in self.events:
                await asyncio.sleep(self.pause_s)
                yield event
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def test_a_remote_agent_in_the_registry_is_delegated_to_like_a_local_one(services: Services) -> None:
    from core.delegation.registry import RemoteEvent

    remote = ScriptedRemoteAgent(
        "weather",
        [
            RemoteEvent(state="working"),
            RemoteEvent(text="Sunny, "),
            RemoteEvent(text="22 °C."),
            RemoteEvent(state="completed", final=True),
        ],
    )
    await services.registry.claim(remote)
    chat = await chat_with(services)
    events = await run_turn(services, chat, "@weather in Paris?")
    [started] = [e.data for e in events if e.type == "a2a-task-started"]
    assert started["calleeAgentName"] == "Weather"
    [output] = tool_outputs(events)
    assert output["isError"] is False and output["output"]["output"] == "Sunny, 22 °C."
    [task] = await all_tasks(services)
    assert remote.requests == [("in Paris?", task.id)]
    assert task.state == "completed" and task.callee_agent_id is None and task.callee_agent_slug == "weather"
    _, answer = await messages_of(services, task.session_id)
    assert (answer.content, answer.model_id, answer.source) == ("Sunny, 22 °C.", "a2a/weather", "a2a")
    deltas = [e.data["delta"] async for e in services.hub.subscribe(task_stream_key(task.id)) if e.type == "text-delta"]
    assert deltas == ["Sunny, ", "22 °C."]


@pytest.mark.parametrize(
    ("script", "says"),
    [
        ("failed", "reported that the task failed"),
        ("no-final", "without a final state"),
    ],
)
async def test_a_remote_agent_that_fails_or_just_stops_fails_the_task(services: Services, script, says) -> None:
    from core.delegation.registry import RemoteEvent

    events = [RemoteEvent(text="partial")]
    if script == "failed":
        events.append(RemoteEvent(state="failed", final=True))
    await services.registry.claim(ScriptedRemoteAgent("flaky", events))
    chat = await chat_with(services)
    turn_events = await run_turn(services, chat, "@flaky try")
    [output] = tool_outputs(turn_events)
    assert output["isError"] is True and says in output["output"]["error"]
    [task] = await all_tasks(services)
    assert task.state == "failed" and says in task.error
    _, answer = await messages_of(services, task.session_id)
    assert answer.content == "partial" and answer.status == "error"


async def test_stopping_the_caller_cancels_the_remote_stream(services: Services) -> None:
    from core.delegation.registry import RemoteEvent

    remote = ScriptedRemoteAgent("slow", [RemoteEvent(text="tick ")] * 1000, pause_s=0.01)
    await services.registry.claim(remote)
    chat = await chat_with(services)
    await services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text="@slow go")
    for _ in range(300):
        tasks = await all_tasks(services)
        if tasks and (info := services.hub.get(task_stream_key(tasks[0].id))) and info.last_id > 5:
            break
        await asyncio.sleep(0.01)
    assert await services.chat.cancel(chat)
    await services.chat.wait(chat, timeout=5)
    [task] = await all_tasks(services)
    assert task.state == "canceled" and remote.cancelled
    _, answer = await messages_of(services, task.session_id)
    assert answer.status == "canceled" and answer.content.startswith("tick ")


async def test_the_registry_refuses_ids_that_are_taken(services: Services) -> None:
    from core.delegation.registry import IdTakenError

    with pytest.raises(IdTakenError, match="local agent"):
        await services.registry.claim(ScriptedRemoteAgent("coding-assistant", []))
    first = ScriptedRemoteAgent("twin", [])
    await services.registry.claim(first)
    with pytest.raises(IdTakenError, match="already connected"):
        await services.registry.claim(ScriptedRemoteAgent("twin", []))
    await services.registry.release("twin", ScriptedRemoteAgent("twin", []))  # not that instance: stays
    assert services.registry.remote("twin") is first
    await services.registry.release("twin", first)
    assert services.registry.remote("twin") is None


async def test_tasks_cut_off_by_a_stop_are_failed_at_the_next_start(settings) -> None:
    from models import utcnow

    first = Services.build(settings)
    first.prepare()
    chat = await chat_with(first)
    async with first.db.session() as s:
        hidden = await sessions_store.create_session(s, user_id=first.auth.local_user_id, agent_id=1)
        s.add(
            A2ATaskSession(
                id="cutoff",
                session_id=hidden.id,
                callee_agent_slug="coding-assistant",
                caller_user_id=first.auth.local_user_id,
                caller_session_id=chat,
                state="working",
                created_at=utcnow(),
                updated_at=utcnow(),
            )
        )
        await s.commit()
    await first.db.close()

    second = Services.build(settings)
    second.prepare()
    try:
        [task] = await all_tasks(second)
        assert task.state == "failed" and "server stopped" in task.error and task.finished_at is not None
    finally:
        await second.db.close()
