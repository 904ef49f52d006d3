"""Secrets at rest: what the app stores that would let someone act as a user or reach a remote agent.

- Secrets the app must read back (a remote agent's bearer token) are encrypted with Fernet
  (AES-128-CBC and HMAC-SHA256, from the `cryptography` package) before they are written. The key
  is `SECRET_KEY` from the environment when set, else a key generated once into
  `DATA_DIR/.secret_key` (mode 0600). A database copied without that file (a backup, a dump) does
  not give the tokens away. Stored values read `fernet:<token>`; older plain values are still read,
  and `seal` them again at start (`RemoteAgentDirectory.seal_stored_tokens`).
- Secrets the app only checks (passwords, API keys) are hashed elsewhere and never stored.
- Files: a new `DATA_DIR` is made 0700, and the SQLite database with its WAL and shared-memory files
  0600 (SQLite gives the WAL files the database file's mode).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from core.errors import AppError

log = logging.getLogger(__name__)

SEALED_PREFIX = "fernet:"
KEY_FILE = ".secret_key"


class SecretUnreadableError(AppError, ValueError):
    """A stored secret that this key cannot open (another `SECRET_KEY`, or a lost key file)."""

    code = "secret_unreadable"


def write_private_file(path: Path, text: str) -> None:
    """Create `path` readable by this user only (0600) from the first byte, and write `text`.

    A missing folder is made 0700 (it is `DATA_DIR`).
    """
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text)
    path.chmod(0o600)  # an existing file keeps its old mode through O_CREAT


def make_data_dir_private(data_dir: Path) -> None:
    """A new `DATA_DIR` is made 0700, and the app's files in it 0600 (they hold every chat).

    An existing `DATA_DIR` that others can open is only warned about: it may be shared on purpose.
    """
    if not data_dir.exists():
        data_dir.mkdir(parents=True, mode=0o700)
        data_dir.chmod(0o700)  # mkdir's mode is filtered through the umask
    elif data_dir.stat().st_mode & 0o077:
        log.warning(
            "DATA_DIR %s can be read by other users of this machine; it holds every chat and the "
            "keys: run chmod 700 %s",
            data_dir,
            data_dir,
        )
    for name in ("app.db", "app.db-wal", "app.db-shm", "app.db-journal", KEY_FILE, ".storage_secret"):
        path = data_dir / name
        if path.exists():
            path.chmod(0o600)


class SecretBox:
    """Seals and opens secrets that the app stores and must read back.

    Args:
        key: the Fernet key (32 url-safe base64 bytes); any other text is stretched into one.
    """

    def __init__(self, key: str) -> None:
        try:
            self._fernet = Fernet(key.encode())
        except ValueError:
            self._fernet = Fernet(base64.urlsafe_b64encode(hashlib.sha256(key.encode()).digest()))

    @classmethod
    def for_data_dir(cls, data_dir: Path, secret_key: str | None = None) -> SecretBox:
        """`secret_key` if given, else the key in `DATA_DIR/.secret_key`, made on first use."""
        if secret_key:
            return cls(secret_key)
        path = data_dir / KEY_FILE
        if not path.is_file():
            write_private_file(path, Fernet.generate_key().decode())
        return cls(path.read_text(encoding="utf-8").strip())

    @staticmethod
    def is_sealed(stored: str) -> bool:
        """True for a value written by `seal`."""
        return stored.startswith(SEALED_PREFIX)

    def seal(self, secret: str) -> str:
        """The value to store for `secret`."""
        return SEALED_PREFIX + self._fernet.encrypt(secret.encode("utf-8")).decode("ascii")

    def open(self, stored: str) -> str:
        """The secret a stored value holds (a plain value from before encryption is returned as it is).

        Raises:
            SecretUnreadableError: it was sealed with another key.
        """
        if not self.is_sealed(stored):
            return stored
        try:
            return self._fernet.decrypt(stored.removeprefix(SEALED_PREFIX).encode("ascii")).decode("utf-8")
        except InvalidToken:
            raise SecretUnreadableError(
                "a stored secret cannot be opened with this key: was SECRET_KEY changed, or DATA_DIR/.secret_key lost?"
            ) from None


class LazySecretBox:
    """A `SecretBox` for `DATA_DIR` whose key file is made on first use, not when the services are built."""

    def __init__(self, data_dir: Path, secret_key: str | None = None) -> None:
        self.data_dir = data_dir
        self.secret_key = secret_key
        self._box: SecretBox | None = None

    @property
    def box(self) -> SecretBox:
        """The box (made now if it was not yet)."""
        if self._box is None:
            self._box = SecretBox.for_data_dir(self.data_dir, self.secret_key)
        return self._box

    def seal(self, secret: str) -> str:
        """See `SecretBox.seal`."""
        return self.box.seal(secret)

    def open(self, stored: str) -> str:
        """See `SecretBox.open` (raises `SecretUnreadableError`)."""
        return self.box.open(stored)
