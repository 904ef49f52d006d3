"""`core.chat.model_route`: which key goes to which base URL, for every kind of model call (issue 34).

The rule: an agent's own key only to its own apiBase; an environment key only to its provider's own
endpoint, or to the global base URL it was configured with (`LLM_API_BASE`/`LLM_API_KEY`: OpenAI-compatible
calls only); with its own apiBase and no key an agent sends a placeholder, never an environment key.
"""

from __future__ import annotations

import pytest

from core.chat.model_route import NO_KEY, ModelRoute, RouteRefusedError, model_route, same_base

AGENT_BASE = "http://models.example/v1"
GLOBAL_BASE = "http://gateway.example/v1"


def route(
    provider: str | None,
    *,
    agent_base: str | None = None,
    agent_key: str | None = None,
    global_base: str | None = GLOBAL_BASE,
    global_key: str | None = "sk-global",
) -> ModelRoute:
    return model_route(
        provider=provider, agent_base=agent_base, agent_key=agent_key, global_base=global_base, global_key=global_key
    )


@pytest.mark.parametrize("provider", ["openai", "anthropic", "ollama", "hosted_vllm", "groq"])
def test_an_agents_own_base_gets_its_own_key_or_the_placeholder_never_a_global_or_environment_one(
    provider: str,
) -> None:
    assert route(provider, agent_base=AGENT_BASE, agent_key="sk-agent") == ModelRoute(
        AGENT_BASE, "sk-agent", None, "agent"
    )
    # No key of its own: the placeholder, so that LiteLLM does not fall back to OPENAI_API_KEY & co.
    assert route(provider, agent_base=AGENT_BASE) == ModelRoute(AGENT_BASE, NO_KEY, None, "agent")
    assert route(provider, agent_base=AGENT_BASE, agent_key="") == ModelRoute(AGENT_BASE, NO_KEY, None, "agent")


def test_a_model_litellm_does_not_know_goes_to_the_agents_base_as_openai_compatible() -> None:
    assert route(None, agent_base=AGENT_BASE) == ModelRoute(AGENT_BASE, NO_KEY, "openai", "agent")
    assert route(None, agent_base=AGENT_BASE, agent_key="sk-agent") == ModelRoute(
        AGENT_BASE, "sk-agent", "openai", "agent"
    )


@pytest.mark.parametrize("provider", ["bedrock", "vertex_ai", "sagemaker", "azure", "watsonx", "gemini"])
def test_providers_whose_credentials_come_from_the_environment_cannot_have_an_api_base(provider: str) -> None:
    with pytest.raises(RouteRefusedError, match=f"a {provider}/... model cannot have an apiBase"):
        route(provider, agent_base=AGENT_BASE, agent_key="sk-agent")
    assert route(provider) == ModelRoute(None, None, None, "provider")  # without one: the provider's own setup


def test_openai_calls_without_an_agent_base_go_to_the_global_base_with_the_global_key() -> None:
    assert route("openai") == ModelRoute(GLOBAL_BASE, "sk-global", None, "operator")
    # An agent's key saved without a base URL goes where its model goes without one.
    assert route("openai", agent_key="sk-agent") == ModelRoute(GLOBAL_BASE, "sk-agent", None, "operator")
    # LLM_API_BASE without LLM_API_KEY: the placeholder, never OPENAI_API_KEY (configured for OpenAI, not this server).
    assert route("openai", global_key=None) == ModelRoute(GLOBAL_BASE, NO_KEY, None, "operator")
    assert route(None) == ModelRoute(GLOBAL_BASE, "sk-global", "openai", "operator")


def test_openai_calls_without_any_base_go_to_the_providers_endpoint() -> None:
    assert route("openai", global_base=None) == ModelRoute(None, "sk-global", None, "provider")
    # Nothing given: LiteLLM takes OPENAI_API_KEY, for OpenAI's own endpoint.
    assert route("openai", global_base=None, global_key=None) == ModelRoute(None, None, None, "provider")
    with pytest.raises(RouteRefusedError, match="does not know this model"):
        route(None, global_base=None)


@pytest.mark.parametrize("provider", ["anthropic", "gemini", "groq", "bedrock"])
def test_other_providers_never_get_the_global_base_or_key(provider: str) -> None:
    # An anthropic/... agent once posted LLM_API_KEY to LLM_API_BASE/v1/v1/messages.
    assert route(provider) == ModelRoute(None, None, None, "provider")
    assert route(provider, agent_key="sk-agent") == ModelRoute(None, "sk-agent", None, "provider")


def test_same_base_ignores_only_what_does_not_change_the_endpoint() -> None:
    assert same_base("http://Models.Example:80/v1/", "http://models.example/v1")
    assert same_base("https://models.example:443/v1", "HTTPS://models.example/v1/")
    assert same_base(None, "") and same_base(" ", None)
    for other in (
        "https://models.example/v1",
        "http://models.example:8080/v1",
        "http://models.example/v2",
        "http://evil.example/v1",
        "http://models.example.evil/v1",
        "http://user@models.example/v1",
        None,
    ):
        assert not same_base("http://models.example/v1", other), other
