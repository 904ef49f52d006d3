"""The pytest plugin (entry point `pytest11: a2a-delegation-chat`): fixtures for a suite that tests the app.

    def test_the_panel_streams(chat_app, chat_page, panel):
        chat_page.get_by_test_id("msg-input").fill("@coding-assistant write a haiku")
        chat_page.get_by_test_id("send-btn").click()
        tab = panel(chat_page).wait_open().wait_for_state("completed")

Loaded by pytest in every suite of the environment, so this module imports nothing heavy: the app
starts only for a test that asks for `chat_app`, Playwright only for `chat_browser` and `chat_page`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from a2a_chat_testing.app import ChatApp, start_chat_app
from a2a_chat_testing.panel import Panel, chromium_launch_options

MARKER = "chat_app_settings"


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(**env): settings of the app that `chat_app` starts for this "
        "test, as environment variables (DEMO_MODEL_DELAY_MS='20', ...)",
    )


@pytest.fixture
def chat_app_settings() -> dict[str, str]:
    """Settings of every `chat_app` (override this fixture); the demo model at 5 ms a token by default."""
    return {"DEMO_MODEL_DELAY_MS": "5"}


@pytest.fixture
def chat_app_users() -> dict[str, str]:
    """Accounts to create before the app starts (name -> password); none: single-user mode."""
    return {}


@pytest.fixture
def chat_app(
    request: pytest.FixtureRequest, chat_app_settings: dict[str, str], chat_app_users: dict[str, str]
) -> Iterator[ChatApp]:
    """The app on a free 127.0.0.1 port with a temporary data folder; stopped cleanly after the test."""
    settings = dict(chat_app_settings)
    for marker in reversed(list(request.node.iter_markers(MARKER))):
        settings.update({k: str(v) for k, v in marker.kwargs.items()})
    with start_chat_app(settings, users=chat_app_users) as app:
        yield app


@pytest.fixture(scope="session")
def chat_browser() -> Iterator[Any]:
    """Headless Chromium through Playwright (`PLAYWRIGHT_CHROMIUM_EXECUTABLE`, else the system's Chromium)."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the browser fixtures need Playwright (pip install playwright)"
    )
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(**chromium_launch_options())
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def chat_viewport() -> dict[str, int]:
    """The size of `chat_page` (override for a phone: `{"width": 390, "height": 844}`)."""
    return {"width": 1280, "height": 800}


@pytest.fixture
def chat_page(chat_app: ChatApp, chat_browser: Any, chat_viewport: dict[str, int]) -> Iterator[Any]:
    """A page on `chat_app`'s first screen (a new chat with the default agent), logged in with accounts."""
    context = chat_browser.new_context(viewport=chat_viewport, base_url=chat_app.base_url)
    context.set_default_timeout(15_000)
    try:
        page = context.new_page()
        page.goto("/")
        if chat_app.users:
            name, password = next(iter(chat_app.users.items()))
            page.get_by_test_id("login-username").fill(name)
            page.get_by_test_id("login-password").fill(password)
            page.get_by_test_id("login-btn").click()
        page.get_by_test_id("msg-input").wait_for()
        yield page
    finally:
        context.close()


@pytest.fixture
def panel() -> Callable[..., Panel]:
    """`panel(page)`: the side panel of a chat page (see `a2a_chat_testing.panel.Panel`)."""
    return Panel
