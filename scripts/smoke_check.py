"""Start `python app.py` as a new user would and check that it serves a chat, then stops cleanly.

    python scripts/smoke_check.py --python .venv/bin/python [--data-dir DIR]
    python scripts/smoke_check.py --command "/tmp/venv/bin/a2a-delegation-chat" --cwd /tmp/run   (the package)

What it checks, in order (exit code 1 and the server's output on the first failure):

1. the app prints where to open it (`Open http://127.0.0.1:PORT`), `GET /` answers 200 and its
   stylesheet `/assets/app.css` and script `/assets/app.js` are served;
2. one chat turn over the REST API: a new session with the default agent, a message, and its
   event stream read to the `finish` event, with text on the way;
3. SIGTERM stops it with exit code 0 and no traceback in its output.

Standard library only, so that it checks the environment it is given and nothing else.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60.0
TURN_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
# Settings of the caller's shell that would make this run differ from a new user's first one.
_DROPPED_ENV = (
    "PYTEST_CURRENT_TEST",
    "NICEGUI_USER_SIMULATION",
    "NICEGUI_STORAGE_PATH",
    "HOST",
    "PORT",
    "DATABASE_URL",
    "REDIS_URL",
    "REDIS_HOST",
    "PUBLIC_BASE_URL",
    "DEFAULT_MODEL",
    "STORAGE_SECRET",
)


class SmokeError(Exception):
    """A check failed; the message says which and what was seen."""


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def request(base: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict | str]:
    """One HTTP request; returns the status and the parsed JSON (or the text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{base}{path}", data=data, method=method, headers={"content-type": "application/json"} if data else {}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    text = raw.decode("utf-8", "replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def wait_for_first_page(base: str, process: subprocess.Popen) -> float:
    """Poll `GET /` until it answers 200; returns the seconds it took."""
    started = time.monotonic()
    last = "no answer yet"
    while time.monotonic() - started < START_TIMEOUT_S:
        if process.poll() is not None:
            raise SmokeError(f"the app exited with code {process.returncode} before serving its first page")
        try:
            status, _ = request(base, "GET", "/")
            if status == 200:
                return time.monotonic() - started
            last = f"HTTP {status}"
        except OSError as exc:
            last = repr(exc)
        time.sleep(0.1)
    raise SmokeError(f"GET / did not answer 200 within {START_TIMEOUT_S:.0f} s (last: {last})")


def check_assets(base: str) -> None:
    """The first page links the app's stylesheet and script, and both are served (from the package, installed)."""
    _, page = request(base, "GET", "/")
    for path, kind in (("/assets/app.css", "text/css"), ("/assets/app.js", "javascript")):
        if path not in str(page):
            raise SmokeError(f"the first page does not link {path}")
        req = urllib.request.Request(f"{base}{path}")
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                status, content_type, size = (
                    response.status,
                    response.headers.get("content-type", ""),
                    len(response.read()),
                )
        except urllib.error.HTTPError as exc:
            raise SmokeError(f"GET {path} answered {exc.code}") from None
        if status != 200 or kind not in content_type or size == 0:
            raise SmokeError(f"GET {path} answered {status} {content_type!r} with {size} bytes")


def run_chat_turn(base: str) -> tuple[float, int]:
    """A session, a message and its stream read to `finish`; returns the seconds and the text length."""
    started = time.monotonic()
    status, session = request(base, "POST", "/api/sessions", {})
    if status != 201 or not isinstance(session, dict):
        raise SmokeError(f"POST /api/sessions answered {status}: {session}")
    session_id = session["id"]
    status, turn = request(base, "POST", f"/api/sessions/{session_id}/messages", {"content": "hello"})
    if status != 202:
        raise SmokeError(f"POST /api/sessions/{session_id}/messages answered {status}: {turn}")
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=TURN_TIMEOUT_S)
    try:
        conn.request("GET", f"/api/sessions/{session_id}/stream", headers={"accept": "text/event-stream"})
        response = conn.getresponse()
        if response.status != 200:
            raise SmokeError(f"the session's stream answered {response.status}: {response.read()[:500]!r}")
        text = ""
        for raw in response:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            kind = event.get("type")
            if kind == "text-delta":
                text += event.get("delta", "")
            elif kind == "error":
                raise SmokeError(f"the turn failed: {event}")
            elif kind == "finish":
                if not text.strip():
                    raise SmokeError("the turn finished without any text")
                return time.monotonic() - started, len(text)
            if time.monotonic() - started > TURN_TIMEOUT_S:
                break
        raise SmokeError(f"the stream ended or timed out before its `finish` event (text so far: {text[:200]!r})")
    finally:
        conn.close()


def stop(process: subprocess.Popen) -> float:
    """SIGTERM, then wait; returns the seconds it took to exit."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise SmokeError(f"the app did not exit within {STOP_TIMEOUT_S:.0f} s of SIGTERM") from None
    return time.monotonic() - started


def main() -> int:
    """Run the checks; 0 when all pass."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the environment to check")
    parser.add_argument("--data-dir", type=Path, help="DATA_DIR for the app (default: a temporary folder)")
    parser.add_argument("--command", help="start the app with this command instead of `PYTHON app.py` (the package)")
    parser.add_argument("--cwd", type=Path, default=ROOT, help="the working folder of the app (default: the checkout)")
    args = parser.parse_args()
    command = shlex.split(args.command) if args.command else [args.python, "app.py"]
    if args.data_dir is None:
        with tempfile.TemporaryDirectory(prefix="a2a-smoke-") as tmp:
            return check(command, Path(tmp) / "data", args.cwd)
    return check(command, args.data_dir, args.cwd)


def check(command: list[str], data_dir: Path, cwd: Path = ROOT) -> int:
    """Start the app with `command` in `cwd` on `data_dir`, run the checks and stop it; 0 when all pass."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    env.update(DATA_DIR=str(data_dir), PORT=str(port), PYTHONUNBUFFERED="1")
    log_path = data_dir / "smoke-app-output.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        first_page_s = wait_for_first_page(base, process)
        output = log_path.read_text(errors="replace")
        if f"Open {base}" not in output:
            raise SmokeError(f"the app did not print where to open it (expected 'Open {base}')")
        check_assets(base)
        turn_s, chars = run_chat_turn(base)
        stop_s = stop(process)
        output = log_path.read_text(errors="replace")
        if process.returncode != 0:
            raise SmokeError(f"after SIGTERM the app exited with code {process.returncode}, not 0")
        if "Traceback" in output:
            raise SmokeError("the app printed a traceback")
    except SmokeError as exc:
        if process.poll() is None:
            process.kill()
            process.wait()
        print(
            f"smoke: FAILED: {exc}\n--- the app's output ---\n{log_path.read_text(errors='replace')}", file=sys.stderr
        )
        return 1
    print(
        f"smoke: first page {first_page_s:.1f} s after start, with its styles and script; a chat turn of {chars} "
        f"characters in {turn_s:.1f} s; stopped by SIGTERM with exit code 0 in {stop_s:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
