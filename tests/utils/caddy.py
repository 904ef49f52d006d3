"""Caddy in front of replicas, with the project's own `deploy/Caddyfile`, for the cluster tests.

Caddy is found at `$CADDY_BIN`, on PATH, or at `.venv/bin/caddy` (where `scripts/install-caddy`
puts Debian's binary; `scripts/test` runs it). Without it the tests that need it skip, except under
CI=true, where they fail.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.utils.app_process import end_process

ROOT = Path(__file__).resolve().parents[2]
CADDYFILE = ROOT / "deploy" / "Caddyfile"
COOKIE = "a2a_replica"  # lb_policy cookie's name in deploy/Caddyfile


def caddy_binary() -> str | None:
    """Where Caddy is, or None."""
    configured = os.environ.get("CADDY_BIN")
    if configured:
        return configured
    found = shutil.which("caddy")
    if found:
        return found
    local = ROOT / ".venv" / "bin" / "caddy"
    return str(local) if local.exists() else None


@dataclass
class Caddy:
    """A running Caddy: its URL, and which upstream a stickiness cookie names."""

    url: str
    secret: str
    upstreams: list[str]
    log_path: Path

    def upstream_of(self, cookie_value: str) -> str | None:
        """The upstream (host:port) a `a2a_replica` cookie sends to (Caddy signs the dial address with the secret)."""
        for upstream in self.upstreams:
            mac = hmac.new(self.secret.encode(), upstream.encode(), hashlib.sha256).hexdigest()
            if hmac.compare_digest(mac, cookie_value):
                return upstream
        return None


@contextmanager
def caddy_proxy(
    binary: str, port: int, upstreams: list[str], tmp: Path, *, secret: str = "test-lb-secret", timeout_s: float = 20.0
) -> Iterator[Caddy]:
    """Run `caddy run` with deploy/Caddyfile on 127.0.0.1:`port` until the block ends; waits until it proxies."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SITE_ADDRESS": f"http://127.0.0.1:{port}",
        "UPSTREAMS": " ".join(upstreams),
        "LB_SECRET": secret,
        "XDG_DATA_HOME": str(tmp / "data"),
        "XDG_CONFIG_HOME": str(tmp / "config"),
        "HOME": str(tmp),
    }
    log_path = tmp / "caddy.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [binary, "run", "--config", str(CADDYFILE), "--adapter", "caddyfile"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            assert process.poll() is None, f"caddy exited with {process.returncode}:\n{log_path.read_text()}"
            try:
                if httpx.get(f"{url}/a2a/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"caddy did not proxy within {timeout_s:.0f} s:\n{log_path.read_text()}"
            time.sleep(0.1)
        yield Caddy(url, secret, upstreams, log_path)
    finally:
        end_process(process)
