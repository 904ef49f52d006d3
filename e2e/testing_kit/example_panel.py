"""An example a user can copy (docs/TESTING.md): the side panel, driven through the browser.

It imports no module of the app: only Playwright and the fixtures of the testing kit (its own
package, a pytest plugin). e2e/test_testing_kit.py runs it from a folder outside the project, with
no conftest, as a user's suite would.
"""

from playwright.sync_api import expect


def send(page, text: str) -> None:
    page.get_by_test_id("msg-input").fill(text)
    page.get_by_test_id("send-btn").click()


def test_a_delegation_streams_into_the_panel(chat_app, chat_page, panel):
    send(chat_page, "@coding-assistant write a function that greets a user")
    side = panel(chat_page).wait_open()
    tab = side.wait_for_state("completed")
    assert "Coding Assistant" in tab.label
    assert "greets a user" in side.text(tab)
    expect(chat_page.get_by_test_id("assistant-message").last).to_contain_text("replied")


def test_a_failure_half_way_shows_the_reason(chat_app, chat_page, panel):
    send(chat_page, "@coding-assistant /fail 5")
    side = panel(chat_page).wait_open()
    tab = side.wait_for_state("failed")
    assert "after 5 words" in side.error(tab)
    assert len(side.text(tab).split()) == 5


def test_a_callee_past_its_timeout_fails(chat_app, chat_page, panel):
    send(chat_page, "/timeout 500 @coding-assistant /hang")
    side = panel(chat_page).wait_open()
    tab = side.wait_for_state("failed")
    assert "did not finish within 0.5 s" in side.error(tab)


def test_stop_during_a_callee_that_never_ends(chat_app, chat_page, panel):
    send(chat_page, "@coding-assistant /hang")
    side = panel(chat_page).wait_open()
    side.wait_for_state("working")
    chat_page.get_by_test_id("stop-btn").click()
    tab = side.wait_for_state("canceled")
    assert "will not go on until it is stopped" in side.text(tab)
