"""Bad input gets a clear error, never a crash: deep nesting, huge ids, lone surrogates, log injection."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nicegui.app.app import USER_STORAGE_PRUNE_INTERVAL

from core.broker import wire
from core.services import Services
from core.streaming.sse import _parse_resume
from core.web.logtext import loggable
from tests.conftest import make_settings
from tests.utils.app_process import AppProcess, app_process
from tests.utils.broker import FakeAgent, broker_app, serve_app, wait_for


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory):
    with app_process(
        tmp_path_factory.mktemp("bad-input") / "data", DEMO_MODEL_DELAY_MS="1", BROKER_DISPATCH_TOKEN="bad-input-token"
    ) as running:
        running.wait_until_serving()
        yield running


def nested(depth: int) -> str:
    return '{"jsonrpc": "2.0", "id": 1, "result": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize("depth", [wire.MAX_NESTING, wire.MAX_NESTING + 1, 2_000, 100_000])
def test_deep_nesting_is_a_parse_error_not_a_crash(depth: int) -> None:
    if depth < wire.MAX_NESTING:  # the object itself is one level
        assert wire.decode(nested(depth)).kind == "response"
        return
    with pytest.raises(wire.RpcLineError) as refused:
        wire.decode(nested(depth))
    assert refused.value.code == wire.PARSE_ERROR and "nested more than 64 levels" in str(refused.value)


async def test_a_deeply_nested_line_keeps_the_agents_socket(tmp_path: Path) -> None:
    services = Services.build(make_settings(tmp_path))
    services.prepare()
    async with serve_app(broker_app(services)) as host:
        agent = await FakeAgent.connect(host, a2a_id="deep", wait_registered=services.broker)
        await agent.ws.send(nested(2_000))
        await wait_for(lambda: len(agent.errors) >= 1)
        assert agent.errors[0]["error"]["code"] == wire.PARSE_ERROR
        await asyncio.sleep(0.2)
        assert services.broker.connection("deep") is not None  # still connected, still serving
        await agent.close()


HUGE_NUMBER_LINE = '{"jsonrpc": "2.0", "id": 1, "result": ' + "9" * 5000 + "}"


async def test_a_number_of_5000_digits_is_a_parse_error_in_our_words(tmp_path: Path) -> None:
    """Python refuses to read it (sys.get_int_max_str_digits()); the peer is told so, not how to raise the limit."""
    services = Services.build(make_settings(tmp_path))
    services.prepare()
    async with serve_app(broker_app(services)) as host:
        agent = await FakeAgent.connect(host, a2a_id="digits", wait_registered=services.broker)
        await agent.ws.send(HUGE_NUMBER_LINE)
        await wait_for(lambda: len(agent.errors) >= 1)
        error = agent.errors[0]["error"]
        assert error == {"code": wire.PARSE_ERROR, "message": "not valid JSON: a number has more than 4300 digits"}
        assert services.broker.connection("digits") is not None
        await agent.close()


SURROGATE = "hi \ud800 there"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/sessions", {"title": SURROGATE}, "title"),
        ("/api/a2a/keys", {"name": SURROGATE}, "name"),
        ("/api/agents", {"id": "x", "name": SURROGATE}, "name"),
        ("/a2a/tasks/dispatch", {"task": SURROGATE, "targetAgent": "t", "agentId": 1, "chatId": "c"}, "task"),
        (
            "/a2a/tasks/dispatch",
            {"task": "t", "targetAgent": "t", "agentId": 1, "chatId": "c", "macAddress": SURROGATE},
            "macAddress",
        ),
        ("/api/sessions/{sid}/messages", {"content": SURROGATE}, "content"),
    ],
)
def test_a_lone_surrogate_is_422_naming_the_field(app: AppProcess, path: str, body: dict, field: str) -> None:
    sid = httpx.post(f"{app.base_url}/api/sessions", json={}, timeout=5).json()["id"]
    raw = json.dumps(body).encode()  # JSON's own escape (\ud800), as a client sends it
    response = httpx.post(
        f"{app.base_url}{path.format(sid=sid)}",
        content=raw,
        timeout=5,
        headers={"content-type": "application/json", "authorization": "Bearer bad-input-token"},
    )
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"][-1] == field and "unicode" in error["msg"].lower()
    assert httpx.get(f"{app.base_url}/api/sessions/{sid}/messages", timeout=5).json() == []


@pytest.mark.parametrize("key_id", ["99999999999999999999999", "-1", "0", "x"])
def test_an_impossible_key_id_is_422(app: AppProcess, key_id: str) -> None:
    response = httpx.delete(f"{app.base_url}/api/a2a/keys/{key_id}", timeout=5)
    assert response.status_code == 422


@pytest.mark.parametrize("last_id", ["99999999999999999999999", "-5", "9" * 5000, "1e3"])
def test_an_impossible_last_event_id_restarts_the_stream_with_a_reason(app: AppProcess, last_id: str) -> None:
    sid = httpx.post(f"{app.base_url}/api/sessions", json={}, timeout=5).json()["id"]
    httpx.post(f"{app.base_url}/api/sessions/{sid}/messages", json={"content": "hello"}, timeout=5)
    with httpx.stream(
        "GET", f"{app.base_url}/api/sessions/{sid}/stream", headers={"Last-Event-ID": last_id}, timeout=10
    ) as response:
        assert response.status_code == 200
        first = next(line for line in response.iter_lines() if line.startswith("data:"))
    assert '"reset"' in first or "reset" in first
    after, reason = _parse_resume(last_id)
    assert after is None and ("out of range" in reason or "not a number" in reason) and len(reason) < 100


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain 中文 text", "plain 中文 text"),
        ("forged\r\n2026-01-01 INFO core: all good", "forged\\r\\n2026-01-01 INFO core: all good"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("line\u2028sep", "line\\u2028sep"),
        ("x" * 300, "x" * 200 + "… (+100 characters)"),
    ],
)
def test_loggable(text: str, expected: str) -> None:
    assert loggable(text) == expected


async def test_a_bad_agent_line_is_one_warning_without_forged_lines(tmp_path: Path, caplog) -> None:
    services = Services.build(make_settings(tmp_path))
    services.prepare()
    async with serve_app(broker_app(services)) as host:
        agent = await FakeAgent.connect(host, a2a_id="forger", wait_registered=services.broker)
        with caplog.at_level(logging.INFO, logger="core.broker"):
            await agent.ws.send("not json\r2026-01-01 INFO core.broker: agent admin connected\x1b[2J" + "y" * 10_000)
            await wait_for(lambda: len(agent.errors) >= 1)
        [record] = [r for r in caplog.records if "dropped a bad line" in r.getMessage()]
        message = record.getMessage()
        assert record.levelno == logging.WARNING and record.exc_info is None
        assert "\r" not in message and "\x1b" not in message and "\\r2026" in message
        assert len(message) < 600
        await agent.close()


@pytest.mark.parametrize("path", ["/api/../../bar", "/a2a/%2e%2e/%2e%2e/bar", "/api/nope", "/a2a/agents/x/y/z"])
def test_an_unknown_api_address_is_a_json_404_and_leaves_nicegui_nothing_to_trip_on(app: AppProcess, path: str) -> None:
    """Sent raw (no client normalises the dots); NiceGUI's 404 page would leave it a client without a session."""
    host, port = app.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        raw = b"".join(iter(lambda: sock.recv(65536), b""))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404 ") and b"application/json" in head, head
    assert json.loads(body) == {"detail": "Not Found", "code": "not_found"}
    if path == "/a2a/agents/x/y/z":  # the last one: NiceGUI prunes every USER_STORAGE_PRUNE_INTERVAL (10 s)
        time.sleep(USER_STORAGE_PRUNE_INTERVAL + 1.5)
        assert "KeyError" not in app.output and "not found" not in app.output


# -- JSON-RPC on /a2a/agents/{id}: the right code, never -32603 with Python's text -----------------------


@pytest.fixture(scope="module")
def rpc(app: AppProcess):
    key = httpx.post(f"{app.base_url}/api/a2a/keys", json={"name": "fuzz"}, timeout=5).json()["key"]

    def call(content: bytes, **headers: str) -> httpx.Response:
        return httpx.post(
            f"{app.base_url}/a2a/agents/coding-assistant",
            content=content,
            timeout=10,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json", **headers},
        )

    return call


MESSAGE_03 = {
    "message": {"role": "user", "messageId": "m1", "kind": "message", "parts": [{"kind": "text", "text": "hi"}]}
}


def rpc_body(method: str, params: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).encode()


@pytest.mark.parametrize(
    ("body", "headers", "code", "words"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"\xff"}}', {}, -32700, "not UTF-8"),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"GetTask","params":' + b"[" * 3000 + b"]" * 3000 + b"}",
            {},
            -32700,
            "nests more than 64",
        ),
        (b'{"jsonrpc": "2.0", "id": 1, "method"', {}, -32700, "Expecting"),
        (rpc_body("ListTasks", {"pageToken": "abc"}), {"A2A-Version": "1.0"}, -32602, "pageToken 'abc'"),
        (rpc_body("ListTasks", {"pageToken": "9" * 30}), {"A2A-Version": "1.0"}, -32602, "not one this server"),
        (rpc_body("Frobnicate", {}), {}, -32601, "Method not found: 'Frobnicate'"),
        (rpc_body("GetTask", {"id": "x"}), {"A2A-Version": "9.9"}, -32009, "9.9"),
        # A method of one protocol version asked for under another: -32009 naming the version it is of.
        (
            rpc_body("message/send", MESSAGE_03),
            {"A2A-Version": "1.0"},
            -32009,
            "message/send is a method of A2A 0.3, but the request asks for A2A '1.0'. Expected version '0.3': send "
            "'A2A-Version: 0.3' or none, or call SendMessage, its A2A 1.0 name.",
        ),
        (rpc_body("tasks/get", {"id": "x"}), {"A2A-Version": "1.1"}, -32009, "or call GetTask, its A2A 1.0 name"),
        (
            rpc_body("message/stream", MESSAGE_03),
            {"A2A-Version": "2.0"},
            -32009,
            "A2A '2.0', which this server does not speak (it speaks 1.0 and 0.3)",
        ),
        (rpc_body("GetTask", {"id": "x"}), {"A2A-Version": "0.3"}, -32009, "or call tasks/get, its A2A 0.3 name"),
        (rpc_body("SendMessage", {}), {}, -32009, "asks for A2A '0.3' (no A2A-Version header means 0.3)"),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x","n":' + b"9" * 5000 + b"}}",
            {"A2A-Version": "1.0"},
            -32700,
            "Parse error: a number has more than 4300 digits",
        ),
        (
            b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"tasks/get","params":{"id":"x"}}',
            {},
            -32700,
            "Parse error: a number has more than 4300 digits",
        ),
    ],
)
def test_json_rpc_errors_have_their_own_code_and_say_what_is_wrong(rpc, body, headers, code, words) -> None:
    response = rpc(body, **headers)
    assert response.status_code < 500
    error = response.json()["error"]
    assert error["code"] == code and words in error["message"], error


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
methods = st.sampled_from(
    [
        "SendMessage",
        "GetTask",
        "ListTasks",
        "CancelTask",
        "message/send",
        "tasks/get",
        "SubscribeToTask",
        "GetExtendedAgentCard",
        "nope",
        "",
    ]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=methods,
    params=json_values,
    version=st.sampled_from([None, "1.0", "0.3", "x"]),
    raw=st.one_of(st.none(), st.binary(max_size=60)),
)
def test_fuzzed_json_rpc_never_gets_a_5xx(rpc, method, params, version, raw) -> None:
    headers = {"A2A-Version": version} if version else {}
    response = rpc(raw if raw is not None else rpc_body(method, params), **headers)
    assert response.status_code < 500, response.text
    answer = response.json() if response.headers.get("content-type", "").startswith("application/json") else None
    if answer is not None and "error" in answer:
        assert answer["error"]["code"] != -32603, answer


@settings(max_examples=40, deadline=None)
@given(lines=st.lists(st.text(max_size=40) | json_values.map(json.dumps), min_size=1, max_size=5))
async def test_fuzzed_broker_lines_keep_the_agent_connected(tmp_path_factory, lines) -> None:
    services = Services.build(make_settings(tmp_path_factory.mktemp("fuzz")))
    services.prepare()
    async with serve_app(broker_app(services)) as host:
        agent = await FakeAgent.connect(host, a2a_id="fuzzed", wait_registered=services.broker)
        await agent.ws.send("\n".join(lines))
        await asyncio.sleep(0.05)
        assert services.broker.connection("fuzzed") is not None
        assert all(e["error"]["code"] in {-32700, -32600, -32601} for e in agent.errors)
        await agent.close()


def test_after_all_of_it_the_app_answers_a_normal_turn_and_logged_no_traceback(app: AppProcess) -> None:
    sid = httpx.post(f"{app.base_url}/api/sessions", json={}, timeout=5).json()["id"]
    turn = httpx.post(f"{app.base_url}/api/sessions/{sid}/messages", json={"content": "hello"}, timeout=5).json()
    with httpx.stream("GET", f"{app.base_url}{turn['streamUrl']}", timeout=20) as response:
        kinds = [json.loads(line[5:])["type"] for line in response.iter_lines() if line.startswith("data:")]
    assert kinds[-1] == "finish" and "error" not in kinds
    assert "Traceback" not in app.output
