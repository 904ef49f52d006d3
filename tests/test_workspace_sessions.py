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
