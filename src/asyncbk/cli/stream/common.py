"""Helpers the ``asyncbk stream`` commands share: errors as one line saying what to
do, record counts in words, confirmation on the terminal before deleting, and a
stdout whose reader has gone."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from ...errors import (
    BKError,
    NamespaceExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchStreamError,
    TruncatedError,
)
from .. import common as cli_common
from ..common import CliError


def explain(exc: BKError, args: argparse.Namespace) -> BKError | CliError:
    """The client's error with what to do next, for the errors a user meets."""
    ns = getattr(args, "namespace", "")
    name = getattr(args, "stream", "")
    if isinstance(exc, NoSuchNamespaceError):
        return CliError(f"no namespace {ns!r}; create it with `asyncbk stream "
                        f"create-namespace {ns}`; `asyncbk stream namespaces` lists them")
    if isinstance(exc, NoSuchStreamError):
        return CliError(f"{exc}; create it with `asyncbk stream create {ns} {name}` (or "
                        f"`write --create`); `asyncbk stream list {ns}` lists the streams")
    if isinstance(exc, NamespaceNotEmptyError):
        return CliError(f"namespace {ns!r} still has streams: delete them first, or add "
                        "--force to delete them with it")
    if isinstance(exc, NamespaceExistsError):
        return CliError(f"namespace {ns!r} exists already")
    if isinstance(exc, TruncatedError) and args.stream_command == "tail":
        return CliError(f"{exc}; start with --from earliest")
    return exc


def records_text(n: int) -> str:
    """``n`` records, in words: "1 record", "12,345 records"."""
    return cli_common.count_text(n, "record")


def stdout_gone() -> None:
    """stdout was closed by its reader (``| head``): stop writing to it, quietly."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


async def confirm(question: str, refusal: str) -> None:
    """Ask ``question`` on the terminal; CliError(``refusal``) unless the answer is yes.
    Without a terminal, refuse at once."""
    await cli_common.confirm(
        question,
        no_terminal=f"{refusal} without confirmation (stdin is not a terminal); add --force",
        declined=f"{refusal}: not confirmed")
