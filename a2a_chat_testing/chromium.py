"""Registered by the plugin when pytest-playwright runs and `PLAYWRIGHT_CHROMIUM_EXECUTABLE` is set.

Its fixture overrides pytest-playwright's `browser_type_launch_args` (registered after every entry point, it
comes last) and extends it: that Chromium, with the kit's arguments, unless a channel was chosen.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from a2a_chat_testing.panel import CHROMIUM_ARGS


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any], browser_name: str) -> dict[str, Any]:
    """pytest-playwright's launch options, with `PLAYWRIGHT_CHROMIUM_EXECUTABLE` for Chromium."""
    if browser_name != "chromium" or "channel" in browser_type_launch_args:
        return browser_type_launch_args
    return {
        "executable_path": os.environ["PLAYWRIGHT_CHROMIUM_EXECUTABLE"],
        "args": CHROMIUM_ARGS,
        **browser_type_launch_args,
    }
