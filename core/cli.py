"""The command line of `python app.py`: its arguments and the commands that do not serve.

    python app.py                      start the app (HOST/PORT, default 127.0.0.1:3100)
    python app.py users add NAME       create an account (asks for the password; --admin: may change agents)
    python app.py users promote NAME   make an account an admin (the first account is one)
    python app.py users passwd NAME    change a password
    python app.py users list           list accounts
    python app.py migrate              upgrade the database and exit (a one-shot step before replicas start)
    python app.py backup DIR           copy the database (SQLite, online) and the key files into DIR

Serving is `app.py`'s own (it wires the pages, which `core` does not know); every other command is here.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import sys

from core.settings import Settings, load_settings


def load_settings_or_exit() -> Settings:
    """The settings, or exit with one line per bad setting."""
    try:
        return load_settings()
    except ValueError as exc:  # pydantic's ValidationError, or a config file that is not JSON
        sys.exit(
            f"error: the settings are not valid; fix the environment, .env or config/server.json:\n"
            f"{_describe_settings_error(exc)}"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command and its arguments (`command` is None: serve)."""
    # The installed console script's own name in its usage line; `python app.py` from a checkout.
    command = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    prog = command if command.startswith("a2a-delegation-chat") else "python app.py"
    parser = argparse.ArgumentParser(prog=prog, description="A2A delegation chat and hub.")
    commands = parser.add_subparsers(dest="command")
    users = commands.add_parser("users", help="manage accounts")
    users_actions = users.add_subparsers(dest="action", required=True)
    add = users_actions.add_parser("add", help="create an account")
    add.add_argument("name")
    add.add_argument("--admin", action="store_true", help="may create, change and delete agents")
    users_actions.add_parser("promote", help="make an account an admin").add_argument("name")
    users_actions.add_parser("passwd", help="change a password").add_argument("name")
    users_actions.add_parser("list", help="list accounts")
    commands.add_parser("migrate", help="upgrade the database schema and exit (run once before the replicas)")
    backup = commands.add_parser("backup", help="copy the database and the key files into a folder, while the app runs")
    backup.add_argument("folder", help="a new or empty folder (created private)")
    return parser.parse_args(argv)


def run_command(settings: Settings, args: argparse.Namespace) -> int:
    """Run the command `args` names (not serving); returns the exit code."""
    if args.command == "users":
        return users_command(settings, args)
    if args.command == "migrate":
        return migrate_command(settings)
    if args.command == "backup":
        return backup_command(settings, args.folder)
    raise ValueError(f"not a command: {args.command!r}")


def backup_command(settings: Settings, folder: str) -> int:
    """`backup DIR`: `core.backup.backup`, then what was written and what is left to the person."""
    from pathlib import Path

    from core.backup import BackupError, backup

    try:
        report = backup(settings, Path(folder))
    except BackupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name in report.written:
        print(f"wrote {report.folder / name}")
    for note in report.notes:
        print(f"note: {note}")
    print(f"to restore: stop the app, then copy the files of {report.folder} into DATA_DIR ({settings.data_dir}).")
    return 0


def migrate_command(settings: Settings) -> int:
    """`migrate`: bring the schema to head (under PostgreSQL's migration lock, so replicas starting meanwhile wait)."""
    from core.db import Database, describe_database

    try:
        Database(settings.database).migrate()
    except Exception as exc:  # the driver's errors: unreachable server, missing rights, ...
        print(f"error: could not migrate {describe_database(settings.database)}: {exc}", file=sys.stderr)
        return 2
    print(f"the database is at the newest schema: {describe_database(settings.database)}")
    return 0


def users_command(settings: Settings, args: argparse.Namespace) -> int:
    """`users add|passwd|list|promote`."""
    from core.admin.service import ACCOUNTS
    from core.auth import accounts
    from core.auth.account_mark import AccountsMark
    from core.db import Database
    from core.db_events import RegistryEvents

    db = Database(settings.database)
    db.migrate()
    # A running app keeps who is an admin in memory: replicas of a cluster are told, as of a change in the
    # admin area; a single app on this data folder sees a file's time move (core/auth/account_mark.py).
    events = RegistryEvents(db, "cli", enabled=settings.cluster)

    async def run() -> int:
        try:
            changed = await change()
            if changed:
                await events.notify(ACCOUNTS, changed, args.action)
                AccountsMark(settings.data_dir).touch()
            return 0
        except accounts.AccountError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        finally:
            await db.close()

    async def change() -> str | None:
        """Do the action; the name of the account it changed, if any."""
        async with db.session() as s:
            if args.action == "list":
                for user in await accounts.list_users(s):
                    kind = "password" if user.password_hash else "single-user mode"
                    print(f"{user.username}\t{kind}" + ("\tadmin" if user.is_admin else ""))
                return None
            if args.action == "promote":
                await accounts.promote(s, username=args.name)
                print(f"{args.name!r} is an admin: may create, change and delete agents")
                return str(args.name)
            password = os.environ.get("APP_USER_PASSWORD") or _ask_password()
            if args.action == "add":
                user = await accounts.create_user(s, username=args.name, password=password, admin=args.admin)
                role = " (admin)" if user.is_admin else ""
                print(f"created user {args.name!r}{role}; restart the app to switch to multi-user mode")
            else:
                await accounts.set_password(s, username=args.name, password=password)
                print(f"changed the password of {args.name!r}")
            return str(args.name)

    return asyncio.run(run())


def _describe_settings_error(exc: ValueError) -> str:
    """One line per bad setting: its name and what is wrong."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return f"  {exc}"
    return "\n".join(
        f"  {'.'.join(str(part) for part in e['loc'])}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()
    )


def _ask_password() -> str:
    first = getpass.getpass("Password: ")
    if getpass.getpass("Repeat: ") != first:
        raise SystemExit("error: the passwords differ")
    return first
