"""The command line's account changes, seen by an app already running on the same data folder.

`python app.py users promote NAME` (or `passwd`) runs in a process of its own. In a cluster it tells the
running replicas with a notice (`core/db_events.py`); a single app (`CLUSTER` off) listens to none, and it
keeps the accounts' rows and who is an admin in memory (`AuthState`), so a promotion made there reached
the API and the pages only after a restart, although the app's own 403 tells the user to run it.

The command line touches a file in the data folder after each change it made (`AccountsMark.touch`); the
running app compares the file's modification time at each look-up of a kept account (`moved`: one
`stat`, about a microsecond) and forgets what it kept when it moved. Both must use the same `DATA_DIR`
(they do when run from the same folder with the same settings, which is also how they find the same
SQLite file). docs/ARCHITECTURE.md, "Accounts kept in memory".
"""

from __future__ import annotations

import os
import time
from pathlib import Path

FILE_NAME = ".accounts-changed"


class AccountsMark:
    """A file whose modification time says "an account changed" (see the module docstring)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE_NAME
        self._seen = self._stamp()

    def _stamp(self) -> int:
        try:
            return os.stat(self.path).st_mtime_ns
        except OSError:  # never touched (or the folder is gone): nothing changed elsewhere
            return 0

    def touch(self) -> None:
        """Say an account changed (the command line, after its change is committed)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        # An explicit time in nanoseconds: two changes within the file system's clock tick still differ.
        now = time.time_ns()
        os.utime(self.path, ns=(now, max(now, self._stamp() + 1)))

    def moved(self) -> bool:
        """Whether the file was touched since this was last asked (or since it was made)."""
        stamp = self._stamp()
        if stamp == self._seen:
            return False
        self._seen = stamp
        return True
