"""Issue 14, item 6: renaming, deleting (and undoing it) and searching chats, in the workspace."""

from __future__ import annotations

import pytest

from core.chat.engine import InvalidMessageError, SessionNotFoundError
from core.chat.workspace import Workspace
from core.delegation.runs import estimate_tokens
from core.delegation.states import short_task_text, state_word


def test_state_words_are_the_api_states() -> None:
    """The word shown for a state is the API's state name; no state yet reads `submitted`."""
    for state in ("submitted", "working", "completed", "failed", "canceled"):
        assert state_word(state) == state
    assert state_word(None) == "submitted"
    assert short_task_text("a  b\nc") == "a b c"
    assert short_task_text("x" * 40, 10) == "x" * 9 + "…"


def test_a_stopped_run_gets_an_estimated_token_count() -> None:
    """About four characters a token; nothing said is no tokens."""
    assert estimate_tokens("") == 0
    assert estimate_tokens("abc") == 1
    assert estimate_tokens("x" * 400) == 100


async def test_rename_search_delete_and_restore_a_chat(services) -> None:
    """Search matches titles and messages (case-insensitive, `%` and `_` literally); delete hides, restore undoes."""
    workspace: Workspace = services.workspace
    user_id = services.auth.local_user_id
    first = await workspace.create(user_id, "general-assistant")
    second = await workspace.create(user_id, "general-assistant")
    renamed = await workspace.rename(user_id, first.id, "  Zebra   plans\n100% done ")
    assert renamed.title == "Zebra plans 100% done"
    await services.chat.start_turn(session_id=second.id, user_id=user_id, text="about giraffes_and more")
    await services.chat.wait(second.id, timeout=30)

    async def titles(search: str | None) -> set[str]:
        return {s.id for s in await workspace.sessions(user_id, search)}

    assert await titles(None) == {first.id, second.id}
    assert await titles("zebra") == {first.id}
    assert await titles("100%") == {first.id}
    assert await titles("0% d") == {first.id}
    assert await titles("%") == {first.id}  # a literal percent sign, not "anything"
    assert await titles("GIRAFFES_") == {second.id}  # found in a message
    assert await titles("giraffes-") == set()  # `_` is not a wildcard
    with pytest.raises(InvalidMessageError):
        await workspace.rename(user_id, first.id, "   ")
    with pytest.raises(SessionNotFoundError):
        await workspace.rename(user_id + 1, first.id, "not yours")

    assert await workspace.delete(user_id, first.id)
    assert await titles(None) == {second.id}
    assert not await workspace.delete(user_id, first.id)  # already gone
    assert await workspace.restore(user_id, first.id)
    assert await titles("zebra") == {first.id}
    assert not await workspace.restore(user_id, first.id)  # not deleted any more


def test_chats_are_grouped_under_the_readers_local_day() -> None:
    """Item 10a of issue 40: Today, Yesterday, Previous 7 days, Older, by the day in the reader's time zone."""
    from dataclasses import dataclass
    from datetime import UTC, datetime, timedelta

    from core.chat.day_groups import day_group, group_by_day
    from core.i18n import use_timezone

    @dataclass
    class Row:
        name: str
        updated_at: datetime

    now = datetime(2025, 6, 12, 7, 30, tzinfo=UTC)  # 00:30 in Los Angeles (UTC-7 in June)
    rows = [
        Row("future", now + timedelta(minutes=5)),  # another machine's clock: today
        Row("now", now),
        Row("utc-midnight", datetime(2025, 6, 12, 0, 10, tzinfo=UTC)),
        Row("late-yesterday", datetime(2025, 6, 11, 23, 50, tzinfo=UTC)),
        Row("two-days", now - timedelta(days=2)),
        Row("seven-days", now - timedelta(days=7)),
        Row("eight-days", now - timedelta(days=8)),
        Row("naive-old", datetime(2024, 1, 1, 12, 0)),  # naive: UTC, as the database keeps them
    ]

    def groups(zone: str | None) -> dict[str, list[str]]:
        return {g: [r.name for r in rs] for g, rs in group_by_day(rows, now=now, zone=zone)}

    assert groups("UTC") == {
        "today": ["future", "now", "utc-midnight"],
        "yesterday": ["late-yesterday"],
        "previous-7-days": ["two-days", "seven-days"],
        "older": ["eight-days", "naive-old"],
    }
    # In Los Angeles it is just past midnight: what was "today" in UTC at 00:10 is yesterday's afternoon there.
    assert groups("America/Los_Angeles") == {
        "today": ["future", "now"],
        "yesterday": ["utc-midnight", "late-yesterday"],
        "previous-7-days": ["two-days", "seven-days"],
        "older": ["eight-days", "naive-old"],
    }
    # Without a zone: the reader's (the browser's once it has said), else UTC; an unknown name is UTC.
    with use_timezone("America/Los_Angeles"):
        assert day_group(datetime(2025, 6, 12, 0, 10, tzinfo=UTC), now=now) == "yesterday"
    with use_timezone(None):
        assert day_group(datetime(2025, 6, 12, 0, 10, tzinfo=UTC), now=now) == "today"
    assert day_group(datetime(2025, 6, 12, 0, 10, tzinfo=UTC), now=now, zone="Not/AZone") == "today"
    assert group_by_day([], now=now) == []
