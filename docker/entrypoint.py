#!/usr/bin/env python3
"""The image's entrypoint: ``asyncbk ARGS``, with options from the environment.

Every long option of the command being run can also be given as an environment
variable: ``ASYNCBK_`` and the option's name in capitals with dashes as
underscores. ``--metadata-uri`` is ``ASYNCBK_METADATA_URI``, ``--tls-cert`` is
``ASYNCBK_TLS_CERT``, ``--auth-tokens-file`` is ``ASYNCBK_AUTH_TOKENS_FILE``.
A switch (``--autorecovery``, ``--log-json``, ``--tls-require-client-cert``) is
on for ``1``/``true``/``yes``/``on`` and off for ``0``/``false``/``no``/``off``.
An empty variable counts as unset.

The options from the environment go in front of the command line's, so an option
given on the command line wins (an option given on both is taken from the command
line only). The command is the leading words of ARGS: ``bookie``,
``autorecovery``, ``shell simpletest``, ``stream list``, ...

Tokens are never passed this way: a bookie reads its tokens from the file named by
``ASYNCBK_AUTH_TOKENS_FILE``, a client from ``ASYNCBK_AUTH_TOKEN_FILE`` (a file) or
``ASYNCBK_AUTH_TOKEN``, which asyncbk itself reads, so no token is ever in a
command line that ``ps`` shows.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence

PREFIX = "ASYNCBK_"
NOT_FROM_ENV = {"--check-config"}
"""Options a variable never sets: a stray ASYNCBK_CHECK_CONFIG would turn every
container into a dry run that exits at once (give it on the command line)."""
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off"}


class EnvError(Exception):
    """A variable with a value its option cannot take."""


def env_name(option: str) -> str:
    """``--metadata-uri`` -> ``ASYNCBK_METADATA_URI``."""
    return PREFIX + option.lstrip("-").replace("-", "_").upper()


def command_parser(parser: argparse.ArgumentParser,
                   args: Sequence[str]) -> tuple[argparse.ArgumentParser, int]:
    """The parser of the (sub)command that ARGS name, and how many words name it."""
    depth = 0
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or depth >= len(args) or args[depth] not in subs[0].choices:
            return parser, depth
        parser = subs[0].choices[args[depth]]
        depth += 1


def _given(args: Sequence[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def env_options(parser: argparse.ArgumentParser, args: Sequence[str],
                environ: Mapping[str, str]) -> list[str]:
    """ARGS with the options ``environ`` gives the command they name, in front of the
    command's own."""
    cmd, depth = command_parser(parser, args)
    if depth == 0:  # no command: `asyncbk --help`, `asyncbk --version`
        return list(args)
    given = _given(args[depth:])
    out: list[str] = []
    for action in cmd._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction,
                               argparse._SubParsersAction)):
            continue
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or given.intersection(action.option_strings) \
                or NOT_FROM_ENV.intersection(longs):
            continue
        option = longs[0]
        name = env_name(option)
        value = environ.get(name, "").strip()
        if not value:
            continue
        if action.nargs == 0:  # a switch
            if value.lower() in TRUE:
                out.append(option)
            elif value.lower() not in FALSE:
                raise EnvError(f"{name} must be true or false (1/0, yes/no, on/off), "
                               f"not {value!r}")
        elif action.nargs in (None, "?"):
            out += [option, value]
        else:  # several values: split like a shell would
            out += [option, *shlex.split(value)]
    return [*args[:depth], *out, *args[depth:]]


def build_argv(args: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """ARGS with the options from ``environ`` in place."""
    from asyncbk.cli.main import build_parser

    return env_options(build_parser(), list(args), environ)


def main() -> None:
    try:
        argv = build_argv(sys.argv[1:], os.environ)
    except EnvError as exc:
        sys.stderr.write(f"asyncbk-entrypoint: error: {exc}\n")
        sys.exit(2)
    from asyncbk.cli.main import main as asyncbk_main

    asyncbk_main(argv)


if __name__ == "__main__":
    main()
