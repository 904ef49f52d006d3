"""Registered by the plugin when pytest-playwright runs: its Chromium, where Playwright has none of its own.

Its fixture overrides pytest-playwright's `browser_type_launch_args` (registered after every entry point, it
comes last) and extends it, unless a channel or an executable was chosen: `PLAYWRIGHT_CHROMIUM_EXECUTABLE` when
set, else the system's Chromium when Playwright's own is not installed (`playwright install chromium`), with the
kit's arguments. Otherwise pytest-playwright launches as it always does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from a2a_chat_testing.panel import CHROMIUM_ARGS, chromium_launch_options


@pytest.fixture(scope="session")
def browser_type_launch_args(
    browser_type_launch_args: dict[str, Any], browser_name: str, browser_type: Any
) -> dict[str, Any]:
    """pytest-playwright's launch options, with the Chromium the kit would use when Playwright has none."""
    chosen = {"channel", "executable_path"} & set(browser_type_launch_args)
    if browser_name != "chromium" or chosen:
        return browser_type_launch_args
    executable = os.environ.get("PLAYWRIGHT_CHROMIUM_EXECUTABLE")
    if not executable and not Path(browser_type.executable_path).exists():
        executable = chromium_launch_options().get("executable_path")
    if not executable:
        return browser_type_launch_args
    return {"executable_path": executable, "args": CHROMIUM_ARGS, **browser_type_launch_args}
