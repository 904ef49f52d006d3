"""A deployment that heals (issue 37, item 4; README "Running as several replicas", "On one host").

The one-host recipe as a user runs it: `deploy/run-one-host` with an env file (free ports, a fresh PostgreSQL
database, a Redis key prefix of its own) migrates, creates the first account and runs supervisord with two
replicas and Caddy. One replica is killed with SIGKILL: the site keeps answering through Caddy while it is down,
supervisord starts it again, and everything stops cleanly at the end.

The cluster's start also checks the Redis it is given: `appendonly yes` and `maxmemory-policy noeviction`, or a
WARNING that says which setting, what it is, what it must be and what is lost otherwise (`check_redis_settings`).

Real PostgreSQL (TEST_POSTGRES_URL), Redis (TEST_REDIS_URL), Caddy (tests/utils/caddy.py) and supervisor (the
`test` extra); under CI=true a missing one fails.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import pytest
import redis
from redis.exceptions import ResponseError

from core.streaming import redis_replica
from core.streaming.redis_replica import REQUIRED_REDIS_SETTINGS, check_redis_settings
from tests.conftest import unavailable
from tests.utils.app_process import ROOT, child_env
from tests.utils.broker import redis_test_url
from tests.utils.caddy import COOKIE, caddy_binary
from tests.utils.cluster import ADMIN, ClusterBackends, cluster_backends, redis_reachable
from tests.utils.ports import free_port

pytestmark = pytest.mark.cluster

LAUNCHER = ROOT / "deploy" / "run-one-host"
START_TIMEOUT_S = 180.0  # migrate, the first account, then two replicas and Caddy (2 CPUs shared in CI)
BACK_WITHIN_S = 10.0  # issue 37: a killed replica serves again within this
POLL_INTERVAL_S = 0.1
RESPAWN_WITHIN_S = 3.0  # supervisord notices the exit and starts the program again (its loop ticks every second)
# The browser kept on the killed replica does not wait for it: measured up to 2.1 s on a busy machine; without
# Caddy's fail_duration its next request waited for the next active health check (4.2 to 4.4 s in three runs of four).
SLOWEST_S = 3.0


@pytest.fixture
def redis_url() -> str:
    url = redis_test_url()
    if (reason := redis_reachable(url)) is not None:
        unavailable(reason)
    return url


def test_the_start_warns_of_each_redis_setting_a_cluster_cannot_run_safely_with(redis_url, caplog):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        actual = {name: client.config_get(name)[name] for name in REQUIRED_REDIS_SETTINGS}
    finally:
        client.close()
    with caplog.at_level(logging.INFO, logger=redis_replica.__name__):
        warnings = check_redis_settings(redis_url)
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert logged == warnings
    for name, (required, _why) in REQUIRED_REDIS_SETTINGS.items():
        named = [w for w in warnings if w.startswith(f"Redis has {name} ")]
        if actual[name] == required:
            assert not named
        else:  # the test Redis runs without AOF: this branch is the one CI takes for appendonly
            [warning] = named
            assert f"Redis has {name} {actual[name]}; a cluster needs {name} {required}" in warning
    if actual["appendonly"] != "yes":
        [warning] = [w for w in warnings if "appendonly" in w]
        assert "a restart of Redis loses the running turns' and tasks' streams" in warning
        assert "results still owed" in warning


class _NoConfig:
    """A Redis whose CONFIG command is disabled (`rename-command CONFIG ""`, most managed services)."""

    def config_get(self, name: str) -> dict[str, str]:
        raise ResponseError("unknown command 'CONFIG', with args beginning with: 'GET'")

    def close(self) -> None:
        pass


class _Settings:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def config_get(self, name: str) -> dict[str, str]:
        return {name: self.values[name]} if name in self.values else {}

    def close(self) -> None:
        pass


def test_a_redis_without_config_is_logged_as_unchecked_not_as_wrong(monkeypatch, caplog):
    monkeypatch.setattr(redis.Redis, "from_url", classmethod(lambda cls, url, **kw: _NoConfig()))
    with caplog.at_level(logging.INFO, logger=redis_replica.__name__):
        assert check_redis_settings("redis://example.invalid:6379/0") == []
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in messages] == [logging.INFO, logging.INFO]
    assert messages[0][1].startswith("could not check Redis's appendonly (unknown command 'CONFIG'")
    assert "a cluster needs appendonly yes" in messages[0][1]
    assert "could not check Redis's maxmemory-policy" in messages[1][1]


def test_a_redis_set_as_required_gives_no_warning_and_one_that_is_not_names_each(monkeypatch, caplog):
    good = _Settings({"appendonly": "yes", "maxmemory-policy": "noeviction"})
    monkeypatch.setattr(redis.Redis, "from_url", classmethod(lambda cls, url, **kw: good))
    with caplog.at_level(logging.INFO, logger=redis_replica.__name__):
        assert check_redis_settings("redis://example.invalid:6379/0") == []
    assert not caplog.records

    bad = _Settings({"appendonly": "no", "maxmemory-policy": "allkeys-lru"})
    monkeypatch.setattr(redis.Redis, "from_url", classmethod(lambda cls, url, **kw: bad))
    with caplog.at_level(logging.INFO, logger=redis_replica.__name__):
        warnings = check_redis_settings("redis://example.invalid:6379/0")
    assert [w.split(":")[0] for w in warnings] == [
        "Redis has appendonly no; a cluster needs appendonly yes",
        "Redis has maxmemory-policy allkeys-lru; a cluster needs maxmemory-policy noeviction",
    ]
    assert "evict" in warnings[1]


# -- the one-host recipe under supervisord ----------------------------------------------------------------------


@dataclass
class OneHost:
    """A running `deploy/run-one-host`: its env file, ports and log folder; `ctl(...)` is its supervisorctl."""

    env_file: Path
    process: subprocess.Popen[bytes]
    app_ports: dict[str, int]
    site: str
    lb_secret: str
    log_dir: Path
    output: Path

    def ctl(self, *args: str) -> str:
        done = subprocess.run(
            ["bash", str(LAUNCHER), str(self.env_file), "ctl", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            env=_launcher_env(),
        )
        return done.stdout.strip()

    def pid(self, program: str) -> int:
        """The program's pid as supervisord knows it (0 while it is not running)."""
        text = self.ctl("pid", program)
        return int(text) if text.isdigit() else 0

    def logs(self) -> str:
        parts = [f"== launcher ==\n{self.output.read_text(errors='replace')[-4000:]}"]
        for path in sorted(self.log_dir.glob("*.log")):
            parts.append(f"== {path.name} ==\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)


def _launcher_env() -> dict[str, str]:
    """The environment the launcher starts from: this one, less pytest's and the app's own settings."""
    env = child_env(Path(tempfile.gettempdir()) / "unused")
    # PYTHONDONTWRITEBYTECODE too: a deployment starts from its cached bytecode, and so does a restart here.
    for name in ("DATA_DIR", "TRUSTED_HOSTS", "DEMO_MODEL_DELAY_MS", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    return env


def _write_env_file(path: Path, backends: ClusterBackends, run_dir: Path, caddy: str, ports: dict[str, int]) -> str:
    lb_secret = secrets.token_urlsafe(24)
    site = f"http://127.0.0.1:{ports['caddy']}"
    settings = {
        "APP1_PORT": ports["app1"],
        "APP2_PORT": ports["app2"],
        "CADDY_PORT": ports["caddy"],
        "SITE_ADDRESS": site,
        "DATABASE_URL": backends.database_url,
        "REDIS_URL": backends.redis_url,
        "REDIS_KEY_PREFIX": backends.key_prefix,
        "STORAGE_SECRET": backends.storage_secret,
        "SECRET_KEY": secrets.token_urlsafe(32),
        "INTERNAL_TOKEN": backends.internal_token,
        "LB_SECRET": lb_secret,
        "PUBLIC_BASE_URL": site,
        "APP_ADMIN_USER": ADMIN[0],
        "APP_ADMIN_PASSWORD": ADMIN[1],
        "RUN_DIR": run_dir,
        "PYTHON": sys.executable,
        "CADDY": caddy,
        "CLUSTER_LEASE_S": 5,  # as deploy/one-host.env.example
        "CONFIG_FILE": run_dir / "no-config.json",  # nothing of the working tree's config/server.json or .env
        "ENV_FILE": run_dir / "no.env",
    }
    path.write_text("".join(f"{name}='{value}'\n" for name, value in settings.items()))
    return lb_secret


def _wait_for(check, timeout_s: float, what: str, logs) -> float:
    """Poll `check()` until it is true; returns the seconds it took."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what} did not happen within {timeout_s:g} s\n{logs()}")
        time.sleep(0.05)
    return time.monotonic() - started


def _answers(url: str, **kwargs) -> bool:
    try:
        return httpx.get(url, timeout=2, **kwargs).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def one_host(postgres_server_url: str) -> Iterator[OneHost]:
    """`deploy/run-one-host ENV_FILE` in a temporary folder until the block ends; then `ctl shutdown`."""
    caddy = caddy_binary()
    if caddy is None:
        unavailable("caddy not found: run scripts/install-caddy, put caddy on PATH or set CADDY_BIN")
    try:
        import supervisor  # noqa: F401
    except ImportError:
        unavailable("supervisor is not installed: pip install -e '.[test]'")
    # Short: supervisord's socket lives in it (a Unix socket's path has at most 107 bytes).
    tmp = Path(tempfile.mkdtemp(prefix="one-host-"))
    try:
        with cluster_backends(postgres_server_url) as backends:
            ports = {"app1": free_port(), "app2": free_port(), "caddy": free_port()}
            env_file = tmp / "one-host.env"
            lb_secret = _write_env_file(env_file, backends, tmp / "run", caddy, ports)
            output = tmp / "launcher.log"
            with output.open("wb") as out:
                process = subprocess.Popen(
                    ["bash", str(LAUNCHER), str(env_file)],
                    cwd=ROOT,
                    env=_launcher_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: nothing of it outlives the test
                )
            host = OneHost(
                env_file,
                process,
                {"app1": ports["app1"], "app2": ports["app2"]},
                f"http://127.0.0.1:{ports['caddy']}",
                lb_secret,
                tmp / "run" / "logs",
                output,
            )
            try:
                yield host
            finally:
                if process.poll() is None:
                    host.ctl("shutdown")
                    try:
                        process.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        os.killpg(process.pid, signal.SIGKILL)
                        process.wait()
    except ConnectionError as exc:
        unavailable(str(exc))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class Probe:
    """GETs through Caddy several times a second: /a2a/health from a browser kept on one replica and from a new one
    each time, and the login page (a NiceGUI page) from the kept one.

    `samples`: (when, which request, seconds it took, what went wrong or None), `when` on `time.monotonic()`.
    """

    site: str
    sticky_cookie: str
    samples: list[tuple[float, str, float, str | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(base_url=self.site, timeout=15) as pinned:
            pinned.cookies.set(COOKIE, self.sticky_cookie)
            while not self._stop.is_set():
                for who, path in (("pinned", "/a2a/health"), ("new", "/a2a/health"), ("pinned", "/login")):
                    sent = time.monotonic()
                    problem = None
                    try:
                        if who == "new":
                            response = httpx.get(f"{self.site}{path}", timeout=15)
                        else:
                            response = pinned.get(path)
                        if response.status_code != 200:
                            problem = f"HTTP {response.status_code}"
                    except httpx.HTTPError as exc:
                        problem = repr(exc)
                    self.samples.append((sent, f"{who} {path}", time.monotonic() - sent, problem))
                time.sleep(POLL_INTERVAL_S)

    def stop(self) -> None:
        self._stop.set()

    def failures(self, since: float) -> list[tuple[float, str, str]]:
        return [(round(t - since, 2), what, problem) for t, what, _took, problem in self.samples if problem]

    def slowest(self, since: float, until: float = float("inf"), path: str = "") -> tuple[float, float, str]:
        """(seconds, when after `since`, which request) of the slowest request to `path` sent in [since, until)."""
        took, when, what = max(
            ((took, t, what) for t, what, took, _ in self.samples if since <= t < until and what.endswith(path)),
            default=(0.0, since, ""),
        )
        return took, round(when - since, 2), what


def _sticky_cookie(lb_secret: str, upstream: str) -> str:
    """A stickiness cookie that keeps a browser on `upstream` (Caddy signs the dial address with LB_SECRET)."""
    import hashlib
    import hmac

    return hmac.new(lb_secret.encode(), upstream.encode(), hashlib.sha256).hexdigest()


def _spawned_at(host: OneHost, program: str) -> list[float]:
    """When supervisord started `program`, each time (epoch seconds, from supervisord.log)."""
    times = []
    for line in (host.log_dir / "supervisord.log").read_text(errors="replace").splitlines():
        if f"spawned: '{program}'" in line:
            times.append(datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return times


@pytest.mark.postgres
def test_a_killed_replica_is_restarted_while_the_site_keeps_answering_through_caddy(
    postgres_server_url: str,
) -> None:
    with one_host(postgres_server_url) as host:
        app1 = f"http://127.0.0.1:{host.app_ports['app1']}/login"
        _wait_for(lambda: _answers(app1), START_TIMEOUT_S, "app1 answering", host.logs)
        # How long a cold start of a replica takes on this machine now (imports, migrations check, first page).
        cold_start_s = time.time() - _spawned_at(host, "app1")[0]
        ready_s = _wait_for(lambda: _answers(f"{host.site}/login"), 60, "the site through Caddy", host.logs)
        _wait_for(lambda: _answers(f"http://127.0.0.1:{host.app_ports['app2']}/login"), 60, "app2", host.logs)
        # The first account exists: the launcher made it from APP_ADMIN_USER / APP_ADMIN_PASSWORD.
        listed = httpx.get(f"{host.site}/api/agents", auth=ADMIN, timeout=10)
        assert listed.status_code == 200, listed.text
        before = {program: host.pid(program) for program in ("app1", "app2", "caddy")}
        assert all(before.values()), before

        probe = Probe(host.site, _sticky_cookie(host.lb_secret, f"127.0.0.1:{host.app_ports['app1']}"))
        poller = threading.Thread(target=probe.run, name="probe", daemon=True)
        poller.start()
        time.sleep(1.0)  # answering before the kill
        killed_at, killed_epoch = time.monotonic(), time.time()
        os.kill(before["app1"], signal.SIGKILL)
        back_s = _wait_for(
            lambda: _answers(app1) and host.pid("app1") not in (0, before["app1"]),
            BACK_WITHIN_S + 30,
            "app1's restart",
            host.logs,
        )
        back_at = killed_at + back_s
        time.sleep(2.0)  # and after it is back
        probe.stop()
        poller.join(timeout=30)
        respawned_s = _spawned_at(host, "app1")[1] - killed_epoch
        failures = probe.failures(killed_at)
        slowest_before = probe.slowest(0, killed_at, "/a2a/health")[0]
        slowest_down, down_at, down_who = probe.slowest(killed_at, back_at, "/a2a/health")
        slowest_after = probe.slowest(back_at, path="/a2a/health")[0]
        slowest_page, page_at, page_who = probe.slowest(killed_at, back_at, "/login")
        sent = sum(1 for t, *_ in probe.samples if killed_at <= t < back_at)
        print(
            f"\none host: a replica's cold start {cold_start_s:.1f} s, the site through Caddy after {ready_s:.1f} s "
            f"more. kill -9 of app1: started again after {respawned_s:.1f} s, answering on its port after "
            f"{back_s:.1f} s. Through Caddy meanwhile: {sent} requests, {len(failures)} failed {failures}; the "
            f"slowest /a2a/health took {slowest_down:.2f} s ({down_who}, {down_at} s after the kill; before the kill "
            f"{slowest_before:.2f} s, in the 2 s after app1 was back {slowest_after:.2f} s), the slowest login page "
            f"{slowest_page:.2f} s ({page_who}, {page_at} s after the kill)"
        )
        # supervisord starts it again at once; it then serves within 10 s, or, on a machine so busy that a cold
        # start alone takes longer, within its cold start and a little more.
        assert respawned_s < RESPAWN_WITHIN_S, f"supervisord started app1 again only after {respawned_s:.1f} s"
        allowed_s = max(BACK_WITHIN_S, cold_start_s + 3.0)
        assert back_s <= allowed_s, f"app1 served again only after {back_s:.1f} s\n{host.logs()}"
        assert failures == [], f"requests failed through Caddy while app1 was down: {failures}"
        # The browser whose cookie names app1 is sent to app2 at once (Caddy's fail_duration), not after a wait.
        slowest_pinned = max(
            took for t, what, took, _ in probe.samples if killed_at <= t < back_at and "pinned" in what
        )
        assert slowest_pinned < SLOWEST_S, f"a request took {slowest_pinned:.2f} s through Caddy while app1 was down"
        assert sent >= back_s  # all along the outage (several a second unless the machine is very busy)
        # The others were never restarted.
        assert host.pid("app2") == before["app2"] and host.pid("caddy") == before["caddy"]
        after = {program: host.pid(program) for program in ("app1", "app2", "caddy")}
        # The cluster's start checked Redis (its WARNING is in the replica's log when the test Redis has no AOF).
        log = (host.log_dir / "app1.log").read_text(errors="replace")
        client = redis.Redis.from_url(redis_test_url(), decode_responses=True)
        try:
            aof = client.config_get("appendonly").get("appendonly")
        finally:
            client.close()
        if aof == "no":
            assert (
                "WARNING core.streaming.redis_replica: Redis has appendonly no; a cluster needs appendonly yes" in log
            )

        # Everything stops cleanly: supervisord (the launcher's process) exits, and nothing it started is left.
        assert host.ctl("shutdown") in {"Shut down", ""}
        assert host.process.wait(timeout=60) == 0, host.logs()
        for program, pid in after.items():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            raise AssertionError(f"{program} (pid {pid}) is still running after the shutdown")
        for port in host.app_ports.values():
            assert not _answers(f"http://127.0.0.1:{port}/login")
        assert not _answers(f"{host.site}/login")
