"""A deployment that heals (issue 37, item 4; README "Running as several replicas").

The cluster's start checks the Redis it is given: `appendonly yes` and `maxmemory-policy noeviction`, or a
WARNING that says which setting, what it is, what it must be and what is lost otherwise (`check_redis_settings`).
Against the real test Redis (TEST_REDIS_URL); under CI=true a missing server fails.
"""

from __future__ import annotations

import logging

import pytest
import redis
from redis.exceptions import ResponseError

from core.streaming import redis_replica
from core.streaming.redis_replica import REQUIRED_REDIS_SETTINGS, check_redis_settings
from tests.conftest import unavailable
from tests.utils.broker import redis_test_url
from tests.utils.cluster import redis_reachable

pytestmark = pytest.mark.cluster


@pytest.fixture
def redis_url() -> str:
    url = redis_test_url()
    if (reason := redis_reachable(url)) is not None:
        unavailable(reason)
    return url


def test_the_start_warns_of_each_redis_setting_a_cluster_cannot_run_safely_with(redis_url, caplog):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        actual = {name: client.config_get(name)[name] for name in REQUIRED_REDIS_SETTINGS}
    finally:
        client.close()
    with caplog.at_level(logging.INFO, logger=redis_replica.__name__):
        warnings = check_redis_settings(redis_url)
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert logged == warnings
    for name, (required, _why) in REQUIRED_REDIS_SETTINGS.items():
        named = [w for w in warnings if w.startswith(f"Redis has {name} ")]
        if actual[name] == required:
            assert not named
        else:  # the test Redis runs without AOF: this branch is the one CI takes for appendonly
            [warning] = named
            assert f"Redis has {name} {actual[name]}; a cluster needs {name} {required}" in warning
    if actual["appendonly"] != "yes":
        [warning] = [w for w in warnings if "appendonly" in w]
        assert "a restart of Redis loses the running turns' and tasks' streams" in warning
        assert "results still owed" in warning


class _NoConfig:
    """A Redis whose CONFIG command is disabled (`rename-command CONFIG ""`, most managed services)."""

    def config_get(self, name: str) -> dict[str, str]:
        raise ResponseError("unknown command 'CONFIG', with args beginning with: 'GET'")

    def close(self) -> None:
        pass


class _Settings:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def config_get(self, name: str) -> dict[str, str]:
        return {name: self.values[name]} if name in self.values else {}

    def close(self) -> None:
        pass


def test_a_redis_without_config_is_logged_as_unchecked_not_as_wrong(monkeypatch, caplog):
    monkeypatch.setattr(redis.Redis, "from_url", classmethod(lambda cls, url, **kw: _NoConfig()))
    with caplog.at_level(logging.INFO, logger=redis_replica.__name__):
        assert check_redis_settings("redis://example.invalid:6379/0") == []
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in messages] == [logging.INFO, logging.INFO]
    assert messages[0][1].startswith("could not check Redis's appendonly (unknown command 'CONFIG'")
    assert "a cluster needs appendonly yes" in messages[0][1]
    assert "could not check Redis's maxmemory-policy" in messages[1][1]


def test_a_redis_set_as_required_gives_no_warning_and_one_that_is_not_names_each(monkeypatch, caplog):
    good = _Settings({"appendonly": "yes", "maxmemory-policy": "noeviction"})
    monkeypatch.setattr(redis.Redis, "from_url", classmethod(lambda cls, url, **kw: good))
    with caplog.at_level(logging.INFO, logger=redis_replica.__name__):
        assert check_redis_settings("redis://example.invalid:6379/0") == []
    assert not caplog.records

    bad = _Settings({"appendonly": "no", "maxmemory-policy": "allkeys-lru"})
    monkeypatch.setattr(redis.Redis, "from_url", classmethod(lambda cls, url, **kw: bad))
    with caplog.at_level(logging.INFO, logger=redis_replica.__name__):
        warnings = check_redis_settings("redis://example.invalid:6379/0")
    assert [w.split(":")[0] for w in warnings] == [
        "Redis has appendonly no; a cluster needs appendonly yes",
        "Redis has maxmemory-policy allkeys-lru; a cluster needs maxmemory-policy noeviction",
    ]
    assert "evict" in warnings[1]
