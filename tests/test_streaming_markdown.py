"""Issue 14, item 3: code blocks in streamed markdown (the language label, an unclosed fence); issue 40: open spans."""

from __future__ import annotations

from nicegui import ui
from nicegui.testing import User

from ui.streaming import ChatMarkdown, StreamingMarkdown, unclosed_fence, while_streaming


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


def test_an_open_emphasis_or_code_span_shows_closed_while_streaming() -> None:
    """Issue 40: half-streamed bold showed `**offline` until its closing `**` arrived."""
    assert while_streaming("This is the **offline") == "This is the **offline**"
    assert while_streaming("This is the **offline demo ") == "This is the **offline demo**"
    assert while_streaming("Hello *wor") == "Hello *wor*"
    assert while_streaming("***both") == "***both***"
    assert while_streaming("x **bold*") == "x **bold**"
    assert while_streaming("Run `pip inst") == "Run `pip inst`"
    assert while_streaming("a `x` **b `c") == "a `x` **b `c`**"
    assert while_streaming("Text\n\n> **quo") == "Text\n\n> **quo**"
    assert while_streaming("```py\nprint(1)\n```\nthen **bo") == "```py\nprint(1)\n```\nthen **bo**"


def test_an_opener_with_nothing_after_it_yet_is_left_out() -> None:
    """A `**`, `*` or backtick that just arrived shows nothing until its text does."""
    assert while_streaming("This is the **") == "This is the"
    assert while_streaming("**") == ""
    assert while_streaming("a **b** c *") == "a **b** c"
    assert while_streaming("Run `") == "Run"
    assert while_streaming("*") == ""


def test_closed_spans_lists_arithmetic_and_code_are_left_as_they_are() -> None:
    """Only what is open at the end changes; stars that are no emphasis and code stay."""
    for text in (
        "x **bold** y and *it* and `code`",
        "* item\n* other",
        "2 * 3 = 6",
        "5*3",
        "foo**bar",
        "use `*` here",
        "Here:\n\n```python\nx = '**'",  # an open fence: code, not emphasis
        "```\n**not bold\n```",
    ):
        assert while_streaming(text) == text, text


async def test_half_streamed_bold_renders_bold_and_the_finished_text_as_written(user: User) -> None:
    """The streaming view shows `<strong>` without the markers; finalize renders the text itself."""
    views: dict[str, StreamingMarkdown] = {}

    @ui.page("/streaming-bold-probe")
    def probe() -> None:
        views["bold"] = StreamingMarkdown("This is the **offline")
        views["left"] = StreamingMarkdown("First paragraph.\n\nA literal **star")

    await user.open("/streaming-bold-probe")
    bold, left = views["bold"], views["left"]
    html = bold._tail.props["innerHTML"]
    assert "<strong>offline</strong>" in html and "**" not in html, html
    bold.append(" demo model**: it answers.")
    bold.flush()
    assert "<strong>offline demo model</strong>" in bold._tail.props["innerHTML"]
    bold.finalize()
    assert bold._tail.content == "This is the **offline demo model**: it answers."

    assert "<strong>star</strong>" in left._tail.props["innerHTML"]
    left.finalize()  # the finished text never closed it: it shows as written
    assert left._tail.content == "First paragraph.\n\nA literal **star"
    assert "**star" in left._tail.props["innerHTML"]
