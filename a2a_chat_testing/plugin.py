"""The pytest plugin (entry point `pytest11: a2a-delegation-chat`): fixtures for a suite that tests the app.

    def test_the_panel_streams(chat_app, chat_page, panel):
        chat_page.get_by_test_id("msg-input").fill("@coding-assistant write a haiku")
        chat_page.get_by_test_id("send-btn").click()
        tab = panel(chat_page).wait_open().wait_for_state("completed")

Options (on the command line, or in the ini file with `_` for `-`: `chat_app_scope = module`):

- `--chat-app-scope function|module|session`: how long one app serves (default `function`: one per test).
  Shared, it is reset between tests (`ChatApp.reset`: every chat deleted, earlier tasks left out of
  `tasks()`); a test with other settings or accounts gets an app of its own, started then.
- `--chat-app-port N`: the port it listens on (default: a free one).
- `--chat-app-command CMD`: how to start it (default: the console script `a2a-delegation-chat`, see
  `a2a_chat_testing.app.app_command`).

With pytest-playwright installed, `chat_browser` is its `browser` (one Playwright per run: two would fail
with "Playwright Sync API inside the asyncio loop"); its Chromium is then `PLAYWRIGHT_CHROMIUM_EXECUTABLE` when
set, else the system's where Playwright has no Chromium of its own (a2a_chat_testing/chromium.py).

Loaded by pytest in every suite of the environment, so this module imports nothing heavy:
the app starts only for a test that asks for `chat_app`, Playwright only for `chat_browser` and `chat_page`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from a2a_chat_testing.app import ChatApp, start_chat_app
from a2a_chat_testing.panel import Panel, chromium_launch_options

MARKER = "chat_app_settings"
SCOPES = ("function", "module", "session")
PYTEST_PLAYWRIGHT = "playwright"  # pytest-playwright's plugin name (its pytest11 entry point)


def pytest_addoption(parser: pytest.Parser) -> None:
    """`--chat-app-scope`, `--chat-app-port`, `--chat-app-command`, and the same as ini options."""
    group = parser.getgroup("a2a-delegation-chat", "A2A delegation chat testing kit")
    options = {
        "scope": (
            "function (default): one app per test; module or session: one app shared, reset between tests",
            SCOPES,
        ),
        "port": ("the port the app listens on on 127.0.0.1 (default: a free one)", None),
        "command": ("how to start the app (default: the console script a2a-delegation-chat)", None),
    }
    for name, (help_text, choices) in options.items():
        group.addoption(f"--chat-app-{name}", dest=f"chat_app_{name}", default=None, choices=choices, help=help_text)
        parser.addini(f"chat_app_{name}", help_text)


def option(config: pytest.Config, name: str) -> str | None:
    """An option of the kit: the command line, else the ini file; None when neither sets it."""
    value = config.getoption(f"chat_app_{name}") or config.getini(f"chat_app_{name}")
    return (str(value).strip() or None) if value else None


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker; check the scope; give pytest-playwright the kit's Chromium where it has none."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(**env): settings of the app that `chat_app` starts for this "
        "test, as environment variables (DEMO_MODEL_DELAY_MS='20', ...)",
    )
    scope = option(config, "scope")
    if scope is not None and scope not in SCOPES:
        raise pytest.UsageError(f"chat_app_scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    if config.pluginmanager.has_plugin(PYTEST_PLAYWRIGHT):
        # Registered now, after every entry point: its fixture overrides pytest-playwright's and extends it.
        from a2a_chat_testing import chromium

        config.pluginmanager.register(chromium, "a2a-delegation-chat-chromium")


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """With pytest-playwright, a test of `chat_page` runs per `--browser` as its own tests do (one browser each)."""
    uses_playwright = metafunc.config.pluginmanager.has_plugin(PYTEST_PLAYWRIGHT)
    if uses_playwright and "chat_browser" in metafunc.fixturenames and "browser_name" not in metafunc.fixturenames:
        metafunc.fixturenames.append("browser_name")  # pytest-playwright's hook, after this one, parametrizes it


def _chat_app_scope(fixture_name: str, config: pytest.Config) -> str:
    return option(config, "scope") or "function"


def _browser_scope(fixture_name: str, config: pytest.Config) -> str:
    # pytest-playwright's `browser` is asked for in each test: it may change with `browser_name`.
    return "function" if config.pluginmanager.has_plugin(PYTEST_PLAYWRIGHT) else "session"


@pytest.fixture
def chat_app_settings() -> dict[str, str]:
    """Settings of every `chat_app` (override this fixture); the demo model at 5 ms a token by default."""
    return {"DEMO_MODEL_DELAY_MS": "5"}


@pytest.fixture
def chat_app_users() -> dict[str, str]:
    """Accounts to create before the app starts (name -> password); none: single-user mode."""
    return {}


class _SharedApp:
    """The app of a scope: kept while tests ask for the same settings and accounts, else started anew."""

    def __init__(self, config: pytest.Config) -> None:
        port = option(config, "port")
        self.port = int(port) if port else None
        self.command = option(config, "command")
        self.key: tuple[Any, ...] | None = None
        self.app: ChatApp | None = None
        self.stack = ExitStack()

    def get(self, settings: dict[str, str], users: dict[str, str]) -> ChatApp:
        key = (sorted(settings.items()), sorted(users.items()))
        if self.app is not None and key == self.key and self.app.process.poll() is None:
            self.app.reset()
            return self.app
        self.close()
        self.app = self.stack.enter_context(start_chat_app(settings, users=users, port=self.port, command=self.command))
        self.key = key
        return self.app

    def close(self) -> None:
        self.app, self.key = None, None
        self.stack.close()
        self.stack = ExitStack()


@pytest.fixture(scope=_chat_app_scope)
def _chat_app_shared(pytestconfig: pytest.Config) -> Iterator[_SharedApp]:
    """Holds the app for the scope of `--chat-app-scope` (function by default) and stops it at the end."""
    shared = _SharedApp(pytestconfig)
    try:
        yield shared
    finally:
        shared.close()


@pytest.fixture
def chat_app(
    request: pytest.FixtureRequest,
    chat_app_settings: dict[str, str],
    chat_app_users: dict[str, str],
    _chat_app_shared: _SharedApp,
) -> ChatApp:
    """The app on 127.0.0.1 (a free port, or `--chat-app-port`) with a temporary data folder.

    One per test, stopped cleanly after it; with `--chat-app-scope module|session` one for the module or the
    run, reset before each test that reuses it.
    """
    settings = dict(chat_app_settings)
    for marker in reversed(list(request.node.iter_markers(MARKER))):
        settings.update({k: str(v) for k, v in marker.kwargs.items()})
    return _chat_app_shared.get(settings, dict(chat_app_users))


@pytest.fixture(scope=_browser_scope)
def chat_browser(pytestconfig: pytest.Config, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Headless Chromium through Playwright: pytest-playwright's `browser` when it is installed, else the kit's own.

    The kit's own: `PLAYWRIGHT_CHROMIUM_EXECUTABLE`, else the system's Chromium, else Playwright's.
    """
    if pytestconfig.pluginmanager.has_plugin(PYTEST_PLAYWRIGHT):
        yield request.getfixturevalue("browser")
        return
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
        # The page's socket must be connected before a click is sent: NiceGUI drops the events of a page whose
        # socket is not up yet, so on a busy machine a first Send could be lost (the message stays in the box).
        page.wait_for_function("() => window.socket && window.socket.connected")
        yield page
    finally:
        context.close()


@pytest.fixture
def panel() -> Callable[..., Panel]:
    """`panel(page)`: the side panel of a chat page (see `a2a_chat_testing.panel.Panel`)."""
    return Panel
