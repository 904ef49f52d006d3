"""The app as a real process for a test (its console script), and a small client of its REST API and streams.

The app is started by a command, found in this order: the `command` argument (the plugin's
`--chat-app-command` option), `$A2A_CHAT_APP_COMMAND`, the console script `a2a-delegation-chat` beside this
Python or on `PATH` (the app installed in this environment, or with pipx), `python -m a2a_delegation_chat`.
So a test environment may hold only the kit, with the app installed wherever.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

APP_SCRIPT = "a2a-delegation-chat"
APP_MODULE = "a2a_delegation_chat"
COMMAND_ENV = "A2A_CHAT_APP_COMMAND"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0

# The child must not think it runs under pytest or NiceGUI's simulation, nor inherit where to listen,
# a password, or the caller's data and config.
DROPPED_ENV = {
    "PYTEST_CURRENT_TEST",
    "NICEGUI_USER_SIMULATION",
    "NICEGUI_STORAGE_PATH",
    "APP_USER_PASSWORD",
    "HOST",
    "PORT",
    "DATA_DIR",
    "DATABASE_URL",
    "CONFIG_FILE",
    "ENV_FILE",
}


class ChatAppError(AssertionError):
    """The app did not start, stop or answer as expected; the message carries its output."""


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def app_command(command: str | list[str] | None = None) -> list[str]:
    """How to start the app: `command` (a string is split as a shell would), else the first found of these.

    `$A2A_CHAT_APP_COMMAND`, `a2a-delegation-chat` beside this Python or on `PATH`, `python -m a2a_delegation_chat`.

    Raises:
        ChatAppError: none of them is there (the app is not installed where the kit can find it).
    """
    command = command or os.environ.get(COMMAND_ENV) or None
    if isinstance(command, str):
        return shlex.split(command)
    if command:
        return list(command)
    beside = Path(sys.executable).parent / APP_SCRIPT
    if beside.is_file():
        return [str(beside)]
    on_path = shutil.which(APP_SCRIPT)
    if on_path:
        return [on_path]
    if importlib.util.find_spec(APP_MODULE) is not None:
        return [sys.executable, "-m", APP_MODULE]
    raise ChatAppError(
        f"the app is not installed where the testing kit can find it: install it in this environment "
        f"(pip install a2a-delegation-chat) or anywhere on PATH (pipx install a2a-delegation-chat), or say how to "
        f"start it with --chat-app-command, the ini option chat_app_command or ${COMMAND_ENV}"
    )


def child_env(data_dir: Path, port: int, settings: dict[str, str]) -> dict[str, str]:
    """The environment of the app: this one, less what belongs to the caller, plus `settings`."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update(
        HOST="127.0.0.1",
        PORT=str(port),
        DATA_DIR=str(data_dir),
        PYTHONUNBUFFERED="1",
        CONFIG_FILE=str(data_dir.parent / "no-config.json"),
        ENV_FILE=str(data_dir.parent / "no.env"),
    )
    env.update({k: str(v) for k, v in settings.items()})
    return env


@dataclass
class ChatApp:
    """A running app and a client of its REST API.

    In single-user mode (no `users`) no login is needed; with accounts the client sends the first
    user's name and password (HTTP Basic), and `as_user(name)` gives a client for another one.
    """

    process: subprocess.Popen
    base_url: str
    data_dir: Path
    log_path: Path
    users: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    http: httpx.Client = field(init=False)
    # Tasks of earlier tests of a shared app (`reset`): `tasks()` leaves them out.
    hidden_tasks: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.http = self._client(next(iter(self.users), None))

    def as_user(self, name: str) -> ChatApp:
        """The same app, its REST client logged in as `name` (one of `users`)."""
        other = ChatApp(
            self.process, self.base_url, self.data_dir, self.log_path, self.users, self.command, self.hidden_tasks
        )
        other.http.close()
        other.http = self._client(name)
        return other

    @property
    def port(self) -> int:
        """The port the app listens on (127.0.0.1)."""
        return int(self.base_url.rsplit(":", 1)[1])

    def reset(self) -> None:
        """Between two tests of a shared app: every user's chats deleted, earlier tasks left out of `tasks()`.

        Deleting a chat stops its running turn and delegations first.

        Agents, accounts and API keys are kept; a test that changes them wants an app of its own (function scope,
        or settings of its own, which start another app).
        """
        for name in self.users or [None]:
            client = self if name is None or name == next(iter(self.users)) else self.as_user(name)
            for chat in client._json("GET", "/api/sessions"):
                response = client.http.delete(f"/api/sessions/{chat['id']}")
                if response.status_code not in {204, 404}:
                    raise ChatAppError(
                        f"could not delete the chat {chat['id']}: {response.status_code} {response.text}"
                    )
            self.hidden_tasks.update(task["id"] for task in client._json("GET", "/api/tasks"))
            if client is not self:
                client.http.close()

    def _client(self, name: str | None) -> httpx.Client:
        auth = (name, self.users[name]) if name is not None else None
        return httpx.Client(base_url=self.base_url, timeout=30, auth=auth)

    @property
    def output(self) -> str:
        """Everything the app has printed so far."""
        return self.log_path.read_text(errors="replace")

    def wait_until_serving(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Poll `GET /` until the app answers (200, or with accounts a redirect to /login)."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ChatAppError(f"the app exited with {self.process.returncode}:\n{self.output}")
            try:
                response = self.http.get("/", timeout=2)
                if response.status_code < 400:
                    return
                last = f"HTTP {response.status_code}"
            except httpx.TransportError as exc:
                last = repr(exc)
            time.sleep(0.05)
        raise ChatAppError(f"GET / did not answer within {timeout_s:.0f} s (last: {last}):\n{self.output}")

    def new_session(self, agent: str = "general-assistant") -> str:
        """Start a chat with an agent (its id, e.g. `coding-assistant`); the session id."""
        return self._json("POST", "/api/sessions", json={"agentId": agent}, expect=201)["id"]

    def send(self, session_id: str, text: str, attachments: list[str] | None = None) -> dict[str, Any]:
        """Send a message (with the files `attach` gave, by id); the turn (`streamUrl`, ...).

        The answer streams on `stream(session_id)`.
        """
        body: dict[str, Any] = {"content": text}
        if attachments:  # only then: an app from before issue 36 takes the message as it always did
            body["attachmentIds"] = attachments
        return self._json("POST", f"/api/sessions/{session_id}/messages", json=body, expect=202)

    def attach(self, session_id: str, name: str, data: bytes, mime: str = "application/octet-stream") -> dict[str, Any]:
        """Upload a file into a session (what the composer's attach button does); its `id`, `name`, `mime`, `size`."""
        files = {"file": (name, data, mime)}
        return self._json("POST", f"/api/sessions/{session_id}/attachments", files=files, expect=201)

    def download(self, attachment_id: str) -> bytes:
        """A file's bytes (an upload, or a file a delegated agent returned: `a2a-artifact`'s `attachmentId`)."""
        response = self.http.get(f"/api/attachments/{attachment_id}")
        if response.status_code != 200:
            raise ChatAppError(f"GET /api/attachments/{attachment_id} answered {response.status_code}: {response.text}")
        return response.content

    def stop_turn(self, session_id: str) -> dict[str, Any]:
        """Stop the session's running reply (what the Stop button does)."""
        return self._json("POST", f"/api/sessions/{session_id}/stop")

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        """The saved messages of a session."""
        return self._json("GET", f"/api/sessions/{session_id}/messages")

    def tasks(self) -> list[dict[str, Any]]:
        """The delegated tasks, newest first (what /audit lists), since the last `reset`."""
        return [task for task in self._json("GET", "/api/tasks") if task["id"] not in self.hidden_tasks]

    def stream(self, session_id: str, timeout_s: float = 60.0) -> Iterator[dict[str, Any]]:
        """The events of the session's current turn (`{"id", "type", "data"}`), until it finishes."""
        yield from self._events(f"/api/sessions/{session_id}/stream", timeout_s)

    def task_stream(self, task_id: str, timeout_s: float = 60.0) -> Iterator[dict[str, Any]]:
        """The events of a delegated task (what the side panel shows), until it ends."""
        yield from self._events("/api/agents/a2a/stream", timeout_s, params={"taskId": task_id})

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Stop the app (gracefully by default) and wait; its exit code."""
        self.http.close()
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise ChatAppError(f"the app did not stop within {STOP_TIMEOUT_S:.0f} s:\n{self.output}") from None

    def _json(self, method: str, path: str, *, expect: int = 200, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        if response.status_code != expect:
            raise ChatAppError(f"{method} {path} answered {response.status_code}: {response.text}")
        return response.json()

    def _events(self, path: str, timeout_s: float, params: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
        with self.http.stream("GET", path, params=params, timeout=timeout_s) as response:
            if response.status_code != 200:
                raise ChatAppError(f"GET {path} answered {response.status_code}: {response.read().decode()}")
            event: dict[str, Any] = {}
            for line in response.iter_lines():
                if line.startswith("id:"):
                    event["id"] = line[3:].strip()
                elif line.startswith("event:"):
                    event["event"] = line[6:].strip()
                elif line.startswith("data:"):
                    event["data"] = event.get("data", "") + line[5:].strip()
                elif not line and "data" in event:
                    try:
                        data = json.loads(event["data"])
                    except ValueError:
                        data = event["data"]
                    kind = data.get("type") if isinstance(data, dict) else event.get("event")
                    yield {"id": event.get("id"), "type": kind or event.get("event", "message"), "data": data}
                    if kind in {"finish", "done"} or event.get("event") in {"finish", "done", "end"}:
                        return
                    event = {}


@contextmanager
def start_chat_app(
    settings: dict[str, str] | None = None,
    *,
    users: dict[str, str] | None = None,
    data_dir: Path | None = None,
    port: int | None = None,
    command: str | list[str] | None = None,
) -> Iterator[ChatApp]:
    """Run the app until the block ends; `settings` are environment variables.

    `users` (name -> password) are created first (`a2a-delegation-chat users add`): the app then runs with
    accounts, and its client logs in as the first of them. `port` (default: a free one) is where it listens on
    127.0.0.1; `command` how to start it (`app_command`).
    """
    argv = app_command(command)
    with tempfile.TemporaryDirectory(prefix="chat-app-") as tmp:
        data_dir = data_dir or Path(tmp) / "data"  # the app creates it, private (mode 0700)
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        port = port or free_port()
        env = child_env(data_dir, port, settings or {})
        for name, password in (users or {}).items():
            added = subprocess.run(
                [*argv, "users", "add", name],
                cwd=tmp,
                env={**env, "APP_USER_PASSWORD": password},
                capture_output=True,
                text=True,
                timeout=120,
            )
            if added.returncode != 0:
                raise ChatAppError(f"could not create the user {name!r}: {added.stderr or added.stdout}")
        log_path = Path(tmp) / "app.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                argv,
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        app = ChatApp(process, f"http://127.0.0.1:{port}", data_dir, log_path, dict(users or {}), argv)
        try:
            app.wait_until_serving()
            yield app
        finally:
            if process.poll() is None:
                app.stop()
