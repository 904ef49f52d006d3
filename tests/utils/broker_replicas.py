"""Two replicas for the broker's cluster tests, on `tests/utils/cluster.py` (issue 18).

The database, the Redis key prefix, the admin account and the wait come from `tests/utils/cluster.py`;
this adds what the broker's tests need: the dispatch token, progress injects unthrottled, a public URL of
the caller's choice (Caddy's, in `e2e/test_cluster_caddy.py`), and the example echo agent of
`examples/echo_agent.py` dialled into a replica through the agent-side pipe (`python -m core.pipe`),
both real processes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.utils.app_process import ROOT, AppProcess, app_process, child_env, end_process
from tests.utils.broker import DISPATCH_TOKEN
from tests.utils.cluster import ADMIN, REPLICA_START_TIMEOUT_S, ClusterBackends, add_account
from tests.utils.ports import free_port


@dataclass
class Replicas:
    """Replicas A and B and what a test needs to reach them."""

    a: AppProcess
    b: AppProcess
    backends: ClusterBackends
    auth: tuple[str, str] = ADMIN  # the admin's HTTP Basic credentials for /api

    @property
    def redis_url(self) -> str:
        """The Redis the replicas share."""
        return self.backends.redis_url

    @property
    def internal_token(self) -> str:
        """The token replicas call each other with."""
        return self.backends.internal_token


@contextlib.contextmanager
def two_replicas(backends: ClusterBackends, tmp: Path, **extra: str) -> Iterator[Replicas]:
    """Make the admin, start replica A, then B, each waited for; stopped at the end."""
    add_account(backends, tmp / "cli")

    def env(port: int) -> dict[str, str]:
        url = f"http://127.0.0.1:{port}"
        return backends.env(
            **{
                "INSTANCE_ID": f"replica-{port}",
                "REPLICA_URL": url,
                "PUBLIC_BASE_URL": url,
                # No config file or .env of the working tree (module-scoped replicas start before per-test isolation).
                "CONFIG_FILE": str(tmp / "no-config.json"),
                "ENV_FILE": str(tmp / "no.env"),
                "BROKER_DISPATCH_TOKEN": DISPATCH_TOKEN,
                "DEMO_MODEL_DELAY_MS": "5",
                "INJECT_MIN_INTERVAL": "0",
                **extra,
            }
        )

    port_a, port_b = free_port(), free_port()
    with app_process(tmp / "a" / "data", port=port_a, **env(port_a)) as a:
        a.wait_until_serving(REPLICA_START_TIMEOUT_S, path="/login")
        with app_process(tmp / "b" / "data", port=port_b, **env(port_b)) as b:
            b.wait_until_serving(REPLICA_START_TIMEOUT_S, path="/login")
            try:
                yield Replicas(a, b, backends)
            finally:
                b.stop()
            a.stop()


@contextlib.contextmanager
def echo_agent(
    base_url: str,
    a2a_id: str,
    *,
    chat_agent: str | None = None,
    delay_s: float = 0.05,
    name: str = "Echo",
    timeout_s: float = 30.0,
) -> Iterator[subprocess.Popen]:
    """The example echo agent dialled into `base_url` as `a2a_id`; waits until that replica lists it."""
    query = f"a2a_id={a2a_id}" + (f"&agent_id={chat_agent}" if chat_agent else "")
    env = child_env(Path(os.devnull), ECHO_DELAY=str(delay_s), ECHO_NAME=name)
    env.pop("DATA_DIR", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "core.pipe",
            "--backoff-initial",
            "0.2",
            "--backoff-max",
            "1",
            base_url.replace("http://", "ws://") + f"/a2a?{query}",
            "--",
            sys.executable,
            str(ROOT / "examples" / "echo_agent.py"),
        ],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while a2a_id not in listed_agents(base_url):
            assert process.poll() is None, f"the echo agent's pipe exited with {process.returncode}"
            assert time.monotonic() < deadline, f"{a2a_id} did not connect to {base_url} within {timeout_s:.0f} s"
            time.sleep(0.1)
        yield process
    finally:
        end_process(process)


def listed_agents(base_url: str) -> set[str]:
    """The ids `GET /a2a/agents` lists."""
    return {a["a2a_id"] for a in httpx.get(f"{base_url}/a2a/agents", timeout=10).json()["agents"]}
