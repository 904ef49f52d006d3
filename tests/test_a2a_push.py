"""Push notifications served to A2A callers (issue 36), over real HTTP on 127.0.0.1.

A receiver on 127.0.0.1 (allowed by `OUTBOUND_ALLOW_HOSTS`) gets each update of a task with the caller's
token; a loopback webhook without that allowance is refused with -32602; get, list and delete see only
the caller's own configs; a receiver that first answers 500 gets the notification on a retry; the caps of
configs and of notifications per task hold. The demo model answers `/lorem N` with N known words.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from core.chat.demo_model import plan_reply
from tests.test_a2a_conformance import TwoUsers, two_users
from tests.utils.push_receiver import push_receiver

LOCAL = ["127.0.0.1"]
AGENT = "coding-assistant"


def lorem(count: int) -> str:
    """Exactly what the demo model answers to `/lorem <count>`."""
    return "".join(plan_reply([{"role": "user", "content": f"/lorem {count}"}], tools=None).tokens)


def call(app: TwoUsers, key: str, method: str, params: dict, *, version: str | None = "1.0") -> dict:
    """A raw JSON-RPC call to the agent; its answer (`result` or `error`)."""
    headers = {"Authorization": f"Bearer {key}"}
    if version:
        headers["A2A-Version"] = version
    response = httpx.post(
        app.agent_url(AGENT),
        json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
        headers=headers,
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return response.json()


def send(app: TwoUsers, key: str, text: str, *, push: dict | None = None, wait: bool = True) -> dict:
    """`SendMessage` of one text, with a push config if given."""
    configuration: dict = {"returnImmediately": not wait}
    if push is not None:
        configuration["taskPushNotificationConfig"] = push
    message = {"messageId": f"m-{time.monotonic_ns()}", "role": "ROLE_USER", "parts": [{"text": text}]}
    return call(app, key, "SendMessage", {"message": message, "configuration": configuration})


def test_a_receiver_on_an_allowed_host_gets_each_update_with_the_token(tmp_path: Path) -> None:
    with push_receiver() as receiver, two_users(tmp_path, outbound_allow_hosts=LOCAL) as app:
        card = httpx.get(f"{app.agent_url(AGENT)}/.well-known/agent-card.json", headers={"A2A-Version": "1.0"}).json()
        assert card["capabilities"]["pushNotifications"] is True

        answer = send(app, app.alice, "/lorem 30", push={"url": receiver.url, "token": "alice-secret-1"})
        task = answer["result"]["task"]
        receiver.wait_for("TASK_STATE_COMPLETED")
        states = receiver.states()
        assert states[-1] == "TASK_STATE_COMPLETED" and len(states) == len(set(states))  # each state once
        assert "TASK_STATE_WORKING" in states or "TASK_STATE_SUBMITTED" in states
        final = receiver.bodies()[-1]["task"]
        assert final["id"] == task["id"] and final["contextId"] == task["contextId"]
        assert final["artifacts"][0]["parts"][0]["text"] == lorem(30)
        assert all(h.get("x-a2a-notification-token") == "alice-secret-1" for h, _ in receiver.got)

        # A config set after the task ended gets its end once; with its own id and Authorization credentials.
        created = call(
            app,
            app.alice,
            "CreateTaskPushNotificationConfig",
            {
                "taskId": task["id"],
                "id": "second",
                "url": receiver.url,
                "token": "alice-secret-2",
                "authentication": {"scheme": "Bearer", "credentials": "receiver-key"},
            },
        )["result"]
        assert (created["id"], created["taskId"], created["url"]) == ("second", task["id"], receiver.url)
        deadline = time.monotonic() + 10
        while not any(h.get("x-a2a-notification-token") == "alice-secret-2" for h, _ in receiver.got):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        headers = next(h for h, _ in receiver.got if h.get("x-a2a-notification-token") == "alice-secret-2")
        assert headers["authorization"] == "Bearer receiver-key"


def test_a_loopback_webhook_without_the_allowance_is_refused_and_starts_no_task(tmp_path: Path) -> None:
    with push_receiver() as receiver, two_users(tmp_path) as app:
        refused = send(app, app.alice, "/lorem 3", push={"url": receiver.url, "token": "t"})["error"]
        assert refused["code"] == -32602 and "loopback" in refused["message"]
        assert "OUTBOUND_ALLOW_HOSTS" in refused["message"]
        listed = call(app, app.alice, "ListTasks", {})["result"]
        assert listed.get("tasks", []) == []  # refused before the task started

        task = send(app, app.alice, "/lorem 3")["result"]["task"]
        for url in (receiver.url, "http://169.254.169.254/hook", "http://10.0.0.1/hook", "ftp://example.com/x"):
            answer = call(app, app.alice, "CreateTaskPushNotificationConfig", {"taskId": task["id"], "url": url})
            assert answer["error"]["code"] == -32602, url
        v03 = call(
            app,
            app.alice,
            "tasks/pushNotificationConfig/set",
            {"taskId": task["id"], "pushNotificationConfig": {"url": receiver.url}},
            version=None,
        )
        assert "loopback" in v03["error"]["message"]
        time.sleep(0.3)
        assert receiver.got == []


def test_get_list_and_delete_see_only_the_callers_own_configs(tmp_path: Path) -> None:
    with push_receiver() as receiver, two_users(tmp_path, outbound_allow_hosts=LOCAL) as app:
        task = send(app, app.alice, "/lorem 3")["result"]["task"]
        for config_id in ("a", "b"):
            call(
                app,
                app.alice,
                "CreateTaskPushNotificationConfig",
                {"taskId": task["id"], "id": config_id, "url": receiver.url},
            )

        listed = call(app, app.alice, "ListTaskPushNotificationConfigs", {"taskId": task["id"]})["result"]
        assert [c["id"] for c in listed["configs"]] == ["a", "b"]
        got = call(app, app.alice, "GetTaskPushNotificationConfig", {"taskId": task["id"], "id": "b"})["result"]
        assert (got["id"], got["url"]) == ("b", receiver.url)

        # Bob: alice's task and its configs look exactly like ones that do not exist.
        for method, params in (
            ("ListTaskPushNotificationConfigs", {"taskId": task["id"]}),
            ("GetTaskPushNotificationConfig", {"taskId": task["id"], "id": "a"}),
            ("DeleteTaskPushNotificationConfig", {"taskId": task["id"], "id": "a"}),
            ("CreateTaskPushNotificationConfig", {"taskId": task["id"], "url": receiver.url}),
        ):
            foreign = call(app, app.bob, method, params)["error"]
            unknown = call(app, app.bob, method, {**params, "taskId": "no-such-task"})["error"]
            assert foreign["code"] == unknown["code"] == -32001, method
            assert foreign["message"].replace(task["id"], "X") == unknown["message"].replace("no-such-task", "X")

        assert (
            call(app, app.alice, "DeleteTaskPushNotificationConfig", {"taskId": task["id"], "id": "a"})["result"]
            is None
        )
        again = call(app, app.alice, "DeleteTaskPushNotificationConfig", {"taskId": task["id"], "id": "a"})
        assert again["error"]["code"] == -32001
        missing = call(app, app.alice, "GetTaskPushNotificationConfig", {"taskId": task["id"], "id": "a"})
        assert missing["error"]["code"] == -32001

        # The v0.3 names reach the same configs.
        v03 = call(app, app.alice, "tasks/pushNotificationConfig/list", {"id": task["id"]}, version=None)["result"]
        assert [c["pushNotificationConfig"]["id"] for c in v03] == ["b"]
        one = call(
            app,
            app.alice,
            "tasks/pushNotificationConfig/get",
            {"id": task["id"], "pushNotificationConfigId": "b"},
            version=None,
        )["result"]
        assert one["pushNotificationConfig"]["url"] == receiver.url


def test_a_receiver_that_first_answers_500_gets_the_notification_on_a_retry(tmp_path: Path) -> None:
    settings = {"outbound_allow_hosts": LOCAL, "a2a_push_first_retry_s": 0.05, "a2a_push_attempts": 4}
    with push_receiver(fail_first=2) as receiver, two_users(tmp_path, **settings) as app:
        task = send(app, app.alice, "/lorem 3")["result"]["task"]
        call(
            app,
            app.alice,
            "CreateTaskPushNotificationConfig",
            {"taskId": task["id"], "url": receiver.url, "token": "t"},
        )
        receiver.wait_for("TASK_STATE_COMPLETED")
        assert receiver.refused == 2 and receiver.states() == ["TASK_STATE_COMPLETED"]


def test_the_caps_on_configs_and_notifications_per_task_hold(tmp_path: Path) -> None:
    settings = {
        "outbound_allow_hosts": LOCAL,
        "a2a_push_max_configs_per_task": 2,
        "a2a_push_max_deliveries_per_task": 3,
    }
    with push_receiver() as receiver, two_users(tmp_path, **settings) as app:
        task = send(app, app.alice, "/lorem 2000", wait=False)["result"]["task"]
        for config_id in ("a", "b"):
            call(
                app,
                app.alice,
                "CreateTaskPushNotificationConfig",
                {"taskId": task["id"], "id": config_id, "url": receiver.url},
            )
        over = call(
            app, app.alice, "CreateTaskPushNotificationConfig", {"taskId": task["id"], "id": "c", "url": receiver.url}
        )
        assert over["error"]["code"] == -32602 and "most allowed" in over["error"]["message"]
        replaced = call(
            app,
            app.alice,
            "CreateTaskPushNotificationConfig",
            {"taskId": task["id"], "id": "a", "url": receiver.url, "token": "new"},
        )
        assert replaced["result"]["token"] == "new"  # replacing one by its id is not one more

        deadline = time.monotonic() + 60
        while (
            call(app, app.alice, "GetTask", {"id": task["id"]})["result"]["status"]["state"] != "TASK_STATE_COMPLETED"
        ):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.5)
        assert len(receiver.got) == 3  # two configs × (working, completed) would be 4


def test_a_v03_client_sets_the_config_inside_message_send(tmp_path: Path) -> None:
    with push_receiver() as receiver, two_users(tmp_path, outbound_allow_hosts=LOCAL) as app:
        message = {
            "kind": "message",
            "messageId": "m-v03",
            "role": "user",
            "parts": [{"kind": "text", "text": "/lorem 4"}],
        }
        push = {"url": receiver.url, "token": "v03-token"}
        answer = call(
            app,
            app.alice,
            "message/send",
            {"message": message, "configuration": {"pushNotificationConfig": push}},
            version=None,
        )
        assert answer["result"]["status"]["state"] == "completed", answer
        receiver.wait_for("TASK_STATE_COMPLETED")
        assert {h.get("x-a2a-notification-token") for h, _ in receiver.got} == {"v03-token"}
        v03 = call(app, app.alice, "tasks/pushNotificationConfig/list", {"id": answer["result"]["id"]}, version=None)
        assert [c["pushNotificationConfig"]["url"] for c in v03["result"]] == [receiver.url]
