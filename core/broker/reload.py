"""Hot reload of `config/server.json` (seed 003: the JSON file is hot-reloaded).

When the file changes, the whole configuration is loaded again exactly as at
start-up (environment > `.env` > the file > defaults) and validated. A bad edit
(not JSON, a wrong type, a public key that does not parse) is rejected with the
reason logged, and the last good configuration stays in force. A good edit
applies the keys that changed in the file and that the broker reads live;
`port`, `host`, `redis` and the rest are only read at start-up, so a change to
them is logged as needing a restart.

Only the keys that changed *in the file* are applied, so values given another
way (the environment, or overrides in code) are not reset by an unrelated edit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

from core.broker.auth import check_public_keys
from core.settings import DEFAULT_CONFIG_FILE, Settings, load_config_file, load_settings

log = logging.getLogger(__name__)

HOT_KEYS = frozenset(
    {
        "request_timeout",
        "task_idle_timeout",
        "inject_min_interval",
        "auth",
        "blacklist_ip",
        "broker_max_line_bytes",
    }
)
DEBOUNCE_MS = 100


def config_path() -> Path:
    """The JSON config file the settings are read from (`$CONFIG_FILE` or `config/server.json`)."""
    return Path(os.environ.get("CONFIG_FILE") or DEFAULT_CONFIG_FILE)


class ConfigReloader:
    """Watches the config file and applies good edits to the live settings object."""

    def __init__(self, settings: Settings, path: Path | None = None) -> None:
        self.settings = settings
        self.path = path or config_path()
        self.reloads = 0
        self.rejected = 0
        self.last_reload_at: float | None = None
        self.last_error: str | None = None
        self._file: dict[str, Any] = {}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def watching(self) -> bool:
        """True while the watcher runs."""
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Start watching, if the file exists (no file, nothing to reload)."""
        if not self.path.is_file():
            log.debug("no config file at %s: hot reload is off", self.path)
            return
        try:
            self._file = load_config_file(self.path)
        except ValueError as exc:  # start-up already loaded it; a race with an editor at most
            self._file = {}
            log.warning("config %s: %s", self.path, exc)
        self._stop.clear()
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="config reload")

    async def stop(self) -> None:
        """Stop watching."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 2.0)
            self._task = None

    async def _watch(self) -> None:
        from watchfiles import awatch

        name = self.path.name
        try:
            async for _ in awatch(
                self.path.parent,
                watch_filter=lambda _change, p: Path(p).name == name,
                debounce=DEBOUNCE_MS,
                step=20,
                stop_event=self._stop,
                recursive=False,
            ):
                self.reload()
        except Exception:
            log.exception("config watcher for %s stopped", self.path)

    def reload(self) -> list[str]:
        """Load and apply the file now; returns the keys applied (none when the edit is rejected)."""
        try:
            raw = load_config_file(self.path)
            fresh = load_settings()
            if fresh.auth.mode == "jwt":
                check_public_keys(fresh.auth.public_keys)
        except ValueError as exc:  # includes pydantic's ValidationError
            self.rejected += 1
            self.last_error = f"{exc}"
            log.warning("config %s rejected, keeping the last good configuration: %s", self.path, exc)
            return []
        changed = sorted(k for k in set(raw) | set(self._file) if raw.get(k) != self._file.get(k))
        applied, restart = [], []
        for key in changed:
            if key in HOT_KEYS:
                setattr(self.settings, key, getattr(fresh, key))
                applied.append(key)
            elif key in Settings.model_fields:
                restart.append(key)
        self._file = raw
        self.reloads += 1
        self.last_reload_at = time.time()
        self.last_error = None
        if applied:
            log.info("config %s reloaded: %s", self.path, ", ".join(applied))
        if restart:
            log.warning("config %s: %s changed; restart the app for that to take effect", self.path, ", ".join(restart))
        return applied
