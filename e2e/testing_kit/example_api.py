"""An example a user can copy (docs/TESTING.md): a delegation over the REST API and the two streams.

It imports no module of the app, only the `chat_app` fixture of the testing kit.
"""

import pytest


@pytest.mark.chat_app_settings(DEMO_MODEL_DELAY_MS="0")
def test_a_delegation_over_rest_and_sse(chat_app):
    session = chat_app.new_session("general-assistant")
    chat_app.send(session, "@coding-assistant write a haiku")
    events = list(chat_app.stream(session))
    [started] = [e["data"] for e in events if e["type"] == "a2a-task-started"]
    assert started["calleeAgentSlug"] == "coding-assistant"
    assert events[-1]["type"] == "finish"

    task_events = list(chat_app.task_stream(started["taskId"]))
    assert task_events[-1]["type"] == "done" and task_events[-1]["data"]["state"] == "completed"
    [task] = chat_app.tasks()
    assert task["state"] == "completed"
