"""One run of an agent: the model/tool loop that a chat turn and a delegated task both use.

`AgentRunner.run` streams the model's reply into a hub buffer (`start`, `text-delta`),
runs the tools it asks for (`tool-input-available`, `tool-output-available`; a step's
parallel calls start in the model's order, `CallTurnstile`), feeds the results back, and
ends when the model answers without tools, after `max_steps` model calls, on a timeout or
a failure (an `error` event). It never saves anything: `AgentRun` records the run (its
messages, its steps as assistant rows, its usage) and its `TurnOutcome`, and the caller
saves them (`ChatEngine` for a session's turn, `DelegationService` for a task).

`build_model_messages` turns a session's saved messages into the chat-completion messages a
run starts from (background-task notes get their labels from `core.chat.prompts`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from core import logcontext, metrics, tracing
from core.chat import attachments
from core.chat.llm import LLMError, LLMGateway, ModelResult, TextDelta, ToolCall
from core.chat.prompts import INJECT_LABELS
from core.chat.tools import BoundTool, CallTurnstile, ToolContext, ToolResult
from core.i18n import _
from core.secret_box import SecretUnreadableError
from core.streaming import events as ev
from core.streaming.backend import StreamHubBackend
from models import Agent, AgentMessage

log = logging.getLogger(__name__)


@dataclass(slots=True)
class TurnOutcome:
    """How a run of an agent ended, and the assistant messages to save."""

    text: str
    status: str  # 'complete' | 'canceled' | 'error'
    error: str | None
    finish_reason: str
    input_tokens: int = 0
    output_tokens: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    cost_usd: float | None = None  # None: no model call of the run had a price


class AgentRunner:
    """Runs the model/tool loop of an `AgentRun`, streaming into a hub buffer.

    Args:
        hub: where the run's events go.
        llm: the model gateway.
        max_steps: model calls per run (bounds the tool loop).
        turn_timeout_s: longest a run may take before it is failed.
        open_secret: reads an agent's stored (sealed) API key back (`LazySecretBox.open`).
        prepare_messages: fills in what the messages only name (attached files, `core.chat.attachments`)
            before the first model call.
    """

    def __init__(
        self,
        hub: StreamHubBackend,
        llm: LLMGateway,
        *,
        max_steps: int = 8,
        turn_timeout_s: float = 600.0,
        open_secret: Callable[[str], str] | None = None,
        prepare_messages: Callable[[Agent, list[dict[str, Any]]], Awaitable[None]] | None = None,
    ) -> None:
        self.prepare_messages = prepare_messages
        self.hub = hub
        self.llm = llm
        self.max_steps = max_steps
        self.turn_timeout_s = turn_timeout_s
        self.open_secret = open_secret

    def model_options(self, agent: Agent, max_output_tokens: int | None = None) -> dict[str, Any]:
        """How the agent's model is called: its own base URL, key, temperature and answer length.

        The agent row is the one read when the run started, so an edit applies to the next run.

        Raises:
            LLMError: its stored key cannot be read (the secret key changed).
        """
        api_key = None
        if agent.api_key:
            try:
                api_key = self.open_secret(agent.api_key) if self.open_secret is not None else agent.api_key
            except SecretUnreadableError as exc:
                raise LLMError(f"The API key of {agent.name} cannot be read ({exc}); set it again on /agents.") from exc
        limits = [n for n in (agent.max_output_tokens, max_output_tokens) if n]
        return {
            "api_base": agent.api_base or None,
            "api_key": api_key,
            "temperature": agent.temperature,
            "max_tokens": min(limits) if limits else None,
        }

    async def run(
        self,
        *,
        stream_key: str,
        run: AgentRun,
        tools: dict[str, BoundTool],
        ctx: ToolContext,
        max_output_tokens: int | None = None,
    ) -> TurnOutcome:
        """Run the model/tool loop of `run`, streaming into `stream_key`.

        Model failures, timeouts and tool errors end the run with an `error` event; they
        do not raise. `run.outcome` is set however the run ends, cancellation included
        (the CancelledError is re-raised after it is recorded), so the caller can save it.
        """
        await self._emit(stream_key, ev.Start(f"msg_{secrets.token_hex(8)}"))
        kind = "delegated" if ctx.task_id else "chat"
        metrics.TURNS_STARTED.labels(kind).inc()
        attributes = {"session.id": ctx.session_id, "a2a.task.id": ctx.task_id, "agent.id": run.agent.slug}
        try:
            async with asyncio.timeout(self.turn_timeout_s):
                with (
                    logcontext.bound(session_id=ctx.session_id, task_id=ctx.task_id),  # the run's log lines
                    tracing.span(f"{kind}.turn", attributes=attributes),  # the model and tool calls' parent
                ):
                    if self.prepare_messages is not None:
                        await self.prepare_messages(run.agent, run.messages)
                    await self._loop(stream_key, run, tools, ctx, max_output_tokens)
        except asyncio.CancelledError:
            run.close_step(status="canceled")
            run.finish("canceled", status="canceled")
            raise
        except TimeoutError:
            await self._fail(
                stream_key,
                run,
                _("The answer took longer than {seconds} s and was stopped.").format(
                    seconds=f"{self.turn_timeout_s:g}"
                ),
            )
        except LLMError as exc:
            await self._fail(stream_key, run, exc.message)
        except Exception:
            log.exception("the run of %s on %s failed", run.agent.slug, stream_key)
            await self._fail(stream_key, run, _("Something went wrong on the server while answering; try again."))
        finally:
            _count_end(kind, run)
        assert run.outcome is not None  # every way out of the loop above finishes the run
        return run.outcome

    async def _fail(self, stream_key: str, run: AgentRun, message: str) -> None:
        run.close_step(status="error", error=message)
        run.finish("error", status="error", error=message)
        await self._emit(stream_key, ev.Error(message))

    async def _loop(
        self, stream_key: str, run: AgentRun, tools: dict[str, BoundTool], ctx: ToolContext, max_tokens: int | None
    ) -> None:
        definitions = [t.definition() for t in tools.values()] or None
        options = self.model_options(run.agent, max_tokens)
        started, first = time.monotonic(), True
        for step in range(self.max_steps):
            run.open_step()
            text_id = f"text-{step}"
            result: ModelResult | None = None
            last: float | None = None
            async for event in self.llm.stream(run.agent.model, run.messages, tools=definitions, **options):
                if isinstance(event, TextDelta):
                    now = time.monotonic()
                    if first:
                        metrics.TIME_TO_FIRST_TOKEN.labels("delegated" if ctx.task_id else "chat").observe(
                            now - started
                        )
                        first = False
                    elif last is not None:
                        metrics.INTER_TOKEN_DELAY.observe(now - last)
                    last = now
                    run.step_text.append(event.text)
                    if run.on_text is not None:
                        run.on_text()
                    await self._emit(stream_key, ev.TextDelta(text_id, event.text))
                else:
                    result = event
            assert result is not None  # the gateway always ends with a ModelResult
            run.add_usage(result)
            if not result.tool_calls:
                run.close_step(text=result.text or "".join(run.step_text))
                run.finish(result.finish_reason or "stop")
                return
            run.step_calls = result.tool_calls
            run.messages.append(_assistant_message(result.text or "".join(run.step_text), result.tool_calls))
            for call in result.tool_calls:
                await self._emit(stream_key, ev.ToolInput(call.id, call.name, _input_for_display(call)))
            gates = CallTurnstile.chain(len(result.tool_calls))
            outputs = await asyncio.gather(
                *(
                    self._call_tool(stream_key, call, tools, ctx, gate)
                    for call, gate in zip(result.tool_calls, gates, strict=True)
                )
            )
            run.step_results = [
                {"toolCallId": call.id, "toolName": call.name, **output}
                for call, output in zip(result.tool_calls, outputs, strict=True)
            ]
            for call, output in zip(result.tool_calls, outputs, strict=True):
                run.messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.id,
                        "name": call.name,
                        "content": json.dumps(output["output"], ensure_ascii=False),
                    }
                )
            run.close_step(text=result.text or "".join(run.step_text))
        await self._fail(stream_key, run, f"Stopped after {self.max_steps} model calls without a final answer.")

    async def _call_tool(
        self,
        stream_key: str,
        call: ToolCall,
        tools: dict[str, BoundTool],
        ctx: ToolContext,
        gate: CallTurnstile | None = None,
    ) -> dict[str, Any]:
        try:
            return await self._run_tool(stream_key, call, tools, ctx, gate)
        finally:
            if gate is not None:
                gate.release()

    async def _run_tool(
        self,
        stream_key: str,
        call: ToolCall,
        tools: dict[str, BoundTool],
        ctx: ToolContext,
        gate: CallTurnstile | None,
    ) -> dict[str, Any]:
        started = time.monotonic()
        bound = tools.get(call.name)
        if bound is None:
            result = ToolResult(
                False, error=f"There is no tool named {call.name!r}; available: {sorted(tools) or 'none'}."
            )
        else:
            try:
                arguments = call.parsed_arguments()
            except ValueError as exc:
                result = ToolResult(False, error=f"Invalid arguments for {call.name}: {exc}.")
            else:
                call_ctx = ToolContext(
                    user_id=ctx.user_id,
                    agent_id=ctx.agent_id,
                    agent_slug=ctx.agent_slug,
                    session_id=ctx.session_id,
                    recursion_depth=ctx.recursion_depth,
                    tool_call_id=call.id,
                    task_id=ctx.task_id,
                    chain=ctx.chain,
                    emit=lambda event: self._emit(stream_key, event),
                    turnstile=gate,
                )
                try:
                    with tracing.span("tool.call", attributes={"tool.name": call.name, "tool.call.id": call.id}):
                        result = await bound.tool.execute(arguments, bound.config, call_ctx)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("tool %s failed", call.name)
                    result = ToolResult(False, error=f"The tool {call.name} failed unexpectedly.")
        result.metadata.setdefault("durationMs", int((time.monotonic() - started) * 1000))
        output = result.for_model()
        await self._emit(stream_key, ev.ToolOutput(call.id, output, result.metadata, not result.success))
        return {"output": output, "metadata": result.metadata, "isError": not result.success}

    async def _emit(self, key: str, event: ev.Event) -> None:
        # `ev.publish`, inlined: this carries every token.
        await self.hub.append(key, event.kind, event.payload())


@dataclass(slots=True)
class AgentRun:
    """The record of one agent run: its messages so far, and its steps as assistant rows.

    Attributes:
        agent: who answers.
        messages: the chat-completion messages (grows with tool calls and results).
        fields: extra columns for every saved row (`source`, `a2a_task_id`, ...).
        outcome: set when the run ends, however it ends.
        on_text: called after each streamed chunk (a chat turn's `DraftSaver.touch`); must not block.
    """

    agent: Agent
    messages: list[dict[str, Any]]
    fields: dict[str, Any]
    step_text: list[str] = field(default_factory=list)
    step_calls: list[ToolCall] = field(default_factory=list)
    step_results: list[dict[str, Any]] | None = None
    step_open: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    step_input_tokens: int = 0
    step_output_tokens: int = 0
    cost_usd: float | None = None
    step_cost_usd: float | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    outcome: TurnOutcome | None = None
    on_text: Callable[[], None] | None = None

    def text_so_far(self) -> str:
        """What the agent has said in this run: the closed steps, then the open one."""
        parts = [r["content"] for r in self.rows if r["content"]]
        if self.step_open:
            parts.extend(self.step_text)
        return "".join(parts)

    def open_step(self) -> None:
        """A model call begins: its text, calls, results and usage start empty."""
        self.step_text, self.step_calls, self.step_results = [], [], None
        self.step_input_tokens = self.step_output_tokens = 0
        self.step_cost_usd = None
        self.step_open = True

    def add_usage(self, result: ModelResult) -> None:
        """Count the tokens of the step's model call, for the step and for the run."""
        self.step_input_tokens, self.step_output_tokens = result.usage.input_tokens, result.usage.output_tokens
        self.input_tokens += result.usage.input_tokens
        self.output_tokens += result.usage.output_tokens
        self.step_cost_usd = result.usage.cost_usd
        if result.usage.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + result.usage.cost_usd

    def close_step(self, *, text: str | None = None, status: str = "complete", error: str | None = None) -> None:
        """End the open step as an assistant row (calls stopped mid-way get an error result each)."""
        if not self.step_open:
            return
        self.step_open = False
        content = text if text is not None else "".join(self.step_text)
        calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.step_calls] or None
        results = self.step_results
        if calls and results is None:  # stopped while the tools ran
            results = [
                {
                    "toolCallId": c["id"],
                    "toolName": c["name"],
                    "isError": True,
                    "output": {"ok": False, "error": f"the call was {status}"},
                    "metadata": {},
                }
                for c in calls
            ]
        if not content and not calls and status == "complete":
            return
        self.rows.append(
            {
                "role": "assistant",
                "content": content,
                "model_id": self.agent.model,
                "input_tokens": self.step_input_tokens or None,
                "output_tokens": self.step_output_tokens or None,
                "cost_usd": self.step_cost_usd,
                "tool_calls": calls,
                "tool_results": results,
                "status": status,
                "error": error,
                **self.fields,
            }
        )

    def finish(self, finish_reason: str, *, status: str = "complete", error: str | None = None) -> None:
        """Set `outcome` from the closed steps."""
        text = "".join(r["content"] for r in self.rows if r["content"])
        self.outcome = TurnOutcome(
            text=text,
            status=status,
            error=error,
            finish_reason=finish_reason,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            rows=self.rows,
            cost_usd=self.cost_usd,
        )


def build_model_messages(agent: Agent, history: list[AgentMessage]) -> list[dict[str, Any]]:
    """The chat-completion messages for `agent` from a session's saved messages."""
    messages: list[dict[str, Any]] = []
    if agent.system_prompt:
        messages.append({"role": "system", "content": agent.system_prompt})
    for row in history:
        if row.role == "user":
            messages.append({"role": "user", "content": attachments.model_parts(row.content, row.attachments or [])})
        elif row.role == "assistant":
            calls = row.tool_calls or []
            if calls:
                messages.append(
                    _assistant_message(
                        row.content, [ToolCall(c["id"], c["name"], c.get("arguments") or "{}") for c in calls]
                    )
                )
                for result in row.tool_results or []:
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": result["toolCallId"],
                            "name": result.get("toolName", ""),
                            "content": json.dumps(result.get("output"), ensure_ascii=False),
                        }
                    )
            elif row.content:
                messages.append({"role": "assistant", "content": row.content})
        elif row.role == "system" and row.content:
            label = INJECT_LABELS.get(row.inject_mode or "")
            messages.append({"role": "system", "content": f"{label}: {row.content}" if label else row.content})
    return messages


def _assistant_message(text: str, calls: list[ToolCall]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text or None,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments or "{}"}}
            for c in calls
        ],
    }


def _input_for_display(call: ToolCall) -> Any:
    try:
        return call.parsed_arguments()
    except ValueError:
        return call.arguments


def _count_end(kind: str, run: AgentRun) -> None:
    """The run's end and its tokens, in the metrics (`core.metrics`)."""
    outcome = run.outcome.status if run.outcome is not None else "error"
    metrics.TURNS_FINISHED.labels(kind, outcome).inc()
    if run.input_tokens:
        metrics.TOKENS.labels("in", run.agent.slug, run.agent.model).inc(run.input_tokens)
    if run.output_tokens:
        metrics.TOKENS.labels("out", run.agent.slug, run.agent.model).inc(run.output_tokens)
