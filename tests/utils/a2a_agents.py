"""The remote A2A agents of the tests and the e2e tests, each in its own process until the block ends.

`running_agent(script, *args)` starts one of this folder's plain a2a-sdk agents on a free loopback port
(or on `port`, to bring the same agent back), waits until its card answers and yields the card URL;
`echo_server` and `asking_server` name the two such agents. The agent in the test's own process is
`a2a_files_agent.files_agent`.

Only the standard library, httpx and `tests.utils`: the e2e tests import it without `tests/conftest.py`.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO

import httpx

from tests.utils.app_process import end_process
from tests.utils.ports import free_port

UTILS = Path(__file__).resolve().parent
ECHO_SERVER = UTILS / "a2a_echo_server.py"
ASKING_SERVER = UTILS / "a2a_asking_server.py"
START_TIMEOUT_S = 20.0
LOCAL_AGENTS = ["127.0.0.1"]  # these agents run on this machine: allow-list loopback (OUTBOUND_ALLOW_HOSTS)


def card_url_at(port: int) -> str:
    """The card URL of an agent of this folder listening on `port`."""
    return f"http://127.0.0.1:{port}/.well-known/agent-card.json"


def _wait_for_card(process: subprocess.Popen, url: str, log: IO[bytes], name: str) -> None:
    """Poll the card until it answers 200; fail with the agent's output if it exits or takes too long."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        exited = process.poll() is not None
        if exited or time.monotonic() > deadline:
            log.seek(0)
            output = log.read().decode(errors="replace")
            raise RuntimeError(f"{name} {'exited' if exited else 'did not start'}: {output}")
        time.sleep(0.05)


@contextmanager
def running_agent(script: Path, *args: str, port: int | None = None) -> Iterator[str]:
    """Run `python script --port PORT *args` (on `port`, or a free one); yields its card URL, stops it on exit.

    Its output goes to a temporary file, not a pipe no one reads (that could fill and stall it); a start
    that fails says so with that output.
    """
    port = port or free_port()
    url = card_url_at(port)
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [sys.executable, str(script), "--port", str(port), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_for_card(process, url, log, f"the agent {script.name}")
            yield url
        finally:
            end_process(process)


def echo_server(*args: str, port: int | None = None) -> AbstractContextManager[str]:
    """The echo agent (`a2a_echo_server.py`: `--name`, `--v03-only`, `--delay-ms`, `--push`); yields its card URL."""
    return running_agent(ECHO_SERVER, *args, port=port)


def asking_server(*, auth: bool = False) -> AbstractContextManager[str]:
    """The agent that asks back (`a2a_asking_server.py`): `input-required`, or `auth-required` with `auth`."""
    return running_agent(ASKING_SERVER, *(["--auth"] if auth else []))
