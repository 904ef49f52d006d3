"""Issue 39, item 5: the admin area in a real Chromium, at 1280×800 and 390×844.

An app with accounts (alice the admin, bob not): bob has no Admin entry and `/admin` refuses him; alice
creates an account and disables it (its open login ends at its next page), sees bob's running turn and
stops it, tests and saves the model connection (a metadata address refused beside the form), and reads
the health of each part.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from e2e.conftest import REPO_ROOT, serve_app

pytestmark = pytest.mark.e2e

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
ALICE, BOB = ("alice", "alice-password"), ("bob", "bob-password")


@pytest.fixture(scope="module")
def accounts_server() -> Iterator[str]:
    """A server of its own with two accounts, made on the command line before it starts."""
    data = Path(tempfile.mkdtemp(prefix="e2e-admin-"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "DATABASE_URL", "REDIS_URL")}
    env.update(DATA_DIR=str(data), CONFIG_FILE=str(data / "none.json"), ENV_FILE=str(data / "none.env"))
    for (name, password), extra in ((ALICE, ["--admin"]), (BOB, [])):
        subprocess.run(
            [sys.executable, "app.py", "users", "add", name, *extra],
            cwd=REPO_ROOT,
            env={**env, "APP_USER_PASSWORD": password},
            check=True,
            capture_output=True,
        )
    with serve_app(DATA_DIR=str(data)) as url:
        yield url


@pytest.fixture(params=[DESKTOP, PHONE], ids=["desktop", "phone"])
def viewport(request: pytest.FixtureRequest) -> dict:
    """Each test of this module at both sizes."""
    return request.param


def logged_in(browser: Browser, url: str, viewport: dict, who: tuple[str, str]) -> Page:
    context = browser.new_context(viewport=viewport, base_url=url)
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.goto("/login")
    page.get_by_test_id("login-username").fill(who[0])
    page.get_by_test_id("login-password").fill(who[1])
    page.get_by_test_id("login-btn").click()
    page.wait_for_url(lambda u: "/login" not in u)
    return page


def fits_the_screen(page: Page) -> None:
    widths = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], f"the page is {widths[0]} px wide on a screen of {widths[1]} px"


def nav_entries(page: Page) -> list[str]:
    """The navigation's entries (in the drawer, which a phone keeps closed: they are in the page still)."""
    return page.evaluate(
        "() => Array.from(document.querySelectorAll('[data-testid^=nav-]')).map(e => e.dataset.testid)"
    )


def test_a_user_who_is_not_an_admin_has_no_admin_area(browser: Browser, accounts_server: str, viewport: dict) -> None:
    page = logged_in(browser, accounts_server, viewport, BOB)
    try:
        page.goto("/")
        expect(page.get_by_test_id("nav-chat")).to_have_count(1)
        assert "nav-admin" not in nav_entries(page)
        page.goto("/admin")
        expect(page.get_by_test_id("admin-refused")).to_be_visible()
        expect(page.get_by_test_id("admin-users")).to_have_count(0)
        expect(page.get_by_test_id("admin-tab-model")).to_have_count(0)
        fits_the_screen(page)
    finally:
        page.context.close()


def test_an_admin_manages_accounts_turns_the_model_and_reads_the_health(
    browser: Browser, accounts_server: str, viewport: dict
) -> None:
    carol = ("carol-" + ("phone" if viewport is PHONE else "desktop"), "carol-password")
    admin = logged_in(browser, accounts_server, viewport, ALICE)
    try:
        admin.goto("/")
        assert "nav-admin" in nav_entries(admin)
        admin.goto("/admin")
        users = admin.get_by_test_id("admin-users")
        expect(users.locator("[data-username=alice]")).to_be_visible()
        expect(users.locator("[data-username=bob]")).to_be_visible()
        fits_the_screen(admin)

        # A new account, which logs in; disabled, its next page is the login page.
        admin.get_by_test_id("admin-new-username").fill(carol[0])
        admin.get_by_test_id("admin-new-password").fill(carol[1])
        admin.get_by_test_id("admin-create-user").click()
        row = users.locator(f"[data-username={carol[0]}]")
        expect(row).to_be_visible()
        other = logged_in(browser, accounts_server, viewport, carol)
        try:
            row.get_by_test_id("admin-toggle-disabled").click()
            expect(row.get_by_test_id("admin-user-disabled")).to_be_visible()
            other.goto("/")
            other.wait_for_url(lambda u: "/login" in u)
        finally:
            other.context.close()

        # Bob's running turn, listed and stopped.
        with httpx.Client(base_url=accounts_server, auth=BOB, timeout=30) as bob:
            session_id = bob.post("/api/sessions", json={}).json()["id"]
            assert bob.post(f"/api/sessions/{session_id}/messages", json={"content": "/hang"}).status_code == 202
            admin.get_by_test_id("admin-refresh").click()
            turn = admin.locator(f"[data-testid=admin-turn][data-session-id={session_id}]")
            expect(turn).to_be_visible()
            fits_the_screen(admin)
            turn.get_by_test_id("admin-stop-turn").click()
            expect(turn).to_have_count(0)
            statuses = [m["status"] for m in bob.get(f"/api/sessions/{session_id}/messages").json()]
            assert statuses == ["complete", "canceled"]

        # The model connection: a metadata address refused; the demo model answers the test.
        admin.get_by_test_id("admin-tab-model").click()
        base = admin.get_by_test_id("admin-model-base")
        base.fill("http://169.254.169.254/v1")
        admin.get_by_test_id("admin-model-save").click()
        result = admin.get_by_test_id("admin-model-result")
        expect(result).to_contain_text("not allowed")
        base.fill("")
        admin.get_by_test_id("admin-model-test").click()
        expect(result).to_contain_text("connection works", timeout=30_000)
        fits_the_screen(admin)

        admin.get_by_test_id("admin-tab-health").click()
        health = admin.get_by_test_id("admin-health")
        expect(health).to_have_attribute("data-status", "ok")
        expect(health.locator("[data-testid=admin-health-row][data-ok=true]")).to_have_count(4)
        fits_the_screen(admin)
    finally:
        admin.context.close()
