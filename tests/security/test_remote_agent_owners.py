"""Remote-agent registrations have an owner: every user may see and call them, only the owner removes one."""

from __future__ import annotations

from pathlib import Path

import httpx

from core.auth import accounts
from core.services import Services
from tests.conftest import make_settings
from tests.utils.a2a_agents import echo_server
from tests.utils.a2a_live import build_a2a_app
from tests.utils.live_server import live_server
from tests.utils.sync import run_sync

ALICE, BOB = ("alice", "alice-password"), ("bob", "bob-password")
TOKEN = "alices-token-for-the-echo-agent"


def test_only_the_owner_removes_a_registration_and_its_token_is_never_shown(tmp_path: Path) -> None:
    seed = Services.build(make_settings(tmp_path))
    seed.db.migrate()

    async def create_users() -> None:
        async with seed.db.session() as s:
            for name, password in (ALICE, BOB):
                await accounts.create_user(s, username=name, password=password)
        await seed.db.close()

    run_sync(create_users())
    services = Services.build(make_settings(tmp_path, outbound_allow_hosts=["127.0.0.1"]))
    services.prepare()
    with echo_server() as card_url, live_server(build_a2a_app(services)) as url:
        created = httpx.post(
            f"{url}/api/a2a/remote-agents",
            auth=ALICE,
            timeout=30,
            json={"cardUrl": card_url, "id": "echo", "bearerToken": TOKEN},
        )
        assert created.status_code == 201 and created.json()["yours"] is True
        [seen_by_bob] = httpx.get(f"{url}/api/a2a/remote-agents", auth=BOB, timeout=5).json()
        assert seen_by_bob["id"] == "echo" and seen_by_bob["yours"] is False
        for answer in (created.text, str(seen_by_bob)):
            assert TOKEN not in answer and "bearer" not in answer.lower()

        refused = httpx.delete(f"{url}/api/a2a/remote-agents/echo", auth=BOB, timeout=5)
        assert refused.status_code == 403 and "only they can remove it" in refused.json()["detail"]
        assert [a["id"] for a in httpx.get(f"{url}/api/a2a/remote-agents", auth=ALICE, timeout=5).json()] == ["echo"]
        assert services.registry.remote("echo") is not None  # bob may still delegate to it

        assert httpx.delete(f"{url}/api/a2a/remote-agents/echo", auth=ALICE, timeout=5).status_code == 204
        assert httpx.get(f"{url}/api/a2a/remote-agents", auth=BOB, timeout=5).json() == []
