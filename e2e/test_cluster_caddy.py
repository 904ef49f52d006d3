"""Two replicas behind Caddy (deploy/Caddyfile), in a real Chromium (issue 18; README "Running as several replicas").

Caddy's cookie stickiness keeps a page on the replica that rendered it, so its socket connects; a turn
started through the other replica shows live on that page, and its Stop button stops it there. Needs
PostgreSQL, Redis and Caddy (`scripts/install-caddy`); under CI=true a missing one fails.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from e2e.conftest import VIEWPORT
from e2e.helpers import TURN_TIMEOUT_MS, open_chat, wait_for_text, wait_for_turn_end
from tests.conftest import DEFAULT_POSTGRES_URL, unavailable
from tests.utils.broker_replicas import Replicas, two_replicas
from tests.utils.caddy import COOKIE, Caddy, caddy_binary, caddy_proxy
from tests.utils.cluster import cluster_backends
from tests.utils.ports import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.postgres]


@dataclass
class Cluster:
    """The replicas and the proxy in front of them."""

    replicas: Replicas
    caddy: Caddy

    def by_upstream(self, upstream: str) -> tuple[str, str]:
        """(this replica's URL, the other one's) for an upstream host:port."""
        a, b = self.replicas.a.base_url, self.replicas.b.base_url
        return (a, b) if a.endswith(upstream) else (b, a)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Replicas A and B on a fresh database, Caddy in front; the public URL is Caddy's."""
    binary = caddy_binary()
    if binary is None:
        unavailable("caddy not found: run scripts/install-caddy, put caddy on PATH or set CADDY_BIN")
    tmp = Path(tempfile.mkdtemp(prefix="e2e-cluster-"))
    port = free_port()
    try:
        with (
            cluster_backends(os.environ.get("TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)) as backends,
            two_replicas(
                backends, tmp, DEMO_MODEL_DELAY_MS="40", PUBLIC_BASE_URL=f"http://127.0.0.1:{port}"
            ) as replicas,
        ):
            upstreams = [replicas.a.base_url.removeprefix("http://"), replicas.b.base_url.removeprefix("http://")]
            with caddy_proxy(binary, port, upstreams, tmp / "caddy") as caddy:
                yield Cluster(replicas, caddy)
    except ConnectionError as exc:
        unavailable(str(exc))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def context(browser: Browser, cluster: Cluster) -> Iterator[BrowserContext]:
    """A fresh browser (its own cookies) whose relative URLs go to Caddy."""
    ctx = browser.new_context(viewport=VIEWPORT, base_url=cluster.caddy.url)
    ctx.set_default_timeout(15_000)
    try:
        yield ctx
    finally:
        ctx.close()


def log_in(page: Page, cluster: Cluster) -> None:
    """Cluster mode runs with accounts: log in as the replicas' admin through Caddy."""
    page.goto("/login")
    page.get_by_test_id("login-username").fill(cluster.replicas.auth[0])
    page.get_by_test_id("login-password").fill(cluster.replicas.auth[1])
    page.get_by_test_id("login-btn").click()
    page.wait_for_url(lambda url: "/login" not in url)
    page.wait_for_function("() => window.socket && window.socket.connected")


def replica_of(context: BrowserContext, cluster: Cluster) -> str:
    """The upstream Caddy's stickiness cookie sends this browser to."""
    cookies = {c["name"]: c["value"] for c in context.cookies()}
    assert COOKIE in cookies, f"Caddy set no {COOKIE} cookie: {sorted(cookies)}"
    upstream = cluster.caddy.upstream_of(cookies[COOKIE])
    assert upstream is not None, "the stickiness cookie names neither replica"
    return upstream


def test_pages_behind_caddy_stay_on_their_replica_and_connect(context: BrowserContext, cluster: Cluster) -> None:
    """Every load through Caddy goes to the same replica (the cookie), and the page's socket connects."""
    page = context.new_page()
    log_in(page, cluster)
    open_chat(page, "/")
    first = replica_of(context, cluster)
    for _ in range(5):
        page.reload()
        page.wait_for_function("() => window.socket && window.socket.connected", timeout=15_000)
        assert replica_of(context, cluster) == first
    expect(page.get_by_test_id("msg-input")).to_be_visible()
    # The broker's pages read the directory through Caddy too.
    health = httpx.get(
        f"{cluster.caddy.url}/a2a/health", timeout=10, cookies=dict((c["name"], c["value"]) for c in context.cookies())
    ).json()
    assert health["replica"] == "replica-" + first.rsplit(":", 1)[1]  # the replica the cookie names answered


def test_a_page_on_one_replica_follows_a_turn_started_through_the_other_and_stops_it(
    context: BrowserContext, cluster: Cluster
) -> None:
    """The chat open on A (through Caddy) shows a turn started through B as it streams; its Stop ends it on B."""
    page: Page = context.new_page()
    log_in(page, cluster)
    here, other = cluster.by_upstream(replica_of(context, cluster))
    with httpx.Client(timeout=20, auth=cluster.replicas.auth) as http:
        sid = http.post(f"{other}/api/sessions", json={"agentId": "general-assistant"}).json()["id"]
        open_chat(page, f"/chat/{sid}")  # open before anything runs
        assert cluster.by_upstream(replica_of(context, cluster))[0] == here  # the page is A's

        started = http.post(f"{other}/api/sessions/{sid}/messages", json={"content": "/lorem 2000"})
        assert started.status_code == 202, started.text  # ≈ 80 s at 40 ms a token unless stopped
        expect(page.get_by_test_id("user-message")).to_contain_text("/lorem 2000", timeout=TURN_TIMEOUT_MS)
        expect(page.get_by_test_id("stop-btn")).to_be_visible(timeout=TURN_TIMEOUT_MS)
        shown = len(wait_for_text(page, 100, timeout_s=20))
        wait_for_text(page, shown + 50, timeout_s=20)  # it grows: B's tokens, live on A's page
        page.get_by_test_id("stop-btn").click()
        expect(page.get_by_test_id("assistant-message").get_by_text("Stopped.", exact=True)).to_be_visible(
            timeout=TURN_TIMEOUT_MS
        )
        wait_for_turn_end(page)
        saved = http.get(f"{other}/api/sessions/{sid}/messages").json()

        # A page opened while B's turn runs follows it as well.
        second = http.post(f"{other}/api/sessions/{sid}/messages", json={"content": "/lorem 2000"})
        assert second.status_code == 202, second.text
        page.reload()
        page.wait_for_function("() => window.socket && window.socket.connected")
        expect(page.get_by_test_id("stop-btn")).to_be_visible(timeout=TURN_TIMEOUT_MS)
        page.get_by_test_id("stop-btn").click()
        wait_for_turn_end(page)
    assert [m["role"] for m in saved] == ["user", "assistant"]
    assert saved[1]["status"] == "canceled"  # stopped on B, where it ran
    assert 0 < len(saved[1]["content"].split()) < 2000
