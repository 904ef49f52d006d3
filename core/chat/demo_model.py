"""The offline demo model: deterministic replies, token by token, with tool calls.

This module decides *what* the demo model says; `core/chat/demo_provider.py` streams it
with a configurable delay and `core/chat/llm.py` registers it with LiteLLM as the `local/`
provider, so a demo turn goes through exactly the same LiteLLM path as a real provider
(except the turns that start while LiteLLM is still being imported after a start).

Behaviour (documented in the README, relied on by the tests):

1. The last message is a tool result: the model answers from the results of
   that step, quoting each callee's output (or its error); a background
   dispatch's result is answered with "working on it in the background".
   The conversation ends with background task results (system messages that
   start with the `auto` label of `core.chat.prompts.INJECT_LABELS`): the
   model announces each of them.
2. The last user message contains `@<agent-id> <text>` and the request offers
   the `agent_invoke` tool: it says which agents it delegates to, then calls
   `agent_invoke` with `{"agentSlug": "<agent-id>", "input": "<text>"}` once
   per mention, all in one step. The text of a mention runs to the next mention.
   `@@<agent-id>` is not a mention here: it is passed on as `@<agent-id>` in the
   text, so the callee delegates in turn (`@planner ask @@coding-assistant for code`
   gives a nested delegation).
   A message that starts with `/background` calls the broker tools instead:
   `a2a_<agent-id>` with `{"task": "<text>"}` for each mention whose tool is
   offered (so do mentions when `agent_invoke` is not offered but the tool is).
3. `/lorem N`: N words of lorem ipsum (N up to 100,000), for long streams.
4. `/error`: a few tokens, then a failure (to try error handling end to end).
   `/history`: what came before in the conversation, one line per message
   ("- you: …", "- me: …"), to see what an agent was given (A2A contexts).
5. Otherwise: an echo of the message with a short guide. When the system prompt
   mentions code, the reply carries a fenced Python block.

Commands that put the side panel in each of its states on demand (for people who
test it; docs/TESTING.md has the table). They work in a chat and, sent on with a
mention, in the callee (`@coding-assistant /hang`):

- `/slow N MS`: N lorem words, MS milliseconds apart (MS up to 10,000), whatever
  the server's `DEMO_MODEL_DELAY_MS`.
- `/fail N`: N words, then a failure (`/error` is `/fail 4`).
- `/hang`: one line, then nothing until the turn is stopped (Stop, Esc, a cancel,
  the caller's timeout or `TURN_TIMEOUT_S`).
- `/timeout MS @agent text`: delegate with a timeout of MS milliseconds for this call
  (never longer than the agent's configured `timeoutMs`); `@agent /hang` makes it expire.
- `/parallel N @agent text`: N delegations to one agent in one step (N up to 10),
  inputs `text (1/N)` … `text (N/N)`.
- `/ask QUESTION`: the agent asks QUESTION back through the `ask_user` tool (offered to a
  delegated agent: its task goes `input-required` until the caller answers), then says
  `You answered: ANSWER`. Where the tool is not offered, it asks in its reply.

Files and data (issue 36; `core/chat/artifacts.py` says how an answer carries them):

- `/file NAME`: a small file artifact named NAME: an 8×8 PNG for `*.png`, else a line of text
  (its type from the name, text/plain when the name says none).
- `/data`: a data artifact, `{"days": 3, "ok": true, "ratio": 0.5}`.
- A message with files attached starts the answer with one line per file,
  "Received file: NAME (MIME, N bytes)", then answers the message's text as above.

Token usage counts words: prompt tokens over all messages, completion tokens
as emitted.

Language: the model answers in the language of the user's last message. A message
with Chinese characters (CJK ideographs) gets the Chinese versions of its fixed
phrases (core/i18n's zh_CN catalog); any other gets English. Commands, agent ids,
lorem words and quoted text stay as they are.
"""

from __future__ import annotations

import json
import mimetypes
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from core.chat import artifacts
from core.chat.prompts import AGENT_INVOKE_TOOL, ASK_USER_TOOL, DISPATCH_TOOL_PREFIX, INJECT_LABELS
from core.errors import AppError
from core.i18n import N_, _, ngettext, use_language

BACKGROUND_COMMAND = "/background"
BACKGROUND_RESULT = INJECT_LABELS["auto"]  # how the engine labels a result (an `auto` inject) for the model
_INJECT_TEXT = re.compile(r"^[^:]*:\s*\[([^\]]+)\]\s*(.*)$", re.DOTALL)
LOREM_MAX_WORDS = 100_000
SLOW_MAX_DELAY_MS = 10_000
PARALLEL_MAX = 10
HANG_LINE = N_("Working on it; this reply will not go on until it is stopped.")
# Han ideographs (CJK Unified, Extension A, Compatibility): a message with one of them is answered in Chinese.
_CHINESE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_SLOW = re.compile(r"/slow\s+(\d+)\s+(\d+)")
_FAIL = re.compile(r"/fail\s+(\d+)")
_TIMEOUT = re.compile(r"/timeout\s+(\d+)\s+(.*)", re.DOTALL)
_PARALLEL = re.compile(r"/parallel\s+(\d+)\s+(.*)", re.DOTALL)
_ASK = re.compile(r"/ask\s+(.*\S)", re.DOTALL)
HISTORY_COMMAND = "/history"
DATA_COMMAND = "/data"
DEMO_DATA = {"days": 3, "ok": True, "ratio": 0.5}
_FILE = re.compile(r"/file\s+([^\s/\\]{1,100})")
_MENTION = re.compile(r"(?<![\w@])@([a-z0-9][a-z0-9_-]{0,63})\b")
_TOKEN = re.compile(r"\s*\S+|\s+")
_LOREM = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et "
    "dolore magna aliqua ut enim ad minim veniam quis nostrud exercitation ullamco laboris nisi ut aliquip"
).split()


class DemoModelError(AppError, RuntimeError):
    """The failure that `/error` asks for."""

    code = "demo_model_error"


@dataclass(frozen=True, slots=True)
class DemoToolCall:
    """One tool call the demo model makes."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class DemoReply:
    """What the demo model will stream: text tokens, then tool calls, maybe a failure."""

    tokens: list[str]
    tool_calls: list[DemoToolCall] = field(default_factory=list)
    fail_after_tokens: int | None = None
    prompt_tokens: int = 0
    delay_s: float | None = None  # between tokens; None: the gateway's DEMO_MODEL_DELAY_MS
    hang: bool = False  # after the tokens, wait until canceled

    @property
    def finish_reason(self) -> str:
        """`tool_calls` when the reply calls tools, else `stop`."""
        return "tool_calls" if self.tool_calls else "stop"


def tokenize(text: str) -> list[str]:
    """Split text into word-sized tokens that join back to exactly `text`."""
    return _TOKEN.findall(text)


def find_mentions(text: str) -> list[tuple[str, str]]:
    """`@agent-id text` pairs in order; each text runs up to the next mention (`@@` becomes `@` in it)."""
    matches = list(_MENTION.finditer(text))
    mentions: list[tuple[str, str]] = []
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip().replace("@@", "@")
        mentions.append((match.group(1), body))
    return mentions


def plan_reply(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> DemoReply:
    """Decide the whole reply for a chat-completion request (see the module docstring)."""
    prompt_tokens = sum(len(_content_text(m).split()) for m in messages)
    with use_language(reply_language(messages)):
        reply = _plan(messages, _tool_names(tools))
    reply.prompt_tokens = prompt_tokens
    return reply


def reply_language(messages: list[dict[str, Any]]) -> str:
    """The language of the user's last message: `zh_CN` when it has Chinese characters, else `en`."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return "zh_CN" if _CHINESE.search(_content_text(message)) else "en"
    return "en"


def _plan(messages: list[dict[str, Any]], tool_names: set[str]) -> DemoReply:
    if not messages:
        return DemoReply(tokenize(_("(The demo model received no messages.)")))
    last = messages[-1]
    if last.get("role") == "tool":
        return DemoReply(tokenize(_answer_from_tool_results(messages)))
    results = _trailing_background_results(messages)
    if results:
        return DemoReply(tokenize("\n\n".join(_announce(r) for r in results)))
    received = _received_files(last)
    text = _first_text(last).strip()
    if received:
        reply = _plan([*messages[:-1], {"role": "user", "content": text}], tool_names)
        lines = "\n".join(_("Received file: {file}").format(file=f) for f in received)
        return DemoReply([*tokenize(lines + "\n\n"), *reply.tokens], reply.tool_calls, reply.fail_after_tokens)
    system = " ".join(_content_text(m) for m in messages if m.get("role") == "system")

    background = text.startswith(BACKGROUND_COMMAND)
    if background:
        text = text[len(BACKGROUND_COMMAND) :].strip()
    timeout_ms: int | None = None
    timeout = _TIMEOUT.fullmatch(text)
    if timeout:
        timeout_ms, text = max(1, int(timeout.group(1))), timeout.group(2).strip()
    parallel = _PARALLEL.fullmatch(text)
    if parallel and AGENT_INVOKE_TOOL in tool_names:
        count = min(max(1, int(parallel.group(1))), PARALLEL_MAX)
        mentions = [(slug, body) for slug, body in find_mentions(parallel.group(2)) if body][:1]
        if mentions:
            slug, body = mentions[0]
            return _delegate([(slug, f"{body} ({i}/{count})") for i in range(1, count + 1)], timeout_ms)
    mentions = [(slug, body) for slug, body in find_mentions(text) if body]
    dispatches = [(slug, body) for slug, body in mentions if f"{DISPATCH_TOOL_PREFIX}{slug}" in tool_names]
    if dispatches and (background or AGENT_INVOKE_TOOL not in tool_names):
        calls = [
            DemoToolCall(
                id=f"call_{i}_{slug}"[:40],
                name=f"{DISPATCH_TOOL_PREFIX}{slug}",
                arguments=json.dumps({"task": body}, ensure_ascii=False),
            )
            for i, (slug, body) in enumerate(dispatches)
        ]
        names = ", ".join(f"@{slug}" for slug, _ in dispatches)
        return DemoReply(
            tokenize(_("Sending this to {names} in the background.").format(names=names) + "\n\n"), tool_calls=calls
        )
    if mentions and AGENT_INVOKE_TOOL in tool_names:
        return _delegate(mentions, timeout_ms)

    lorem = re.fullmatch(r"/lorem\s+(\d+)", text)
    if lorem:
        count = min(int(lorem.group(1)), LOREM_MAX_WORDS)
        words = _lorem(count)
        body = " ".join(words)
        # Paragraph breaks every 60 words keep long replies readable (and renderable in pieces).
        paragraphs = [" ".join(words[i : i + 60]) for i in range(0, count, 60)] if count else []
        body = "\n\n".join(paragraphs) if paragraphs else body
        return DemoReply(tokenize(body))

    slow = _SLOW.fullmatch(text)
    if slow:
        count = min(int(slow.group(1)), LOREM_MAX_WORDS)
        delay_ms = min(int(slow.group(2)), SLOW_MAX_DELAY_MS)
        return DemoReply(tokenize(" ".join(_lorem(count))), delay_s=delay_ms / 1000)

    fail = _FAIL.fullmatch(text)
    if fail:  # one word more than it says, so that the failure comes before the reply could end
        count = min(int(fail.group(1)), LOREM_MAX_WORDS)
        return DemoReply(tokenize(" ".join(_lorem(count + 1))), fail_after_tokens=count)
    if text == "/error":
        return DemoReply(tokenize(_("This reply will fail part way through")), fail_after_tokens=4)

    ask = _ASK.fullmatch(text)
    if ask:
        question = ask.group(1).strip()
        if ASK_USER_TOOL not in tool_names:
            return DemoReply(tokenize(question))
        call = DemoToolCall("call_ask", ASK_USER_TOOL, json.dumps({"question": question}, ensure_ascii=False))
        return DemoReply([], tool_calls=[call])
    made = _FILE.fullmatch(text)
    if made:
        name = made.group(1)
        mime = "image/png" if name.lower().endswith(".png") else (mimetypes.guess_type(name)[0] or "text/plain")
        data = _tiny_png() if mime == "image/png" else f"Demo file {name}\n".encode()
        block = artifacts.file_block(name, mime, data)
        return DemoReply([*tokenize(_("Here is {name}.").format(name=name) + "\n\n"), block])
    if text == DATA_COMMAND:
        return DemoReply([*tokenize(_("Here is some data.") + "\n\n"), artifacts.data_block(DEMO_DATA, "demo")])

    if text == "/hang":
        return DemoReply(tokenize(_(HANG_LINE)), hang=True)
    if text == HISTORY_COMMAND:
        return DemoReply(tokenize(_history(messages[:-1])))

    return DemoReply(tokenize(_echo(text, wants_code="code" in system.lower())))


def _lorem(count: int) -> list[str]:
    return [_LOREM[i % len(_LOREM)] for i in range(count)]


def _delegate(mentions: list[tuple[str, str]], timeout_ms: int | None) -> DemoReply:
    """One `agent_invoke` call per mention, all in one step."""
    names = ", ".join(dict.fromkeys(f"@{slug}" for slug, _ in mentions))
    calls = []
    for i, (slug, body) in enumerate(mentions):
        arguments: dict[str, Any] = {"agentSlug": slug, "input": body}
        if timeout_ms is not None:
            arguments["timeoutMs"] = timeout_ms
        calls.append(
            DemoToolCall(
                id=f"call_{i}_{slug}"[:40], name=AGENT_INVOKE_TOOL, arguments=json.dumps(arguments, ensure_ascii=False)
            )
        )
    return DemoReply(tokenize(_("Delegating to {names}.").format(names=names) + "\n\n"), tool_calls=calls)


def _history(earlier: list[dict[str, Any]]) -> str:
    said = [(m["role"], " ".join(_content_text(m).split())) for m in earlier if m.get("role") in ("user", "assistant")]
    said = [(role, text) for role, text in said if text]
    if not said:
        return _("Nothing came before this message in our conversation.")
    you, me = _("you"), _("me")
    lines = [
        f"- {you if role == 'user' else me}: {text if len(text) <= 80 else text[:79] + '…'}" for role, text in said
    ]
    return _("Earlier in our conversation:") + "\n\n" + "\n".join(lines)


def _echo(text: str, *, wants_code: bool) -> str:
    quoted = "\n".join(f"> {line}" for line in text.splitlines()) or "> " + _("(empty)")
    words = len(text.split())
    parts = [
        ngettext("You wrote {count} word:", "You wrote {count} words:", words).format(count=words),
        f"\n\n{quoted}\n\n",
        _("This is the **offline demo model**: it answers deterministically, token by token. "),
        _("Mention an agent (`@coding-assistant write a haiku`) to delegate, or send `/lorem 300` for a long reply."),
    ]
    if wants_code:
        literal = json.dumps(text, ensure_ascii=False)
        parts.append(f"\n\n```python\ndef answer() -> str:\n    return {literal}\n```\n")
    return "".join(parts)


def _answer_from_tool_results(messages: list[dict[str, Any]]) -> str:
    # The tool messages of the latest step follow the last assistant message that made calls.
    results: list[dict[str, Any]] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        results.append(message)
    results.reverse()
    lines = []
    for result in results:
        name = result.get("name") or "tool"
        content = _content_text(result)
        try:
            payload = json.loads(content)
        except json.JSONDecodeError:
            payload = content
        lines.append(_describe_result(name, payload))
    return "\n\n".join(lines) or _("(No tool results.)")


def _trailing_background_results(messages: list[dict[str, Any]]) -> list[str]:
    """The background task results the conversation ends with (after its last user or assistant message)."""
    results: list[str] = []
    for message in reversed(messages[1:]):
        if message.get("role") != "system":
            break
        text = _content_text(message)
        if text.startswith(BACKGROUND_RESULT):
            results.append(text)
    return list(reversed(results))


def _announce(note: str) -> str:
    match = _INJECT_TEXT.match(note)
    if match is None:
        return _("A background task has ended:") + f"\n\n> {note}"
    who, text = match.group(1), match.group(2).strip()
    quoted = "\n".join(f"> {line}" for line in text.splitlines()) or "> " + _("(no text)")
    return _("Result from **{who}**:").format(who=who) + f"\n\n{quoted}"


def _describe_result(name: str, payload: Any) -> str:
    if name == ASK_USER_TOOL and isinstance(payload, dict):
        if payload.get("ok") is False:
            return _("I could not ask: {error}").format(error=payload.get("error") or _("unknown error"))
        return _("You answered: {answer}").format(answer=payload.get("output", ""))
    if isinstance(payload, dict):
        who = payload.get("agentSlug") or name
        if payload.get("ok") is False or payload.get("error"):
            return _("The call to **{who}** failed: {error}").format(
                who=who, error=payload.get("error") or _("unknown error")
            )
        if payload.get("background"):
            return _(
                "**{who}** is working on it in the background; I will tell you the result when it arrives."
            ).format(who=who)
        output = payload.get("output", payload)
        text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
        quoted = "\n".join(f"> {line}" for line in text.splitlines()) or "> " + _("(empty)")
        return _("**{who}** replied:").format(who=who) + f"\n\n{quoted}"
    return _("**{name}** returned: {payload}").format(name=name, payload=payload)


def _tool_names(tools: list[dict[str, Any]] | None) -> set[str]:
    names = set()
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name"):
            names.add(function["name"])
    return names


def _content_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _tiny_png() -> bytes:
    """An 8×8 PNG (a blue square): what `/file NAME.png` returns."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + b"\x1e\x60\xd0" * 8 for _ in range(8))
    header = struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


_ATTACHED = "Attached file: "  # core.chat.attachments names each attached file so


def _received_files(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, list):
        return []
    return [
        p["text"].removeprefix(_ATTACHED)
        for p in content
        if isinstance(p, dict) and p.get("type") == "text" and str(p.get("text", "")).startswith(_ATTACHED)
    ]


def _first_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return next((p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"), "")
    return _content_text(message)
