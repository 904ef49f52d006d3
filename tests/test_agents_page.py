"""`/agents` and the chat page's picker through NiceGUI's simulated `User` (issue 15).

The browser test (e2e/test_agents_page.py) creates an agent and chats with it; here: the list, a
refusal beside its field, who may edit, and a deleted agent's chat that stays readable.
"""

from __future__ import annotations

import pytest
from nicegui import app
from nicegui.testing import User

from core.services import Services
from tests.test_chat_page import BOB, MULTI_USER, app_env, litellm_imported, log_in, user  # noqa: F401  (fixtures)


def services() -> Services:
    return app.state.services


async def test_the_page_lists_every_agent_and_the_graph(user: User) -> None:  # noqa: F811
    await user.open("/agents")
    await user.should_see("Planner")
    await user.should_see("Breaks a job into steps")
    await user.should_see("Who may call whom")
    await user.should_see("Planner → Coding Assistant (any agent)")


async def test_a_deleted_agents_chat_opens_marked_agent_deleted(user: User) -> None:  # noqa: F811
    admin = services().agent_admin
    await admin.create({"id": "gone", "name": "Gone", "description": "Will be deleted."})
    chat = await services().workspace.create(services().auth.local_user_id, "gone")
    await admin.delete("gone")
    await user.open(f"/chat/{chat.id}")
    await user.should_see("gone (agent deleted)")


@pytest.mark.parametrize("field", ["model"])
async def test_a_refusal_shows_beside_its_field(user: User, field: str) -> None:  # noqa: F811
    await user.open("/agents")
    from ui.agents_page import AgentEditor  # the editor as the page builds it, driven directly

    views = await services().agent_admin.list()
    with user:
        editor = AgentEditor(services(), None, views, True, on_saved=lambda _id: None)
        editor.render()
        editor.inputs["id"].value = "oops"
        editor.inputs["name"].value = "Oops"
        editor.inputs["model"].value = "no-such-model"
    await editor.save()
    assert "LiteLLM does not know the model" in (editor.inputs[field].error or "")


@pytest.mark.parametrize("app_env", [MULTI_USER], indirect=True)
async def test_try_it_is_not_for_a_user_who_may_not_change_the_agent(user: User) -> None:  # noqa: F811
    """Try it sends the agent's key where the form says and shows the reply: bob (no admin) neither sees nor runs it."""
    await log_in(user, *BOB, path="/agents")
    await user.open("/agents?edit=planner")
    await user.should_see("Edit Planner")
    await user.should_see("Only admins change agents.")
    await user.should_not_see("Try it")
    from ui.agents_page import AgentEditor  # as if the button were there: the page's action, refused in core

    planner = await services().agent_admin.get("planner")
    with user:
        editor = AgentEditor(services(), planner, await services().agent_admin.list(), True, on_saved=lambda _id: None)
        editor.render()
        editor.inputs["apiBase"].value = "http://127.0.0.1:9/v1"
    await editor.try_it()
    assert editor.try_status.text == "Error: Only admins may try an agent's model."


@pytest.mark.parametrize("app_env", [MULTI_USER], indirect=True)
async def test_a_user_who_may_not_change_agents_gets_no_save_or_delete(user: User) -> None:  # noqa: F811
    """The editor's Save and Delete exist only on an admin's page (an event needs its element on the page)."""
    await log_in(user, *BOB, path="/agents")
    await user.open("/agents?edit=planner")
    await user.should_see("Edit Planner")
    await user.should_not_see("Save")
    await user.should_not_see("Delete")
    await user.should_not_see("New agent")
    assert await services().agent_admin.get("planner") is not None


async def test_an_agents_stored_key_is_never_put_in_the_editor(user: User) -> None:  # noqa: F811
    await services().agent_admin.create(
        {"id": "keyed", "name": "Keyed", "model": "openai/gpt-4o-mini", "api_key": "sk-stored-secret-0123456789"}
    )
    await user.open("/agents?edit=keyed")
    await user.should_see("API key (stored; type to replace)")
    from ui.agents_page import AgentEditor  # the page's editor: every input it renders, and their values

    keyed = await services().agent_admin.get("keyed")
    with user:
        editor = AgentEditor(services(), keyed, await services().agent_admin.list(), True, on_saved=lambda _id: None)
        editor.render()
    assert editor.inputs["apiKey"].value == ""
    assert all("sk-stored-secret" not in str(getattr(element, "value", "")) for element in editor.inputs.values())
    await user.should_not_see(content="sk-stored-secret")


async def test_delete_on_the_page_removes_the_agent_or_says_why_not(user: User) -> None:  # noqa: F811
    admin = services().agent_admin
    await admin.create({"id": "doomed", "name": "Doomed"})
    await admin.create({"id": "answering", "name": "Answering"})
    from ui.agents_page import AgentEditor

    chat = await services().workspace.create(services().auth.local_user_id, "answering")
    await services().chat.start_turn(session_id=chat.id, user_id=services().auth.local_user_id, text="/hang")
    try:
        await user.open("/agents?edit=doomed")
        saved: list[str | None] = []

        async def on_saved(agent_id: str | None) -> None:
            saved.append(agent_id)

        for agent_id in ("answering", "doomed"):
            view = await admin.get(agent_id)
            with user:
                editor = AgentEditor(services(), view, await admin.list(), True, on_saved=on_saved)
                editor.render()
            await editor.delete()
        # The agent answering in a chat is refused with the reason, the other is gone (and the page re-reads).
        left = {view.id for view in await admin.list()}
        assert "answering" in left and "doomed" not in left
        assert saved == [None]
        await user.should_see("Deleted Doomed.")
        await user.should_see("is answering in chats right now")
    finally:
        await services().chat.cancel(chat.id)
