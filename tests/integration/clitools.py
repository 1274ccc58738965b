"""What the command-line tests share: the environment of a CLI child process, and
running the CLI with a terminal as its stdin."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def cli_env() -> dict[str, str]:
    """This process's environment, with the checkout's sources first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    return env


def run_with_terminal(args: list[str], typed: str) -> subprocess.CompletedProcess[str]:
    """Run ``asyncbk ARGS`` with a terminal as stdin, on which ``typed`` is typed."""
    primary, secondary = pty.openpty()
    try:
        with subprocess.Popen([sys.executable, "-m", "asyncbk", *args], stdin=secondary,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=cli_env()) as p:
            os.write(primary, typed.encode())
            out, err = p.communicate(timeout=60)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)
    finally:
        os.close(primary)
        os.close(secondary)
