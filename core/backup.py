"""`python app.py backup DIR`: a consistent copy of what the app cannot do without, taken while it runs.

What is copied (docs/ARCHITECTURE.md, "Backups"):

- the SQLite database (`DATA_DIR/app.db`), through SQLite's online backup API: pages are copied while
  the app keeps writing, and the copy is one consistent state of the database (a turn streaming at that
  moment is in it as its draft, which the restored app ends as interrupted, as after any stop);
- the key that seals the stored secrets (`DATA_DIR/.secret_key`): a database without it has API keys
  and tokens no one can open; and the browser sessions' signing secret (`DATA_DIR/.storage_secret`),
  so people stay logged in after a restore. When they come from the environment (`SECRET_KEY`,
  `STORAGE_SECRET`) there is no file: the command says to keep those values with the backup.

With PostgreSQL the database is the server's to back up (`pg_dump`); the command copies the key files
and says so. Restoring is copying the folder's files back into `DATA_DIR` with the app stopped (README,
"Backups").
"""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import make_url

from core.errors import AppError
from core.secret_box import KEY_FILE, write_private_file
from core.settings import Settings

DATABASE_FILE = "app.db"
STORAGE_SECRET_FILE = ".storage_secret"
PAGES_PER_STEP = 1024  # the online backup copies this many pages, then lets the app's writers in again


class BackupError(AppError, RuntimeError):
    """The backup could not be made; the message says why and what to do."""

    code = "backup_failed"


@dataclass
class BackupReport:
    """What `backup` wrote, and what it left to the person (a PostgreSQL dump, keys from the environment)."""

    folder: Path
    written: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def backup(settings: Settings, folder: Path) -> BackupReport:
    """Copy the database (SQLite) and the key files into `folder` (created private; must hold none of them).

    Raises:
        BackupError: the folder already holds a backup, or the database cannot be read.
    """
    report = BackupReport(folder)
    names = [DATABASE_FILE, KEY_FILE, STORAGE_SECRET_FILE]
    clashes = [name for name in names if (folder / name).exists()]
    if clashes:
        raise BackupError(f"{folder} already holds {', '.join(clashes)}: give an empty or new folder.")
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    url = make_url(settings.database)
    if url.get_backend_name() == "sqlite":
        if not url.database or url.database == ":memory:":
            raise BackupError("the database is in memory: there is nothing on disk to back up.")
        _copy_sqlite(Path(url.database), folder / DATABASE_FILE)
        report.written.append(DATABASE_FILE)
    else:
        report.notes.append(
            f"The database is {url.get_backend_name()} on {url.host or 'localhost'}: back it up with its own "
            f"tools (for PostgreSQL: pg_dump --format=custom --file=app.dump {url.database or 'DBNAME'}); "
            "this folder holds the keys that go with it."
        )
    for name, from_env, variable in (
        (KEY_FILE, settings.secret_key, "SECRET_KEY"),
        (STORAGE_SECRET_FILE, settings.storage_secret, "STORAGE_SECRET"),
    ):
        source = settings.data_dir / name
        if from_env:
            report.notes.append(f"{variable} comes from the environment: keep its value with this backup.")
        elif source.exists():
            write_private_file(folder / name, source.read_text(encoding="utf-8"))
            report.written.append(name)
    return report


def _copy_sqlite(source: Path, target: Path) -> None:
    """SQLite's online backup of `source` into `target` (a consistent state, with the app still writing)."""
    if not source.exists():
        raise BackupError(f"there is no database at {source}: is DATA_DIR (or DATABASE_URL) the app's?")
    partial = target.with_name(target.name + ".partial")
    try:
        with closing(sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)) as src:
            with closing(sqlite3.connect(partial)) as dst:
                src.backup(dst, pages=PAGES_PER_STEP)
                problems = dst.execute("PRAGMA integrity_check").fetchone()
        if problems != ("ok",):
            raise BackupError(f"the copy of {source} failed SQLite's integrity check: {problems[0]}")
    except sqlite3.Error as exc:
        partial.unlink(missing_ok=True)
        raise BackupError(f"could not read {source}: {exc}") from exc
    except BackupError:
        partial.unlink(missing_ok=True)
        raise
    partial.chmod(0o600)
    shutil.move(partial, target)
