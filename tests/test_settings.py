"""Settings precedence (seed 003): environment > .env > config/server.json > defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.settings import Settings, load_settings


def write_config(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_defaults_bind_loopback_on_port_3100() -> None:
    settings = load_settings()
    assert settings.host == "127.0.0.1"
    assert settings.port == 3100
    assert settings.is_loopback
    assert settings.request_timeout == 10_000
    assert settings.task_idle_timeout == 120_000
    assert settings.inject_min_interval == 1000
    assert settings.auth.mode == "none"
    assert settings.redis.dsn is None
    assert settings.database.endswith("/app.db") and settings.database.startswith("sqlite:///")


def test_json_then_dotenv_then_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_config(
        tmp_path / "server.json",
        {
            "_comment": "ignored",
            "port": 4000,
            "inject_min_interval": 250,
            "redis": {"host": "json-host", "port": 6380, "db": 3},
            "auth": {"mode": "jwt"},
            "blacklist_ip": ["10.0.0.9"],
        },
    )
    dotenv = tmp_path / "test.env"
    dotenv.write_text("PORT=5000\nREDIS_HOST=dotenv-host\n", encoding="utf-8")
    monkeypatch.setenv("CONFIG_FILE", str(config))
    monkeypatch.setenv("ENV_FILE", str(dotenv))

    settings = load_settings()
    assert settings.port == 5000  # .env beats JSON
    assert settings.inject_min_interval == 250  # JSON beats defaults
    assert settings.redis.host == "dotenv-host"
    assert settings.redis.port == 6380 and settings.redis.db == 3  # nested JSON keys survive a partial override
    assert settings.auth.mode == "jwt"
    assert settings.blacklist_ip == ["10.0.0.9"]

    monkeypatch.setenv("PORT", "6000")
    monkeypatch.setenv("REDIS_HOST", "env-host")
    monkeypatch.setenv("BLACKLIST_IP", "1.2.3.4, 5.6.7.8")
    settings = load_settings()
    assert settings.port == 6000  # the environment beats .env
    assert settings.redis.host == "env-host"
    assert settings.redis.dsn == "redis://env-host:6380/3"
    assert settings.blacklist_ip == ["1.2.3.4", "5.6.7.8"]


def test_redis_url_wins_over_host_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/5")
    monkeypatch.setenv("REDIS_HOST", "ignored")
    assert load_settings().redis.dsn == "redis://127.0.0.1:6379/5"


def test_shipped_config_file_is_valid_and_documents_every_key(monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = Path(__file__).resolve().parent.parent / "config" / "server.json"
    monkeypatch.setenv("CONFIG_FILE", str(shipped))
    settings = load_settings()
    raw = json.loads(shipped.read_text(encoding="utf-8"))
    documented = {k for k in raw if not k.startswith("_")}
    assert documented == set(Settings.model_fields), "config/server.json must list every setting"
    for key in documented:
        assert f"_{key}" in raw, f"config/server.json has no _{key} comment"
    assert settings.port == 3100


def test_env_example_lists_the_environment_names() -> None:
    example = (Path(__file__).resolve().parent.parent / ".env.example").read_text(encoding="utf-8")
    for name in (
        "HOST",
        "PORT",
        "DATABASE_URL",
        "REDIS_URL",
        "REDIS_HOST",
        "DEFAULT_MODEL",
        "LLM_API_BASE",
        "LLM_API_KEY",
        "DEMO_MODEL_DELAY_MS",
        "DATA_DIR",
        "STORAGE_SECRET",
        "AUTH_MODE",
    ):
        assert f"{name}=" in example


def test_bad_values_are_refused_with_the_field_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PORT", "not-a-port")
    with pytest.raises(ValueError, match="port"):
        load_settings()
    monkeypatch.delenv("PORT")
    broken = tmp_path / "broken.json"
    broken.write_text("{ not json", encoding="utf-8")
    monkeypatch.setenv("CONFIG_FILE", str(broken))
    with pytest.raises(ValueError, match="not valid JSON"):
        load_settings()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("localhost", True), ("::1", True), ("0.0.0.0", False), ("192.0.2.10", False)],
)
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert Settings(_env_file=None, host=host).is_loopback is loopback


def test_storage_secret_is_generated_once_and_kept(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, data_dir=tmp_path / "d")
    first = settings.ensure_storage_secret()
    assert len(first) >= 32
    assert Settings(_env_file=None, data_dir=tmp_path / "d").ensure_storage_secret() == first
