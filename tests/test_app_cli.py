"""`python app.py` as a command: `users add|list|passwd`, and no single-user mode beyond loopback.

The commands run as real subprocesses on their own data dirs (side by side where independent);
the error paths call `app.main` in-process, which is the same code without the start-up cost.
"""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from core.auth import accounts
from core.chat import sessions as sessions_store
from core.chat.demo_model import plan_reply
from core.db import Database, describe_database
from core.services import Services, StartupRefusedError
from core.settings import describe_redis
from tests.conftest import make_settings
from tests.utils.app_process import ROOT, app_process, child_env, free_port
from tests.utils.sync import run_sync

COMMAND_TIMEOUT_S = 30
HTTP_TIMEOUT_S = 30  # generous: a busy machine (a CI runner, parallel test runs) can stall a fresh app for seconds


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def start_app(args: list[str], data_dir: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "app.py", *args],
        cwd=ROOT,
        env=child_env(data_dir, **env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # no terminal: a password prompt fails at once instead of waiting
    )


def finish(proc: subprocess.Popen) -> Result:
    try:
        out, err = proc.communicate(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"`python app.py {' '.join(proc.args[2:])}` did not finish in {COMMAND_TIMEOUT_S} s:\n{err}")
    return Result(proc.returncode, out, err)


def run_all(*commands: tuple[list[str], Path, dict[str, str]]) -> list[Result]:
    """Run independent commands side by side; results in the same order."""
    started = [start_app(args, data_dir, **env) for args, data_dir, env in commands]
    return [finish(proc) for proc in started]


def authenticate(data_dir: Path, username: str, password: str) -> bool:
    db = Database(make_settings(data_dir.parent, data_dir=data_dir).database)

    async def check() -> bool:
        try:
            async with db.session() as s:
                return await accounts.authenticate(s, username=username, password=password) is not None
        finally:
            await db.close()

    return run_sync(check())


def create_account(data_dir: Path, username: str, password: str) -> None:
    db = Database(make_settings(data_dir.parent, data_dir=data_dir).database)
    db.migrate()

    async def create() -> None:
        try:
            async with db.session() as s:
                await accounts.create_user(s, username=username, password=password)
        finally:
            await db.close()

    run_sync(create())


def is_listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


# -- users add / list / passwd --------------------------------------------------------------


def test_users_add_then_list_and_passwd(tmp_path: Path) -> None:
    main = tmp_path / "main"
    (add,) = run_all((["users", "add", "alice"], main, {"APP_USER_PASSWORD": "first-password"}))
    assert add.returncode == 0, add.stderr
    assert "created user 'alice'" in add.stdout
    assert authenticate(main, "alice", "first-password")
    assert not authenticate(main, "alice", "wrong-password")

    # A copy of the data dir, so that `list` and `passwd` can run side by side on their own files.
    copy = tmp_path / "copy"
    shutil.copytree(main, copy)
    listed, passwd = run_all(
        (["users", "list"], copy, {}),
        (["users", "passwd", "alice"], main, {"APP_USER_PASSWORD": "second-password"}),
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == ["alice\tpassword\tadmin"]  # the first account is an admin
    assert passwd.returncode == 0, passwd.stderr
    assert "changed the password of 'alice'" in passwd.stdout
    assert authenticate(main, "alice", "second-password")
    assert not authenticate(main, "alice", "first-password")


# The error paths run `app.main` in this process (the same code as the subprocess, minus its
# two-second start), with the data dir of `isolated_env`.


@pytest.fixture
def run_main(monkeypatch: pytest.MonkeyPatch, isolated_env: Path, capsys: pytest.CaptureFixture):
    import app

    monkeypatch.setenv("NICEGUI_STORAGE_PATH", str(isolated_env / "nicegui-storage"))  # main() setdefault()s it
    monkeypatch.delenv("APP_USER_PASSWORD", raising=False)

    def run(*argv: str, password: str | None = None, typed: list[str] | None = None) -> Result:
        if password is not None:
            monkeypatch.setenv("APP_USER_PASSWORD", password)
        else:
            monkeypatch.delenv("APP_USER_PASSWORD", raising=False)
        answers = iter(typed or [])
        monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            app.main(list(argv))
        out, err = capsys.readouterr()
        code = exited.value.code
        if isinstance(code, str):  # sys.exit("message") prints the message and exits with 1
            return Result(1, out, err + code)
        return Result(code or 0, out, err)

    return run


def test_users_errors_are_clear(run_main, isolated_env: Path) -> None:
    data = isolated_env / "data"
    too_short = run_main("users", "add", "bob", password="short")
    assert too_short.returncode == 2 and "at least 8 characters" in too_short.stderr
    no_such_user = run_main("users", "passwd", "nobody", password="long-enough-password")
    assert no_such_user.returncode == 2 and "there is no user 'nobody'" in no_such_user.stderr
    reserved = run_main("users", "add", "local", password="long-enough-password")
    assert reserved.returncode == 2 and "reserved for single-user mode" in reserved.stderr
    bad_name = run_main("users", "add", "no spaces", password="long-enough-password")
    assert bad_name.returncode == 2 and "a username is 1-64 letters" in bad_name.stderr

    assert run_main("users", "add", "alice", password="alice-password").returncode == 0
    again = run_main("users", "add", "alice", password="other-password")
    assert again.returncode == 2 and "the user 'alice' already exists" in again.stderr
    assert authenticate(data, "alice", "alice-password")
    assert not authenticate(data, "bob", "short")


def test_without_the_env_variable_the_password_is_asked_twice(run_main, isolated_env: Path) -> None:
    data = isolated_env / "data"
    differ = run_main("users", "add", "carol", typed=["one-password", "another-password"])
    assert differ.returncode != 0 and "the passwords differ" in differ.stderr
    assert not authenticate(data, "carol", "one-password")

    typed = run_main("users", "add", "dave", typed=["typed-password", "typed-password"])
    assert typed.returncode == 0, typed.stderr
    assert authenticate(data, "dave", "typed-password")
    listed = run_main("users", "list")
    assert listed.stdout.splitlines() == ["dave\tpassword\tadmin"]


def test_the_first_account_is_admin_and_others_are_made_admins(run_main) -> None:
    assert "(admin)" in run_main("users", "add", "alice", password="alice-password").stdout
    assert "(admin)" not in run_main("users", "add", "bob", password="bob-password").stdout
    assert "(admin)" in run_main("users", "add", "carol", "--admin", password="carol-password").stdout
    assert run_main("users", "list").stdout.splitlines() == [
        "alice\tpassword\tadmin",
        "bob\tpassword",
        "carol\tpassword\tadmin",
    ]
    promoted = run_main("users", "promote", "bob")
    assert promoted.returncode == 0 and "'bob' is an admin" in promoted.stdout
    assert "bob\tpassword\tadmin" in run_main("users", "list").stdout.splitlines()
    nobody = run_main("users", "promote", "nobody")
    assert nobody.returncode == 2 and "there is no user 'nobody'" in nobody.stderr


def test_users_needs_an_action(run_main) -> None:
    missing = run_main("users")
    assert missing.returncode == 2 and "add" in missing.stderr and "passwd" in missing.stderr


# -- serving ----------------------------------------------------------------------------------


def test_listening_beyond_loopback_without_accounts_is_refused(tmp_path: Path) -> None:
    port = free_port()
    result = finish(start_app([], tmp_path / "data", HOST="0.0.0.0", PORT=str(port)))
    assert result.returncode != 0
    assert "Refusing to listen on 0.0.0.0" in result.stderr
    assert "python app.py users add NAME" in result.stderr and "HOST=127.0.0.1" in result.stderr
    assert not is_listening(port)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "example.org"])
def test_prepare_refuses_a_non_loopback_host_without_accounts(tmp_path: Path, host: str) -> None:
    services = Services.build(make_settings(tmp_path, host=host))
    with pytest.raises(StartupRefusedError, match=f"Refusing to listen on {host}"):
        services.prepare()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_prepare_allows_single_user_mode_on_loopback(tmp_path: Path, host: str) -> None:
    services = Services.build(make_settings(tmp_path, host=host))
    services.prepare()
    assert not services.auth.multi_user and services.auth.local_user_id is not None


def test_prepare_allows_any_host_once_an_account_exists(tmp_path: Path) -> None:
    # What `python app.py` with HOST=0.0.0.0 checks before it binds (app.serve: build -> prepare).
    # The live check below binds loopback only, so the test never opens a port to the network.
    create_account(tmp_path / "data", "alice", "alice-password")
    services = Services.build(make_settings(tmp_path, host="0.0.0.0"))
    services.prepare()
    assert services.auth.multi_user and services.auth.local_user_id is None


def test_with_an_account_the_app_serves_login_and_docs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    create_account(data, "alice", "alice-password")
    with app_process(data) as app:
        base = app.base_url
        deadline = time.monotonic() + 20
        while True:
            assert app.process.poll() is None, f"the app exited with {app.process.returncode}: {app.output}"
            try:
                docs = httpx.get(f"{base}/docs", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the app did not start listening"
                time.sleep(0.1)
        assert docs.status_code == 200 and "swagger-ui" in docs.text.lower()
        assert httpx.get(f"{base}/redoc", timeout=HTTP_TIMEOUT_S).status_code == 200  # the docs need no login
        schema = httpx.get(f"{base}/openapi.json", timeout=HTTP_TIMEOUT_S)
        assert schema.status_code == 200 and "/api/sessions" in schema.json()["paths"]
        page = httpx.get(f"{base}/", timeout=HTTP_TIMEOUT_S)
        assert page.status_code in {302, 303, 307}
        assert page.headers["location"] == "/login?redirect_to=%2F"
        login = httpx.get(f"{base}/login", timeout=HTTP_TIMEOUT_S)
        assert login.status_code == 200 and login.headers.get("x-nicegui-content") == "page"
        assert httpx.get(f"{base}/api/sessions", timeout=HTTP_TIMEOUT_S).status_code == 401
        assert httpx.get(f"{base}/api/sessions", auth=("alice", "alice-password"), timeout=HTTP_TIMEOUT_S).json() == []
        assert "mode: accounts" in app.output
        assert app.stop() == 0


def test_the_app_says_where_to_open_it_and_how_it_runs(tmp_path: Path) -> None:
    with app_process(tmp_path / "data") as app:
        app.wait_until_serving()
        lines = app.output.splitlines()
        assert f"Open {app.base_url}" in lines
        [summary] = [line for line in lines if line.startswith("A2A Delegation Chat: ")]
        assert "mode: single-user" in summary
        assert f"database: SQLite {(tmp_path / 'data' / 'app.db').resolve()}" in summary
        assert "Redis: none" in summary and "default model: local/demo (offline demo model)" in summary
        assert app.stop() == 0


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:////srv/chat/app.db", "SQLite /srv/chat/app.db"),
        ("sqlite://", "SQLite in memory"),
        ("postgresql://chat:s3cret-pw@db.internal:5433/chat", "postgresql on db.internal:5433/chat"),
        ("postgresql+psycopg://chat:s3cret-pw@db.internal/chat", "postgresql on db.internal/chat"),
    ],
)
def test_the_database_is_described_without_its_password(url: str, expected: str) -> None:
    assert describe_database(url) == expected


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        (None, "none"),
        ("redis://127.0.0.1:6379/0", "127.0.0.1:6379/0"),
        ("redis://:s3cret-pw@cache.internal/2", "cache.internal:6379/2"),
        ("rediss://user:s3cret-pw@cache.internal:6380", "cache.internal:6380/0"),
    ],
)
def test_redis_is_described_without_its_password(dsn: str | None, expected: str) -> None:
    assert describe_redis(dsn) == expected


@pytest.mark.parametrize(("pong_timeout_ms", "at_least_s", "at_most_s"), [(300, 0.5, 1.5), (2000, 2.2, 4.0)])
def test_a_half_open_agent_is_dropped_after_the_heartbeat_and_the_pong_timeout(
    tmp_path: Path,
    pong_timeout_ms: int,
    at_least_s: float,
    at_most_s: float,
) -> None:
    """An agent that completes the WebSocket handshake and then goes silent (no pong) is dropped in time.

    With a 300 ms ping period the server closes the socket one period plus `BROKER_PONG_TIMEOUT` after
    the handshake (0.6 s or 2.3 s here), not after a second ping period.
    """
    with app_process(
        tmp_path / "data", BROKER_HEARTBEAT_INTERVAL="300", BROKER_PONG_TIMEOUT=str(pong_timeout_ms)
    ) as app:
        app.wait_until_serving()
        port = int(app.base_url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as silent:
            silent.sendall(
                b"GET /a2a?a2a_id=silent HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            received = silent.recv(4096)
            connected = time.monotonic()
            assert received.startswith(b"HTTP/1.1 101")
            while chunk := silent.recv(4096):  # the card request, pings; never an answer from us
                received += chunk
            closed_after = time.monotonic() - connected
        assert b"keepalive ping timeout" in received
        assert at_least_s <= closed_after <= at_most_s, closed_after
        assert app.stop() == 0


# -- stopping: Ctrl+C and SIGTERM end the app with code 0 and no traceback ----------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_while_serving_exits_0_and_keeps_the_running_turn(tmp_path: Path, signum: int) -> None:
    data = tmp_path / "data"
    with app_process(data, DEMO_MODEL_DELAY_MS="20") as app:
        app.wait_until_serving()
        session_id = httpx.post(f"{app.base_url}/api/sessions", json={}, timeout=HTTP_TIMEOUT_S).json()["id"]
        httpx.post(
            f"{app.base_url}/api/sessions/{session_id}/messages",
            json={"content": "/lorem 3000"},
            timeout=HTTP_TIMEOUT_S,
        )
        # A client following the answer keeps a connection open while the app stops. The first turn of a
        # fresh app imports LiteLLM: on a busy machine the first token can take over 10 s.
        with httpx.stream("GET", f"{app.base_url}/api/sessions/{session_id}/stream", timeout=30) as stream:
            lines = stream.iter_lines()
            while "text-delta" not in next(lines):
                pass
            assert app.stop(signum) == 0
        assert "Traceback" not in app.output, app.output
    [user_message, answer] = messages_of(data, session_id)
    assert answer.role == "assistant" and answer.status == "canceled" and answer.content.startswith("lorem ipsum")


def test_a_kill_during_an_answer_keeps_what_was_streamed_as_interrupted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with app_process(data, DEMO_MODEL_DELAY_MS="20") as app:
        app.wait_until_serving()
        session_id = httpx.post(f"{app.base_url}/api/sessions", json={}, timeout=HTTP_TIMEOUT_S).json()["id"]
        posted = httpx.post(
            f"{app.base_url}/api/sessions/{session_id}/messages",
            json={"content": "/lorem 3000"},
            timeout=HTTP_TIMEOUT_S,
        )
        assert posted.status_code == 202
        with httpx.stream("GET", f"{app.base_url}{posted.json()['streamUrl']}", timeout=10) as stream:
            lines = stream.iter_lines()
            while "text-delta" not in next(lines):
                pass
        time.sleep(2.5)  # the answer streams on (~50 words a second), its draft saved about once a second
        app.process.kill()  # SIGKILL: nothing runs on the way out
        app.process.wait()

    with app_process(data) as app:
        app.wait_until_serving()
        messages = httpx.get(f"{app.base_url}/api/sessions/{session_id}/messages", timeout=HTTP_TIMEOUT_S).json()
        assert "marked interrupted" in app.output, app.output
    [question, answer] = messages
    assert (question["role"], question["content"]) == ("user", "/lorem 3000")
    assert answer["role"] == "assistant" and answer["status"] == "interrupted"
    assert "interrupted by a server restart" in answer["error"].lower()
    full = "".join(plan_reply([{"role": "user", "content": "/lorem 3000"}], tools=None).tokens)
    assert answer["content"] and full.startswith(answer["content"])
    assert 50 < len(answer["content"].split()) < 3000


def test_a_second_ctrl_c_only_says_it_is_stopping(tmp_path: Path) -> None:
    with app_process(tmp_path / "data") as app:
        app.wait_until_serving()
        app.process.send_signal(signal.SIGINT)
        app.process.send_signal(signal.SIGINT)
        assert app.stop(signal.SIGINT) in {0, 1}  # a third one may stop it at once (code 1)
        assert "Traceback" not in app.output, app.output


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_during_start_up_exits_0_without_a_traceback(tmp_path: Path, signum: int) -> None:
    with app_process(tmp_path / "data") as app:
        # Migrating: app.py runs (its handlers are in place), the server does not handle signals yet.
        deadline = time.monotonic() + 20
        while not (tmp_path / "data" / "app.db").exists():
            assert time.monotonic() < deadline and app.process.poll() is None, app.output
            time.sleep(0.01)
        assert app.stop(signum) == 0
        assert "Traceback" not in app.output, app.output


def messages_of(data_dir: Path, session_id: str) -> list:
    db = Database(make_settings(data_dir.parent, data_dir=data_dir).database)

    async def read() -> list:
        try:
            async with db.session() as s:
                return await sessions_store.list_messages(s, session_id=session_id)
        finally:
            await db.close()

    return run_sync(read())


@pytest.mark.parametrize(
    ("debug", "broker", "chat", "root"),
    [
        (None, logging.INFO, logging.INFO, logging.INFO),
        ("", logging.INFO, logging.INFO, logging.INFO),
        ("false", logging.INFO, logging.INFO, logging.INFO),
        ("a2a-broker", logging.DEBUG, logging.INFO, logging.INFO),  # seed 003's namespace
        ("a2a-broker,a2a-chat", logging.DEBUG, logging.DEBUG, logging.INFO),
        ("1", logging.DEBUG, logging.DEBUG, logging.DEBUG),
    ],
)
def test_debug_names_what_is_logged_in_detail(debug, broker, chat, root) -> None:
    import app

    loggers = [logging.getLogger(), logging.getLogger("core"), logging.getLogger("core.broker")]
    saved = [lg.level for lg in loggers]
    try:
        for lg in loggers[1:]:
            lg.setLevel(logging.NOTSET)
        app.configure_logging(debug)
        assert logging.getLogger("core.broker.service").getEffectiveLevel() == broker
        assert logging.getLogger("core.chat").getEffectiveLevel() == chat
        assert logging.getLogger("nicegui").getEffectiveLevel() == root
    finally:
        for lg, level in zip(loggers, saved, strict=True):
            lg.setLevel(level)
