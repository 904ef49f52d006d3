"""Issue 14, item 3: code blocks in streamed markdown (the language label, an unclosed fence)."""

from __future__ import annotations

from nicegui import ui
from nicegui.testing import User

from ui.streaming import ChatMarkdown, StreamingMarkdown, unclosed_fence


def test_an_unclosed_fence_is_detected() -> None:
    """An odd number of fences means an open code block."""
    assert unclosed_fence("text\n```python\nprint(1)")
    assert not unclosed_fence("text\n```python\nprint(1)\n```\nafter")
    assert not unclosed_fence("no code at all")


async def test_a_streaming_open_fence_renders_as_code_with_its_language(user: User) -> None:
    """An open fence renders as code while streaming, with its language on the `<pre>`."""
    views: dict[str, object] = {}

    @ui.page("/streaming-markdown-probe")
    def probe() -> None:
        views["md"] = ChatMarkdown("Here:\n\n```python\nprint('so far')")
        views["stream"] = StreamingMarkdown("Intro\n\n```js\nlet a = 1;\n")

    await user.open("/streaming-markdown-probe")
    html = views["md"].props["innerHTML"]
    assert '<pre data-lang="python">' in html and "print" in html and "```" not in html
    assert views["md"].content.endswith("print('so far')")  # the text itself is unchanged
    stream: StreamingMarkdown = views["stream"]
    tail_html = stream._tail.props["innerHTML"]
    assert '<pre data-lang="js">' in tail_html and "```" not in tail_html
    stream.append("```\n")
    stream.finalize()
    assert stream.text == "Intro\n\n```js\nlet a = 1;\n```\n"
