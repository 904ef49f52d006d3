"""The agent-side pipe with the example stdio agent, as real processes against a live broker:
registration, a streamed task, cancel, reconnect after the broker drops it, stop on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest

from core.pipe import _redact, parse_args
from core.services import Services
from tests.conftest import make_settings
from tests.utils.broker import DISPATCH_HEADERS, broker_app, serve_app, wait_for

ROOT = Path(__file__).resolve().parent.parent


async def next_auto(queue: asyncio.Queue, chat_id: str, timeout: float = 10.0):
    async with asyncio.timeout(timeout):
        while True:
            inject = await queue.get()
            if inject.chat_id == chat_id and inject.mode == "auto":
                return inject


async def test_the_pipe_bridges_the_example_agent_and_reconnects(tmp_path: Path) -> None:
    services = Services.build(make_settings(tmp_path))
    services.prepare()
    broker = services.broker
    async with (
        serve_app(broker_app(services)) as host,
        httpx.AsyncClient(base_url=f"http://{host}", headers=DISPATCH_HEADERS) as http,
    ):
        env = {**os.environ, "ECHO_DELAY": "0.02", "PYTHONUNBUFFERED": "1"}
        pipe = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "core.pipe",
            "--backoff-initial",
            "0.1",
            "--backoff-max",
            "0.2",
            f"ws://{host}/a2a?a2a_id=echo&agent_id=42",
            "--",
            sys.executable,
            str(ROOT / "examples" / "echo_agent.py"),
            cwd=ROOT,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await wait_for(lambda: broker.connection("echo") is not None, timeout=15)
            first = broker.connection("echo")
            assert (first.name, first.binding) == ("Echo", "42")
            assert first.card()["skills"] == [{"id": "echo", "name": "Echo", "description": "Repeat the text back"}]

            async with broker.injects.bus.subscribe() as injects:
                ack = (
                    await http.post(
                        "/a2a/tasks/dispatch",
                        json={"task": "hello from the pipe", "targetAgent": "echo", "agentId": 42, "chatId": "c1"},
                    )
                ).json()
                assert ack["status"] == "accepted"
                progress = await asyncio.wait_for(injects.get(), 10)
                assert (progress.text, progress.mode) == ("[Echo] Echoing 4 words…", "delay")
                done = await next_auto(injects, "c1")
                assert done.text == "[Echo] hello from the pipe"

                long_task = " ".join(["word"] * 500)  # 10 s at 0.02 s a word: canceled long before
                await http.post(
                    "/a2a/tasks/dispatch",
                    json={"task": long_task, "targetAgent": "echo", "agentId": 42, "chatId": "c2"},
                )
                await wait_for(lambda: any(t.events >= 3 for t in broker.running_tasks()))
                assert (await http.post("/a2a/tasks/cancel", json={"chatId": "c2"})).json() == {"canceled": 1}
                canceled = await next_auto(injects, "c2")
                assert canceled.text == "[Echo] The task was canceled."
            await wait_for(lambda: first.in_flight == 0)  # the agent confirmed the cancel

            # The broker drops the connection: the pipe comes back with a fresh child.
            assert await broker.disconnect("echo", "restarting", code=1012)
            await wait_for(lambda: (c := broker.connection("echo")) is not None and c is not first, timeout=15)
            async with broker.injects.bus.subscribe() as injects:
                await http.post(
                    "/a2a/tasks/dispatch", json={"task": "again", "targetAgent": "echo", "agentId": 42, "chatId": "c3"}
                )
                assert (await next_auto(injects, "c3")).text == "[Echo] again"

                # `/disconnect`: the agent vanishes mid-stream (docs/TESTING.md); its task fails, the pipe returns.
                second = broker.connection("echo")
                await http.post(
                    "/a2a/tasks/dispatch",
                    json={
                        "task": "/disconnect one two three four five",
                        "targetAgent": "echo",
                        "agentId": 42,
                        "chatId": "c4",
                    },
                )
                assert (await next_auto(injects, "c4")).text == "[Echo] The task failed: the agent disconnected."
            await wait_for(lambda: (c := broker.connection("echo")) is not None and c is not second, timeout=15)
        finally:
            if pipe.returncode is None:
                pipe.send_signal(signal.SIGTERM)
            stderr = (await asyncio.wait_for(pipe.communicate(), 10))[1].decode()
        assert pipe.returncode == 0, stderr
        assert "reconnecting in 0.1 s" in stderr and "stopped" in stderr
        await wait_for(lambda: broker.connection("echo") is None)


def test_pipe_arguments_and_token_redaction(monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse_args(["ws://h/a2a?a2a_id=x", "--", "python", "agent.py", "--flag"])
    assert args.url == "ws://h/a2a?a2a_id=x" and args.command == ["python", "agent.py", "--flag"]
    monkeypatch.setenv("A2A_BROKER_URL", "wss://h/a2a?token=abc")
    assert parse_args(["--backoff-max", "5", "--", "agent"]).url == "wss://h/a2a?token=abc"
    with pytest.raises(SystemExit):
        parse_args(["ws://h/a2a", "agent"])  # no --
    with pytest.raises(SystemExit):
        parse_args(["http://h/a2a", "--", "agent"])
    assert _redact("ws://h/a2a?a2a_id=x&token=secret") == "ws://h/a2a?a2a_id=x&token=***"
