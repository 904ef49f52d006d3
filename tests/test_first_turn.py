"""The first demo turn after a start does not wait for LiteLLM's import (core/chat/llm.py, issue 34).

LiteLLM takes 3-5 s to import; it is imported in a worker thread after start-up. The demo model
needs none of it: while the import runs, `LLMGateway.stream` reads the demo model's chunks directly
(`core/chat/demo_provider.py`), and these give the same events as the path through LiteLLM.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from core.chat import llm
from core.chat.llm import LLMError, LLMGateway, ModelResult, TextDelta, litellm_module
from tests.utils.app_process import ROOT

INVOKE = [{"type": "function", "function": {"name": "agent_invoke", "parameters": {}}}]
BROKER = [{"type": "function", "function": {"name": "a2a_planner", "parameters": {}}}]


def test_the_first_demo_turn_streams_while_litellm_is_still_being_imported() -> None:
    # A process of its own: here LiteLLM is imported already. As in the app: the warm-up's import
    # starts in a thread, and a turn starts at once.
    script = textwrap.dedent("""
        import asyncio, time
        from core.chat import llm

        async def main():
            llm.warm_up()
            started = time.perf_counter()
            async for event in llm.LLMGateway(demo_delay_s=0.005).stream(
                    "local/demo", [{"role": "user", "content": "hello"}]):
                if isinstance(event, llm.TextDelta):
                    print("first token after", round(time.perf_counter() - started, 3), "s;",
                          "litellm loaded" if llm._litellm is not None else "litellm still loading")
                    return

        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "litellm still loading" in done.stdout, done.stdout


def events_of(items: list) -> list:
    """Comparable events: the text deltas, then the result's fields."""
    return [
        (
            type(e).__name__,
            e.text
            if isinstance(e, TextDelta)
            else (e.text, [(c.id, c.name, c.arguments) for c in e.tool_calls], e.usage, e.finish_reason, e.model),
        )
        for e in items
    ]


@pytest.mark.parametrize(
    ("text", "tools"),
    [
        ("hello there", None),
        ("please write some code", None),
        ("/lorem 40", None),
        ("@coding-assistant write a parser @planner plan it", INVOKE),
        ("/parallel 3 @coding-assistant write tests", INVOKE),
        ("/background @planner plan the release", BROKER),
        ("你好，世界", None),
    ],
)
async def test_the_demo_model_says_the_same_with_and_without_litellm(text: str, tools: list | None) -> None:
    litellm_module()
    messages = [{"role": "system", "content": "You write Python code."}, {"role": "user", "content": text}]
    through_litellm = [e async for e in LLMGateway(demo_delay_s=0).stream("local/demo", messages, tools=tools)]
    direct = [e async for e in llm._demo_without_litellm("local/demo", messages, tools, 0)]
    assert events_of(direct) == events_of(through_litellm)
    assert isinstance(direct[-1], ModelResult) and direct[-1].usage.output_tokens > 0


async def test_a_demo_failure_reads_the_same_with_and_without_litellm() -> None:
    litellm_module()
    messages = [{"role": "user", "content": "/fail 3"}]
    errors, texts = [], []
    for stream in (
        LLMGateway(demo_delay_s=0).stream("local/demo", messages),
        llm._demo_without_litellm("local/demo", messages, None, 0),
    ):
        seen = []
        with pytest.raises(LLMError) as failed:
            async for event in stream:
                seen.append(event.text)
        errors.append(failed.value.message)
        texts.append(seen)
    assert errors[0] == errors[1] and texts[0] == texts[1] and len(texts[0]) == 3
