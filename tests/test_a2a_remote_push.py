"""Remote A2A tasks that end by push to this app (issue 36, `A2A_REMOTE_PUSH`), over real HTTP on 127.0.0.1.

The remote side is `tests/utils/a2a_echo_server.py --push`: an agent built only on the a2a-sdk 1.3 whose
push notifications are sent by the SDK's own `BasePushNotificationSender`. `/ticks N` answers after N status
updates with the artifact `done after N ticks`.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path

import httpx

from tests.test_a2a_client import chat, register, task_events
from tests.utils.a2a_agents import LOCAL_AGENTS, echo_server
from tests.utils.a2a_live import live_a2a_app
from tests.utils.ports import free_port


def waits(data_dir: Path) -> list[tuple[str, str | None, str | None]]:
    """The rows of `a2a_remote_push_waits`: (state, remote task id, answer)."""
    with sqlite3.connect(data_dir / "app.db") as db:
        return list(db.execute("SELECT state, remote_task_id, answer FROM a2a_remote_push_waits ORDER BY created_at"))


def test_a_delegation_to_an_agent_that_offers_push_ends_by_its_push(tmp_path: Path) -> None:
    settings = {
        "demo_model_delay_ms": 0,
        "outbound_allow_hosts": LOCAL_AGENTS,
        "a2a_remote_push": True,
        "a2a_remote_push_poll_s": 300,  # never read back within the test: only a push can end it
    }
    with (
        echo_server("--push", "--delay-ms", "30", "--name", "Push Echo") as card_url,
        live_a2a_app(tmp_path, **settings) as app,
    ):
        assert register(app, card_url, "pusher").status_code == 201
        session = chat(app, "@pusher /ticks 8")
        [task] = [t for t in httpx.get(f"{app.url}/api/tasks").json() if t["callerSessionId"] == session]
        assert task["state"] == "completed", task
        detail = httpx.get(f"{app.url}/api/tasks/{task['id']}").json()
        assert detail["messages"][-1]["content"] == "done after 8 ticks"
        [(state, remote_task_id, answer)] = waits(tmp_path / "data")
        assert (state, answer) == ("completed", "done after 8 ticks") and remote_task_id
        # The progress came with the pushes, into the side panel.
        deltas = [data["textDelta"] for kind, data in task_events(app, task["id"]) if kind == "text-delta"]
        assert any(d.startswith("tick ") for d in deltas), deltas


def test_without_the_setting_the_same_agent_is_streamed_as_before(tmp_path: Path) -> None:
    with (
        echo_server("--push", "--name", "Push Echo") as card_url,
        live_a2a_app(tmp_path, demo_model_delay_ms=0, outbound_allow_hosts=LOCAL_AGENTS) as app,
    ):
        assert register(app, card_url, "pusher").status_code == 201
        session = chat(app, "@pusher /ticks 2")
        [task] = [t for t in httpx.get(f"{app.url}/api/tasks").json() if t["callerSessionId"] == session]
        assert task["state"] == "completed"
        assert waits(tmp_path / "data") == []


def test_a_task_waiting_for_its_push_survives_a_restart_of_the_app(tmp_path: Path) -> None:
    data, port = tmp_path / "kept", free_port()
    settings = {
        "data_dir": data,
        "port": port,
        "demo_model_delay_ms": 0,
        "outbound_allow_hosts": LOCAL_AGENTS,
        "a2a_remote_push": True,
        "a2a_remote_push_poll_s": 3,  # after the restart: its push, or GetTask if the push came while it was down
    }
    with echo_server("--push", "--delay-ms", "100", "--name", "Push Echo") as card_url:
        with live_a2a_app(tmp_path, **settings) as first:
            assert register(first, card_url, "pusher").status_code == 201
            session = httpx.post(f"{first.url}/api/sessions", json={"agentId": "general-assistant"}).json()["id"]
            sent = httpx.post(f"{first.url}/api/sessions/{session}/messages", json={"content": "@pusher /ticks 60"})
            assert sent.status_code == 202
            deadline = time.monotonic() + 20
            while not [w for w in waits(data) if w[1]]:
                assert time.monotonic() < deadline, "the remote task was not started"
                time.sleep(0.05)
        assert waits(data)[0][0] == "waiting"  # the stop left it waiting (and did not cancel the remote task)

        with live_a2a_app(tmp_path, **settings) as second:
            deadline = time.monotonic() + 30
            while True:
                tasks = [t for t in httpx.get(f"{second.url}/api/tasks").json() if t["callerSessionId"] == session]
                if tasks and tasks[0]["state"] == "completed":
                    break
                assert time.monotonic() < deadline, tasks
                time.sleep(0.1)
            detail = httpx.get(f"{second.url}/api/tasks/{tasks[0]['id']}").json()
            assert detail["messages"][-1]["content"] == "done after 60 ticks"
            assert waits(data)[0][0] == "completed"


def test_the_webhook_takes_only_its_own_token_and_unknown_ids_look_the_same(tmp_path: Path) -> None:
    settings = {"demo_model_delay_ms": 0, "outbound_allow_hosts": LOCAL_AGENTS, "a2a_remote_push": True}
    with echo_server("--push", "--name", "Push Echo") as card_url, live_a2a_app(tmp_path, **settings) as app:
        assert register(app, card_url, "pusher").status_code == 201
        session = chat(app, "@pusher /ticks 2")
        [task] = [t for t in httpx.get(f"{app.url}/api/tasks").json() if t["callerSessionId"] == session]
        with sqlite3.connect(tmp_path / "data" / "app.db") as db:
            [(wait_id, token_hash)] = list(db.execute("SELECT id, token_hash FROM a2a_remote_push_waits"))
            assert len(token_hash) == 64  # only the SHA-256 of the token is kept
            token = "a-token-of-this-test"
            db.execute(
                "INSERT INTO a2a_remote_push_waits (id, task_id, remote_agent_id, token_hash, state, created_at) "
                "VALUES ('w2', ?, 'pusher', ?, 'waiting', '2026-01-01 00:00:00')",
                (task["id"], hashlib.sha256(token.encode()).hexdigest()),
            )
        body = {"task": {"id": "r1", "contextId": "c1", "status": {"state": "TASK_STATE_WORKING"}}}
        answers = [
            httpx.post(f"{app.url}/a2a/push/{wait_id}", json=body, headers={"X-A2A-Notification-Token": "wrong"}),
            httpx.post(f"{app.url}/a2a/push/{wait_id}", json=body),
            httpx.post(f"{app.url}/a2a/push/no-such-wait", json=body, headers={"X-A2A-Notification-Token": token}),
            httpx.post(f"{app.url}/a2a/push/w2", json=body, headers={"X-A2A-Notification-Token": "wrong"}),
        ]
        assert [a.status_code for a in answers] == [404] * 4
        assert len({a.text for a in answers}) == 1  # not yours looks exactly like none
        taken = httpx.post(f"{app.url}/a2a/push/w2", json=body, headers={"X-A2A-Notification-Token": token})
        assert taken.status_code == 204
        not_json = httpx.post(
            f"{app.url}/a2a/push/w2", content=b"{not json", headers={"X-A2A-Notification-Token": token}
        )
        assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["detail"]
