"""Usage and cost (issue 39, item 3): tokens and LiteLLM's list price per answer and per delegated task.

A model LiteLLM's price list has (here `openai/gpt-4o-mini`, served by the OpenAI-compatible test server
with a usage chunk of 11 + 7 tokens) gets its price on the turn's `finish`, on the saved answer, on the
delegated task (`GET /api/tasks/{id}`, the list, the `done` event); the demo model and models the list
lacks have none (null). The audit's waterfall reads the whole chain of a task, for its owner only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.chat.llm import litellm_module
from core.chat.llm_stream import ModelResult, Usage
from core.chat.prices import priced
from core.services import Services
from tests.conftest import make_settings
from tests.test_api import build_api_app, stream_events
from tests.test_delegation_api import kind
from tests.utils.accounts import ALICE, BOB, seed_accounts
from tests.utils.live_server import live_server
from tests.utils.openai_server import openai_server, text  # noqa: F401  (fixture)

PRICED_MODEL = "openai/gpt-4o-mini"


def list_price(tokens_in: int, tokens_out: int) -> float:
    """What LiteLLM's own price list says those tokens of gpt-4o-mini cost."""
    entry = litellm_module().model_cost["gpt-4o-mini"]
    return tokens_in * entry["input_cost_per_token"] + tokens_out * entry["output_cost_per_token"]


def test_a_call_is_priced_at_litellms_list_prices_and_unpriced_models_have_none() -> None:
    litellm = litellm_module()
    cost = priced(litellm, ModelResult("hi", usage=Usage(11, 7), model=PRICED_MODEL)).usage.cost_usd
    assert cost == pytest.approx(list_price(11, 7)) and cost > 0
    for unpriced in ("local/demo", "openai/no-such-model-anywhere", "some-local-model"):
        assert priced(litellm, ModelResult("hi", usage=Usage(11, 7), model=unpriced)).usage.cost_usd is None


@pytest.fixture
def api(tmp_path: Path, database_url: str) -> Iterator[tuple[str, Services]]:
    """A live API with alice and bob; agents' model servers may be on this machine."""
    seed_accounts(tmp_path, database_url)
    settings = make_settings(
        tmp_path, database_url=database_url, demo_model_delay_ms=2, outbound_allow_hosts=["127.0.0.1"]
    )
    services = Services.build(settings)
    services.prepare()
    with live_server(build_api_app(services)) as url:
        yield url, services


async def turn(client: httpx.AsyncClient, agent_id: str, content: str) -> tuple[str, list[dict]]:
    session_id = (await client.post("/api/sessions", json={"agentId": agent_id})).json()["id"]
    posted = await client.post(f"/api/sessions/{session_id}/messages", json={"content": content})
    assert posted.status_code == 202, posted.text
    _, events = await stream_events(client, posted.json()["streamUrl"])
    return session_id, events


async def test_a_priced_answer_and_task_carry_their_cost_and_demo_ones_none(api, openai_server) -> None:  # noqa: F811
    url, _services = api
    async with httpx.AsyncClient(base_url=url, auth=ALICE, timeout=60) as alice:
        created = await alice.post(
            "/api/agents",
            json={"id": "priced", "name": "Priced", "model": PRICED_MODEL, "apiBase": openai_server.api_base},
        )
        assert created.status_code == 201, created.text

        # A chat with it: the finish event and the saved answer carry the price.
        openai_server.script(text("Four", " words", " of", " answer", usage=(11, 7)))
        session_id, events = await turn(alice, "priced", "hello")
        [finish] = [e["data"] for e in events if kind(e) == "finish"]
        assert finish["usage"]["inputTokens"] == 11 and finish["usage"]["outputTokens"] == 7
        assert finish["usage"]["costUsd"] == pytest.approx(list_price(11, 7))
        answer = (await alice.get(f"/api/sessions/{session_id}/messages")).json()[-1]
        assert answer["role"] == "assistant" and answer["costUsd"] == pytest.approx(list_price(11, 7))

        # Delegated to: the task has the callee's tokens and price, in the API and on its `done` event.
        openai_server.script(text("Delegated", " answer", usage=(20, 2)))
        _, events = await turn(alice, "general-assistant", "@priced say something")
        [task] = (await alice.get("/api/tasks")).json()
        assert task["calleeAgentId"] == "priced" and task["state"] == "completed"
        assert (task["inputTokens"], task["outputTokens"]) == (20, 2)
        assert task["costUsd"] == pytest.approx(list_price(20, 2))
        assert (await alice.get(f"/api/tasks/{task['id']}")).json()["costUsd"] == pytest.approx(list_price(20, 2))
        _, task_events = await stream_events(alice, f"/api/agents/a2a/stream?taskId={task['id']}")
        assert task_events[-1]["data"]["usage"]["costUsd"] == pytest.approx(list_price(20, 2))
        # The caller's own answer is the demo model's: counted, not priced.
        [caller_finish] = [e["data"] for e in events if kind(e) == "finish"]
        assert caller_finish["usage"]["outputTokens"] > 0 and "costUsd" not in caller_finish["usage"]

        # All on the demo model: tokens, no price.
        await turn(alice, "general-assistant", "@coding-assistant write a greeting")
        demo_task = next(t for t in (await alice.get("/api/tasks")).json() if t["calleeAgentId"] == "coding-assistant")
        assert demo_task["outputTokens"] > 0 and demo_task["costUsd"] is None


async def test_the_chain_of_a_task_is_read_whole_and_only_by_its_owner(api) -> None:
    url, services = api
    async with httpx.AsyncClient(base_url=url, auth=ALICE, timeout=60) as alice:
        await turn(alice, "general-assistant", "@planner plan @@coding-assistant code it")
        for _ in range(100):
            tasks = (await alice.get("/api/tasks")).json()
            if len(tasks) == 2 and all(t["state"] == "completed" for t in tasks):
                break
            await asyncio.sleep(0.05)
        root = next(t for t in tasks if t["parentTaskId"] is None)
        child = next(t for t in tasks if t["parentTaskId"] == root["id"])
        alice_id = (await alice.get("/api/me")).json()["id"]
    for start in (root["id"], child["id"]):  # from any hop, the whole chain, root first
        chain = await services.delegation.task_chain(alice_id, start)
        assert [(t.id, t.recursion_depth) for t in chain] == [(root["id"], 1), (child["id"], 2)]
        assert chain[0].created_at <= chain[1].created_at
    async with httpx.AsyncClient(base_url=url, auth=BOB, timeout=30) as bob:
        bob_id = (await bob.get("/api/me")).json()["id"]
    assert await services.delegation.task_chain(bob_id, child["id"]) == []
    assert await services.delegation.task_chain(alice_id, "no-such-task") == []
