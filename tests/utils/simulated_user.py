"""app.py in NiceGUI's user simulation: the one body of the test modules' `user` fixtures."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from nicegui.testing import User
from nicegui.testing.general_fixtures import get_path_to_main_file
from nicegui.testing.user_simulation import user_simulation


@asynccontextmanager
async def simulated_app_user(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture | None = None
) -> AsyncIterator[User]:
    """Run app.py in the simulation; with `caplog`, fail the test on ERROR logs of its call phase.

    The failure is raised only once the simulation has shut down: raised inside it, it skips
    NiceGUI's shutdown (its lifespan has no `finally`), the app stays "started", its background
    tasks keep running, and every later simulated test errors with "Unable to register another
    startup handler".
    """
    async with user_simulation(main_file=get_path_to_main_file(request)) as simulated:
        yield simulated
    if caplog is None:
        return
    errors = [
        r.getMessage()
        for r in caplog.get_records("call")
        if r.levelno >= logging.ERROR and not _is_simulated_drawer_timeout(r)
    ]
    if errors:
        pytest.fail(f"There were unexpected ERROR logs: {errors}", pytrace=False)


def _is_simulated_drawer_timeout(record: logging.LogRecord) -> bool:
    """The simulation's race on a drawer opened with `value=None` (ui/frame.py's left drawer).

    Such a drawer asks the browser whether it is open as soon as the page connects. The simulated
    `User` answers that request from a patch it installs on the page's outbox *after* the connect
    handshake; on a busy machine the outbox can send the request before the patch is in place, the
    answer never comes and NiceGUI logs "JavaScript did not respond" from `drawer.py`. A browser
    always answers (the e2e tests open the same pages in Chromium), so this record says nothing
    about the app; any other JavaScript timeout still fails the test.
    """
    if not record.getMessage().startswith("JavaScript did not respond") or not record.exc_info:
        return False
    tb = record.exc_info[2]
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "_request_value" and code.co_filename.endswith("drawer.py"):
            return True
        tb = tb.tb_next
    return False
