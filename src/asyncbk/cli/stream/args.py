"""The ``asyncbk stream`` subcommands' arguments: the parsers, their value types and
the stream settings (``--ensemble-size`` ... ``--retention-s``) that
``create-namespace`` and ``create`` take."""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Callable
from typing import Any

from ...meta.model import DIGESTS
from ...stream.meta import StreamConfig
from ...stream.position import Position
from ...topology import POLICIES, RACK_FILE_FORMAT
from ..common import non_negative_float, non_negative_int, positive_int
from ..security import add_client_security_options

_DEFAULTS = StreamConfig()

# ------------------------------------------------------------------ argument types


def _size(text: str) -> int:
    """Bytes, with an optional binary suffix: 4096, 64K, 256M, 1G (0 turns it off)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    factor = 1
    if t and t[-1] in "KMGT":
        factor = 1024 ** ("KMGT".index(t[-1]) + 1)
        t = t[:-1]
    try:
        value = int(t) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected bytes (e.g. 268435456, 256M, 1G), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


_positive = positive_int
_non_negative = non_negative_int
_seconds = non_negative_float


def _position(text: str) -> Position:
    try:
        return Position.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _time_ms(text: str) -> int:
    """A time: milliseconds since the epoch, or ISO 8601 (``2026-11-27T09:00:00Z``,
    ``2026-11-27 09:00+01:00``; without an offset: UTC)."""
    t = text.strip()
    if t.isdigit():
        return int(t)
    try:
        when = datetime.datetime.fromisoformat(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a time as milliseconds since the epoch or ISO 8601 "
            f"(e.g. 2026-11-27T09:00:00Z), got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    ms = int(when.timestamp() * 1000)
    if ms < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is before 1970")
    return ms


def _subscription_name(text: str) -> str:
    from ...stream.subscription import check_subscription_name

    try:
        return check_subscription_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ------------------------------------------------------------------ the parser

SETTINGS: list[tuple[str, str, Callable[[str], Any], str, str]] = [
    # flag, StreamConfig field, type, metavar, help
    ("--ensemble-size", "ensemble_size", _positive, "E",
     "bookies each segment's ledger is striped over"),
    ("--write-quorum", "write_quorum", _positive, "QW", "bookies each entry is written to"),
    ("--ack-quorum", "ack_quorum", _positive, "QA",
     "bookies that must have made an entry durable before its records are acknowledged"),
    ("--digest", "digest", str, "DIGEST", f"digest of each entry ({', '.join(DIGESTS)})"),
    ("--rolling-bytes", "rolling_bytes", _size, "BYTES",
     "start a new segment after this many bytes of records (suffixes K, M, G; 0: never)"),
    ("--rolling-s", "rolling_s", _seconds, "SECONDS",
     "start a new segment after this long (0: never)"),
    ("--rolling-entries", "rolling_entries", _non_negative, "RECORDS",
     "start a new segment after this many records (0: never)"),
    ("--retention-s", "retention_s", _seconds, "SECONDS",
     "drop segments completed longer ago than this (0: keep them until truncated)"),
    ("--placement-policy", "placement_policy", str, "POLICY",
     f"how each segment's bookies are chosen ({', '.join(POLICIES)}); see "
     "docs/placement.md"),
    ("--min-racks-per-write-quorum", "min_racks_per_write_quorum", _positive, "N",
     "rack- and region-aware: racks every write set spans at least"),
    ("--min-regions-per-write-quorum", "min_regions_per_write_quorum", _positive, "N",
     "region-aware: regions every write set spans at least"),
    ("--enforce-placement", "enforce_placement", bool, "",
     "fail to start a segment whose write sets cannot span the minimum racks/regions, "
     "rather than place it with less spread and a warning (--no-enforce-placement: "
     "place it anyway)"),
    ("--backlog-quota-bytes", "backlog_quota_bytes", _size, "BYTES",
     "a subscription holds back retention and truncation until its backlog exceeds this "
     "(suffixes K, M, G; 0: no limit)"),
    ("--backlog-quota-s", "backlog_quota_s", _seconds, "SECONDS",
     "... or until the oldest segment it holds is older than this (0: no limit)"),
    ("--subscription-ack-interval-s", "subscription_ack_interval_s", _seconds, "SECONDS",
     "how often a consumer persists its acknowledgements (one metadata write per "
     "subscription per interval at most)"),
    ("--offload-after-s", "offload_after_s", _seconds, "SECONDS",
     "tiered storage: `asyncbk offload` copies segments completed longer ago than this to "
     "the object store (0: not by age)"),
    ("--offload-after-bytes", "offload_after_bytes", _size, "BYTES",
     "tiered storage: ... and the oldest while the stream keeps more than this on the "
     "bookies alone (suffixes K, M, G; 0: no bound)"),
    ("--offload-deletion-lag-s", "offload_deletion_lag_s", _seconds, "SECONDS",
     "tiered storage: how long an offloaded segment's ledger stays on the bookies"),
]
"""The stream settings ``create-namespace`` takes (its streams' defaults) and
``create`` may override."""

def _add_settings(p: argparse.ArgumentParser, for_stream: bool) -> None:
    for flag, field, kind, metavar, text in SETTINGS:
        choices = DIGESTS if field == "digest" else \
            POLICIES if field == "placement_policy" else None
        default = None if for_stream else getattr(_DEFAULTS, field)
        if for_stream:
            text = f"{text} (default: the namespace's)"
        elif default is None:
            text = f"{text} (default: the {field} of the client writing the segment)"
        if kind is bool:
            p.add_argument(flag, dest=field, action=argparse.BooleanOptionalAction,
                           default=default, help=text)
        else:
            p.add_argument(flag, dest=field, type=kind, metavar=metavar, default=default,
                           choices=choices, help=text)


RACK_OPTIONS = ("bookie_racks_file", "bookie_racks_script")
"""The ClientConfig fields of :func:`add_rack_options`' options (of the same names)."""


def add_rack_options(p: argparse.ArgumentParser) -> None:
    """Where this command's client locates bookies: ``--bookie-racks-file`` and
    ``--bookie-racks-script``.  (The placement options of ``create`` and
    ``create-namespace``, ``--placement-policy`` and the others, are stream settings:
    not this client's, whose placement is the namespace's or the stream's.)"""
    p.add_argument("--bookie-racks-file", metavar="FILE", default=None,
                   help=f"locate bookies by this file, lines {RACK_FILE_FORMAT.split(',')[0]} "
                   "('#' comments; a host matches any port), winning over "
                   "--bookie-racks-script and the bookies' --rack; see docs/placement.md "
                   "(default: none)")
    p.add_argument("--bookie-racks-script", metavar="COMMAND", default=None,
                   help="locate bookies by running COMMAND with bookie hosts as arguments; it "
                   "prints one location per host (default: none)")


def add_commands(sub: Any, add_log_options: Callable[[argparse.ArgumentParser], None],
                 formatter: type[argparse.HelpFormatter]) -> None:
    """The ``asyncbk stream`` subcommands, on the subparsers ``sub``."""

    def command(name: str, help_text: str, description: str = "") -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(
            name, help=help_text, description=description or help_text,
            formatter_class=formatter)
        p.add_argument("--metadata-uri", required=True,
                       help="required: the cluster, etcd://host:port[,host:port...]/<root>")
        add_client_security_options(p)
        add_rack_options(p)
        add_log_options(p)
        return p

    def names(p: argparse.ArgumentParser, stream: bool = True) -> None:
        p.add_argument("namespace", metavar="NS", help="namespace name")
        if stream:
            p.add_argument("stream", metavar="STREAM", help="stream name (may contain '/')")

    command("namespaces", "list the namespaces")
    p = command("create-namespace", "create a namespace with the defaults of its streams",
                "Create a namespace. Its settings are the defaults of the streams created "
                "in it (each stream may override them).")
    names(p, stream=False)
    _add_settings(p, for_stream=False)
    p = command("namespace-info", "a namespace's settings (its streams' defaults)",
                "A namespace's settings: the defaults of its streams, placement included "
                "(a placement setting it leaves out is the writing client's), and how "
                "many streams it has.")
    names(p, stream=False)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p = command("delete-namespace", "delete a namespace (and, with --force, its streams)",
                "Delete a namespace. One that still has streams is deleted with them only "
                "after confirmation on a terminal, or with --force.")
    names(p, stream=False)
    p.add_argument("--force", action="store_true",
                   help="also delete its streams, without asking (required when stdin is "
                   "not a terminal)")

    p = command("list", "list the streams of a namespace")
    names(p, stream=False)
    p.add_argument("--prefix", default="", help="only streams whose name starts with this")
    p = command("create", "create a stream", "Create an empty stream. Settings not given "
                "are the namespace's.")
    names(p)
    _add_settings(p, for_stream=True)
    p = command("info", "a stream's settings and segments",
                "A stream's settings and its segments: number, ledger, state, first and "
                "last position, first and last txid, records, bytes. For the open segment, "
                "what is durable so far.")
    names(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p = command("delete", "delete a stream and its segments' ledgers",
                "Delete a stream: fences its writer, removes it, deletes its segments' "
                "ledgers. Asks first unless --force.")
    names(p)
    p.add_argument("--force", action="store_true",
                   help="delete without asking (required when stdin is not a terminal)")
    p = command("truncate", "drop the segments wholly before a position",
                "Drop the completed segments whose records all lie before POSITION, and "
                "their ledgers, as far as the stream's subscriptions have acknowledged them "
                "(or their backlog quota lets them go). The open segment and the last one "
                "are never dropped.")
    names(p)
    p.add_argument("--before", type=_position, required=True, metavar="POSITION",
                   help="required: SEGMENT:ENTRY:SLOT, as tail and info print it")
    p.add_argument("--force", action="store_true",
                   help="also drop segments a subscription has not acknowledged (its "
                   "consumer's next read then fails with a truncation error)")

    p = command("retention", "drop segments older than their stream's retention_s",
                "Apply retention now: drop the completed segments (and their ledgers) "
                "completed longer ago than the stream's retention_s, in STREAM or in every "
                "stream of the namespace. Writers do this when they open and roll; run "
                "this (e.g. from cron, or as a service with --every) for streams that no "
                "writer writes any more. Segments a subscription has not acknowledged "
                "stay until its backlog quota is exceeded.")
    p.add_argument("namespace", metavar="NS", help="namespace name")
    p.add_argument("stream", nargs="?", metavar="STREAM",
                   help="one stream (default: every stream of it)")
    p.add_argument("--every", type=_seconds, default=0.0, metavar="SECONDS",
                   help="run again every SECONDS until Ctrl-C, measuring each subscription's "
                   "lag too (default: 0, once)")
    p.add_argument("--metrics-port", type=_non_negative, default=None, metavar="PORT",
                   help="with --every: serve GET /metrics (Prometheus) on this port: the "
                   "subscriptions' lag gauges and eviction counters, see docs/admin.md "
                   "(default: none)")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                   help="the address --metrics-port listens on")
    p = command("write", "write stdin to a stream, one record per line",
                "Write each line of stdin as one record (without its newline; an empty "
                "line is an empty record), pipelined: many records are in flight and "
                "batched into ledger entries. Prints a summary once every record is "
                "durable. Each run opens a new writer, which fences any other writer "
                "of the stream and starts a new segment.")
    names(p)
    p.add_argument("--create", action="store_true",
                   help="create the stream first if it does not exist (and its namespace, "
                   "with the default settings, if that does not exist either)")
    p.add_argument("--txid", type=_non_negative, default=None, metavar="TXID",
                   help="txid of the first record, the next ones counting up from it "
                   "(default: the stream's last txid + 1)")
    p.add_argument("--with-txid", action="store_true",
                   help="each line is 'TXID DATA' (one space or tab between): the record "
                   "is DATA with that txid")
    p.add_argument("--end", action="store_true",
                   help="after the last line, end the stream: readers stop there and no "
                   "writer can open it again")
    p = command("tail", "print a stream's records, following it",
                "Print records as 'POSITION TXID DATA' lines (DATA as text when it is "
                "UTF-8 without control characters other than tab, else 'hex:' and its hex "
                "digits) or as JSON lines. Follows the stream until Ctrl-C unless --no-follow "
                "or --count.")
    names(p)
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from", dest="start", type=_position, default=Position.EARLIEST,
                       metavar="POSITION",
                       help="SEGMENT:ENTRY:SLOT, 'earliest' or 'latest' (only new records)")
    start.add_argument("--txid", type=_non_negative, default=None, metavar="TXID",
                       help="start at the first record whose txid is >= TXID (default: "
                       "use --from)")
    start.add_argument("--from-time", dest="from_time", type=_time_ms, default=None,
                       metavar="TIME",
                       help="start at the first record whose timestamp is at or after TIME: "
                       "ms since the epoch or ISO 8601 (2026-11-27T09:00:00Z; no offset: "
                       "UTC) (default: use --from)")
    p.add_argument("--json", action="store_true",
                   help='JSON lines: {"position", "txid", "timestamp_ms", "data"} and, '
                   'when the record has them, "key" and "headers" ("data" null and '
                   '"data_hex" when the data is not UTF-8; keys and header values as '
                   'text or "hex:..." likewise)')
    p.add_argument("--count", type=_positive, default=None, metavar="N",
                   help="stop after N records (default: no limit)")
    p.add_argument("--no-follow", action="store_true",
                   help="stop at the end the stream had when the command started")

    p = command("subscriptions", "a stream's subscriptions and how far behind they are",
                "List the subscriptions (durable cursors) of a stream: where each resumes "
                "(the first record not acknowledged), its lag in records, bytes and "
                "seconds (age of that record), its consumer epoch, and whether retention "
                "dropped records it had not acknowledged (backlog quota).")
    names(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p = command("subscribe", "consume a subscription: print its records and acknowledge "
                "them",
                "Consume the subscription NAME of STREAM (created at --start if it does "
                "not exist, else taken over from its consumer): print each record as tail "
                "does and acknowledge it; acknowledgements are persisted every "
                "subscription_ack_interval_s and when the command stops. Runs until "
                "Ctrl-C, --count records, or (with --no-follow) the end the stream had "
                "when it started.")
    names(p)
    p.add_argument("name", metavar="NAME", type=_subscription_name, help="subscription name")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--start", type=_position, default=Position.EARLIEST,
                       metavar="POSITION",
                       help="where a new subscription starts: SEGMENT:ENTRY:SLOT, 'earliest' "
                       "or 'latest' (ignored when it exists)")
    start.add_argument("--start-time", dest="start_time", type=_time_ms, default=None,
                       metavar="TIME", help="a new subscription starts at the first record "
                       "at or after TIME (ms or ISO 8601) (default: use --start)")
    p.add_argument("--json", action="store_true", help="JSON lines, as tail --json")
    p.add_argument("--count", type=_positive, default=None, metavar="N",
                   help="stop after N records (default: no limit)")
    p.add_argument("--no-follow", action="store_true",
                   help="stop at the end the stream had when the command started")
    p = command("seek-subscription", "move a subscription to a position or a time",
                "Move the subscription NAME to POSITION or to the first record at or after "
                "TIME, backwards or forwards. Its consumer, if any, is fenced (its next "
                "acknowledgement fails) and must subscribe again.")
    names(p)
    p.add_argument("name", metavar="NAME", type=_subscription_name, help="subscription name")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--position", type=_position, metavar="POSITION",
                       help="SEGMENT:ENTRY:SLOT, 'earliest' or 'latest' (required: this or "
                       "--time)")
    where.add_argument("--time", dest="time_ms", type=_time_ms, metavar="TIME",
                       help="the first record at or after TIME: ms since the epoch or ISO "
                       "8601 (required: this or --position)")
    p = command("delete-subscription", "delete a subscription",
                "Delete the subscription NAME: retention no longer waits for it, and its "
                "consumer, if any, is fenced. Asks first unless --force.")
    names(p)
    p.add_argument("name", metavar="NAME", type=_subscription_name, help="subscription name")
    p.add_argument("--force", action="store_true",
                   help="delete without asking (required when stdin is not a terminal)")

