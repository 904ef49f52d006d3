"""A remote task's text as people read it: progress notes on their own lines, then the answer (issue 36 item 5).

A remote A2A agent sends text two ways: in `working` status messages, and as artifacts. Its status
messages are either its answer streamed piece by piece (this app's own A2A server, many SDK agents;
the artifact at the end only repeats them and is not shown again, `RemoteStreamReader`) or progress
notes ("chunk 1/4", "searching…") around an answer given as artifacts. Which of the two is known only
once an artifact is shown: from then on every status message of the task was, and is, a note. So the
text is laid out from its pieces, each marked as a status message's text or not:

- no artifact text (yet): the pieces as they came (the streamed answer, or the notes until an artifact);
- else: each status message's text on its own line (a paragraph of its own), in the order they came,
  then the artifacts' text, whole: "starting…", "chunk 1/2", "chunk 2/2", then "slow echo".

The task's buffer carries the mark as the text part's id (`STATUS_TEXT_ID` for a status message's
text, `ANSWER_TEXT_ID` for the rest), so the side panel lays the text out the same way while it
streams (`ui/agent_invoke_panel.py`), and a task that fails part-way says what it had said the same
way (`RemoteRun.text`, the caller's failure message). A completed task's result is its answer alone
(`RemoteEvent.answer`).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ANSWER_TEXT_ID", "STATUS_TEXT_ID", "layout"]

#: The text part id of a remote status message's text in a task's buffer (a `text-delta` event's `id`).
STATUS_TEXT_ID = "status-0"
#: The text part id of every other text of a task (a remote agent's artifacts, a local agent's answer).
ANSWER_TEXT_ID = "text-0"


def layout(pieces: Iterable[tuple[str, str]]) -> str:
    """The text of a task's `(text part id, text)` pieces, notes on their own lines (see the module)."""
    notes: list[str] = []
    answer: list[str] = []
    for part_id, text in pieces:
        (notes if part_id == STATUS_TEXT_ID else answer).append(text)
    if not answer:
        return "".join(notes)
    lines = [line for line in (n.strip() for n in notes) if line]
    body = "".join(answer).lstrip("\n")
    return "\n\n".join([*lines, body]) if body else "\n\n".join(lines)
