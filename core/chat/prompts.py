"""The words the model reads that several modules must agree on. A leaf: it imports nothing from `core`.

- Tool function names: `agent_invoke` (the delegation tool, `core.delegation.tool`), `ask_user`
  (a delegated agent asks its caller back, `core.delegation.questions`) and the
  prefix of the broker agents' tools, `a2a_<id>` (seed 003's discovery, `core.broker.wire`).
- How a background task's inject, saved as a system message of the session, reads to the model:
  `INJECT_LABELS` by inject mode (`delay`: progress, `auto`: the result).

The chat engine writes the labels (`core.chat.engine.build_model_messages`) and the demo model
recognises the names and the labels (`core.chat.demo_model`), so both take them from here rather
than keeping copies.
"""

from __future__ import annotations

__all__ = ["AGENT_INVOKE_TOOL", "ASK_USER_TOOL", "DISPATCH_TOOL_PREFIX", "INJECT_LABELS"]

AGENT_INVOKE_TOOL = "agent_invoke"
ASK_USER_TOOL = "ask_user"
DISPATCH_TOOL_PREFIX = "a2a_"

# How a background task's inject (a system message of the session) reads to the model. The demo
# model announces a trailing "Background task result" (core/chat/demo_model.py, rule 1).
INJECT_LABELS = {
    "delay": "Background task progress (kept for later; no reply needed)",
    "auto": "Background task result (tell the user now)",
}
