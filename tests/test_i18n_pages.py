"""The pages' language through NiceGUI's simulated `User` (docs/ARCHITECTURE.md, "Languages").

The switch rebuilds the page in place; the choice is kept for the browser and, with accounts, for the account.
"""

from __future__ import annotations

import pytest
from nicegui import app
from nicegui.element_filter import ElementFilter
from nicegui.testing import User

from tests.test_chat_page import (  # noqa: F401 (fixtures)
    ALICE,
    BOB,
    MULTI_USER,
    app_env,
    element,
    log_in,
    navigated,
    send,
    services,
    user,
    wait_for_answer,
    wait_until,
)
from ui.language import ACCOUNT_LANGUAGE_KEY


async def switch_to(user: User, language: str) -> None:  # noqa: F811
    # The page has settled: its drawer has asked the browser whether it is open (NiceGUI's on-connect request).
    await wait_until(lambda: element(user, "app-drawer").value is not None, what="the drawer's state")
    with user:
        element(user, "language-switch").set_value(language)


def nav_chat_says(user: User, text: str) -> bool:  # noqa: F811
    """Whether the page's Chat link reads `text` (False while the page is being rebuilt)."""
    with user:
        links = list(ElementFilter(marker="nav-chat", local_scope=False))
    return len(links) == 1 and links[0].text == text


async def test_the_switch_rebuilds_the_page_in_place_and_the_choice_is_kept(user: User) -> None:  # noqa: F811
    await user.open("/")
    page = user.client
    await user.should_see("Start a conversation")
    await switch_to(user, "zh_CN")
    await wait_until(lambda: nav_chat_says(user, "对话"), what="the Chinese navigation")
    assert user.client is page, "the switch opened another page"
    await user.should_see("开始对话")
    await user.should_not_see("Start a conversation")
    assert element(user, "language-switch").props["data-language"] == "zh_CN"
    # The rebuilt page works: one of each element, and a message is answered and shown.
    await send(user, "hello there")
    await wait_for_answer(user)
    await user.should_see("You wrote 2 words:")

    await user.open("/audit")  # another page of this browser: still Chinese
    await user.should_see("还没有委派：在对话中提及一个智能体（@coding-assistant …）。")
    await user.open("/?lang=en")  # a link's ?lang= wins, and is kept
    await user.should_see("Start a conversation")
    await user.open("/audit")
    await user.should_see("No delegations yet: mention an agent in a chat (@coding-assistant …).")


@pytest.mark.parametrize("app_env", [MULTI_USER], indirect=True)
async def test_with_accounts_the_choice_follows_the_account(user: User) -> None:  # noqa: F811
    await log_in(user, *ALICE)
    await switch_to(user, "zh_CN")
    await wait_until(lambda: nav_chat_says(user, "对话"), what="the Chinese navigation")
    assert "zh_CN" in [v for k, v in app.storage.general.items() if k.startswith("language-of-user-")]

    # Bob, in this same browser, picks English: the browser now says English ...
    page = user.client
    await user.open("/logout")
    await navigated(user, page)
    await log_in(user, *BOB)
    await user.open("/?lang=en")
    await user.should_see("Start a conversation")
    # ... but Alice's account keeps Chinese when she logs in again here.
    page = user.client
    await user.open("/logout")
    await navigated(user, page)
    await log_in(user, *ALICE)
    await user.should_see("开始对话")
    keys = {k: v for k, v in app.storage.general.items() if k.startswith(ACCOUNT_LANGUAGE_KEY.split("{")[0])}
    assert sorted(keys.values()) == ["en", "zh_CN"]
