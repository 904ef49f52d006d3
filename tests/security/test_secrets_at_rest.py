"""Secrets at rest: remote agents' bearer tokens are encrypted, and the data folder is private."""

from __future__ import annotations

import logging
import sqlite3
import stat
import time
from pathlib import Path

import httpx
import pytest

import core.a2a.client as a2a_client
from core.secret_box import SecretBox, SecretUnreadableError
from core.services import Services
from models import RemoteA2AAgent
from tests.conftest import make_settings
from tests.utils.a2a_agents import echo_server
from tests.utils.a2a_live import live_a2a_app
from tests.utils.sync import run_sync

TOKEN = "s3cret-bearer-token-7f3a9c"
LOCAL = ["127.0.0.1"]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def stored_token(data: Path, agent_id: str) -> str | None:
    with sqlite3.connect(data / "app.db") as conn:
        row = conn.execute("SELECT bearer_token FROM a2a_remote_agents WHERE id = ?", (agent_id,)).fetchone()
    return row[0] if row else None


def test_a_bearer_token_is_stored_encrypted_and_read_back_after_a_restart(tmp_path: Path, monkeypatch) -> None:
    data = tmp_path / "data"
    with echo_server() as card_url:
        with live_a2a_app(tmp_path, data_dir=data, outbound_allow_hosts=LOCAL) as first:
            created = httpx.post(
                f"{first.url}/api/a2a/remote-agents",
                timeout=30,
                json={"cardUrl": card_url, "id": "echo", "bearerToken": TOKEN},
            )
            assert created.status_code == 201, created.text
            assert TOKEN not in created.text  # never shown back
        stored = stored_token(data, "echo")
        assert stored.startswith("fernet:") and TOKEN not in stored
        for file in data.glob("app.db*"):  # the database and its WAL
            assert TOKEN.encode() not in file.read_bytes(), file

        restored: list[str | None] = []

        class Recording(a2a_client.HttpRemoteAgent):
            def __init__(self, **kwargs) -> None:
                restored.append(kwargs.get("bearer_token"))
                super().__init__(**kwargs)

        monkeypatch.setattr(a2a_client, "HttpRemoteAgent", Recording)
        with live_a2a_app(tmp_path, data_dir=data, outbound_allow_hosts=LOCAL) as second:
            deadline = time.monotonic() + 10
            while not [a for a in httpx.get(f"{second.url}/api/a2a/remote-agents").json() if a["online"]]:
                assert time.monotonic() < deadline, "the registration did not come back"
                time.sleep(0.05)
        assert restored == [TOKEN]


def test_tokens_saved_before_encryption_are_sealed_at_the_next_start(tmp_path: Path) -> None:
    services = Services.build(make_settings(tmp_path))
    services.prepare()

    async def save_plain() -> None:
        async with services.db.session() as s:
            s.add(RemoteA2AAgent(id="old", card_url="https://agent.example/card", card={}, bearer_token=TOKEN))
            await s.commit()
        await services.db.close()

    run_sync(save_plain())
    assert stored_token(tmp_path / "data", "old") == TOKEN
    again = Services.build(make_settings(tmp_path))
    again.prepare()
    stored = stored_token(tmp_path / "data", "old")
    assert stored.startswith("fernet:") and again.remote_agents.secrets.open(stored) == TOKEN


def test_another_key_cannot_open_a_sealed_token(tmp_path: Path) -> None:
    box = SecretBox.for_data_dir(tmp_path, "the-first-key")
    sealed = box.seal(TOKEN)
    assert SecretBox.for_data_dir(tmp_path, "the-first-key").open(sealed) == TOKEN
    with pytest.raises(SecretUnreadableError, match="SECRET_KEY"):
        SecretBox.for_data_dir(tmp_path, "another-key").open(sealed)
    # Without SECRET_KEY, the key is made once into DATA_DIR (0600) and used from then on.
    kept = SecretBox.for_data_dir(tmp_path / "kept").seal(TOKEN)
    assert SecretBox.for_data_dir(tmp_path / "kept").open(kept) == TOKEN
    assert mode(tmp_path / "kept" / ".secret_key") == 0o600


def test_a_new_data_dir_and_the_files_in_it_are_private(tmp_path: Path) -> None:
    data = tmp_path / "fresh" / "data"
    services = Services.build(make_settings(tmp_path, data_dir=data, database_url=f"sqlite:///{data / 'app.db'}"))
    services.prepare()
    services.settings.ensure_storage_secret()
    assert mode(data) == 0o700
    for name in ("app.db", ".secret_key", ".storage_secret"):
        assert mode(data / name) == 0o600, name
    for wal in data.glob("app.db-*"):
        assert mode(wal) == 0o600, wal


def test_an_existing_data_dir_open_to_others_is_warned_about_not_changed(tmp_path: Path, caplog) -> None:
    data = tmp_path / "shared"
    data.mkdir()
    data.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="core.secret_box"):
        Services.build(make_settings(tmp_path, data_dir=data, database_url=f"sqlite:///{data / 'app.db'}")).prepare()
    assert mode(data) == 0o755 and "chmod 700" in caplog.text
    assert mode(data / "app.db") == 0o600
