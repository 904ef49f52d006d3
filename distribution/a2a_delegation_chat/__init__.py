"""A2A delegation chat as an installed package: one import name, the app inside it as the repository lays it out.

    a2a-delegation-chat                      serve (HOST/PORT, default 127.0.0.1:3100)
    a2a-delegation-chat users add NAME       the accounts commands of `python app.py users ...`
    a2a-delegation-chat migrate              upgrade the database and exit
    a2a-delegation-chat pipe URL -- CMD ...  the agent-side pipe (`python -m core.pipe` in a checkout)
    a2a-delegation-chat echo-agent           the example stdio agent (examples/echo_agent.py)
    python -m a2a_delegation_chat ...        the same

The built wheel (scripts/build-package) holds `app.py`, `core/`, `ui/`, `models/`, `assets/`, `config/` and
`examples/` inside this package's folder, so the only name it adds to an environment is `a2a_delegation_chat`.
`main` puts that folder at the front of `sys.path` of the app's own process, where the app's modules import one
another as they do in a checkout (`import core.settings`); nothing else in the environment sees them.
In a checkout (`pip install -e .`) this file is `distribution/a2a_delegation_chat/__init__.py` and the folder is
the repository's root. docs/ARCHITECTURE.md, "Packaging", says why.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

__all__ = ["APP_DIR", "main"]

_HERE = Path(__file__).resolve().parent
# Installed: app.py is beside this file. A checkout: the repository's root, two folders up.
APP_DIR = _HERE if (_HERE / "app.py").is_file() else _HERE.parent.parent


def main(argv: list[str] | None = None) -> None:
    """The console script `a2a-delegation-chat`: serve, or run one of `python app.py`'s commands."""
    args = sys.argv[1:] if argv is None else list(argv)
    if str(APP_DIR) not in sys.path:
        sys.path.insert(0, str(APP_DIR))
    if args[:1] == ["pipe"]:
        from core.pipe import main as pipe_main

        pipe_main(args[1:])
        return
    if args[:1] == ["echo-agent"]:
        sys.argv = [str(APP_DIR / "examples" / "echo_agent.py"), *args[1:]]
        runpy.run_path(sys.argv[0], run_name="__main__")
        return
    from core.process import exit_quietly_on_stop_signals

    if "NICEGUI_USER_SIMULATION" not in os.environ:
        exit_quietly_on_stop_signals()  # what `python app.py` does before it starts
    import app

    app.main(args)
