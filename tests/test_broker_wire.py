"""The broker's wire module: line framing, JSON-RPC classification, both A2A stream shapes, cards, tools."""

from __future__ import annotations

import pytest

from core.broker import wire
from core.broker.auth import BrokerRefusedError, identify, is_blacklisted
from core.settings import AuthSettings


def test_frames_split_into_lines_and_messages_classify() -> None:
    assert wire.split_lines('{"a":1}\n\n  \n{"b":2}\n') == ['{"a":1}', '{"b":2}']
    response = wire.decode('{"jsonrpc":"2.0","id":3,"result":{"x":1}}')
    assert (response.kind, response.id, response.result) == ("response", 3, {"x": 1})
    error = wire.decode('{"jsonrpc":"2.0","id":3,"error":{"code":-1,"message":"m"}}').error
    assert error == {"code": -1, "message": "m"}
    assert wire.decode('{"jsonrpc":"2.0","id":1,"method":"x"}').kind == "request"
    assert wire.decode('{"jsonrpc":"2.0","method":"x"}').kind == "notification"
    for line, code in [
        ("{", wire.PARSE_ERROR),
        ("[]", wire.INVALID_REQUEST),
        ('{"id":1,"result":1}', wire.INVALID_REQUEST),
        ('{"jsonrpc":"2.0","id":1}', wire.INVALID_REQUEST),
        ('{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1}}', wire.INVALID_REQUEST),
        ('{"jsonrpc":"2.0","result":1}', wire.INVALID_REQUEST),
        ('{"jsonrpc":"2.0","id":1,"method":5}', wire.INVALID_REQUEST),
    ]:
        with pytest.raises(wire.RpcLineError) as caught:
            wire.decode(line)
        assert caught.value.code == code, line


def test_requests_have_the_seed_shape() -> None:
    assert wire.stream_request(1, "hi", message_id="m1") == {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/stream",
        "params": {
            "message": {"kind": "message", "role": "user", "parts": [{"kind": "text", "text": "hi"}], "messageId": "m1"}
        },
    }
    assert wire.card_request(1) == {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "agent/authenticatedExtendedCard",
        "params": {},
    }
    assert wire.cancel_request(7, "t1") == {"jsonrpc": "2.0", "id": 7, "method": "tasks/cancel", "params": {"id": "t1"}}
    assert wire.stream_request(2, "hi", message_id="m", v1=True)["params"]["message"]["role"] == "ROLE_USER"


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (
            {
                "kind": "status-update",
                "taskId": "t",
                "final": False,
                "status": {"state": "working", "message": {"role": "agent", "parts": [{"kind": "text", "text": "a"}]}},
            },
            wire.WireEvent("status", "a", "working", False, "t"),
        ),
        (
            {"kind": "status-update", "taskId": "t", "status": {"state": "completed"}, "final": True},
            wire.WireEvent("status", "", "completed", True, "t"),
        ),
        (
            {"kind": "status-update", "taskId": "t", "status": {"state": "input-required"}},
            wire.WireEvent("status", "", "input-required", True, "t"),
        ),
        (
            {
                "kind": "task",
                "id": "t",
                "status": {"state": "submitted"},
                "history": [{"role": "user", "parts": [{"kind": "text", "text": "the request"}]}],
            },
            wire.WireEvent("task", "", "submitted", False, "t"),
        ),
        (
            {
                "kind": "task",
                "id": "t",
                "status": {"state": "completed"},
                "artifacts": [{"parts": [{"kind": "text", "text": "res"}, {"kind": "file", "file": {}}]}],
            },
            wire.WireEvent("task", "res", "completed", True, "t"),
        ),
        (
            {
                "kind": "artifact-update",
                "taskId": "t",
                "append": True,
                "artifact": {"artifactId": "a", "parts": [{"kind": "text", "text": "x"}]},
            },
            wire.WireEvent("artifact", "x", None, False, "t", "a", True),
        ),
        (
            {"kind": "message", "role": "agent", "parts": [{"kind": "text", "text": "hey"}]},
            wire.WireEvent("message", "hey", "completed", True),
        ),
        (
            {"statusUpdate": {"taskId": "T", "status": {"state": "TASK_STATE_CANCELLED"}}},
            wire.WireEvent("status", "", "canceled", True, "T"),
        ),
        (
            {
                "statusUpdate": {
                    "taskId": "T",
                    "status": {
                        "state": "TASK_STATE_WORKING",
                        "message": {"role": "ROLE_AGENT", "parts": [{"text": "tick"}]},
                    },
                }
            },
            wire.WireEvent("status", "tick", "working", False, "T"),
        ),
        (
            {"artifactUpdate": {"taskId": "T", "artifact": {"artifactId": "A", "parts": [{"text": "r"}]}}},
            wire.WireEvent("artifact", "r", None, False, "T", "A"),
        ),
        (
            {"task": {"id": "T", "status": {"state": "TASK_STATE_REJECTED"}}},
            wire.WireEvent("task", "", "rejected", True, "T"),
        ),
    ],
)
def test_stream_results_of_both_generations_parse(result: dict, expected: wire.WireEvent) -> None:
    assert wire.parse_stream_result(result) == expected


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"kind": "other"},
        {},
        {"task": {}, "message": {}},
        {"kind": "status-update"},
        {"kind": "artifact-update", "artifact": "x"},
    ],
)
def test_bad_stream_results_are_refused(bad) -> None:
    with pytest.raises(wire.WireError):
        wire.parse_stream_result(bad)


def test_cards_are_checked_and_become_tools() -> None:
    card = wire.parse_card(
        {
            "name": " Travel ",
            "description": "Trains.",
            "skills": [{"id": "train", "name": "Tickets", "description": "High-speed"}, {"id": "x", "name": "X"}],
        }
    )
    assert (card.name, card.v1) == ("Travel", False)
    tool = wire.tool_definition("travel", card)
    assert tool["name"] == "a2a_travel"
    assert tool["description"] == "[Travel] Trains. Skills: Tickets (High-speed); X."
    assert tool["inputSchema"]["required"] == ["task"]
    v1 = wire.parse_card(
        {"name": "N", "description": "", "skills": [], "supportedInterfaces": [{"protocolVersion": "1.0"}]}
    )
    assert v1.v1
    with pytest.raises(wire.WireError, match="lacks name .*description .*skills"):
        wire.parse_card({"name": ""})


def test_identity_from_the_query_and_the_blacklist() -> None:
    none = AuthSettings()
    assert identify({"a2a_id": "travel", "agent_id": "123"}, none).agent_id == "123"
    assert identify({"a2a_id": "travel", "agentId": "7"}, none).agent_id == "7"  # legacy name
    assert identify({"a2a_id": "travel"}, none).agent_id is None  # global
    for query in [{}, {"a2a_id": "UPPER"}, {"a2a_id": "x" * 61}, {"a2a_id": "a b"}]:
        with pytest.raises(BrokerRefusedError):
            identify(query, none)
    assert is_blacklisted("10.1.2.3", ["10.0.0.0/8"]) and is_blacklisted("::1", ["::1"])
    assert not is_blacklisted("127.0.0.1", ["10.0.0.0/8", "nonsense"]) and not is_blacklisted(None, ["1.1.1.1"])


def test_the_answer_is_the_artifacts_else_the_final_message_never_both() -> None:
    answer = wire.Answer()
    answer.add_artifact(wire.WireEvent("artifact", "G1234 ", None, False, "t", "a", False))
    answer.add_artifact(wire.WireEvent("artifact", "08:00", None, False, "t", "a", True))
    answer.add_artifact(wire.WireEvent("artifact", "2nd class", None, False, "t", "b", False))
    closing = wire.WireEvent("status", "Here is your booking.", "completed", True, "t")
    assert answer.text(closing) == "G1234 08:00\n2nd class"
    assert wire.Answer().text(closing) == "Here is your booking."  # no artifacts: the final message
    quiet = wire.Answer(last_progress="half way")
    assert quiet.text(wire.WireEvent("status", "", "completed", True, "t")) == "half way"
