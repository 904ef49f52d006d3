"""End-to-end fixtures: the real server (`python app.py`) and a real headless Chromium.

Self-contained on purpose: `tests/conftest.py` (its `isolated_env` and the rest)
is not loaded for this directory. Everything here is plain *sync* code: the
Playwright sync API refuses to run inside a running asyncio loop, and
pytest-asyncio (`asyncio_mode = "auto"`) only runs a loop for async tests and
fixtures, so sync ones are safe.

Environment:
    E2E_BASE_URL                    use an already running server instead of starting one
    PLAYWRIGHT_CHROMIUM_EXECUTABLE  the Chromium to drive (default /usr/bin/chromium when present)
    CI=true                         a missing Chromium fails the run instead of skipping it
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, Playwright, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from a2a_chat_testing.panel import CHROMIUM_ARGS as KIT_CHROMIUM_ARGS
from tests.utils.app_process import end_process
from tests.utils.ports import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
E2E_DIR = Path(__file__).resolve().parent
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
SERVER_START_TIMEOUT_S = 30.0
DEMO_MODEL_DELAY_MS = 15
CHROMIUM_ARGS = KIT_CHROMIUM_ARGS  # one list: the testing kit's (a2a_chat_testing/panel.py)
VIEWPORT = {"width": 1280, "height": 800}
VIEWPORTS = {"desktop": VIEWPORT, "phone": {"width": 390, "height": 844}}  # `sized_page`'s
# NiceGUI treats a child that inherits these as running under pytest and `ui.run` crashes.
_PYTEST_ONLY_ENV = ("PYTEST_CURRENT_TEST", "NICEGUI_USER_SIMULATION")
# App settings from the developer's shell that must not leak into the server under test.
_APP_ENV_VARS = (
    "DATABASE_URL",
    "REDIS_URL",
    "REDIS_HOST",
    "REDIS_PORT",
    "REDIS_DB",
    "REDIS_PASSWORD",
    "AUTH_MODE",
    "DEFAULT_MODEL",
    "LLM_API_BASE",
    "LLM_API_KEY",
    "STORAGE_SECRET",
    "PUBLIC_BASE_URL",
    "BLACKLIST_IP",
    "NICEGUI_STORAGE_PATH",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under `e2e/` is an e2e test (`-m "not e2e"` deselects them all)."""
    for item in items:
        if E2E_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


# -- the server -----------------------------------------------------------------------------


def _server_env(tmp: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _PYTEST_ONLY_ENV and k not in _APP_ENV_VARS}
    env.update(
        DATA_DIR=str(tmp / "data"),
        PORT=str(port),
        HOST="127.0.0.1",
        DEMO_MODEL_DELAY_MS=str(DEMO_MODEL_DELAY_MS),
        CONFIG_FILE=str(tmp / "no-config.json"),  # missing files are skipped: defaults only
        ENV_FILE=str(tmp / "no.env"),
        OUTBOUND_ALLOW_HOSTS="127.0.0.1",  # the remote agents under test run on this machine
        PYTHONUNBUFFERED="1",
    )
    return env


def _wait_until_ready(base_url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(
                f"the server exited with code {process.returncode} before it was ready:\n"
                f"{log_path.read_text(errors='replace')}",
                pytrace=False,
            )
        try:
            response = httpx.get(f"{base_url}/api/me", timeout=2.0)
            if response.status_code in (200, 401):  # 401: ready, with accounts (a login is asked for)
                return
            last_error = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            last_error = repr(exc)
        time.sleep(0.1)
    pytest.fail(
        f"the server at {base_url} was not ready within {SERVER_START_TIMEOUT_S:.0f} s "
        f"(last: {last_error}); its output:\n{log_path.read_text(errors='replace')}",
        pytrace=False,
    )


@contextmanager
def serve_app(**env: str) -> Iterator[str]:
    """Run a fresh `python app.py` (its own data dir, a free port) until the block ends; yields its URL."""
    tmp = Path(tempfile.mkdtemp(prefix="e2e-server-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "app.py"],
            cwd=REPO_ROOT,
            env={**_server_env(tmp, port), **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        _wait_until_ready(url, process, log_path)
        yield url
    finally:
        end_process(process)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def base_url() -> Iterator[str]:
    """The URL of the app under test: `$E2E_BASE_URL`, or a fresh `python app.py` on a free port."""
    external = os.environ.get("E2E_BASE_URL")
    if external:
        yield external.rstrip("/")
        return
    with serve_app() as url:
        yield url


# -- the browser ----------------------------------------------------------------------------


def _chromium_executable() -> str | None:
    configured = os.environ.get("PLAYWRIGHT_CHROMIUM_EXECUTABLE")
    if configured:
        return configured
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def _no_browser(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing browser is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def playwright() -> Iterator[Playwright]:
    """One Playwright driver for the run."""
    driver = sync_playwright().start()
    try:
        yield driver
    finally:
        driver.stop()


@pytest.fixture(scope="session")
def browser(playwright: Playwright) -> Iterator[Browser]:
    """One headless Chromium for the run."""
    executable = _chromium_executable()
    if executable is not None and not Path(executable).exists():
        _no_browser(f"Chromium not found at {executable} (PLAYWRIGHT_CHROMIUM_EXECUTABLE)")
    try:
        # Without an executable this tries Playwright's own download (`playwright install chromium`).
        launched = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
    except PlaywrightError as exc:
        if executable is None:
            _no_browser(
                "no Chromium: install it (apt-get install chromium) or set PLAYWRIGHT_CHROMIUM_EXECUTABLE "
                f"({str(exc).splitlines()[0]})"
            )
        raise
    try:
        yield launched
    finally:
        launched.close()


@pytest.fixture(scope="session")
def chat_browser(browser: Browser) -> Browser:
    """The testing kit's browser is this run's (one Playwright driver per process: its sync API allows one)."""
    return browser


@pytest.fixture
def page(browser: Browser, base_url: str, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A fresh browser context and page per test; relative `goto` paths resolve against the app."""
    context = browser.new_context(viewport=VIEWPORT, base_url=base_url)
    context.set_default_timeout(10_000)
    new_page = context.new_page()
    errors: list[str] = []
    new_page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield new_page
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            out = REPO_ROOT / "test-results"
            out.mkdir(exist_ok=True)
            name = request.node.name.replace("/", "_")
            try:
                new_page.screenshot(path=str(out / f"{name}.png"), full_page=True)
            except PlaywrightError:
                pass
            if errors:
                print(f"JavaScript errors on the page: {errors}")
        context.close()


@pytest.fixture(params=list(VIEWPORTS))
def sized_page(request: pytest.FixtureRequest, browser: Browser, base_url: str) -> Iterator[Page]:
    """A fresh browser context and page at 1280×800 (`desktop`), then at 390×844 (`phone`)."""
    context = browser.new_context(viewport=VIEWPORTS[request.param], base_url=base_url)
    context.set_default_timeout(10_000)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Keep each phase's report on the item so `page` can save a screenshot of a failed test."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
