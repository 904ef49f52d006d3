"""`python app.py backup DIR` (issue 39, item 6): taken while a turn streams, it restores into a working app.

A real `python app.py` on a SQLite file; the backup command runs as its own process beside it, as a person
would run it; the restored folder is the `DATA_DIR` of a second app, which serves the chat and answers.
"""

from __future__ import annotations

import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from core.backup import BackupError, backup
from core.secret_box import KEY_FILE
from core.settings import Settings
from tests.utils.app_process import ROOT, app_process, child_env


def run_backup(data_dir: Path, folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "app.py", "backup", str(folder)],
        cwd=ROOT,
        env=child_env(data_dir, **env),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def messages(http: httpx.Client, session_id: str) -> list[dict]:
    response = http.get(f"/api/sessions/{session_id}/messages")
    assert response.status_code == 200, response.text
    return response.json()


def answered(http: httpx.Client, session_id: str) -> bool:
    last = messages(http, session_id)[-1]
    return last["role"] == "assistant" and last["status"] == "complete"


def drafts(database: Path) -> int:
    """Rows of answers being written (`streaming`): the API leaves them out while a turn runs."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        return db.execute("SELECT COUNT(*) FROM agent_messages WHERE status = 'streaming'").fetchone()[0]


def until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_backup_taken_during_a_streaming_turn_restores_into_a_working_app(tmp_path: Path) -> None:
    data_dir, folder, restored = tmp_path / "data", tmp_path / "backup", tmp_path / "restored"
    with app_process(data_dir) as app:
        app.wait_until_serving()
        with httpx.Client(base_url=app.base_url, timeout=30) as http:
            chat = http.post("/api/sessions", json={"agentId": "general-assistant"}).json()
            done = http.post(f"/api/sessions/{chat['id']}/messages", json={"content": "/lorem 5"})
            assert done.status_code == 202, done.text
            until(lambda: answered(http, chat["id"]))
            streaming = http.post(f"/api/sessions/{chat['id']}/messages", json={"content": "/slow 200 50"})
            assert streaming.status_code == 202, streaming.text
            until(lambda: drafts(data_dir / "app.db") == 1)

            made = run_backup(data_dir, folder)  # while the turn streams and saves its draft

            assert made.returncode == 0, made.stderr
            assert drafts(data_dir / "app.db") == 1 and not answered(http, chat["id"])  # it really was mid-turn
        assert app.stop() == 0

    assert f"wrote {folder / 'app.db'}" in made.stdout and "to restore" in made.stdout
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in ("app.db", KEY_FILE):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    assert (folder / KEY_FILE).read_text() == (data_dir / KEY_FILE).read_text()
    with sqlite3.connect(folder / "app.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert drafts(folder / "app.db") == 1  # one consistent state: the turn's draft as it stood

    restored.mkdir()
    for item in folder.iterdir():  # the README's restore: the backup's files into DATA_DIR
        (restored / item.name).write_bytes(item.read_bytes())
    with app_process(restored) as app:
        app.wait_until_serving()
        with httpx.Client(base_url=app.base_url, timeout=30) as http:
            saved = messages(http, chat["id"])
            assert [m["role"] for m in saved] == ["user", "assistant", "user", "assistant"]
            assert saved[1]["status"] == "complete" and saved[3]["status"] == "interrupted"  # the draft, ended
            again = http.post(f"/api/sessions/{chat['id']}/messages", json={"content": "/lorem 3"})
            assert again.status_code == 202, again.text
            until(lambda: answered(http, chat["id"]))
        assert app.stop() == 0


def test_a_backup_refuses_a_folder_that_holds_one_and_says_what_postgresql_needs(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / KEY_FILE).write_text("k")
    folder = tmp_path / "backup"
    folder.mkdir()
    (folder / "app.db").write_text("an older backup")
    sqlite = Settings(data_dir=data_dir, _env_file=None)  # type: ignore[call-arg]
    with pytest.raises(BackupError, match="already holds app.db"):
        backup(sqlite, folder)
    with pytest.raises(BackupError, match="there is no database"):
        backup(sqlite, tmp_path / "new")

    postgres = Settings(
        data_dir=data_dir, database_url="postgresql://app@db.example:5432/chat", secret_key="from-env", _env_file=None
    )  # type: ignore[call-arg]
    report = backup(postgres, tmp_path / "pg")
    assert report.written == []  # the key is in the environment; no database file to copy
    assert any("pg_dump" in note and "chat" in note for note in report.notes)
    assert any("SECRET_KEY" in note for note in report.notes)


def test_the_command_says_what_went_wrong_in_one_line(tmp_path: Path) -> None:
    made = run_backup(tmp_path / "nothing-here", tmp_path / "backup")
    assert made.returncode == 2
    assert made.stderr.startswith("error: there is no database at ") and made.stderr.count("\n") == 1
