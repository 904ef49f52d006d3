"""The side panel, read through its `data-testid` names (docs/TESTING.md), with Playwright's sync API.

    panel = Panel(page)
    panel.wait_open()
    first = panel.wait_for_state("completed")     # the first tab, until its status reads "completed"
    assert "def greet" in panel.text(first)

A tab is found by its position, its task id or (a part of) its label. A state is the task's A2A
state, as the tab carries it in `data-state` (`submitted`, `working`, `completed`, `failed`,
`canceled`), whatever words and language the panel shows for it (`PanelTab.status`).

Any number of tabs: every tab is read from the tab strip itself (its data attributes, its icon's
`aria-label` for the status word), since only the selected tab's body is on the page; `text` and
`error` show (click) the tab first when its body is not.

A task that asks back (`input-required`, `auth-required`; the demo model's `/ask QUESTION` in a
callee) shows its question with an answer box: `question` reads it, `answer` sends the answer:

    panel.wait_for_state("input-required")
    assert panel.question() == "Which language?"
    panel.answer("Rust")
    assert "You answered: Rust" in panel.text(panel.wait_for_state("completed"))
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_MS = 30_000
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def chromium_launch_options() -> dict[str, Any]:
    """`chromium.launch(**options)`: headless; `PLAYWRIGHT_CHROMIUM_EXECUTABLE`, else the system's Chromium."""
    executable = os.environ.get("PLAYWRIGHT_CHROMIUM_EXECUTABLE") or next(
        (p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if Path(p).exists()), None
    )
    options: dict[str, Any] = {"headless": True, "args": CHROMIUM_ARGS}
    if executable:
        options["executable_path"] = executable
    return options


# Each tab as the tab strip has it: the badge in the body exists only for the selected tab, the icon for every one.
_READ_TABS = """tabs => tabs.map(tab => {
    const icon = tab.querySelector('[data-testid="agent-invoke-tab-icon"]');
    const taskId = tab.getAttribute("data-task-id") || "";
    const badge = document.querySelector(`[data-testid="agent-invoke-status"][data-task-id="${taskId}"]`);
    const name = tab.querySelector('[data-testid="agent-invoke-tab-name"]');
    const text = tab.querySelector('[data-testid="agent-invoke-tab-text"]');
    return {
        taskId,
        label: [name, text].filter(e => e).map(e => e.innerText).join(" ") || tab.innerText,
        state: tab.getAttribute("data-state"),
        status: (badge && badge.textContent) || (icon && icon.getAttribute("aria-label")) || "",
        parentTaskId: tab.getAttribute("data-parent-task-id"),
        depth: tab.getAttribute("data-depth"),
    };
})"""


@dataclass(frozen=True, slots=True)
class PanelTab:
    """One tab of the panel as it is now."""

    task_id: str
    label: str
    state: str  # submitted, working, input-required, auth-required, completed, failed, canceled (A2A's names)
    status: str  # the word the panel shows for it
    parent_task_id: str | None
    depth: int


class Panel:
    """The side panel of one chat page."""

    def __init__(self, page: Any, timeout_ms: float = DEFAULT_TIMEOUT_MS) -> None:
        self.page = page
        self.timeout_ms = timeout_ms
        self.root = page.get_by_test_id("agent-invoke-panel")

    def wait_open(self, timeout_ms: float | None = None) -> Panel:
        """Until the panel is visible with at least one tab."""
        from playwright.sync_api import expect

        expect(self.root).to_be_visible(timeout=timeout_ms or self.timeout_ms)
        expect(self._tabs().first).to_be_attached(timeout=timeout_ms or self.timeout_ms)
        return self

    def wait_for_tabs(self, count: int, timeout_ms: float | None = None) -> list[PanelTab]:
        """Until the panel has `count` tabs; returns them."""
        from playwright.sync_api import expect

        expect(self._tabs()).to_have_count(count, timeout=timeout_ms or self.timeout_ms)
        return self.tabs()

    def tabs(self) -> list[PanelTab]:
        """Every tab, in the panel's order (read in one pass, so the list is one moment of the panel)."""
        rows = self._tabs().evaluate_all(_READ_TABS)
        return [
            PanelTab(
                task_id=row["taskId"],
                label=" ".join(row["label"].split()),
                state=row["state"] or "submitted",
                status=" ".join(row["status"].split()),
                parent_task_id=row["parentTaskId"] or None,
                depth=int(row["depth"] or 0),
            )
            for row in rows
        ]

    def tab(self, which: int | str | PanelTab = 0) -> PanelTab:
        """A tab by position, task id, or a part of its label."""
        if isinstance(which, PanelTab):
            which = which.task_id
        tabs = self.tabs()
        if isinstance(which, int):
            if which >= len(tabs):
                raise AssertionError(f"the panel has {len(tabs)} tabs; there is no tab {which}")
            return tabs[which]
        for tab in tabs:
            if which == tab.task_id or which in tab.label:
                return tab
        raise AssertionError(f"no tab matches {which!r}; the tabs are {[t.label for t in tabs]}")

    def select(self, which: int | str | PanelTab = 0) -> PanelTab:
        """Show a tab (click it)."""
        tab = self.tab(which)
        self._tab_of(tab.task_id).click()
        return tab

    def text(self, which: int | str | PanelTab = 0) -> str:
        """What the tab's agent has written so far (the tab is shown first if another one is)."""
        tab = self.show(which)
        return self._body(tab.task_id).inner_text()

    def error(self, which: int | str | PanelTab = 0) -> str:
        """The tab's error line, empty when there is none (the tab is shown first if another one is)."""
        tab = self.show(which)
        panel = self.page.locator(".q-tab-panel").filter(has=self._status(tab.task_id))
        error = panel.get_by_test_id("agent-invoke-error")
        return error.text_content().strip() if error.count() else ""

    def show(self, which: int | str | PanelTab = 0) -> PanelTab:
        """Make the tab's body the one on the page: click the tab unless it is already shown."""
        from playwright.sync_api import expect

        tab = self.tab(which)
        if self._body(tab.task_id).count() == 0:
            self._tab_of(tab.task_id).click()
            expect(self._body(tab.task_id)).to_be_attached(timeout=self.timeout_ms)
        return tab

    def wait_for_state(self, state: str, which: int | str | PanelTab = 0, timeout_ms: float | None = None) -> PanelTab:
        """Until the tab's task is in `state` (`completed`, `failed`, `canceled`, ...); returns the tab."""
        from playwright.sync_api import expect

        timeout = timeout_ms or self.timeout_ms
        if isinstance(which, int):
            expect(self._tabs()).not_to_have_count(0, timeout=timeout)
            expect(self._tabs().nth(which)).to_be_attached(timeout=timeout)
        task_id = self.tab(which).task_id
        expect(self._tab_of(task_id)).to_have_attribute("data-state", state, timeout=timeout)
        return self.tab(task_id)

    def question(self, which: int | str | PanelTab = 0, timeout_ms: float | None = None) -> str:
        """What the tab's agent asks back, once its task waits for an answer (`input-required`, `auth-required`)."""
        from playwright.sync_api import expect

        tab = self.show(which)
        box = self._question_box(tab.task_id)
        expect(box).to_be_visible(timeout=timeout_ms or self.timeout_ms)
        text: str = box.get_by_test_id("agent-panel-question").inner_text()
        return text

    def answer(self, text: str, which: int | str | PanelTab = 0) -> PanelTab:
        """Send `text` as the answer to the tab's question (its answer box); the task then goes on."""
        from playwright.sync_api import expect

        tab = self.show(which)
        box = self._question_box(tab.task_id)
        expect(box).to_be_visible(timeout=self.timeout_ms)
        box.get_by_test_id("agent-panel-answer-input").fill(text)
        box.get_by_test_id("agent-panel-answer-send").click()
        expect(box).to_be_hidden(timeout=self.timeout_ms)
        return tab

    def close(self) -> None:
        """Close the panel (its close button)."""
        self.page.get_by_test_id("agent-invoke-close").click()

    def _tabs(self) -> Any:
        return self.page.get_by_test_id("agent-invoke-tab")

    def _tab_of(self, task_id: str) -> Any:
        return self.page.locator(f'[data-testid="agent-invoke-tab"][data-task-id="{task_id}"]')

    def _body(self, task_id: str) -> Any:
        return self.page.locator(f'[data-testid="agent-invoke-body"][data-task-id="{task_id}"]')

    def _question_box(self, task_id: str) -> Any:
        return self.page.locator(f'[data-testid="agent-panel-question-box"][data-task-id="{task_id}"]')

    def _status(self, task_id: str) -> Any:
        return self.page.locator(f'[data-testid="agent-invoke-status"][data-task-id="{task_id}"]')
