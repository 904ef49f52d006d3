"""`GET /metrics` (issue 39, item 1): Prometheus text from a real `python app.py`, and who may read it.

A delegation moves the counters it should (runs by kind and outcome, tokens, the delegated task by state
and callee, time to first token); `METRICS_TOKEN` is required as a bearer token when set, and once there are
accounts metrics are off without it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.utils.app_process import ROOT, app_process, child_env


def samples(http: httpx.Client, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = http.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def test_a_delegation_moves_the_counters(tmp_path: Path) -> None:
    with app_process(tmp_path / "data") as app:
        app.wait_until_serving()
        with httpx.Client(base_url=app.base_url, timeout=30) as http:
            before = samples(http)
            chat = http.post("/api/sessions", json={"agentId": "general-assistant"}).json()
            sent = http.post(f"/api/sessions/{chat['id']}/messages", json={"content": "@coding-assistant /lorem 5"})
            assert sent.status_code == 202, sent.text
            deadline = time.monotonic() + 60
            while True:
                last = http.get(f"/api/sessions/{chat['id']}/messages").json()[-1]
                if last["role"] == "assistant" and last["status"] == "complete":
                    break
                assert time.monotonic() < deadline, "the turn did not end"
                time.sleep(0.2)
            after = samples(http)
        assert app.stop() == 0

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("a2a_chat_turns_started_total", kind="chat") == 1
    assert moved("a2a_chat_turns_started_total", kind="delegated") == 1
    assert moved("a2a_chat_turns_finished_total", kind="chat", outcome="complete") == 1
    assert moved("a2a_chat_turns_finished_total", kind="delegated", outcome="complete") == 1
    assert moved("a2a_chat_delegated_tasks_total", state="completed", callee="coding-assistant") == 1
    assert moved("a2a_chat_model_tokens_total", direction="out", agent="coding-assistant", model="local/demo") > 0
    assert moved("a2a_chat_time_to_first_token_seconds_count", kind="delegated") == 1
    assert moved("a2a_chat_inter_token_delay_seconds_count") > 0
    assert value(after, "a2a_chat_turns_running") == 0 and ("a2a_chat_streams_open", ()) in after


def test_the_token_is_asked_for_when_set_and_metrics_are_off_with_accounts_without_one(tmp_path: Path) -> None:
    with app_process(tmp_path / "token", METRICS_TOKEN="scrape-me") as app:
        app.wait_until_serving()
        with httpx.Client(base_url=app.base_url, timeout=30) as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic c2NyYXBlLW1l"}):
                refused = http.get("/metrics", headers=headers)
                assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer", headers
                assert "METRICS_TOKEN" in refused.json()["detail"]
            assert samples(http, Authorization="Bearer scrape-me")
        assert app.stop() == 0

    accounts = tmp_path / "accounts"
    made = subprocess.run(
        [sys.executable, "app.py", "users", "add", "alice", "--admin"],
        cwd=ROOT,
        env=child_env(accounts, APP_USER_PASSWORD="alice-password-1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    with app_process(accounts) as app:
        app.wait_until_serving(path="/login")
        with httpx.Client(base_url=app.base_url, timeout=30) as http:
            off = http.get("/metrics", follow_redirects=False)
            assert off.status_code == 404 and "METRICS_TOKEN" in off.json()["detail"]  # not the login page
            logged_in = http.get("/metrics", auth=("alice", "alice-password-1"), follow_redirects=False)
            assert logged_in.status_code == 404  # an account is not a scraper's token
        assert app.stop() == 0


async def test_a_held_event_loop_is_counted_as_a_block() -> None:
    import asyncio

    from core import metrics

    watcher = asyncio.get_running_loop().create_task(metrics.watch_event_loop(interval_s=0.02))
    try:
        await asyncio.sleep(0.05)
        before = metrics.EVENT_LOOP_BLOCKS._value.get()
        time.sleep(0.08)  # hold the loop as a blocking call would
        await asyncio.sleep(0.05)
        assert metrics.EVENT_LOOP_BLOCKS._value.get() >= before + 1
    finally:
        watcher.cancel()
