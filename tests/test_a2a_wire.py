"""The A2A stream's JSON: events written by hand are exactly what the SDK would write (Divergence #4)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from a2a.types import Message, Part, Role, TaskState, TaskStatus, TaskStatusUpdateEvent
from a2a.utils.errors import TaskNotFoundError
from a2a.utils.proto_utils import to_stream_response
from google.protobuf.json_format import MessageToDict

from core.a2a import protocol as wire
from core.a2a.protocol import jsonrpc as wire_jsonrpc
from core.a2a.protocol import text_updates as wire_text_updates

#: Texts of tokens: empty, blank, escapes JSON needs, a NUL and a line separator, long.
TEXTS = ["Hello", "", " ", '汉字 and “quotes” "escaped" \\ \n\t', "\u0000\u2028 emoji 🧪", "x" * 5000]


def sdk_result(event) -> dict:
    """What the SDK's dispatcher sends for `event` (`_map_event` in a2a-sdk 1.3.0)."""
    return {
        "result": MessageToDict(to_stream_response(event), preserving_proto_field_name=False),
        "id": 7,
        "jsonrpc": "2.0",
    }


def test_text_updates_are_written_by_hand_to_exactly_the_sdks_json() -> None:
    events = wire.TaskEvents("task-1", "context-1")
    for text in TEXTS:
        update = events.text(text)
        assert wire_text_updates.text_update_json(update) is not None, "the token's shape goes the fast way"
        assert wire_jsonrpc._stream_result(7, update) == sdk_result(update), repr(text)
    working = events.state("working")
    assert wire_text_updates.text_update_json(working) is not None
    assert wire_jsonrpc._stream_result(7, working) == sdk_result(working)


def test_plain_text_updates_are_the_same_event_and_the_same_json_as_the_sdks() -> None:
    for task_id, context_id in [("task-1", "context-1"), ("task-1", ""), ("", "")]:
        plain, proto = wire.TaskEvents(task_id, context_id), wire.TaskEvents(task_id, context_id)
        for text in TEXTS:
            update, event = plain.text_update(text), proto.text(text)
            assert isinstance(update, wire.TextUpdate)
            assert update.to_proto() == event, "the same event, message id included"
            assert wire_jsonrpc._stream_result(7, update) == sdk_result(event), (task_id, context_id, text)


def test_events_of_other_shapes_go_the_sdks_way_with_the_same_json() -> None:
    events = wire.TaskEvents("task-1", "context-1")
    with_metadata = events.text("a")
    with_metadata.metadata["k"] = "v"
    message_metadata = events.text("b")
    message_metadata.status.message.metadata["k"] = "v"
    data_part = TaskStatusUpdateEvent(
        task_id="t",
        context_id="c",
        status=TaskStatus(
            state=TaskState.TASK_STATE_WORKING,
            message=Message(message_id="m", role=Role.ROLE_AGENT, parts=[Part(text="a"), Part(url="https://x")]),
        ),
    )
    named_part = TaskStatusUpdateEvent(
        task_id="t",
        context_id="c",
        status=TaskStatus(
            state=TaskState.TASK_STATE_WORKING,
            message=Message(message_id="m", role=Role.ROLE_AGENT, parts=[Part(text="a", media_type="text/plain")]),
        ),
    )
    others = [
        events.state("failed", error="boom", when=datetime(2026, 12, 5, 8, 30, tzinfo=UTC)),  # a timestamp
        events.result("the whole answer"),  # an artifact
        with_metadata,
        message_metadata,
        data_part,
        named_part,
    ]
    for event in others:
        assert wire_text_updates.text_update_json(event) is None, event
        assert wire_jsonrpc._stream_result(7, event) == sdk_result(event)
    # Shapes it does know, written by hand: no timestamp, an error message, an unset role.
    known = [
        events.state("completed"),
        events.state("failed", error="boom"),
        TaskStatusUpdateEvent(
            task_id="t",
            status=TaskStatus(
                state=TaskState.TASK_STATE_WORKING, message=Message(message_id="m", parts=[Part(text="a")])
            ),
        ),
    ]
    for event in known:
        assert wire_text_updates.text_update_json(event) is not None, event
        assert wire_jsonrpc._stream_result(7, event) == sdk_result(event)


async def test_a_stream_that_fails_midway_ends_with_the_errors_json_rpc_response() -> None:
    events = wire.TaskEvents("task-1", "context-1")

    async def stream():
        yield events.text("one")
        raise TaskNotFoundError(message="gone")

    source = stream()
    first = await anext(source)
    sent = [item async for item in wire_jsonrpc._stream_results(3, source, first)]
    assert sent[0]["result"]["statusUpdate"]["status"]["message"]["parts"] == [{"text": "one"}]
    assert sent[1]["id"] == 3 and sent[1]["error"]["code"] == -32001
    assert sent[1]["error"]["message"] == "gone"


@pytest.mark.parametrize("first", [None, "x"])
async def test_a_stream_ends_after_its_last_event(first) -> None:
    events = wire.TaskEvents("task-1", "context-1")

    async def empty():
        return
        yield  # an async generator with no events

    sent = [item async for item in wire_jsonrpc._stream_results(1, empty(), events.text(first) if first else None)]
    assert len(sent) == (0 if first is None else 1)
