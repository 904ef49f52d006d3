"""The global model connection, set by an admin in the browser (issue 39): default model, base URL, key.

The environment's `DEFAULT_MODEL`, `LLM_API_BASE` and `LLM_API_KEY` stay the defaults; what an admin saves
(one row of `model_connection`) replaces each one it sets, at once in this process and at the start of
every process; in a cluster the other replicas are told (`follow`: a registry notice, `core/db_events.py`)
and read the row again. The key is write-only: sealed at rest (`core/secret_box.py`), never shown or sent back,
and it goes only where `LLM_API_KEY` goes (`core.chat.model_route`: the operator's base URL, or
`openai/...` models at OpenAI). The base URL is held to the operator's rule: any address but a cloud
metadata one (`core.web.outbound_policy.OPERATOR_CONFIGURED`), since only an admin sets it.

"Test" sends one short prompt through the fields as they would be saved, without saving them, on a gateway
of its own, so which key goes where is the same rule as for a saved connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from core.chat.llm import LLMError, LLMGateway, model_problem
from core.db import Database
from core.db_events import RegistryEvents
from core.delegation.agent_admin import AgentAdmin
from core.errors import AppError
from core.i18n import _
from core.secret_box import LazySecretBox
from core.settings import Settings
from models import ModelConnection, utcnow

__all__ = ["ConnectionRuleError", "ModelConnectionAdmin", "TestOutcome"]

ROW_ID = 1
MODEL_CONNECTION = "model-connection"  # the kind of registry notice a save sends (core/db_events.py)
TEST_PROMPT = "Reply with one short sentence: the connection works."
TEST_TIMEOUT_S = 30.0


class ConnectionRuleError(AppError, ValueError):
    """A model or base URL the global connection cannot take; `field` names the form field (API name)."""

    code = "connection_rule"

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


@dataclass(frozen=True, slots=True)
class TestOutcome:
    """One prompt through a connection: the model's reply, or the provider's error in plain words."""

    ok: bool
    text: str


class ModelConnectionAdmin:
    """Reads, saves, applies and tests the global model connection.

    Args:
        db: where the row is kept.
        settings: the environment's values (the defaults).
        llm: the gateway every model call goes through; a saved connection is applied to it.
        agent_admin: its `default_model` is what a new agent gets.
        secrets: seals and opens the key.
    """

    def __init__(
        self, db: Database, settings: Settings, llm: LLMGateway, agent_admin: AgentAdmin, secrets: LazySecretBox
    ) -> None:
        self.db = db
        self.settings = settings
        self.llm = llm
        self.agent_admin = agent_admin
        self.secrets = secrets
        self._notify: Callable[[str, str, str], Awaitable[None]] | None = None

    def follow(self, events: RegistryEvents) -> None:
        """In a cluster: tell the other replicas of each save, and apply theirs (and read again after a missed one)."""
        self._notify = events.notify
        events.on(MODEL_CONNECTION, self._saved_elsewhere)
        events.on_reconnect(self.load)

    async def _saved_elsewhere(self, _row_id: str, _op: str) -> None:
        await self.load()

    async def load(self) -> None:
        """Apply the saved connection (at start, and when another replica saved one)."""
        async with self.db.read() as s:
            row = await s.get(ModelConnection, ROW_ID)
        self._apply(row)

    def _apply(self, row: ModelConnection | None) -> None:
        saved_key = self.secrets.open(row.api_key) if row is not None and row.api_key else None
        self.llm.api_base = (row.api_base if row else None) or self.settings.llm_api_base
        self.llm.api_key = saved_key or self.settings.llm_api_key
        self.agent_admin.default_model = (row.default_model if row else None) or self.settings.default_model

    async def view(self) -> dict[str, Any]:
        """What the admin area shows: the values in force, where each comes from, whether a key is set (never it)."""
        async with self.db.read() as s:
            row = await s.get(ModelConnection, ROW_ID)
        saved_model = row.default_model if row else None
        saved_base = row.api_base if row else None
        saved_key = bool(row and row.api_key)
        return {
            "defaultModel": saved_model or self.settings.default_model,
            "defaultModelFrom": "admin" if saved_model else "environment",
            "apiBase": saved_base or self.settings.llm_api_base,
            "apiBaseFrom": "admin" if saved_base else ("environment" if self.settings.llm_api_base else None),
            "hasApiKey": saved_key or bool(self.settings.llm_api_key),
            "apiKeyFrom": "admin" if saved_key else ("environment" if self.settings.llm_api_key else None),
            "updatedAt": row.updated_at.isoformat() if row else None,
        }

    async def _check(self, model: str | None, api_base: str | None) -> None:
        if model is not None:
            problem = await model_problem(model, api_base=api_base or self.llm.api_base)
            if problem is not None:
                raise ConnectionRuleError(problem[0].upper() + problem[1:] + ".", field="defaultModel")
        if api_base is not None:
            if not api_base.startswith(("http://", "https://")):
                raise ConnectionRuleError(_("A base URL starts with http:// or https://."), field="apiBase")
            problem = await self.llm.endpoint_problem(api_base, operator=True)
            if problem is not None:
                raise ConnectionRuleError(
                    _("The base URL {url} is not allowed: {problem}.").format(url=api_base, problem=problem),
                    field="apiBase",
                )

    async def save(self, fields: dict[str, Any], *, user_id: int) -> dict[str, Any]:
        """Save the fields given and apply them; fields not given stay.

        `defaultModel`, `apiBase`: a value, or "" for the environment's; `apiKey`: a new key, or "" to remove
        the saved one (a new base URL without a key removes the saved key: it stays with its address).

        Raises:
            ConnectionRuleError: the model is not one LiteLLM can call, or the base URL is not allowed.
        """
        model = _given(fields, "defaultModel")
        api_base = _given(fields, "apiBase")
        await self._check(model or None, api_base or None)
        async with self.db.session() as s:
            row = await s.get(ModelConnection, ROW_ID) or ModelConnection(id=ROW_ID)
            if model is not None:
                row.default_model = model or None
            if api_base is not None:
                if (api_base or None) != row.api_base and "apiKey" not in fields:
                    row.api_key = None  # a saved key stays with the base URL it was saved for
                row.api_base = api_base or None
            if "apiKey" in fields:
                key = (fields["apiKey"] or "").strip()
                row.api_key = self.secrets.seal(key) if key else None
            row.updated_at = utcnow()
            row.updated_by = user_id
            s.add(row)
            await s.commit()
            await s.refresh(row)
        self._apply(row)
        if self._notify is not None:
            await self._notify(MODEL_CONNECTION, str(ROW_ID), "saved")
        return await self.view()

    async def test(self, fields: dict[str, Any]) -> TestOutcome:
        """Send one short prompt through the connection the fields describe, unsaved.

        The key in force goes along unless `apiKey` is given, and only while the base URL is the one in force.
        """
        model = _given(fields, "defaultModel") or self.agent_admin.default_model
        given_base = _given(fields, "apiBase")
        api_base = self.llm.api_base if given_base is None else (given_base or self.settings.llm_api_base)
        try:
            await self._check(model, given_base or None)
        except ConnectionRuleError as exc:
            return TestOutcome(False, exc.message)
        if "apiKey" in fields:
            api_key = (fields["apiKey"] or "").strip() or self.settings.llm_api_key
        elif api_base == self.llm.api_base:
            api_key = self.llm.api_key
        else:  # the key in force was given for another address: it does not follow the form elsewhere
            api_key = None
        trial = LLMGateway(
            demo_delay_s=self.llm.demo_delay_s,
            api_base=api_base,
            api_key=api_key,
            timeout_s=self.llm.timeout_s,
            allow=self.llm.allow,
        )
        text: list[str] = []
        try:
            async with asyncio.timeout(TEST_TIMEOUT_S):
                async for event in trial.stream(model, [{"role": "user", "content": TEST_PROMPT}], max_tokens=60):
                    if hasattr(event, "tool_calls"):
                        text = [event.text or "".join(text)]
                    else:
                        text.append(event.text)
        except LLMError as exc:
            return TestOutcome(False, exc.message)
        except TimeoutError:
            return TestOutcome(
                False, _("The model {model!r} did not answer within {s} s.").format(model=model, s=int(TEST_TIMEOUT_S))
            )
        reply = "".join(text).strip()
        return TestOutcome(True, reply or _("(the model answered with no text)"))


def _given(fields: dict[str, Any], name: str) -> str | None:
    """A field's stripped text; None when the form does not give it."""
    if name not in fields or fields[name] is None:
        return None
    return str(fields[name]).strip()
