"""`python app.py` as a real process on a free 127.0.0.1 port, for tests of what a user runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.utils.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0

# The child must not think it runs under pytest or NiceGUI's simulation (see the playwright notes),
# nor inherit the parent's NiceGUI storage path, a password or where to listen.
DROPPED_ENV = {
    "PYTEST_CURRENT_TEST",
    "NICEGUI_USER_SIMULATION",
    "NICEGUI_STORAGE_PATH",
    "APP_USER_PASSWORD",
    "HOST",
    "PORT",
}


def child_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a child `python app.py`: this one, less what belongs to pytest, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update(DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1", **extra)
    return env


@dataclass
class AppProcess:
    """A running `python app.py`; its output (stdout and stderr) goes to `log_path`."""

    process: subprocess.Popen
    base_url: str
    log_path: Path

    @property
    def output(self) -> str:
        """Everything it has printed so far."""
        return self.log_path.read_text(errors="replace")

    def wait_until_serving(self, timeout_s: float = START_TIMEOUT_S, path: str = "/") -> float:
        """Poll `GET path` until it answers 200; returns the seconds it took.

        With accounts `/` redirects to the login page: wait on `/login` there.
        """
        started = time.monotonic()
        last = "no answer yet"
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise AssertionError(f"the app exited with {self.process.returncode}:\n{self.output}")
            try:
                response = httpx.get(f"{self.base_url}{path}", timeout=2)
                if response.status_code == 200:
                    return time.monotonic() - started
                last = f"HTTP {response.status_code}"
            except httpx.TransportError as exc:
                last = repr(exc)
            time.sleep(0.05)
        raise AssertionError(f"GET {path} did not answer 200 within {timeout_s:.0f} s (last: {last}):\n{self.output}")

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Send `signum` and wait for the exit; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"the app did not exit within {STOP_TIMEOUT_S:.0f} s of {signum!r}") from None


def end_process(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Ask a helper process to stop (SIGTERM); kill it if it is still there after `timeout_s`."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def app_process(data_dir: Path, *args: str, port: int | None = None, **env: str) -> Iterator[AppProcess]:
    """Start `python app.py [args]` with `DATA_DIR=data_dir` on a free port; killed at the end if still running."""
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / f"app-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "app.py", *args],
            cwd=ROOT,
            env=child_env(data_dir, HOST="127.0.0.1", PORT=str(port), **env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    running = AppProcess(process, f"http://127.0.0.1:{port}", log_path)
    try:
        yield running
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
