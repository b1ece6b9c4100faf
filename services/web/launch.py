"""Start the app on its malloc: `python -m services.web.launch app.py --headless --port 8000`.

A process's malloc is chosen when it starts (LD_PRELOAD), before any Python
runs, so APP_ALLOCATOR cannot be applied from inside `chainlit run`. This
launcher reads the settings, sets the preload (services/memory/allocators.py)
and replaces itself with `python -m chainlit run <arguments>`. scripts/run.sh,
the Dockerfile and the test and bench servers (harness/server.py) start the
app this way; plain `chainlit run app.py` still works, on glibc.
"""

from __future__ import annotations

import logging
import os
import sys

from services.config import Settings, SettingsError
from services.memory import app_memory_env


def launch_command(arguments: list[str]) -> list[str]:
    """`chainlit run` with `arguments`, on this interpreter."""
    return [sys.executable, "-m", "chainlit", "run", *arguments]


def main(arguments: list[str]) -> None:
    """Apply APP_ALLOCATOR to the environment and exec `chainlit run` (never returns)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env()
    except SettingsError as error:
        sys.exit(f"Invalid setting: {error}")
    env = {**os.environ, **app_memory_env(settings)}
    command = launch_command(arguments)
    os.execve(command[0], command, env)


if __name__ == "__main__":
    main(sys.argv[1:])
