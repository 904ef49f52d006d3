"""The admin area's API (issue 39, item 5) over real HTTP, on SQLite and PostgreSQL.

Admins only (403 for everyone else, 401 without a login); accounts created, promoted, disabled (their
logins end) and given a new password, under the rules that keep an enabled admin; every user's running
turns listed and stopped; the global model connection saved write-only, used by the next call (its key
only to its own base URL), tested unsaved, and kept across a restart; the server's health.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from sqlmodel import select

from core.auth import user_admin
from core.services import Services
from core.web.errors import install_error_handlers
from models import ModelConnection, User
from tests.conftest import make_settings
from tests.test_api import build_api_app, stream_events
from tests.utils.accounts import ALICE, BOB, seed_accounts
from tests.utils.live_server import live_server
from tests.utils.openai_server import OpenAIServer, openai_server, text  # noqa: F401  (fixture)

ROUTES = [
    ("GET", "/api/admin/users", None),
    ("POST", "/api/admin/users", {"username": "mallory", "password": "long-enough-password"}),
    ("PATCH", "/api/admin/users/1", {"admin": False}),
    ("GET", "/api/admin/turns", None),
    ("POST", "/api/admin/turns/as_x/stop", None),
    ("GET", "/api/admin/model", None),
    ("PUT", "/api/admin/model", {"apiBase": "http://127.0.0.1:9/v1"}),
    ("POST", "/api/admin/model/test", {}),
    ("GET", "/api/admin/health", None),
]


@pytest.fixture
def accounts_api(tmp_path: Path, database_url: str) -> Iterator[tuple[str, Services]]:
    """A live API server with alice (the first account: admin) and bob (not an admin)."""
    seed_accounts(tmp_path, database_url)
    services = Services.build(make_settings(tmp_path, database_url=database_url, demo_model_delay_ms=5))
    services.prepare()
    with live_server(admin_app(services)) as url:
        yield url, services


@pytest.fixture
def local_api(tmp_path: Path, database_url: str) -> Iterator[tuple[str, Services, Path, str]]:
    """A live API server in single-user mode (`local` is the admin)."""
    services = Services.build(make_settings(tmp_path, database_url=database_url))
    services.prepare()
    with live_server(admin_app(services)) as url:
        yield url, services, tmp_path, database_url


def admin_app(services: Services) -> FastAPI:
    """The API with the app's error handlers (the JSON errors' `code`)."""
    app = build_api_app(services)
    install_error_handlers(app)
    return app


def as_user(url: str, who: tuple[str, str]) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, auth=who, timeout=30)


async def test_the_admin_area_is_refused_to_non_admins_and_to_visitors(accounts_api) -> None:
    url, _ = accounts_api
    async with as_user(url, BOB) as bob, httpx.AsyncClient(base_url=url, timeout=30) as nobody:
        for method, path, body in ROUTES:
            refused = await bob.request(method, path, json=body)
            assert refused.status_code == 403, (path, refused.text)
            assert refused.json()["code"] == "admin_required" and "admin" in refused.json()["detail"]
            anonymous = await nobody.request(method, path, json=body)
            assert anonymous.status_code == 401, (path, anonymous.text)
        # Nothing of what bob asked for happened.
        async with as_user(url, ALICE) as alice:
            names = [row["username"] for row in (await alice.get("/api/admin/users")).json()]
            assert names == ["alice", "bob"]
            assert (await alice.get("/api/admin/model")).json()["apiBase"] is None


async def test_an_admin_creates_promotes_disables_and_resets_accounts(accounts_api) -> None:
    url, services = accounts_api
    async with as_user(url, ALICE) as alice:
        users = (await alice.get("/api/admin/users")).json()
        assert [(u["username"], u["admin"], u["disabled"], u["runningTurns"]) for u in users] == [
            ("alice", True, False, 0),
            ("bob", False, False, 0),
        ]
        assert all("password" not in str(key).lower() for u in users for key in u)
        created = await alice.post("/api/admin/users", json={"username": "carol", "password": "carol-password"})
        assert created.status_code == 201, created.text
        carol = created.json()
        assert carol["username"] == "carol" and carol["admin"] is False
        async with as_user(url, ("carol", "carol-password")) as as_carol:
            assert (await as_carol.get("/api/me")).json()["username"] == "carol"

        taken = await alice.post("/api/admin/users", json={"username": "carol", "password": "another-password"})
        assert taken.status_code == 422 and taken.json()["code"] == "account_error"
        assert "already exists" in taken.json()["detail"]
        short = await alice.post("/api/admin/users", json={"username": "dave", "password": "short"})
        assert short.status_code == 422 and "at least" in short.json()["detail"]

        # Disabled: its password is refused like a wrong one, and so is its open login; enabled again: back.
        disabled = await alice.patch(f"/api/admin/users/{carol['id']}", json={"disabled": True})
        assert disabled.status_code == 200 and disabled.json()["disabled"] is True
        assert carol["id"] in services.auth.disabled_ids
        async with as_user(url, ("carol", "carol-password")) as as_carol:
            refused = await as_carol.get("/api/me")
            assert refused.status_code == 401 and refused.json()["code"] == "login_required"
        await alice.patch(f"/api/admin/users/{carol['id']}", json={"disabled": False})
        async with as_user(url, ("carol", "carol-password")) as as_carol:
            assert (await as_carol.get("/api/me")).status_code == 200

        # A new password: the old one stops working at once (the login cache too), the new one works.
        reset = await alice.patch(f"/api/admin/users/{carol['id']}", json={"password": "carol-new-password"})
        assert reset.status_code == 200, reset.text
        async with as_user(url, ("carol", "carol-password")) as old:
            assert (await old.get("/api/me")).status_code == 401
        async with as_user(url, ("carol", "carol-new-password")) as new:
            assert (await new.get("/api/me")).status_code == 200
            assert (await new.get("/api/admin/users")).status_code == 403
            # Promoted: carol uses the area.
            await alice.patch(f"/api/admin/users/{carol['id']}", json={"admin": True})
            assert (await new.get("/api/admin/users")).status_code == 200

        # The rules: not one's own admin rights or account; an unknown account is 404.
        me = next(u for u in users if u["username"] == "alice")
        own = await alice.patch(f"/api/admin/users/{me['id']}", json={"admin": False})
        assert own.status_code == 409 and own.json()["code"] == "account_rule"
        own = await alice.patch(f"/api/admin/users/{me['id']}", json={"disabled": True})
        assert own.status_code == 409 and own.json()["code"] == "account_rule"
        unknown = await alice.patch("/api/admin/users/99999", json={"admin": True})
        assert unknown.status_code == 404 and unknown.json()["code"] == "account_not_found"


async def test_the_last_enabled_admin_stays_one(accounts_api) -> None:
    """Through the API an admin cannot reach it (not their own account); the rule holds beneath it too."""
    _url, services = accounts_api
    async with services.db.session() as s:
        alice = (await s.exec(select(User).where(User.username == "alice"))).one()
        bob = (await s.exec(select(User).where(User.username == "bob"))).one()
        assert alice.id is not None and bob.id is not None
        with pytest.raises(user_admin.AccountRuleError, match="last enabled admin"):
            await user_admin.set_admin(s, actor_id=bob.id, user_id=alice.id, admin=False)
        with pytest.raises(user_admin.AccountRuleError, match="last enabled admin"):
            await user_admin.set_disabled(s, actor_id=bob.id, user_id=alice.id, disabled=True)
        await user_admin.set_admin(s, actor_id=alice.id, user_id=bob.id, admin=True)
        assert (await user_admin.set_disabled(s, actor_id=bob.id, user_id=alice.id, disabled=True)).disabled


async def test_an_admin_sees_every_running_turn_and_stops_one(accounts_api) -> None:
    url, _ = accounts_api
    async with as_user(url, BOB) as bob, as_user(url, ALICE) as alice:
        session_id = (await bob.post("/api/sessions", json={"agentId": "general-assistant"})).json()["id"]
        posted = await bob.post(f"/api/sessions/{session_id}/messages", json={"content": "/hang"})
        assert posted.status_code == 202, posted.text
        reader = asyncio.create_task(stream_events(bob, posted.json()["streamUrl"]))
        for _ in range(100):
            turns = (await alice.get("/api/admin/turns")).json()
            if turns:
                break
            await asyncio.sleep(0.05)
        [turn] = turns
        assert turn["sessionId"] == session_id and turn["username"] == "bob"
        assert turn["agentId"] == "general-assistant" and turn["startedAt"]
        counts = {u["username"]: u["runningTurns"] for u in (await alice.get("/api/admin/users")).json()}
        assert counts == {"alice": 0, "bob": 1}

        stopped = await alice.post(f"/api/admin/turns/{session_id}/stop")
        assert stopped.status_code == 200 and stopped.json() == {"stopped": True}
        _, events = await asyncio.wait_for(reader, timeout=15)  # bob's stream ends
        assert events
        assert (await alice.get("/api/admin/turns")).json() == []
        again = await alice.post(f"/api/admin/turns/{session_id}/stop")
        assert again.status_code == 404 and again.json()["code"] == "turn_not_running"
        # Bob's chat keeps what was said before the stop, as a stopped answer.
        messages = (await bob.get(f"/api/sessions/{session_id}/messages")).json()
        assert [m["status"] for m in messages] == ["complete", "canceled"]


async def test_the_model_connection_is_write_only_used_tested_and_kept(local_api, openai_server) -> None:  # noqa: F811
    url, services, tmp_path, database_url = local_api
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        before = (await client.get("/api/admin/model")).json()
        assert before["defaultModel"] == "local/demo" and before["defaultModelFrom"] == "environment"
        assert before["hasApiKey"] is False and before["apiBase"] is None

        # The operator's rule for the base URL: any address but a cloud metadata one.
        metadata = await client.put("/api/admin/model", json={"apiBase": "http://169.254.169.254/v1"})
        assert metadata.status_code == 422 and metadata.json()["detail"][0]["loc"] == ["body", "apiBase"]
        unknown = await client.put("/api/admin/model", json={"defaultModel": "no-such-provider-model"})
        assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["body", "defaultModel"]

        saved = await client.put(
            "/api/admin/model",
            json={"defaultModel": "openai/admin-model", "apiBase": openai_server.api_base, "apiKey": "sk-admin-key"},
        )
        assert saved.status_code == 200, saved.text
        view = saved.json()
        assert view["hasApiKey"] is True and view["apiKeyFrom"] == "admin" and "sk-admin-key" not in saved.text
        assert view["defaultModel"] == "openai/admin-model" and view["apiBase"] == openai_server.api_base
        assert "sk-admin-key" not in (await client.get("/api/admin/model")).text

        # Used at once: an agent on an OpenAI-compatible model without its own base goes there with the key.
        created = await client.post("/api/agents", json={"id": "helper", "name": "Helper"})
        assert created.status_code == 201, created.text
        assert created.json()["model"] == "openai/admin-model"  # the new default
        openai_server.script(text("Hi", " there"))
        session_id = (await client.post("/api/sessions", json={"agentId": "helper"})).json()["id"]
        posted = await client.post(f"/api/sessions/{session_id}/messages", json={"content": "hello"})
        await stream_events(client, posted.json()["streamUrl"])
        [request] = openai_server.requests
        assert request.headers["authorization"] == "Bearer sk-admin-key"
        assert request.body["model"] == "admin-model"

        # Test, unsaved: with the key in force at its own base; at another base the key does not follow.
        openai_server.script(text("It works."))
        tested = await client.post("/api/admin/model/test", json={})
        assert tested.json() == {"ok": True, "text": "It works."}
        assert openai_server.requests[-1].headers["authorization"] == "Bearer sk-admin-key"
        with OpenAIServer() as other:
            other.script(text("Other server."))
            elsewhere = await client.post("/api/admin/model/test", json={"apiBase": other.api_base})
            assert elsewhere.json()["ok"] is True
            [seen] = other.requests
            assert seen.headers["authorization"] != "Bearer sk-admin-key"
        assert (await client.get("/api/admin/model")).json()["apiBase"] == openai_server.api_base  # not saved

    # Sealed at rest, and applied again by the next start.
    async with services.db.read() as s:
        row = await s.get(ModelConnection, 1)
    assert row is not None and row.api_key and "sk-admin-key" not in row.api_key
    restarted = Services.build(make_settings(tmp_path, database_url=database_url))
    restarted.prepare()
    assert restarted.llm.api_base == openai_server.api_base and restarted.llm.api_key == "sk-admin-key"
    assert restarted.agent_admin.default_model == "openai/admin-model"

    # Cleared: the environment's values are in force again.
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        cleared = await client.put("/api/admin/model", json={"defaultModel": "", "apiBase": "", "apiKey": ""})
        assert cleared.json()["hasApiKey"] is False and cleared.json()["defaultModel"] == "local/demo"
        assert services.llm.api_key is None and services.llm.api_base is None


async def test_account_changes_need_accounts_and_health_reports_each_part(local_api) -> None:
    url, services, *_ = local_api
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        refused = await client.post("/api/admin/users", json={"username": "erin", "password": "erin-password"})
        assert refused.status_code == 409 and refused.json()["code"] == "single_user_mode"
        assert "users add" in refused.json()["detail"]
        assert (await client.get("/api/admin/users")).json() == []
        health = (await client.get("/api/admin/health")).json()
        assert health["status"] == "ok" and health["database"]["ok"] is True and health["database"]["ms"] >= 0
        assert health["redis"]["configured"] is False
        assert health["broker"]["status"] == "ok" and health["replica"]["id"] == services.settings.instance_id
