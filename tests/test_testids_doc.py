"""Issue 14, item 12: the `data-testid` names the pages carry are the ones docs/TESTING.md lists.

And item 11: the a2a-sdk's whole agent card is logged at DEBUG, not at INFO.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

import pytest

from core.web.logtext import install_debug_detail_filter
from ui.frame import NAV_ITEMS

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "TESTING.md"


def carried_test_ids() -> set[str]:
    """Every test id set in `ui/` (props and the `testid` helper) and by `assets/app.js`."""
    ids: set[str] = set()
    for path in (ROOT / "ui").glob("*.py"):
        source = path.read_text()
        ids |= set(re.findall(r"data-testid=([a-z][a-z0-9-]*[a-z0-9])(?![-{a-z0-9])", source))
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "testid"
                and len(node.args) == 2
                and isinstance(node.args[1], ast.Constant)
            ):
                ids.add(node.args[1].value)
            if isinstance(node, ast.Call):  # helpers that set it: `self._input(..., testid="agent-name")`
                ids |= {k.value.value for k in node.keywords if k.arg == "testid" and isinstance(k.value, ast.Constant)}
    ids |= set(re.findall(r'dataset\.testid = "([a-z0-9-]+)"', (ROOT / "assets" / "app.js").read_text()))
    ids |= {f"nav-{item.key}" for item in NAV_ITEMS}  # `data-testid=nav-{item.key}`
    return ids


def listed_test_ids() -> set[str]:
    """The names in backticks under "## Test ids" in docs/TESTING.md (attribute names excluded)."""
    section = DOC.read_text().split("## Test ids", 1)[1].split("\n## ", 1)[0]
    return {
        n
        for n in re.findall(r"`([a-z][a-z0-9-]*)`", section)
        if not n.startswith("data-") and n not in {"auto", "dark", "light"}
    }


def test_every_test_id_a_page_carries_is_listed_in_the_docs() -> None:
    """A new test id is listed in docs/TESTING.md."""
    missing = carried_test_ids() - listed_test_ids()
    assert not missing, f"list these test ids in docs/TESTING.md: {sorted(missing)}"


def test_every_test_id_the_docs_list_is_carried_by_a_page() -> None:
    """No listed test id has been removed from the pages."""
    stale = listed_test_ids() - carried_test_ids()
    assert not stale, f"docs/TESTING.md lists test ids that no page carries: {sorted(stale)}"


@pytest.mark.parametrize(
    "name",
    [
        "msg-input",
        "send-btn",
        "agent-invoke-panel",
        "agent-invoke-tab",
        "agent-invoke-status",
        "agent-invoke-body",
        "session-list",
        "assistant-message",
    ],
)
def test_the_names_the_issue_quotes_are_kept(name: str) -> None:
    """The names people already use in their tests are still there."""
    assert name in carried_test_ids()


def test_the_agent_card_log_is_debug(caplog: pytest.LogCaptureFixture) -> None:
    """Item 11: the a2a-sdk's agent card is a DEBUG record, dropped at INFO."""
    install_debug_detail_filter()
    logger = logging.getLogger("a2a.client.card_resolver")
    with caplog.at_level(logging.INFO):
        logger.info("Successfully fetched agent card data from %s: %s", "http://x/card", {"name": "big card"})
        logger.info("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]
    with caplog.at_level(logging.DEBUG, logger="a2a.client.card_resolver"):
        caplog.clear()
        logger.info("Successfully fetched agent card data from %s: %s", "http://x/card", {"name": "big card"})
    assert [r.levelname for r in caplog.records] == ["DEBUG"]
