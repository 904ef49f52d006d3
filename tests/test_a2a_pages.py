"""The A2A pages through NiceGUI's simulated `User`: API keys (`/api-keys`) and remote agents (`/remote-agents`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from nicegui import ElementFilter, app, ui
from nicegui.testing import User

from core.a2a import api_keys
from core.services import Services
from tests.utils.a2a_agents import echo_server
from tests.utils.simulated_user import simulated_app_user


@pytest.fixture
async def user(
    isolated_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> AsyncIterator[User]:
    """The app (app.py) in NiceGUI's user simulation, on this test's data dir; fails on ERROR logs."""
    # app.py setdefault()s this one; keep it per test so it does not leak into later tests.
    monkeypatch.setenv("NICEGUI_STORAGE_PATH", str(isolated_env / "nicegui-storage"))
    async with simulated_app_user(request, caplog) as simulated:
        yield simulated


def services() -> Services:
    return app.state.services


def text_of(user: User, marker: str) -> str:
    with user:
        [found] = list(ElementFilter(marker=marker, local_scope=False))
    return found.text


async def wait_until(predicate: Callable[[], bool], *, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def authenticates(key: str) -> bool:
    async with services().db.session() as s:
        return await api_keys.authenticate_key(s, key) is not None


async def test_create_a_key_see_it_once_then_revoke_it(user: User) -> None:
    await user.open("/api-keys")
    await user.should_see(marker="no-keys")
    user.find(marker="create-key-btn").click()
    await wait_until(lambda: user.notify.contains("give the key a name"))

    user.find(marker="key-name").type("ci-bot")
    user.find(marker="create-key-btn").click()
    await user.should_see(marker="new-key")
    key = text_of(user, "new-key")
    assert key.startswith(api_keys.KEY_PREFIX)
    assert await authenticates(key)
    await user.should_see("ci-bot")
    await user.should_see(f"{key[: api_keys.SHOWN_PREFIX_CHARS]}…")

    user.find(marker="revoke-ci-bot").click()
    await user.should_see(marker="revoked-ci-bot")
    assert not await authenticates(key)


async def test_register_a_remote_agent_by_card_url_and_remove_it(user: User) -> None:
    await user.open("/remote-agents")
    await user.should_see(marker="no-remote-agents")
    user.find(marker="card-url").type("http://127.0.0.1:9/.well-known/agent-card.json")
    user.find(marker="register-btn").click()
    await wait_until(lambda: user.notify.contains("could not fetch the card: not allowed: a loopback address"))
    services().settings.outbound_allow_hosts = ["127.0.0.1"]  # OUTBOUND_ALLOW_HOSTS: agents on this machine
    user.find(marker="register-btn").click()
    await wait_until(lambda: user.notify.contains("could not fetch the card: could not connect"))
    assert await services().remote_agents.list() == []

    with echo_server() as card_url:
        user.find(marker="card-url").clear().type(card_url)
        user.find(marker="remote-id").type("echo")
        user.find(marker="register-btn").click()
        await user.should_see(marker="remote-echo", retries=100)
        await user.should_see("Echo Agent")
        assert services().registry.remote("echo") is not None

        user.find(marker="remove-echo").click()
        await user.should_see(marker="no-remote-agents")
        assert services().registry.remote("echo") is None


async def test_the_pages_link_to_each_other(user: User) -> None:
    await user.open("/api-keys")
    user.find("Remote agents").click()
    await user.should_see("Remote A2A agents")
    with user:
        assert any(
            isinstance(e, ui.link) and e.props.get("href") == "/api-keys"
            for e in ElementFilter(kind=ui.link, local_scope=False)
        )
