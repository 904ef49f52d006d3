"""A testing kit for people who test the side panel end to end (docs/TESTING.md).

Its own distribution (`a2a-delegation-chat-testing`; in a checkout it is installed with the app), it is
a pytest plugin (the `pytest11` entry point `a2a-delegation-chat`), so a test suite gets these fixtures
without copying code:

- `chat_app`: the app, started through its console script `a2a-delegation-chat` (installed here or on
  `PATH`; `--chat-app-command` says otherwise), on a free 127.0.0.1 port (`--chat-app-port`), a
  temporary data folder and the offline demo model, one per test or shared (`--chat-app-scope`);
  a `ChatApp` with `base_url`, `data_dir` and a small REST client (`new_session`, `send`,
  `stream`, `task_stream`, `stop`). Settings come from the `chat_app_settings` fixture (override it)
  and the `chat_app_settings(...)` marker, as environment variables (`DEMO_MODEL_DELAY_MS="20"`);
  `chat_app_users` creates accounts first (the client and `chat_page` log in as the first).
- `chat_page`: a Playwright page (Chromium) on that app at 1280×800; `chat_viewport` changes the size.
- `panel`: `panel(page)` gives a `Panel` with helpers that wait for the side panel to open, list its
  tabs with their states, read a tab's text and error, and wait for a state.

It imports nothing of the app (only the standard library, httpx and, in the browser fixtures,
Playwright), so a suite that uses it stays a black-box test of what users run.
"""

from a2a_chat_testing.app import ChatApp, ChatAppError, app_command, free_port, start_chat_app
from a2a_chat_testing.panel import Panel, PanelTab, chromium_launch_options

__all__ = [
    "ChatApp",
    "ChatAppError",
    "app_command",
    "Panel",
    "PanelTab",
    "chromium_launch_options",
    "free_port",
    "start_chat_app",
]
