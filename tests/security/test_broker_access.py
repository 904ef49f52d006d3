"""Who may dispatch and cancel broker tasks: a credential on both routes, and cancel reaches one's own tasks only."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from core.a2a import api_keys
from core.auth import accounts
from core.services import Services
from tests.conftest import make_settings
from tests.utils.broker import DISPATCH_TOKEN, FakeAgent, broker_app, serve_app

BODY = {"task": "book a train", "targetAgent": "travel", "agentId": 123, "chatId": "shared-chat"}


async def user_key(services: Services, username: str) -> str:
    async with services.db.session() as s:
        user = await accounts.create_user(s, username=username, password=f"{username}-password")
        _, key = await api_keys.create_key(s, user_id=user.id, name="chat system")
    return key


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_dispatch_and_cancel_need_a_credential_and_cancel_reaches_only_ones_own(tmp_path: Path) -> None:
    services = Services.build(make_settings(tmp_path))
    services.prepare()
    async with serve_app(broker_app(services)) as host, httpx.AsyncClient(base_url=f"http://{host}") as http:
        alice, bob = await user_key(services, "alice"), await user_key(services, "bob")
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=services.broker)
        for headers in ({}, bearer("a2ak_not-a-key"), {"Authorization": "Basic YWxpY2U6eA=="}):
            for path, body in (("/a2a/tasks/dispatch", BODY), ("/a2a/tasks/cancel", {"chatId": "shared-chat"})):
                response = await http.post(path, json=body, headers=headers)
                assert response.status_code == 401, (path, headers)
                assert "Authorization: Bearer" in response.json()["detail"]
                assert response.headers["www-authenticate"].startswith("Bearer")
        assert services.broker.stats()["tasks"]["dispatched"] == 0

        ack = (await http.post("/a2a/tasks/dispatch", json=BODY, headers=bearer(alice))).json()
        assert ack["status"] == "accepted"
        await agent.next_request("message/stream")
        # Bob names alice's chat: nothing of hers is touched, and the answer is the one for an idle chat.
        assert (await http.post("/a2a/tasks/cancel", json={"chatId": "shared-chat"}, headers=bearer(bob))).json() == {
            "canceled": 0
        }
        assert (
            await http.post("/a2a/tasks/cancel", json={"chatId": "shared-chat"}, headers=bearer(DISPATCH_TOKEN))
        ).json() == {"canceled": 0}
        assert [t.state for t in services.broker.running_tasks() if t.id == ack["taskId"]] == ["submitted"]
        assert (await http.post("/a2a/tasks/cancel", json={"chatId": "shared-chat"}, headers=bearer(alice))).json() == {
            "canceled": 1
        }

        # The dispatch token is a credential of its own.
        assert (await http.post("/a2a/tasks/dispatch", json=BODY, headers=bearer(DISPATCH_TOKEN))).json()[
            "status"
        ] == "accepted"
        await agent.close()


@pytest.mark.parametrize(
    ("settings", "allowed"),
    [
        ({"broker_open_dispatch": True}, True),  # the seed's open mode, for trusted networks only
        ({"broker_dispatch_token": None}, False),
    ],
)
async def test_anonymous_dispatch_only_in_open_mode(tmp_path: Path, settings: dict, allowed: bool) -> None:
    services = Services.build(make_settings(tmp_path, **settings))
    services.prepare()
    async with serve_app(broker_app(services)) as host, httpx.AsyncClient(base_url=f"http://{host}") as http:
        response = await http.post("/a2a/tasks/dispatch", json=BODY)
        assert response.status_code == (200 if allowed else 401)
        if allowed:
            assert response.json() == {"status": "no_agent"}
        # Without a configured dispatch token, no bearer value can match "none".
        assert (await http.post("/a2a/tasks/dispatch", json=BODY, headers=bearer("None"))).status_code == (
            200 if allowed else 401
        )
