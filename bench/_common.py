"""Helpers shared by the benchmark scripts: a clean app subprocess, CPU times, a free port.

Only loopback traffic: the server is started on 127.0.0.1 and polled there.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the benchmarks share the tests' free-port helper (tests/utils/ports.py)
    sys.path.insert(0, str(ROOT))

from tests.utils.ports import free_port  # noqa: E402

VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
PYTHON = str(VENV_PYTHON if VENV_PYTHON.exists() else Path(sys.executable))
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Variables a developer's shell might carry that would change what the server does.
_DROP_EXACT = {"PYTEST_CURRENT_TEST", "NICEGUI_USER_SIMULATION", "NICEGUI_STORAGE_PATH", "NICEGUI_SCREEN_TEST_PORT"}
_APP_ENV_VARS = [
    "HOST",
    "PORT",
    "PUBLIC_BASE_URL",
    "DATA_DIR",
    "DATABASE_URL",
    "STORAGE_SECRET",
    "DEFAULT_MODEL",
    "DEMO_MODEL_DELAY_MS",
    "LLM_API_BASE",
    "LLM_API_KEY",
    "LLM_TIMEOUT_S",
    "TURN_TIMEOUT_S",
    "MAX_TURN_STEPS",
    "MAX_MESSAGE_CHARS",
    "STREAM_BUFFER_MAX_EVENTS",
    "STREAM_BUFFER_TTL_S",
    "STREAM_SUBSCRIBER_QUEUE",
    "REQUEST_TIMEOUT",
    "TASK_IDLE_TIMEOUT",
    "INJECT_MIN_INTERVAL",
    "BLACKLIST_IP",
    "DEBUG",
    "CONFIG_FILE",
    "ENV_FILE",
    "INSTANCE_ID",
    "BROKER_DISPATCH_TOKEN",
    "BROKER_OPEN_DISPATCH",
    "LOOP_PROBE",
]
_APP_ENV_PREFIXES = ("REDIS_", "AUTH_")


def clean_env(data_dir: Path, port: int, **extra: str) -> dict[str, str]:
    """The environment for `python app.py`: no test markers, no config/.env files, this data dir and port."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _DROP_EXACT and k not in _APP_ENV_VARS and not k.startswith(_APP_ENV_PREFIXES)
    }
    env.update(
        HOST="127.0.0.1",
        PORT=str(port),
        DATA_DIR=str(data_dir),
        CONFIG_FILE=str(data_dir.parent / "does-not-exist.json"),
        ENV_FILE=str(data_dir.parent / "does-not-exist.env"),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read().decode()
    # The command name (field 2) may contain spaces; it is wrapped in parentheses.
    fields = raw[raw.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / CLK_TCK


def http_get(port: int, path: str = "/", timeout: float = 5.0) -> tuple[int, bytes]:
    """One GET on 127.0.0.1:port; (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def http_json(
    port: int, method: str, path: str, body: object | None = None, timeout: float = 10.0
) -> tuple[int, object]:
    """A JSON request on 127.0.0.1:port; (status, decoded body or None)."""
    import json

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        try:
            return resp.status, json.loads(data) if data else None
        except ValueError:
            return resp.status, data
    finally:
        conn.close()


@dataclass
class Server:
    """A running `python app.py`."""

    proc: subprocess.Popen
    port: int
    data_dir: Path
    log_path: Path
    spawned_at: float  # time.perf_counter() just before Popen
    first_200_s: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


def spawn(
    data_dir: Path,
    *,
    port: int | None = None,
    env_extra: dict[str, str] | None = None,
    log_path: Path | None = None,
    python_args: list[str] | None = None,
) -> Server:
    """Start `python app.py` (not waiting for it)."""
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_path or data_dir.parent / f"server-{port}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the process
    env = clean_env(data_dir, port, **(env_extra or {}))
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [PYTHON, *(python_args or []), "app.py"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    log.close()
    return Server(proc=proc, port=port, data_dir=data_dir, log_path=log_path, spawned_at=t0)


def wait_first_200(server: Server, *, path: str = "/", interval: float = 0.02, timeout: float = 30.0) -> float:
    """Poll until GET `path` answers 200; seconds since spawn."""
    deadline = server.spawned_at + timeout
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode} before answering:\n{server.log_tail()}")
        try:
            status, _ = http_get(server.port, path, timeout=2.0)
            if status == 200:
                server.first_200_s = time.perf_counter() - server.spawned_at
                return server.first_200_s
        except (ConnectionError, OSError, http.client.HTTPException):
            pass
        if time.perf_counter() > deadline:
            raise TimeoutError(f"no 200 on {path} within {timeout} s:\n{server.log_tail()}")
        time.sleep(interval)


def stop(server: Server, timeout: float = 10.0) -> None:
    """SIGTERM the server (by its pid), then SIGKILL it if it lingers."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(5)


@contextlib.contextmanager
def running_server(env_extra: dict[str, str] | None = None, *, tmp: Path | None = None) -> Iterator[Server]:
    """A fresh server in a temporary data dir, stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmpdir:
        base = tmp or Path(tmpdir)
        server = spawn(base / "data", env_extra=env_extra)
        try:
            wait_first_200(server)
            yield server
        finally:
            stop(server)


def wait_cpu_idle(pid: int, *, window: float = 0.5, threshold: float = 0.02, timeout: float = 20.0) -> float:
    """Wait until the process uses at most `threshold` CPU seconds per `window`; the seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        before = cpu_seconds(pid)
        time.sleep(window)
        if cpu_seconds(pid) - before <= threshold:
            return time.perf_counter() - t0
    return time.perf_counter() - t0


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: list[str], rows: list[list[object]]) -> str:
    """A plain-text table (also valid Markdown)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    for row in cells[1:]:
        lines.append(
            "| "
            + " | ".join(c.rjust(w) if _numeric(c) else c.ljust(w) for c, w in zip(row, widths, strict=True))
            + " |"
        )
    return "\n".join(lines)


def _numeric(text: str) -> bool:
    stripped = text.replace(",", "").replace(".", "").replace("×", "").replace("%", "").strip()
    return stripped.lstrip("+-").replace(" ", "").isdigit() if stripped else False
