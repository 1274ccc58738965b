"""The ``asyncbk`` command line: the top-level parser and the dispatch to each command.

Every command lives in its own module, which registers its parser
(``add_parser(subparsers)``) and runs it (``run(args)``, the exit code); what the
commands share is in :mod:`.common`.  Every command has ``--help``; bad input exits
non-zero with one line on stderr (no traceback); Ctrl-C stops cleanly.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn, Protocol

from .._version import __version__
from . import autorecovery, bench_args, bookie, offload, shell, standalone, stream
from .common import EXIT_USAGE, Parser, Subparsers, one_line_errors


class Command(Protocol):
    """A command module."""

    def add_parser(self, sub: Subparsers) -> argparse.ArgumentParser:
        """Register the command (and its subcommands) on ``sub``."""

    def run(self, args: argparse.Namespace) -> int:
        """Run the command; its exit code."""


COMMANDS: dict[str, Command] = {
    "standalone": standalone,
    "bookie": bookie,
    "autorecovery": autorecovery,
    "offload": offload,
    "bench": bench_args,
    "stream": stream,
    "shell": shell,
}
"""Each command's module, by name, in the order ``--help`` lists them."""


class _VersionAction(argparse.Action):
    """``--version``: the version and which build is installed (compiled or pure)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default,
                         nargs=0, help=help or "show the version and the build, and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> NoReturn:
        from ..build import build_info

        sys.stdout.write(f"asyncbk {__version__} ({build_info().describe()})\n")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="asyncbk", description="asyncbk: an asyncio-native replicated log "
                    "service (bookies, ledgers, metadata in etcd).")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = f"asyncbk {args.command}" if args.command else "asyncbk"
    if args.command == "stream" and args.stream_command:
        prog += f" {args.stream_command}"
    with one_line_errors(prog):
        if args.command is None:
            parser.print_help()
            sys.exit(EXIT_USAGE)
        code = COMMANDS[args.command].run(args)
    sys.exit(code)


if __name__ == "__main__":
    main()
