"""Logs a collector can read (issue 39, item 4): `LOG_FORMAT=json`, `LOG_LEVEL`, and the ids a line is about.

`LOG_FORMAT=json` makes every line of a real `python app.py`'s output one JSON object (time, level,
logger, message), the server's own lines and the start-up line included; a line logged while a turn
runs carries its session's id (`core.logcontext`); `LOG_LEVEL` is the least severe level written.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import httpx

from core.logcontext import JsonLogFormatter, bound
from core.services import Services
from tests.test_chat_engine_openai import (  # noqa: F401  (fixtures: the agent on the scripted server)
    Chat,
    chat,
    echo_tool,
    run_turn,
    settings,
)
from tests.utils.app_process import app_process
from tests.utils.openai_server import OpenAIServer, error
from tests.utils.openai_server import openai_server as openai_server  # noqa: F401  (the fixture)


def json_lines(handler_stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in handler_stream.getvalue().splitlines()]


def capture(logger: str) -> tuple[logging.Handler, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLogFormatter())
    logging.getLogger(logger).addHandler(handler)
    return handler, stream


def test_a_record_is_one_json_line_with_its_ids_and_its_error() -> None:
    handler, stream = capture("test.logs")
    log = logging.getLogger("test.logs")
    try:
        log.warning("outside")
        with bound(session_id="as_1"), bound(task_id="t_1", session_id=None):
            try:
                raise ValueError("bad\nthing")
            except ValueError:
                log.exception("inside %s", "the turn")
        log.warning("after")
    finally:
        logging.getLogger("test.logs").removeHandler(handler)
    outside, inside, after = json_lines(stream)
    assert set(outside) == {"time", "level", "logger", "message"} and outside["message"] == "outside"
    assert (inside["session_id"], inside["task_id"], inside["message"]) == ("as_1", "t_1", "inside the turn")
    assert inside["level"] == "ERROR" and "ValueError: bad" in inside["error"] and inside["time"].endswith("+00:00")
    assert "session_id" not in after  # the ids end with their block


async def test_a_line_logged_in_a_turn_carries_its_session(
    services: Services,
    chat: Chat,  # noqa: F811
    openai_server: OpenAIServer,  # noqa: F811
) -> None:
    openai_server.script(*[error(500, "The upstream model crashed.")] * 3)
    handler, stream = capture("core.chat.llm")
    try:
        await run_turn(services, chat, "hi")
    finally:
        logging.getLogger("core.chat.llm").removeHandler(handler)
    [line] = [line for line in json_lines(stream) if "failed" in line["message"]]
    assert line["session_id"] == chat.session_id and line["level"] == "WARNING"
    assert "hi" not in line["message"].split()  # the person's message is not in the log


def test_the_app_writes_only_json_lines_and_leaves_out_what_is_below_log_level(tmp_path: Path) -> None:
    for level, start_up_line in (("info", True), ("WARNING", False)):
        with app_process(tmp_path / level, LOG_FORMAT="json", LOG_LEVEL=level) as app:
            app.wait_until_serving()
            with httpx.Client(base_url=app.base_url, timeout=30) as http:
                chat_row = http.post("/api/sessions", json={"agentId": "general-assistant"}).json()
                assert http.post(f"/api/sessions/{chat_row['id']}/messages", json={"content": "/lorem 3"}).is_success
                http.get("/no-such-page")
            assert app.stop() == 0
            lines = [json.loads(line) for line in app.output.splitlines() if line.strip()]  # each line is JSON
        assert lines or not start_up_line, level
        assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
        assert any("Open http://127.0.0.1" in line["message"] for line in lines) == start_up_line, level
        if not start_up_line:
            assert all(line["level"] in {"WARNING", "ERROR", "CRITICAL"} for line in lines)


async def test_a_redis_password_never_reaches_the_log(caplog) -> None:
    from core.broker.inject import InjectPublisher
    from core.web.logtext import without_password

    assert without_password("redis://:s3cret@127.0.0.1:1/0") == "redis://***@127.0.0.1:1/0"
    assert without_password("redis://user:s3cret@host/2") == "redis://***@host/2"
    assert without_password("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    publisher = InjectPublisher("redis://:s3cret@127.0.0.1:1/0")  # nothing listens: it goes down at once
    with caplog.at_level(logging.INFO, logger="core.broker.inject"):
        await publisher.start()
        await publisher.stop(drain_timeout_s=0)
    assert "unreachable" in caplog.text and "127.0.0.1:1" in caplog.text
    assert "s3cret" not in caplog.text
