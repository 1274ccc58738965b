"""``asyncbk stream``: namespaces and streams from the command line.

Commands (each takes ``--metadata-uri``, the client's TLS and authentication
options, and ``--bookie-racks-file`` / ``--bookie-racks-script``: where its client
locates bookies):

* ``namespaces``, ``create-namespace NS [settings]``, ``namespace-info NS [--json]``,
  ``delete-namespace NS [--force]``;
* ``list NS [--prefix P]``, ``create NS STREAM [settings]``, ``info NS STREAM [--json]``,
  ``delete NS STREAM [--force]``, ``truncate NS STREAM --before POSITION``,
  ``retention NS [STREAM]``;
* ``write NS STREAM``: one record per line of stdin (without its newline), pipelined,
  then a summary;
* ``tail NS STREAM``: records as ``position txid data`` lines or JSON lines, from a
  position, a txid or a time (``--from-time``), following the stream until Ctrl-C
  (or ``--no-follow``: up to the end it had when the command started; ``--count
  N``: N records);
* ``subscriptions NS STREAM [--json]`` (positions and lag), ``subscribe NS STREAM
  NAME`` (print and acknowledge), ``seek-subscription NS STREAM NAME --position P |
  --time T``, ``delete-subscription NS STREAM NAME [--force]``.

Deleting asks on a terminal and needs ``--force`` otherwise.  Errors are one line
saying what to do.

The parsers are in ``args``; the admin commands (namespaces, streams) in ``admin``;
``write`` and ``tail`` in ``data``; the subscription commands in ``subs``; a stream's
segments as rows in ``segments``;
errors, confirmation and stdout handling in ``common``.  This module registers the
command (``add_parser``), checks the arguments, connects to the cluster and runs the
command (``run``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ...errors import BKError
from ...stream.meta import check_namespace_name, check_stream_name
from ..common import (
    CliError,
    DefaultsFormatter,
    Parser,
    Subparsers,
    add_log_options,
    client_options,
    configure_logging,
    connect_client,
    require_cluster,
    run_async,
)
from . import admin, data, subs
from .args import RACK_OPTIONS, add_commands
from .common import explain, stdout_gone

__all__ = ["add_commands", "add_parser", "rack_options", "run"]


def rack_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ClientConfig settings of ``--bookie-racks-file`` and ``--bookie-racks-script``
    given, checked, the rack file read and parsed: ConfigError (naming ``file:line``
    for a bad line) before anything is contacted.  Blocking: call it before the event
    loop runs."""
    return client_options(args, RACK_OPTIONS)


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """``asyncbk stream`` and its commands (see :func:`.args.add_commands`)."""
    p = sub.add_parser("stream", help="namespaces and streams: create, list, info, write, "
                       "tail, subscribe, truncate, delete",
                       description="Namespaces and streams (see docs/streams.md): create, "
                       "list and delete them, write stdin lines as records, tail records as "
                       "text or JSON, show segments, truncate.")
    stsub = p.add_subparsers(dest="stream_command", metavar="STREAM_COMMAND",
                             parser_class=Parser)
    add_commands(stsub, add_log_options, DefaultsFormatter)
    return p


async def _run(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """Connect to the cluster (``options``: ClientConfig fields) and run
    ``args.stream_command``: ``namespaces`` and ``create-namespace`` on the client, the
    others on the namespace ``args.namespace``."""
    from ...stream.client import BookKeeper

    cmd = args.stream_command
    async with await connect_client(args, options, BookKeeper) as bk:
        await require_cluster(bk, args.metadata_uri)
        if cmd in admin.ON_CLUSTER:
            return await admin.ON_CLUSTER[cmd](bk, args)
        # `write --create` creates what is missing, the namespace (with its defaults)
        # as the stream, as `bk.namespace(name, create=True)` does
        create = cmd == "write" and args.create
        ns = await bk.namespace(args.namespace, create=create)
        command = admin.ON_NAMESPACE.get(cmd) or data.ON_NAMESPACE.get(cmd) \
            or subs.ON_NAMESPACE.get(cmd)
        return 0 if command is None else await command(ns, args)


def run(args: argparse.Namespace) -> int:
    """``asyncbk stream COMMAND``: see the package docstring."""
    if args.stream_command is None:
        raise CliError("choose a command: asyncbk stream --help")
    if hasattr(args, "namespace"):  # bad names fail before anything is contacted
        check_namespace_name(args.namespace)
    if getattr(args, "stream", None) is not None:  # (retention's is optional)
        check_stream_name(args.stream)
    if args.stream_command == "truncate" and args.before.is_marker():
        raise CliError("--before needs a position SEGMENT:ENTRY:SLOT (as tail and info "
                       "print them), not earliest or latest")
    if args.stream_command == "retention" and args.metrics_port is not None \
            and not args.every:
        raise CliError("--metrics-port needs --every (a retention service)")
    if args.stream_command == "write" and args.with_txid and args.txid is not None:
        raise CliError("--txid and --with-txid exclude each other: with --with-txid each "
                       "line gives its txid")
    options = rack_options(args)  # a bad rack file: before anything is contacted
    configure_logging(args, "warning")

    async def go() -> int:
        try:
            return await _run(args, options)
        except BKError as exc:
            raise explain(exc, args) from None

    try:
        code = run_async(go)
        sys.stdout.flush()
    except BrokenPipeError:  # `asyncbk stream ... | head`: the reader has seen enough
        stdout_gone()
        return 0
    return code
