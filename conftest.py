"""Project-wide pytest plugins (a root conftest, so `pytest e2e` alone loads them too)."""

pytest_plugins = ["nicegui.testing.user_plugin"]
