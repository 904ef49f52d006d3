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
    assert editor.try_output.text == "Error: Only admins may try an agent's model."
