"""The README's examples, run against a live `python app.py`, so that the README cannot drift from the app.

Every `curl` line in the README's bash blocks is parsed and sent as the same HTTP request (`-X`, `-H`,
`-d`, `-u`; `-N` reads the event stream to its end), in the README's order, with `<id>` replaced by
the id of the session the previous example created. The broker's example agent is started with the
README's own pipe command. The demo model's nested example runs as a chat turn.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.utils.app_process import ROOT, AppProcess, app_process, child_env

README = ROOT / "README.md"
README_PORT = "3100"
BASH_BLOCK = re.compile(r"^[ \t]*```bash\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
PIPE_COMMAND = [".venv/bin/python", "-m", "core.pipe"]


@dataclass
class Curl:
    """One `curl` line of the README."""

    line: str
    method: str = "GET"
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    data: str | None = None
    auth: tuple[str, str] | None = None
    stream: bool = False


def readme_commands() -> list[list[str]]:
    """The commands of the README's bash blocks, split as a shell would (comments dropped)."""
    commands = []
    for block in BASH_BLOCK.findall(README.read_text(encoding="utf-8")):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def parse_curl(words: list[str]) -> Curl:
    """The request a `curl` command line sends."""
    curl = Curl(line=shlex.join(words))
    args = iter(words[1:])
    for arg in args:
        if arg == "-X":
            curl.method = next(args)
        elif arg == "-H":
            name, _, value = next(args).partition(":")
            curl.headers[name.strip()] = value.strip()
        elif arg == "-d":
            curl.data = next(args)
            curl.method = "POST" if curl.method == "GET" else curl.method
        elif arg == "-u":
            user, _, password = next(args).partition(":")
            curl.auth = (user, password)
        elif arg == "-N":
            curl.stream = True
        elif arg == "-s":
            continue
        elif arg.startswith("-"):
            raise AssertionError(f"the README uses a curl option this test does not know: {arg} ({curl.line})")
        else:
            curl.url = arg
    return curl


def on(app: AppProcess, url: str, seen: dict[str, str]) -> str:
    """The README's URL (`localhost:3100/...`) on the app under test, placeholders filled in."""
    return fill(re.sub(rf"^(https?://)?(localhost|127\.0\.0\.1):{README_PORT}", app.base_url, url), seen)


def fill(text: str, seen: dict[str, str]) -> str:
    """`<id>` and `<key>` replaced by the session id and the API key that earlier examples answered with."""
    for placeholder, value in seen.items():
        text = text.replace(placeholder, value)
    assert "<id>" not in text and "<key>" not in text, f"{text}: no example before it gave that value"
    return text


def send(app: AppProcess, curl: Curl, seen: dict[str, str]) -> tuple[int, object]:
    """Send the request; the JSON answer, or for `-N` the list of stream events up to `finish`."""
    url = on(app, curl.url, seen)
    headers = {name: fill(value, seen) for name, value in curl.headers.items()}
    with httpx.Client(timeout=15, auth=curl.auth) as client:
        if not curl.stream:
            response = client.request(curl.method, url, headers=headers, content=curl.data)
            return response.status_code, response.json()
        events = []
        with client.stream(curl.method, url, headers=headers) as response:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
                    if events[-1].get("type") == "finish":
                        break
        return response.status_code, events


@pytest.fixture(scope="module")
def readme_app(tmp_path_factory: pytest.TempPathFactory):
    """`python app.py` on its defaults (demo model, no Redis), as a new user starts it."""
    data = tmp_path_factory.mktemp("readme") / "data"
    with app_process(data, DEMO_MODEL_DELAY_MS="5") as app:
        app.wait_until_serving()
        yield app


def test_the_readme_has_the_examples_this_test_runs() -> None:
    commands = readme_commands()
    curls = [parse_curl(c) for c in commands if c[0] == "curl"]
    paths = {urlsplit(c.url if "://" in c.url else f"http://{c.url}").path for c in curls}
    assert {"/api/sessions", "/api/sessions/<id>/stream", "/a2a/agents", "/a2a/tasks/dispatch"} <= paths, paths
    assert any(c.stream for c in curls), "no example follows a stream"
    assert any(c[:3] == PIPE_COMMAND for c in commands), "the README no longer shows how to start the pipe"


def test_every_curl_example_of_the_readme_works(readme_app: AppProcess, tmp_path: Path) -> None:
    commands = readme_commands()
    pipes = [c for c in commands if c[:3] == PIPE_COMMAND]
    agent = start_pipe(readme_app, pipes[0], tmp_path)
    try:
        wait_for_broker_agent(readme_app, "echo")
        seen: dict[str, str] = {}
        for curl in (parse_curl(c) for c in commands if c[0] == "curl"):
            status, answer = send(readme_app, curl, seen)
            assert 200 <= status < 300, f"{curl.line}\n-> {status} {answer}"
            if curl.stream:
                kinds = [e.get("type") for e in answer]
                assert kinds[-1] == "finish" and "text-delta" in kinds and "error" not in kinds, curl.line
            if isinstance(answer, dict) and str(answer.get("id", "")).startswith("as_"):
                seen["<id>"] = answer["id"]
            if isinstance(answer, dict) and str(answer.get("key", "")).startswith("a2ak_"):
                seen["<key>"] = answer["key"]
            if "/a2a/tasks/dispatch" in curl.url:
                assert answer["status"] == "accepted", f"{curl.line}\n-> {answer}"
            if curl.url.endswith("/a2a/agents"):
                assert "echo" in {a["a2a_id"] for a in answer["agents"]}
                assert "a2a_echo" in {a["tool"]["name"] for a in answer["agents"]}
        assert "<id>" in seen and "<key>" in seen, "no README example created a session and an API key"
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def test_the_nested_delegation_example_works_on_a_fresh_install(readme_app: AppProcess) -> None:
    base = readme_app.base_url
    [example] = set(re.findall(r"`(@planner [^`]*@@coding-assistant[^`]*)`", README.read_text(encoding="utf-8")))
    session_id = httpx.post(f"{base}/api/sessions", json={"agentId": "general-assistant"}, timeout=5).json()["id"]
    turn = httpx.post(f"{base}/api/sessions/{session_id}/messages", json={"content": example}, timeout=5)
    assert turn.status_code == 202, turn.text
    with httpx.stream("GET", f"{base}{turn.json()['streamUrl']}", timeout=30) as response:
        kinds = [json.loads(line[5:])["type"] for line in response.iter_lines() if line.startswith("data:")]
    assert kinds[-1] == "finish" and "error" not in kinds
    tasks = {t["calleeAgentId"]: t for t in httpx.get(f"{base}/api/tasks", timeout=5).json()}
    assert tasks["planner"]["state"] == "completed" and tasks["coding-assistant"]["state"] == "completed"
    assert tasks["coding-assistant"]["recursionDepth"] == 2


def start_pipe(app: AppProcess, words: list[str], tmp_path: Path) -> subprocess.Popen:
    """The README's pipe command, on this app's port and with this interpreter."""
    port = app.base_url.rsplit(":", 1)[1]
    command = [sys.executable if w == ".venv/bin/python" else w.replace(f":{README_PORT}/", f":{port}/") for w in words]
    with (tmp_path / "pipe.log").open("wb") as log:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=child_env(tmp_path / "pipe-data"),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_for_broker_agent(app: AppProcess, a2a_id: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        agents = httpx.get(f"{app.base_url}/a2a/agents", timeout=5).json()["agents"]
        if a2a_id in {a["a2a_id"] for a in agents}:
            return
        time.sleep(0.1)
    raise AssertionError(f"the example agent {a2a_id!r} did not connect within {timeout_s:.0f} s:\n{app.output}")
