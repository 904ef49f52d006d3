"""Which base URL and which key a model call uses: a key goes only to the endpoint it belongs to (issue 34).

LiteLLM fills in what a call does not say from the environment: a provider's key
(`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, ...) whenever the call gives none, whatever
`api_base` it goes to. So every call names its key here, and the rule is:

- an agent with its own `apiBase`: its own key, or, with none, `NO_KEY` (a harmless placeholder:
  LiteLLM picks a provider's key as `api_key or <its settings> or <environment>`, so any non-empty
  value stops the fall-through, and an empty string would not). Only providers whose key is read
  that way (checked in litellm==1.110.2's source, see `CUSTOM_BASE_PROVIDERS`) may have an
  `apiBase`: the others (bedrock, vertex_ai, sagemaker, azure, ...) authenticate with credentials
  LiteLLM takes from the environment past `api_key`, and are refused with one;
- no `apiBase`, an OpenAI-compatible call (`openai/...`; or a model LiteLLM does not know) while the
  operator set `LLM_API_BASE`: to that base, with the agent's key or else `LLM_API_KEY` or else
  `NO_KEY` (never `OPENAI_API_KEY`, which was not configured for that server);
- no `apiBase` otherwise: the provider's own endpoint, with the agent's key, or for `openai/...`
  `LLM_API_KEY`, or else none, which lets LiteLLM take the provider's own environment key for the
  provider's own endpoint. `LLM_API_KEY` goes with no other provider.

`model_route` is pure (the gateway, `core.chat.llm`, asks LiteLLM for the provider first); the
address policy of the base URL it names is `core.web.outbound_policy`'s, applied by the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from core.errors import AppError

#: Sent as the key when a call must carry none of the environment's (see the module docstring).
NO_KEY = "no-key"

#: Providers that take an agent's own `apiBase`: each reads its key as `api_key or ...` (litellm==1.110.2:
#: main.py's openai branch; AnthropicModelInfo.get_api_key; _complete_ollama_chat; the
#: `_get_openai_compatible_provider_info` of groq, hosted_vllm, lm_studio, llamafile, fireworks_ai,
#: deepseek, cerebras, nvidia_nim, ollama in litellm_core_utils/get_llm_provider_logic.py).
CUSTOM_BASE_PROVIDERS = frozenset(
    {
        "openai",
        "text-completion-openai",
        "anthropic",
        "ollama",
        "ollama_chat",
        "hosted_vllm",
        "lm_studio",
        "llamafile",
        "groq",
        "fireworks_ai",
        "deepseek",
        "cerebras",
        "nvidia_nim",
    }
)

#: The providers the operator's `LLM_API_BASE`/`LLM_API_KEY` serve (and models LiteLLM does not know).
GLOBAL_BASE_PROVIDERS = frozenset({"openai"})

Endpoint = Literal["agent", "operator", "provider"]


class RouteRefusedError(AppError, ValueError):
    """A model call that cannot be made without sending a credential where it does not belong."""

    code = "route_refused"


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """Where one model call goes and with what.

    Attributes:
        api_base: LiteLLM's `api_base` (None: the provider's own endpoint).
        api_key: LiteLLM's `api_key` (None: LiteLLM takes the provider's environment key, for its own endpoint).
        custom_llm_provider: "openai" when a model LiteLLM does not know is called as OpenAI-compatible.
        endpoint: whose base URL `api_base` is: the agent's (checked against OUTBOUND_ALLOW_HOSTS), the
            operator's `LLM_API_BASE` (any address but a metadata one), or the provider's own.
    """

    api_base: str | None
    api_key: str | None
    custom_llm_provider: str | None
    endpoint: Endpoint


def model_route(
    *,
    provider: str | None,
    agent_base: str | None,
    agent_key: str | None,
    global_base: str | None,
    global_key: str | None,
) -> ModelRoute:
    """The base URL and key of one call (the rule is the module docstring's).

    Args:
        provider: LiteLLM's provider of the model (`get_llm_provider`), or None when LiteLLM does not know it.
        agent_base: the agent's own `apiBase`.
        agent_key: the agent's own key (or the one typed into "Try it").
        global_base: `LLM_API_BASE`.
        global_key: `LLM_API_KEY`.

    Raises:
        RouteRefusedError: a provider that cannot take an `apiBase`, or an unknown model with no base URL at all.
    """
    agent_key = agent_key or None
    if agent_base:
        if provider is not None and provider not in CUSTOM_BASE_PROVIDERS:
            raise RouteRefusedError(custom_base_refusal(provider))
        return ModelRoute(agent_base, agent_key or NO_KEY, "openai" if provider is None else None, "agent")
    if provider is None or provider in GLOBAL_BASE_PROVIDERS:
        custom = "openai" if provider is None else None
        if global_base:
            return ModelRoute(global_base, agent_key or global_key or NO_KEY, custom, "operator")
        if provider is None:
            raise RouteRefusedError(
                "LiteLLM does not know this model and it has no apiBase: write it as provider/model, "
                "or give the agent the apiBase of an OpenAI-compatible server"
            )
        return ModelRoute(None, agent_key or global_key or None, None, "provider")
    return ModelRoute(None, agent_key, None, "provider")


def custom_base_refusal(provider: str) -> str:
    """Why a model of `provider` cannot have an `apiBase` (for the agent editor and the model call)."""
    return (
        f"a {provider}/... model cannot have an apiBase: {provider} authenticates with credentials taken from "
        "this server's environment, which must not go to another address; use openai/<model> for an "
        "OpenAI-compatible server, or remove the apiBase"
    )


def same_base(a: str | None, b: str | None) -> bool:
    """Whether two base URLs name the same endpoint (scheme and host in any case, default port, trailing '/')."""
    return _normalised(a) == _normalised(b)


def _normalised(url: str | None) -> tuple[str, ...] | None:
    text = (url or "").strip()
    if not text:
        return None
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:
        return (text,)
    return (
        scheme,
        (parts.hostname or "").lower(),
        str(port),
        parts.username or "",
        parts.password or "",
        parts.path.rstrip("/") or "",
        parts.query,
    )
