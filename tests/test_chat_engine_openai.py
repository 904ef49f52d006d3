"""The chat engine's turn loop against a real OpenAI-compatible server, through LiteLLM.

The services are the app's own (`Services.build/prepare/start/stop`, on SQLite and
PostgreSQL), the agent's model is `openai/test-model` with `llm_api_base` pointing at
the scripted server in tests/utils/openai_server.py, and the agent has a small real
tool (`echo`) registered in `services.tools`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from core.chat import agents as agents_store
from core.chat import sessions as sessions_store
from core.chat.llm import litellm_module
from core.chat.tools import ToolContext, ToolResult
from core.services import Services
from core.settings import Settings
from core.streaming.hub import BufferState, StreamEvent
from models import AgentMessage
from tests.conftest import make_settings
from tests.utils.openai_server import (
    OpenAIServer,
    broken,
    call,
    openai_server,  # noqa: F401  (the fixture)
    stall,
    text,
    tool_call,
    tool_calls,
)

MODEL = "openai/test-model"
ECHO_TYPE = "test-echo"
SYSTEM_PROMPT = "You repeat things with the echo tool."


@dataclass
class EchoTool:
    """A real tool: returns its `text` argument with the agent's configured prefix."""

    tool_type: str = ECHO_TYPE
    name: str = "echo"
    description: str = "Echo a text back, with a prefix."
    parameters: dict[str, Any] = field(
        default_factory=lambda: {
            "type": "object",
            "properties": {"text": {"type": "string", "description": "What to echo."}},
            "required": ["text"],
        }
    )
    calls: list[tuple[Any, dict[str, Any], ToolContext]] = field(default_factory=list)

    async def execute(self, arguments: Any, config: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Echo `arguments["text"]`; a failed result (never an exception) for bad input."""
        self.calls.append((arguments, config, ctx))
        if not isinstance(arguments, dict) or not isinstance(arguments.get("text"), str):
            return ToolResult(False, error="echo needs a string 'text'")
        return ToolResult(True, data=f"{config.get('prefix', '')}{arguments['text']}")


@pytest.fixture(scope="module", autouse=True)
def _litellm_imported() -> None:
    """Import litellm once up front (3-5 s), so no single test pays for it."""
    litellm_module()


@pytest.fixture
def settings(tmp_path: Path, database_url: str, openai_server: OpenAIServer) -> Settings:  # noqa: F811
    """Overrides conftest's: the default model and the API base point at the scripted server."""
    return make_settings(
        tmp_path,
        database_url=database_url,
        default_model=MODEL,
        llm_api_base=openai_server.api_base,
        llm_api_key="sk-test",
        llm_timeout_s=5,
    )


@pytest.fixture
def echo_tool(services: Services) -> EchoTool:
    """The echo tool, registered in the services' tool registry."""
    tool = EchoTool()
    services.tools.register(tool)
    return tool


@dataclass
class Chat:
    """A session of the local user with the echo agent."""

    session_id: str
    user_id: int
    agent_id: int


@pytest.fixture
async def chat(services: Services, echo_tool: EchoTool) -> Chat:
    """An agent on `openai/test-model` with the echo tool, and a new session with it."""
    user_id = services.auth.local_user_id
    assert user_id is not None
    async with services.db.session() as s:
        agent = await agents_store.create_agent(
            s,
            slug="echo-agent",
            name="Echo Agent",
            model=MODEL,
            system_prompt=SYSTEM_PROMPT,
            tools={ECHO_TYPE: {"prefix": ">> "}},
        )
        row = await sessions_store.create_session(s, user_id=user_id, agent_id=agent.id)
    return Chat(session_id=row.id, user_id=user_id, agent_id=agent.id)


async def run_turn(services: Services, chat: Chat, message: str, timeout: float = 10.0) -> list[StreamEvent]:
    """Start a turn, wait for it, and return exactly its events from the hub buffer."""
    turn = await services.chat.start_turn(session_id=chat.session_id, user_id=chat.user_id, text=message)
    subscription = services.hub.subscribe(turn.stream_key, after=turn.after_event_id)
    await services.chat.wait(chat.session_id, timeout=timeout)
    assert not services.chat.is_running(chat.session_id), "the turn did not end in time"
    events: list[StreamEvent] = []
    async with asyncio.timeout(5):
        async for event in subscription:
            events.append(event)
    return events


def event_types(events: list[StreamEvent]) -> list[str]:
    """Event types with runs of the same type collapsed (`text-delta` x5 -> one)."""
    types: list[str] = []
    for event in events:
        if not types or types[-1] != event.type:
            types.append(event.type)
    return types


async def saved_messages(services: Services, chat: Chat) -> list[AgentMessage]:
    """The session's messages as stored."""
    async with services.db.session() as s:
        return await sessions_store.list_messages(s, session_id=chat.session_id)


def tool_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `role: tool` messages of a request."""
    return [m for m in messages if m.get("role") == "tool"]


@asynccontextmanager
async def running_services(settings: Settings) -> AsyncIterator[Services]:
    """The app's services on `settings`: built, prepared, started, and stopped on exit."""
    services = Services.build(settings)
    services.prepare()
    await services.start()
    try:
        yield services
    finally:
        await services.stop()


# -- the happy path -------------------------------------------------------------------------


async def test_turn_with_tool_call_streams_events_in_order(
    services: Services,
    chat: Chat,
    openai_server: OpenAIServer,
    echo_tool: EchoTool,  # noqa: F811
) -> None:
    openai_server.script(
        tool_call(
            "echo",
            {"text": "hello"},
            id="call_echo_1",
            text_chunks=["Let me ", "echo that."],
            fragments=4,
            usage=(20, 6),
        ),
        text("The tool ", "said: ", ">> hello", usage=(40, 5)),
    )

    events = await run_turn(services, chat, "please echo hello")

    assert event_types(events) == [
        "start",
        "text-delta",
        "tool-input-available",
        "tool-output-available",
        "text-delta",
        "finish",
    ]
    by_type = {e.type: e.data for e in events}
    assert by_type["tool-input-available"] == {
        "toolCallId": "call_echo_1",
        "toolName": "echo",
        "input": {"text": "hello"},
    }
    output = by_type["tool-output-available"]
    assert output["toolCallId"] == "call_echo_1"
    assert output["isError"] is False
    assert output["output"] == {"ok": True, "output": ">> hello"}
    deltas = [e.data for e in events if e.type == "text-delta"]
    assert "".join(d["delta"] for d in deltas if d["id"] == "text-0") == "Let me echo that."
    assert "".join(d["delta"] for d in deltas if d["id"] == "text-1") == "The tool said: >> hello"
    assert by_type["finish"] == {"finishReason": "stop", "usage": {"inputTokens": 60, "outputTokens": 11}}
    assert services.hub.get(chat.session_id).state is BufferState.DONE

    [(arguments, config, ctx)] = echo_tool.calls
    assert arguments == {"text": "hello"}
    assert config == {"prefix": ">> "}
    assert (ctx.session_id, ctx.user_id, ctx.agent_id, ctx.tool_call_id) == (
        chat.session_id,
        chat.user_id,
        chat.agent_id,
        "call_echo_1",
    )


async def test_turn_sends_tool_call_and_tool_output_back_to_the_model(
    services: Services,
    chat: Chat,
    openai_server: OpenAIServer,  # noqa: F811
) -> None:
    openai_server.script(
        tool_call("echo", {"text": "hello"}, id="call_echo_1", text_chunks=["Echoing."]),
        text("Done."),
    )

    await run_turn(services, chat, "please echo hello")

    first, second = openai_server.requests
    for request in (first, second):
        assert request.headers["authorization"] == "Bearer sk-test"
        assert request.body["model"] == "test-model"
        assert request.tool_names == ["echo"]
        assert request.body["stream"] is True
    assert first.messages == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "please echo hello"},
    ]
    assert second.messages[:2] == first.messages
    assistant, tool = second.messages[2:]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == "Echoing."
    assert assistant["tool_calls"] == [
        {"id": "call_echo_1", "type": "function", "function": {"name": "echo", "arguments": '{"text": "hello"}'}},
    ]
    assert tool["role"] == "tool"
    assert tool["tool_call_id"] == "call_echo_1"
    assert json.loads(tool["content"]) == {"ok": True, "output": ">> hello"}
    assert openai_server.pending == 0


async def test_turn_saves_user_message_tool_step_and_final_text(
    services: Services,
    chat: Chat,
    openai_server: OpenAIServer,  # noqa: F811
) -> None:
    openai_server.script(
        tool_call("echo", {"text": "hello"}, id="call_echo_1", text_chunks=["Let me ", "echo that."], usage=(20, 6)),
        text("The tool said: ", ">> hello", usage=(40, 5)),
    )

    await run_turn(services, chat, "please echo hello")

    rows = await saved_messages(services, chat)
    assert [(r.role, r.status) for r in rows] == [
        ("user", "complete"),
        ("assistant", "complete"),
        ("assistant", "complete"),
    ]
    user, step, final = rows
    assert user.content == "please echo hello"
    assert step.content == "Let me echo that."
    assert step.model_id == MODEL
    assert (step.input_tokens, step.output_tokens) == (20, 6)
    assert step.tool_calls == [{"id": "call_echo_1", "name": "echo", "arguments": '{"text": "hello"}'}]
    [result] = step.tool_results
    assert result["toolCallId"] == "call_echo_1"
    assert result["toolName"] == "echo"
    assert result["isError"] is False
    assert result["output"] == {"ok": True, "output": ">> hello"}
    assert final.content == "The tool said: >> hello"
    assert final.model_id == MODEL
    assert (final.input_tokens, final.output_tokens) == (40, 5)
    assert final.tool_calls is None
    assert final.error is None
    assert user.sort_order < step.sort_order < final.sort_order


async def test_parallel_tool_calls_are_all_answered(
    services: Services,
    chat: Chat,
    openai_server: OpenAIServer,
    echo_tool: EchoTool,  # noqa: F811
) -> None:
    openai_server.script(
        tool_calls(call("echo", {"text": "one"}, id="call_a"), call("echo", {"text": "two"}, id="call_b")),
        text("Both echoed."),
    )

    events = await run_turn(services, chat, "echo one and two")

    inputs = [e.data["toolCallId"] for e in events if e.type == "tool-input-available"]
    outputs = {e.data["toolCallId"]: e.data["output"] for e in events if e.type == "tool-output-available"}
    assert inputs == ["call_a", "call_b"]
    assert outputs == {"call_a": {"ok": True, "output": ">> one"}, "call_b": {"ok": True, "output": ">> two"}}
    second = openai_server.requests[1]
    assert [(m["tool_call_id"], json.loads(m["content"])["output"]) for m in tool_messages(second.messages)] == [
        ("call_a", ">> one"),
        ("call_b", ">> two"),
    ]
    assert events[-1].type == "finish"
    assert sorted(a["text"] for a, _, _ in echo_tool.calls) == ["one", "two"]


async def test_history_with_tool_step_is_replayed_on_the_next_turn(
    services: Services,
    chat: Chat,
    openai_server: OpenAIServer,  # noqa: F811
) -> None:
    openai_server.script(
        tool_call("echo", {"text": "hello"}, id="call_echo_1", text_chunks=["Echoing."]),
        text("Done."),
        text("Second answer."),
    )
    await run_turn(services, chat, "please echo hello")

    events = await run_turn(services, chat, "and now?")

    assert event_types(events) == ["start", "text-delta", "finish"]
    third = openai_server.requests[2]
    assert [m["role"] for m in third.messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert third.messages[2]["tool_calls"][0]["id"] == "call_echo_1"
    assert third.messages[3]["tool_call_id"] == "call_echo_1"
    assert json.loads(third.messages[3]["content"]) == {"ok": True, "output": ">> hello"}
    assert third.messages[4] == {"role": "assistant", "content": "Done."}
    assert third.messages[5] == {"role": "user", "content": "and now?"}


# -- the model gets it wrong ----------------------------------------------------------------


async def test_malformed_tool_arguments_go_back_to_the_model_as_a_tool_error(
    services: Services,
    chat: Chat,
    openai_server: OpenAIServer,
    echo_tool: EchoTool,  # noqa: F811
) -> None:
    openai_server.script(
        tool_call("echo", '{"text": "unterminated', id="call_bad"),
        text("Sorry, ", "my arguments were broken."),
    )

    events = await run_turn(services, chat, "echo something")

    assert event_types(events) == [
        "start",
        "tool-input-available",
        "tool-output-available",
        "text-delta",
        "finish",
    ]
    output = next(e.data for e in events if e.type == "tool-output-available")
    assert output["isError"] is True
    assert output["output"]["ok"] is False
    assert "Invalid arguments for echo" in output["output"]["error"]
    assert echo_tool.calls == []  # the tool never saw the garbage

    second = openai_server.requests[1]
    [tool] = tool_messages(second.messages)
    assert tool["tool_call_id"] == "call_bad"
    payload = json.loads(tool["content"])
    assert payload["ok"] is False and "not valid JSON" in payload["error"]

    rows = await saved_messages(services, chat)
    assert [r.role for r in rows] == ["user", "assistant", "assistant"]
    assert rows[1].tool_results[0]["isError"] is True
    assert rows[2].content == "Sorry, my arguments were broken."
    assert rows[2].status == "complete"
    assert events[-1].data["finishReason"] == "stop"


async def test_unknown_tool_name_goes_back_to_the_model_as_a_tool_error(
    services: Services,
    chat: Chat,
    openai_server: OpenAIServer,
    echo_tool: EchoTool,  # noqa: F811
) -> None:
    openai_server.script(
        tool_call("shell_exec", {"cmd": "rm -rf /"}, id="call_unknown"),
        text("That tool does not exist; ", "here is my answer instead."),
    )

    events = await run_turn(services, chat, "do something dangerous")

    assert event_types(events) == [
        "start",
        "tool-input-available",
        "tool-output-available",
        "text-delta",
        "finish",
    ]
    output = next(e.data for e in events if e.type == "tool-output-available")
    assert output["isError"] is True
    assert "shell_exec" in output["output"]["error"] and "echo" in output["output"]["error"]
    assert echo_tool.calls == []

    [tool] = tool_messages(openai_server.requests[1].messages)
    assert tool["tool_call_id"] == "call_unknown"
    assert "no tool named 'shell_exec'" in json.loads(tool["content"])["error"]

    rows = await saved_messages(services, chat)
    assert rows[-1].content == "That tool does not exist; here is my answer instead."
    assert rows[-1].status == "complete"


# -- the model fails ------------------------------------------------------------------------


async def test_model_error_mid_stream_saves_partial_text_with_error_status(
    services: Services,
    chat: Chat,
    openai_server: OpenAIServer,  # noqa: F811
) -> None:
    openai_server.script(broken(["Partial ", "answer"]))

    events = await run_turn(services, chat, "tell me a story")

    assert event_types(events) == ["start", "text-delta", "error", "finish"]
    error_text = next(e.data["errorText"] for e in events if e.type == "error")
    assert error_text
    assert events[-1].data["finishReason"] == "error"
    info = services.hub.get(chat.session_id)
    assert info.state is BufferState.ERROR and info.error == error_text

    rows = await saved_messages(services, chat)
    assert [r.role for r in rows] == ["user", "assistant"]
    assert rows[0].content == "tell me a story"
    partial = rows[1]
    assert partial.content == "Partial answer"
    assert partial.status == "error"
    assert partial.error == error_text
    assert partial.model_id == MODEL


async def test_model_error_after_a_tool_step_keeps_the_step(
    services: Services,
    chat: Chat,
    openai_server: OpenAIServer,  # noqa: F811
) -> None:
    openai_server.script(
        tool_call("echo", {"text": "hello"}, id="call_echo_1", text_chunks=["Echoing."]),
        broken(["The tool said"]),
    )

    events = await run_turn(services, chat, "please echo hello")

    assert event_types(events) == [
        "start",
        "text-delta",
        "tool-input-available",
        "tool-output-available",
        "text-delta",
        "error",
        "finish",
    ]
    rows = await saved_messages(services, chat)
    assert [(r.role, r.status) for r in rows] == [
        ("user", "complete"),
        ("assistant", "complete"),
        ("assistant", "error"),
    ]
    assert rows[1].tool_results[0]["output"] == {"ok": True, "output": ">> hello"}
    assert rows[2].content == "The tool said"


async def test_model_stall_fails_the_turn_with_a_timeout(
    tmp_path: Path,
    openai_server: OpenAIServer,  # noqa: F811
) -> None:
    # SQLite only: the database plays no part in how a read timeout is handled.
    settings = make_settings(
        tmp_path, default_model=MODEL, llm_api_base=openai_server.api_base, llm_api_key="sk-test", llm_timeout_s=0.5
    )
    async with running_services(settings) as services:
        echo = EchoTool()
        services.tools.register(echo)
        async with services.db.session() as s:
            agent = await agents_store.create_agent(
                s, slug="echo-agent", name="Echo", model=MODEL, tools={ECHO_TYPE: {}}
            )
            row = await sessions_store.create_session(s, user_id=services.auth.local_user_id, agent_id=agent.id)
        chat = Chat(session_id=row.id, user_id=services.auth.local_user_id, agent_id=agent.id)
        openai_server.script(stall(["Thinking"], seconds=10))

        events = await run_turn(services, chat, "hello?")

        assert event_types(events) == ["start", "text-delta", "error", "finish"]
        assert "LLM_TIMEOUT_S" in next(e.data["errorText"] for e in events if e.type == "error")
        rows = await saved_messages(services, chat)
        assert [(r.role, r.status, r.content) for r in rows] == [
            ("user", "complete", "hello?"),
            ("assistant", "error", "Thinking"),
        ]
