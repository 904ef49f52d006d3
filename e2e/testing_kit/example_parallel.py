"""An example a user can copy (docs/TESTING.md): three delegations at once, three tabs in the panel.

Only the selected tab's body is on the page: `Panel` reads every tab from the tab strip, and `text(i)`
shows tab i first.
"""


def send(page, text: str) -> None:
    page.get_by_test_id("msg-input").fill(text)
    page.get_by_test_id("send-btn").click()


def test_three_parallel_delegations_give_three_tabs(chat_app, chat_page, panel):
    send(chat_page, "/parallel 3 @coding-assistant write tests")
    side = panel(chat_page).wait_open()
    tabs = side.wait_for_tabs(3)
    assert len({tab.task_id for tab in tabs}) == 3
    for i in range(3):
        tab = side.wait_for_state("completed", i)
        assert "Coding Assistant" in tab.label and tab.depth == 0
        assert side.text(i).strip()
    assert [tab.state for tab in side.tabs()] == ["completed"] * 3
    assert len(chat_app.tasks()) == 3
