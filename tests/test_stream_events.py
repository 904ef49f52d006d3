"""The typed stream events (`core.streaming.events`): their exact wire, round trips, and refusals."""

from __future__ import annotations

import json

import pytest

from core.streaming import events as ev
from core.streaming.hub import StreamHub
from core.streaming.sse import _hub_frame

# Every kind once, with the JSON a chat stream's SSE frame carries for it (`{"type": kind, **payload}`), as
# the app sent it before the types existed: key order included, since the wire is compared byte for byte.
WIRES: list[tuple[ev.Event, str]] = [
    (ev.Start("msg_1"), '{"type":"start","messageId":"msg_1"}'),
    (ev.TextDelta("text-0", "Hé"), '{"type":"text-delta","id":"text-0","delta":"Hé"}'),
    (
        ev.ToolInput("call_1", "agent_invoke", {"agentSlug": "a", "input": "x"}),
        '{"type":"tool-input-available","toolCallId":"call_1","toolName":"agent_invoke",'
        '"input":{"agentSlug":"a","input":"x"}}',
    ),
    (
        ev.ToolOutput("call_1", {"ok": True, "output": "y"}, {"durationMs": 3}, False),
        '{"type":"tool-output-available","toolCallId":"call_1","output":{"ok":true,"output":"y"},'
        '"metadata":{"durationMs":3},"isError":false}',
    ),
    (
        ev.TaskStarted("t1", "coder", "Coder", "call_1", None, 1),
        '{"type":"a2a-task-started","taskId":"t1","calleeAgentSlug":"coder","calleeAgentName":"Coder",'
        '"toolCallId":"call_1","parentTaskId":null,"recursionDepth":1}',
    ),
    (ev.Error("boom"), '{"type":"error","errorText":"boom"}'),
    (ev.Error("late", "timed_out"), '{"type":"error","errorText":"late","code":"timed_out"}'),
    (
        ev.Finish("stop", 12, 34),
        '{"type":"finish","finishReason":"stop","usage":{"inputTokens":12,"outputTokens":34}}',
    ),
    (
        ev.TaskState("working", "submitted", "2026-01-01T00:00:00.000Z"),
        '{"type":"state","state":"working","previous":"submitted","timestamp":"2026-01-01T00:00:00.000Z"}',
    ),
    (
        ev.TaskState("failed", "working", "T", "it broke"),
        '{"type":"state","state":"failed","previous":"working","timestamp":"T","error":"it broke"}',
    ),
    (
        ev.TaskDone("completed", None, 1500, 1, 2),
        '{"type":"done","state":"completed","error":null,"durationMs":1500,"usage":{"inputTokens":1,"outputTokens":2}}',
    ),
    (
        ev.TaskArtifact("file", "a.png", "image/png", 3, "at_1"),
        '{"type":"a2a-artifact","artifactKind":"file","name":"a.png","mime":"image/png","size":3,'
        '"attachmentId":"at_1","url":null,"data":null}',
    ),
    (
        ev.TaskArtifact("data", "", data={"days": 3}),
        '{"type":"a2a-artifact","artifactKind":"data","name":"","mime":null,"size":null,'
        '"attachmentId":null,"url":null,"data":{"days":3}}',
    ),
]


def compact(value: object) -> str:
    """JSON as the SSE layer writes it (no spaces, UTF-8 kept)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def test_every_event_kind_is_covered() -> None:
    """The table above names each kind of `Event` at least once."""
    assert {type(e) for e, _ in WIRES} == set(ev.Event.__args__)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("event", "wire"), WIRES, ids=[f"{e.kind}-{i}" for i, (e, _) in enumerate(WIRES)])
def test_the_wire_of_each_event_is_exact_and_parses_back(event: ev.Event, wire: str) -> None:
    """`to_wire` gives the exact JSON; `parse_event` of it gives the same event back."""
    assert compact(ev.to_wire(event)) == wire
    assert ev.parse_event(json.loads(wire)) == event
    assert ev.from_stream(event.kind, event.payload()) == event


@pytest.mark.parametrize(("event", "wire"), WIRES, ids=[f"{e.kind}-{i}" for i, (e, _) in enumerate(WIRES)])
async def test_published_events_come_back_from_the_hub_as_the_same_types(event: ev.Event, wire: str) -> None:
    """Through a real hub: `publish`, subscribe, `from_stream` gives the event; the SSE frame's data is the wire."""
    hub = StreamHub()
    await hub.create("s")
    event_id = await ev.publish(hub, "s", event)
    await hub.finish("s")
    [stored] = [e async for e in hub.subscribe("s")]
    assert stored.id == event_id
    assert ev.from_stream(stored.type, stored.data) == event
    assert _hub_frame(stored, frozenset()) == f"id: {event_id}\ndata: {wire}\n\n".encode()


def test_an_unknown_type_is_refused_by_name() -> None:
    """An event of no known kind raises UnknownEventTypeError naming it and the known kinds."""
    with pytest.raises(ev.UnknownEventTypeError, match=r"unknown event type 'text-deltas'; known: .*text-delta"):
        ev.parse_event({"type": "text-deltas", "delta": "x"})
    with pytest.raises(ev.EventFormatError, match="string 'type'"):
        ev.parse_event({"delta": "x"})


def test_a_malformed_event_is_refused_saying_what_is_wrong() -> None:
    """A missing or ill-typed field raises EventFormatError (a ValueError) with the field's name."""
    with pytest.raises(ev.EventFormatError, match="'delta'"):
        ev.parse_event({"type": "text-delta", "id": "text-0"})
    with pytest.raises(ev.EventFormatError, match="'recursionDepth' must be an integer"):
        ev.from_stream(
            "a2a-task-started",
            {
                "taskId": "t",
                "calleeAgentSlug": "a",
                "calleeAgentName": "A",
                "toolCallId": "c",
                "parentTaskId": None,
                "recursionDepth": "1",
            },
        )
    assert issubclass(ev.EventFormatError, ValueError)


def test_the_seed_task_wire() -> None:
    """The task stream endpoint's shapes: seed 000's text-delta and error, seed 002's state; others as stored."""
    assert ev.seed_task_wire(ev.TextDelta("text-0", "hi"), "t1") == ("text-delta", {"textDelta": "hi"})
    assert ev.seed_task_wire(ev.Error("boom", "timed_out"), "t1") == ("error", {"message": "boom"})
    state = ev.seed_task_wire(ev.TaskState("failed", "working", "T", "it broke"), "t1")
    assert compact(state[1]) == '{"taskId":"t1","from":"working","to":"failed","timestamp":"T","error":"it broke"}'
    done = ev.TaskDone("completed", None, 5)
    assert ev.seed_task_wire(done, "t1") == ("done", done.payload())


def test_a_first_state_comes_from_a_string() -> None:
    """Seed 002's `from` is a string: a first state's `previous` is NO_PREVIOUS_STATE, also read from an old null."""
    assert ev.NO_PREVIOUS_STATE == "unknown"
    old = ev.from_stream("state", {"state": "submitted", "previous": None, "timestamp": "T"})
    assert old == ev.TaskState("submitted", ev.NO_PREVIOUS_STATE, "T")
    assert ev.seed_task_wire(old, "t1")[1]["from"] == "unknown"
