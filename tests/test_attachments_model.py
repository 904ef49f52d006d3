"""Attached files reach a real provider's model through LiteLLM (issue 36): an image as an `image_url` part when
LiteLLM says the model takes images, a text file inlined, every file named; a model without vision gets no image.

The provider is the scripted OpenAI-compatible server of `tests/utils/openai_server.py`, over real HTTP.
"""

from __future__ import annotations

import base64

import pytest

from core.chat import agents as agents_store
from core.chat import attachments
from core.chat import sessions as sessions_store
from core.services import Services
from models import Agent
from tests.test_chat_engine_openai import (  # noqa: F401  (fixtures)
    _litellm_imported,
    settings,
)
from tests.utils.a2a_files_agent import PNG
from tests.utils.openai_server import OpenAIServer, openai_server, text  # noqa: F401  (the fixture)


async def content_sent(services: Services, model: str, server: OpenAIServer) -> list[dict]:
    """Send a message with a PNG and a text file to an agent on `model`; the user content the provider got."""
    user_id = services.auth.local_user_id
    assert user_id is not None
    async with services.db.session() as s:
        agent = await agents_store.create_agent(s, slug=model.replace("/", "-"), name="Looker", model=model)
        chat = await sessions_store.create_session(s, user_id=user_id, agent_id=agent.id)
    refs = []
    for name, mime, data in [("dot.png", "image/png", PNG), ("notes.txt", "text/plain", b"buy milk")]:
        row = await attachments.save(services.db, user_id=user_id, session_id=chat.id, name=name, mime=mime, data=data)
        refs.append(attachments.ref_of(row))
    server.script(text("Seen."))
    await services.chat.start_turn(session_id=chat.id, user_id=user_id, text="what are these?", files=refs)
    await services.chat.wait(chat.id, timeout=10)
    return server.requests[-1].body["messages"][-1]["content"]


@pytest.mark.parametrize("model", ["openai/gpt-4o"])
async def test_a_vision_model_gets_the_image_and_the_text_file(
    services: Services,
    openai_server: OpenAIServer,  # noqa: F811
    model: str,
) -> None:
    content = await content_sent(services, model, openai_server)
    assert content == [
        {"type": "text", "text": "what are these?"},
        {"type": "text", "text": f"Attached file: dot.png (image/png, {len(PNG)} bytes)"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()}},
        {"type": "text", "text": "Attached file: notes.txt (text/plain, 8 bytes)"},
        {"type": "text", "text": "```\nbuy milk\n```"},
    ]


async def test_a_model_without_vision_gets_the_image_named_only(
    services: Services,
    openai_server: OpenAIServer,  # noqa: F811
) -> None:
    content = await content_sent(services, "openai/test-model", openai_server)
    assert [part["type"] for part in content] == ["text", "text", "text", "text"]
    assert content[1]["text"] == f"Attached file: dot.png (image/png, {len(PNG)} bytes)"


async def test_a_turn_without_files_does_not_ask_litellm_about_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    monkeypatch.setattr(attachments, "takes_images", lambda model: asked.append(model) or True)
    agent = Agent(slug="looker", name="Looker", model="openai/gpt-4o")
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    await attachments.prepare_for_agent(None, agent, plain)  # type: ignore[arg-type]  # no file: no database either
    assert asked == [] and plain[-1]["content"] == "hi"  # with files it is asked: the tests above
