"""Model endpoints and their keys (issue 34): a key reaches only the endpoint it belongs to, and an agent's
`apiBase` is an outbound fetch under the same policy as card URLs.

Recording servers on 127.0.0.1 (tests/utils/openai_server.py, which records every request's headers)
stand for an agent's own model server, the operator's `LLM_API_BASE` and Anthropic's own endpoint
(`ANTHROPIC_API_BASE`); the app runs as `python app.py` with provider keys of known values in its
environment and two accounts (alice, the admin; bob, not one).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.auth import accounts
from core.chat.llm import LLMError, LLMGateway
from core.delegation.agent_admin import AgentRuleError, NotAllowedError
from core.services import Services
from core.web import outbound_policy
from core.web.outbound_policy import AllowList
from tests.conftest import make_settings
from tests.test_api import stream_events
from tests.test_app_cli import create_account
from tests.utils.app_process import AppProcess, app_process
from tests.utils.openai_server import OpenAIServer, text
from tests.utils.sync import run_sync

ENV_OPENAI, ENV_ANTHROPIC, ENV_GLOBAL = "sk-env-openai-1111", "sk-env-anthropic-2222", "sk-env-llm-3333"
STORED = "sk-stored-4444"
SECRETS = {ENV_OPENAI, ENV_ANTHROPIC, ENV_GLOBAL, STORED}
ALICE, BOB = ("alice", "alice-password"), ("bob", "bob-password")
METADATA_FORMS = [
    "169.254.169.254",
    "fd00:ec2::254",
    "::ffff:169.254.169.254",
    "64:ff9b::a9fe:a9fe",
    "2002:a9fe:a9fe::1",
    "::169.254.169.254",
]


def secrets_seen(server: OpenAIServer) -> set[str]:
    """The known secrets in any header of any request the server got."""
    return {secret for r in server.requests for value in r.headers.values() for secret in SECRETS if secret in value}


def keys_seen(server: OpenAIServer) -> list[str]:
    """The credential each request carried (Authorization or x-api-key)."""
    return [
        r.headers.get("x-api-key") or r.headers.get("authorization", "").removeprefix("Bearer ")
        for r in server.requests
    ]


@pytest.fixture
def recorders() -> Iterator[tuple[OpenAIServer, OpenAIServer, OpenAIServer]]:
    """The agents' own model server, the operator's LLM_API_BASE, and Anthropic's endpoint."""
    with OpenAIServer() as own, OpenAIServer() as operator, OpenAIServer() as anthropic:
        yield own, operator, anthropic


@pytest.fixture
def app(tmp_path: Path, recorders) -> Iterator[AppProcess]:
    _, operator, anthropic = recorders
    data = tmp_path / "data"
    create_account(data, *ALICE)  # the first account: an admin
    create_account(data, *BOB)
    with app_process(
        data,
        OPENAI_API_KEY=ENV_OPENAI,
        ANTHROPIC_API_KEY=ENV_ANTHROPIC,
        ANTHROPIC_API_BASE=anthropic.url,
        LLM_API_BASE=operator.api_base,
        LLM_API_KEY=ENV_GLOBAL,
        LLM_TIMEOUT_S="5",
        DEMO_MODEL_DELAY_MS="0",
        # the model servers run on this machine; the metadata address is listed to show it stays refused
        OUTBOUND_ALLOW_HOSTS="127.0.0.1,169.254.169.254,169.254.0.0/16,fd00::/8,::/0",
    ) as running:
        running.wait_until_serving(path="/login")
        yield running


async def turn(client: httpx.AsyncClient, agent_id: str) -> list[dict]:
    session = (await client.post("/api/sessions", json={"agentId": agent_id})).json()["id"]
    posted = await client.post(f"/api/sessions/{session}/messages", json={"content": "hi"})
    assert posted.status_code == 202, posted.text
    _, events = await stream_events(client, posted.json()["streamUrl"])
    return events


async def test_no_stored_or_environment_key_reaches_a_base_url_it_does_not_belong_to(app, recorders) -> None:
    own, operator, anthropic = recorders
    agent = {"name": "Agent", "apiBase": own.api_base}
    async with httpx.AsyncClient(base_url=app.base_url, auth=ALICE, timeout=60) as alice:
        for body in (
            {"id": "own-key", "model": "openai/test-model", "apiKey": STORED},
            {"id": "no-key", "model": "openai/test-model"},
            {"id": "unknown-model", "model": "my-local-model"},
            {"id": "claude-own-base", "model": "anthropic/claude-3-5-haiku-latest", "apiBase": own.url},
            {"id": "claude", "model": "anthropic/claude-3-5-haiku-latest", "apiBase": None},
            {"id": "gpt", "model": "openai/test-model", "apiBase": None},
        ):
            created = await alice.post("/api/agents", json={**agent, **body})
            assert created.status_code == 201, created.text
        own.script(text("one"), text("two"), text("three"))
        operator.script(text("four"))
        for agent_id in ("own-key", "no-key", "unknown-model", "claude-own-base", "claude", "gpt"):
            await turn(alice, agent_id)

        # The agents' own server: the stored key of the agent it belongs to, else the placeholder; no env key.
        assert keys_seen(own) == [STORED, "no-key", "no-key", "no-key"]
        assert secrets_seen(own) == {STORED}
        # LLM_API_BASE: LLM_API_KEY, for the openai/... agent only (no anthropic/... request lands there).
        assert [r.path for r in operator.requests] == ["/v1/chat/completions"]
        assert secrets_seen(operator) == {ENV_GLOBAL}
        # Anthropic's own endpoint: ANTHROPIC_API_KEY, and nothing else.
        assert [r.path for r in anthropic.requests] == ["/v1/messages"]
        assert keys_seen(anthropic) == [ENV_ANTHROPIC] and secrets_seen(anthropic) == {ENV_ANTHROPIC}

        # A stored key does not follow a changed apiBase: it is given again, or removed.
        moved = await alice.patch("/api/agents/own-key", json={"apiBase": operator.api_base})
        assert moved.status_code == 422, moved.text
        [error] = moved.json()["detail"]
        assert error["loc"] == ["body", "apiKey"] and f"saved for {own.api_base}" in error["msg"]
        assert moved.json()["code"] == "invalid_request"
        # An unchanged base (as the editor sends it with every save, spelled differently here) keeps the key.
        same = await alice.patch("/api/agents/own-key", json={"apiBase": own.api_base + "/", "name": "Renamed"})
        assert same.status_code == 200 and same.json()["hasApiKey"]
        removed = await alice.patch("/api/agents/own-key", json={"apiBase": operator.api_base, "apiKey": None})
        assert removed.status_code == 200 and not removed.json()["hasApiKey"]

        # Providers that authenticate past the api_key (cloud credentials from the environment) take no apiBase.
        bedrock = await alice.post(
            "/api/agents", json={**agent, "id": "bedrock", "model": "bedrock/anthropic.claude-3-haiku-20240307-v1:0"}
        )
        assert bedrock.status_code == 422
        assert bedrock.json()["detail"][0]["loc"] == ["body", "apiBase"]
        assert "bedrock/... model cannot have an apiBase" in bedrock.json()["detail"][0]["msg"]

    async with httpx.AsyncClient(base_url=app.base_url, auth=BOB, timeout=60) as bob:
        assert (await bob.patch("/api/agents/no-key", json={"apiBase": operator.api_base})).status_code == 403


async def test_an_api_base_is_held_to_the_outbound_policy_and_a_metadata_address_is_never_allowed(
    tmp_path: Path, app
) -> None:
    agent = {"name": "Agent", "model": "openai/test-model"}
    async with httpx.AsyncClient(base_url=app.base_url, auth=ALICE, timeout=60) as alice:
        # Allow-listed (OUTBOUND_ALLOW_HOSTS lists 127.0.0.1, and the metadata addresses' networks too).
        assert (
            await alice.post("/api/agents", json={**agent, "id": "local", "apiBase": "http://127.0.0.1:11434/v1"})
        ).status_code == 201
        for index, address in enumerate(METADATA_FORMS):
            host = f"[{address}]" if ":" in address else address
            refused = await alice.post(
                "/api/agents", json={**agent, "id": f"meta{index}", "apiBase": f"http://{host}/latest/v1"}
            )
            assert refused.status_code == 422, (address, refused.text)
            [error] = refused.json()["detail"]
            assert error["loc"] == ["body", "apiBase"] and "a cloud metadata address" in error["msg"], address
        patched = await alice.patch("/api/agents/local", json={"apiBase": "http://169.254.169.254/v1"})
        assert patched.status_code == 422 and "metadata" in patched.text

    with app_process(tmp_path / "plain", DEMO_MODEL_DELAY_MS="0") as plain:  # no OUTBOUND_ALLOW_HOSTS
        plain.wait_until_serving()
        async with httpx.AsyncClient(base_url=plain.base_url, timeout=60) as local:
            for base, reason in (
                ("http://127.0.0.1:11434/v1", "a loopback address"),
                ("http://localhost:11434/v1", "a loopback address"),
                ("http://10.0.0.5/v1", "a private address"),
                ("http://169.254.169.254/v1", "a cloud metadata address"),
            ):
                refused = await local.post("/api/agents", json={**agent, "id": "x", "apiBase": base})
                assert refused.status_code == 422, (base, refused.text)
                [error] = refused.json()["detail"]
                assert error["loc"] == ["body", "apiBase"] and reason in error["msg"], (base, error)
                if "metadata" not in reason:  # says how to allow it; a metadata address cannot be
                    assert "OUTBOUND_ALLOW_HOSTS=" in error["msg"]


@pytest.mark.parametrize("address", METADATA_FORMS)
def test_a_metadata_address_is_refused_in_every_spelling_whatever_the_allow_list(address: str) -> None:
    parsed = ipaddress.ip_address(address)
    everything = AllowList.parse([address, "0.0.0.0/0", "::/0", "169.254.169.254.nip.io"])
    assert outbound_policy.refusal(parsed) == "a cloud metadata address"
    assert not everything.allows(address, parsed)
    assert not everything.allows("169.254.169.254.nip.io", parsed)
    assert not outbound_policy.OPERATOR_CONFIGURED.allows("metadata.google.internal", parsed)
    assert outbound_policy.OPERATOR_CONFIGURED.allows("db.internal", ipaddress.ip_address("10.0.0.5"))


async def test_every_model_call_checks_its_base_url_before_connecting(openai_server_pair) -> None:
    own, _ = openai_server_pair
    messages = [{"role": "user", "content": "hi"}]
    # An agent's apiBase saved while it was allowed, called after the allowance is gone: refused, not sent.
    with pytest.raises(LLMError, match="not allowed: a loopback address") as refused:
        async for _ in LLMGateway(allow=AllowList(), timeout_s=5).stream(
            "openai/test-model", messages, api_base=own.api_base, api_key=STORED
        ):
            pass
    assert "OUTBOUND_ALLOW_HOSTS=127.0.0.1" in refused.value.message
    assert own.requests == []
    own.script(text("allowed"))
    async for _ in LLMGateway(allow=AllowList.parse(["127.0.0.1"]), timeout_s=5).stream(
        "openai/test-model", messages, api_base=own.api_base, api_key=STORED
    ):
        pass
    assert keys_seen(own) == [STORED]
    # The operator's LLM_API_BASE may be on any address of the operator's network, but not a metadata one.
    for base in ("http://169.254.169.254/v1", "http://[::ffff:169.254.169.254]/v1"):
        with pytest.raises(LLMError, match="a cloud metadata address"):
            async for _ in LLMGateway(api_base=base, api_key=ENV_GLOBAL, timeout_s=5).stream(
                "openai/test-model", messages
            ):
                pass


@pytest.fixture
def openai_server_pair() -> Iterator[tuple[OpenAIServer, OpenAIServer]]:
    with OpenAIServer() as first, OpenAIServer() as second:
        yield first, second


@pytest.fixture
def two_users(tmp_path: Path) -> Iterator[tuple[Services, int, int]]:
    """Services with accounts (alice: admin, bob: not), agents' model servers allowed on 127.0.0.1."""
    seed = Services.build(make_settings(tmp_path))
    seed.db.migrate()

    async def create_users() -> tuple[int, int]:
        async with seed.db.session() as s:
            alice = await accounts.create_user(s, username=ALICE[0], password=ALICE[1])
            bob = await accounts.create_user(s, username=BOB[0], password=BOB[1])
        await seed.db.close()
        return alice.id, bob.id

    alice_id, bob_id = run_sync(create_users())
    services = Services.build(make_settings(tmp_path, outbound_allow_hosts=["127.0.0.1"], llm_timeout_s=5))
    services.prepare()
    assert services.auth.multi_user
    yield services, alice_id, bob_id


async def test_try_it_runs_only_for_an_admin_and_sends_a_stored_key_only_to_its_own_base(
    two_users, openai_server_pair
) -> None:
    services, alice, bob = two_users
    own, elsewhere = openai_server_pair
    admin = services.agent_admin
    await admin.create(
        {"id": "keyed", "name": "Keyed", "model": "openai/test-model", "api_base": own.api_base, "api_key": STORED}
    )

    # Bob (no admin) may not try it at all: whatever the form says, nothing is sent anywhere.
    for fields in ({}, {"api_base": elsewhere.api_base}, {"api_base": own.api_base}):
        with pytest.raises(NotAllowedError):
            await admin.try_model(fields, "keyed", user_id=bob, multi_user=True)
    with pytest.raises(NotAllowedError):
        await admin.try_model({"api_base": elsewhere.api_base}, None, user_id=None, multi_user=True)

    # Alice, with another base URL typed and no key: the stored key stays home.
    result = await admin.try_model({"api_base": elsewhere.api_base}, "keyed", user_id=alice, multi_user=True)
    assert not result.ok and result.field == "apiKey" and f"saved for {own.api_base}" in result.text
    assert own.requests == [] and elsewhere.requests == []
    # The base URL it was saved with (spelled with a trailing slash): the stored key is used there.
    own.script(text("hello"))
    result = await admin.try_model({"api_base": own.api_base + "/"}, "keyed", user_id=alice, multi_user=True)
    assert result.ok and result.text == "hello" and keys_seen(own) == [STORED]
    # Another base URL with a key typed: that key, and only it, goes there.
    elsewhere.script(text("typed"))
    result = await admin.try_model(
        {"api_base": elsewhere.api_base, "api_key": "sk-typed"}, "keyed", user_id=alice, multi_user=True
    )
    assert result.ok and keys_seen(elsewhere) == ["sk-typed"]
    # A metadata address is refused in Try it too, before any connection.
    result = await admin.try_model(
        {"api_base": "http://169.254.169.254/v1", "api_key": "sk-typed"}, "keyed", user_id=alice, multi_user=True
    )
    assert not result.ok and "a cloud metadata address" in result.text

    # Saving another base URL without giving the key again is refused beside the key field.
    with pytest.raises(AgentRuleError) as refused:
        await admin.update("keyed", {"api_base": elsewhere.api_base})
    assert refused.value.loc == ("apiKey",)
    assert (await admin.update("keyed", {"api_base": elsewhere.api_base, "api_key": "sk-new"})).has_api_key
