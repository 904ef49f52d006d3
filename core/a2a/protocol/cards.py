"""Agent cards (server side): what a served card says (`CardSpec`), built as the SDK's `AgentCard`.

The card is served as strict v1.0 ProtoJSON to a v1 client, as the SDK's v0.3 card to a v0.3 one, and to a
client that names no version as a card both read (`card_json`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from a2a.compat.v0_3.conversions import to_compat_agent_card
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import (
    PROTOCOL_VERSION_0_3,
    PROTOCOL_VERSION_1_0,
)
from google.protobuf.json_format import MessageToDict

from core.a2a.protocol.states import HTTP_JSON, INPUT_MODES, JSONRPC, SECURITY_SCHEME, TEXT_MODES


@dataclass(frozen=True, slots=True, kw_only=True)
class SkillSpec:
    """One skill on a card."""

    id: str
    name: str
    description: str
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CardSpec:
    """What a served card says, in plain values.

    Attributes:
        name: the agent's display name.
        description: what it does.
        rpc_url: the absolute URL of its JSON-RPC endpoint (both protocol versions).
        rest_url: the absolute URL of its HTTP+JSON endpoint (both protocol versions; v0.3's paths start
            with `/v1`); none: JSON-RPC only.
        version: the agent's version string.
        provider: who runs it, and `provider_url` where.
        skills: its skills; at least one (the card requires them).
        extra_skills: skills listed on the extended card only (for callers with a key).
        notes: how this server treats requests (e.g. contextIds), after the description.
        input_modes: the media types it reads (text, and JSON data parts read as their JSON text).
        output_modes: the media types it may answer with (files and JSON data when its model writes them).
    """

    name: str
    description: str
    rpc_url: str
    version: str
    rest_url: str = ""
    provider: str
    provider_url: str
    skills: tuple[SkillSpec, ...]
    extra_skills: tuple[SkillSpec, ...] = ()
    notes: str = ""
    input_modes: tuple[str, ...] = INPUT_MODES
    output_modes: tuple[str, ...] = TEXT_MODES


def build_card(spec: CardSpec, *, extended: bool = False) -> AgentCard:
    """The agent card: v1.0 and v0.3 JSON-RPC interfaces on one URL (and HTTP+JSON on another), bearer-key security.

    JSON-RPC comes first: a client that takes the server's preference (the SDK's default) keeps using it.
    """
    skills = [*spec.skills, *(spec.extra_skills if extended else ())]
    interfaces = [
        AgentInterface(url=spec.rpc_url, protocol_binding=JSONRPC, protocol_version=PROTOCOL_VERSION_1_0),
        AgentInterface(url=spec.rpc_url, protocol_binding=JSONRPC, protocol_version=PROTOCOL_VERSION_0_3),
    ]
    if spec.rest_url:
        interfaces += [
            AgentInterface(url=spec.rest_url, protocol_binding=HTTP_JSON, protocol_version=PROTOCOL_VERSION_1_0),
            AgentInterface(url=spec.rest_url, protocol_binding=HTTP_JSON, protocol_version=PROTOCOL_VERSION_0_3),
        ]
    return AgentCard(
        name=spec.name,
        description="\n\n".join(t for t in (spec.description or spec.name, spec.notes) if t),
        version=spec.version,
        provider=AgentProvider(organization=spec.provider, url=spec.provider_url),
        supported_interfaces=interfaces,
        capabilities=AgentCapabilities(streaming=True, push_notifications=True, extended_agent_card=True),
        security_schemes={
            SECURITY_SCHEME: SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="bearer",
                    bearer_format="API key",
                    description=f"An API key of this app (create one at {spec.provider_url}/api-keys), "
                    "sent as 'Authorization: Bearer <key>'.",
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={SECURITY_SCHEME: StringList()})],
        default_input_modes=list(spec.input_modes),
        default_output_modes=list(spec.output_modes),
        skills=[
            AgentSkill(
                id=s.id,
                name=s.name,
                description=s.description or s.name,
                tags=list(s.tags) or ["agent"],
                input_modes=list(spec.input_modes),
                output_modes=list(spec.output_modes),
            )
            for s in skills
        ],
    )


def card_json(card: AgentCard, *, version: str | None = None) -> dict[str, Any]:
    """The card as served, in the shape of the protocol version the client asked for.

    - `1.x` (`A2A-Version: 1.0`): strict ProtoJSON, nothing else, so a strict v1.0 parser reads it. The
      SDK's own serializer (`agent_card_to_dict`) merges v0.3 fields into it, which such a parser rejects.
    - `0.x`: the SDK's v0.3 card (`to_compat_agent_card`).
    - none: the spec reads an empty version as 0.3 (§3.6.2), and neither stock resolver sends one (a2a-sdk
      0.3.x nor 1.x). So the v0.3 card, which a 0.3 client reads (`url`, `protocolVersion`, v0.3 security
      schemes), plus the v1.0 card's `supportedInterfaces`: a 0.3 model ignores that field, and a 1.x
      resolver (`parse_agent_card`) keeps the interfaces it lists, v1.0 first, and maps the v0.3 security
      fields to its own, so each client talks the newest version it knows.

    Args:
        card: the card.
        version: the `A2A-Version` the client sent (header or query parameter), if any.
    """
    asked = (version or "").strip()
    v1_0: dict[str, Any] = MessageToDict(card)
    if asked and not asked.startswith("0."):
        return v1_0
    v0_3: dict[str, Any] = to_compat_agent_card(card).model_dump(mode="json", by_alias=True, exclude_none=True)
    if "additionalInterfaces" in v0_3:  # v0.3 §5.5: it should list the main url and transport too
        main = {"url": v0_3["url"], "transport": v0_3["preferredTransport"]}
        v0_3["additionalInterfaces"] = [main, *(i for i in v0_3["additionalInterfaces"] if i != main)]
    if asked:
        return v0_3
    return {**v0_3, "supportedInterfaces": v1_0["supportedInterfaces"]}
