"""The ``asyncbk`` command line.

Every command has ``--help``; bad input exits non-zero with one line on
stderr (no traceback); Ctrl-C stops cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .._version import __version__
from ..errors import BKError, ConfigError
from . import argtypes
from .security import add_client_security_options, add_etcd_security_options, client_security

EXIT_USAGE = 2
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
ETCD_PORT_STANDALONE = 2379
"""etcd's usual client port: ``asyncbk standalone`` takes it when free, so the URI in the
README (``etcd://127.0.0.1:2379/asyncbk``) works as written."""


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 1."""


_positive_int = argtypes.positive_int
_positive_float = argtypes.positive_float
_non_negative_float = argtypes.non_negative_float


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 1..65535, got {value}")
    return value


def _add_log_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"],
                   help="log level (default: info for servers, warning for tools)")
    p.add_argument("--log-json", action="store_true",
                   help="log JSON lines instead of text (default: text)")


def _id_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ids separated by commas, got {text!r}") from None


def add_client_placement_options(p: argparse._ActionsContainer) -> None:
    """The placement settings of a command's client (ClientConfig fields of the same
    names; see docs/placement.md): ``--placement-policy``, ``--min-racks-per-write-
    quorum``, ``--min-regions-per-write-quorum``, ``--enforce-placement``,
    ``--bookie-racks-file``, ``--bookie-racks-script``."""
    from ..topology import POLICIES, RACK_FILE_FORMAT

    p.add_argument("--placement-policy", choices=POLICIES, default=None,
                   help="how this client chooses ensembles and replacement bookies "
                   "(default: random)")
    p.add_argument("--min-racks-per-write-quorum", type=_positive_int, default=None,
                   metavar="N", help="rack- and region-aware: racks every write set spans "
                   "at least, capped at the write quorum (default: 2)")
    p.add_argument("--min-regions-per-write-quorum", type=_positive_int, default=None,
                   metavar="N", help="region-aware: regions every write set spans at least, "
                   "capped at the write quorum (default: 2)")
    p.add_argument("--enforce-placement", action="store_true", default=None,
                   help="fail when the minimum racks/regions cannot be met (default: use "
                   "the best ensemble available, with a warning)")
    p.add_argument("--bookie-racks-file", metavar="FILE", default=None,
                   help=f"locate bookies by this file, lines {RACK_FILE_FORMAT.split(',')[0]} "
                   "('#' comments; a host matches any port), winning over "
                   "--bookie-racks-script and the bookies' --rack (default: none)")
    p.add_argument("--bookie-racks-script", metavar="COMMAND", default=None,
                   help="locate bookies by running COMMAND with bookie hosts as arguments; it "
                   "prints one location per host (default: none)")


_PLACEMENT_OPTIONS = ("placement_policy", "min_racks_per_write_quorum",
                      "min_regions_per_write_quorum", "enforce_placement", "bookie_racks_file",
                      "bookie_racks_script")


def client_placement_options(args: argparse.Namespace, *, read_file: bool = False
                             ) -> dict[str, Any]:
    """The ClientConfig settings of the options of :func:`add_client_placement_options`
    that were given, checked (ConfigError); with ``read_file``, the rack file too
    (blocking: before the event loop runs)."""
    from .argtypes import client_options

    return client_options(args, _PLACEMENT_OPTIONS, read_rack_file=read_file)


async def connect_client(args: argparse.Namespace) -> Any:
    """A BookKeeper client of a command's options: ``--metadata-uri``, TLS and token
    (:mod:`.security`), placement (:func:`add_client_placement_options`).  A bad rack
    file is refused (ConfigError naming file:line) before anything is contacted."""
    from ..client.client import BookKeeper

    options = client_placement_options(args)
    security = await asyncio.to_thread(client_security, args)
    return await BookKeeper.connect(args.metadata_uri, **security, **options)


def _add_autorecovery_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lost-bookie-delay", "--grace-s", dest="lost_bookie_delay",
                   type=_non_negative_float, default=30.0, metavar="SECONDS",
                   help="a bookie gone this long is lost and its ledgers re-replicated "
                   "(default 30; --grace-s is another name for it)")
    p.add_argument("--audit-interval", type=_positive_float, default=60.0, metavar="SECONDS",
                   help="how often the auditor checks every ledger (default 60)")
    p.add_argument("--open-ledger-grace", type=_non_negative_float, default=30.0,
                   metavar="SECONDS", help="how long an open ledger's writer gets to replace a "
                   "lost bookie itself before the ledger is fenced and copied (default 30)")
    p.add_argument("--rate", type=_non_negative_float, default=5000.0, metavar="ENTRIES",
                   help="entries copied per second by this worker, 0 = no limit (default 5000)")
    p.add_argument("--fix-placement", action="store_true",
                   help="the auditor also checks, every --audit-interval, each ledger "
                   "against its own placement (create_ledger(placement=...), namespaces) or "
                   "else --placement-policy (random: nothing to check), and moves fragments "
                   "whose write sets violate it, given where the bookies are now, to bookies "
                   "that comply (default: off)")


def _autorecovery_config(args: argparse.Namespace) -> Any:
    from ..autorecovery.service import AutoRecoveryConfig

    return AutoRecoveryConfig(lost_bookie_delay_s=args.lost_bookie_delay,
                              audit_interval_s=args.audit_interval,
                              open_ledger_grace_s=args.open_ledger_grace,
                              rate_entries_per_s=args.rate,
                              fix_placement=args.fix_placement).validate()


class _DefaultsFormatter(argparse.HelpFormatter):
    """Help that shows every option's default (unless its text already speaks of one)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if ("default" in text or not action.option_strings
                or action.default in (None, argparse.SUPPRESS)):
            return text
        return f"{text} (default: %(default)s)"


def _add_bench_output_options(p: argparse.ArgumentParser) -> None:
    """The options every bench workload shares: which cluster, and where results go."""
    p.add_argument("--metadata-uri",
                   help="run against this cluster (default: start a local cluster of "
                   "--bookies bookies on free ports, stopped afterwards)")
    p.add_argument("--json", metavar="FILE",
                   help="write the results as JSON to this file (default: no file)")
    p.add_argument("--plot", metavar="PNG",
                   help="draw latency distribution and throughput to this PNG, needs "
                   "matplotlib (default: no plot)")


def _add_bench_options(p: argparse.ArgumentParser, default_quorum: int) -> None:
    p.add_argument("--entries", type=_positive_int, default=10_000,
                   help="entries to write or read")
    p.add_argument("--duration", type=_positive_float, metavar="SECONDS",
                   help="stop after this many seconds even if --entries are not done "
                   "(default: no time limit)")
    p.add_argument("--inflight", type=_positive_int, default=256,
                   help="appends in flight, closed loop")
    p.add_argument("--rate", type=_positive_float, metavar="PER_S",
                   help="open loop: offer this many appends per second in total (default: "
                   "closed loop, --inflight appends in flight)")
    p.add_argument("--entry-size", type=_positive_int, default=1024, metavar="BYTES",
                   help="bytes per entry")
    p.add_argument("--ledgers", type=_positive_int, default=1,
                   help="ledgers written or read in parallel")
    p.add_argument("--clients", type=_positive_int, default=1,
                   help="client processes sharing the work")
    p.add_argument("--ensemble", type=_positive_int, default=3,
                   help="ensemble size E: bookies each ledger is striped over")
    p.add_argument("--write-quorum", type=_positive_int, default=default_quorum,
                   help="write quorum Qw: bookies each entry is written to")
    p.add_argument("--ack-quorum", type=_positive_int, default=2,
                   help="ack quorum Qa: bookies that must have an entry before it is "
                   "acknowledged")
    p.add_argument("--digest", default="xxh3", choices=["xxh3", "hmac-sha256", "none"],
                   help="digest of each entry")
    p.add_argument("--bookies", type=_positive_int, default=3,
                   help="bookies of the local cluster (without --metadata-uri)")
    p.add_argument("--index-backend", choices=["memory", "lmdb"],
                   help="entry index of the local cluster's bookies, their index_backend "
                   "setting (without --metadata-uri; default: memory)")
    p.add_argument("--warmup", type=int, default=1000, metavar="ENTRIES",
                   help="entries appended before measuring writes")
    _add_bench_output_options(p)
    # set by a --clients parent for its client processes
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    p.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    p.add_argument("--ledger-ids", type=_id_list, default=[], help=argparse.SUPPRESS)
    _add_log_options(p)


def _add_bench_stream_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=["write", "tail"], default="write",
                   help="write (latency to durable) or tail (latency to a reader)")
    p.add_argument("--records", type=_positive_int, default=200_000,
                   help="records to write")
    p.add_argument("--record-size", type=_positive_int, default=100, metavar="BYTES",
                   help="bytes per record")
    p.add_argument("--duration", type=_positive_float, metavar="SECONDS",
                   help="stop after this many seconds even if --records are not done "
                   "(default: no time limit)")
    p.add_argument("--inflight", type=_positive_int, default=20_000, metavar="RECORDS",
                   help="records written but not yet durable, at most (closed loop; with "
                   "--rate, the bound past which sending waits)")
    p.add_argument("--rate", type=_positive_float, metavar="PER_S",
                   help="open loop: offer this many records per second (default: closed "
                   "loop, --inflight records in flight)")
    p.add_argument("--burst", type=_positive_int, default=1000, metavar="RECORDS",
                   help="records written in one event-loop turn at most (the writer sends "
                   "a turn's records as one ledger entry, up to 1 MiB)")
    p.add_argument("--ensemble", type=_positive_int, default=3,
                   help="ensemble size E of the stream's segments")
    p.add_argument("--write-quorum", type=_positive_int, default=3,
                   help="write quorum Qw: bookies each entry is written to")
    p.add_argument("--ack-quorum", type=_positive_int, default=2,
                   help="ack quorum Qa: bookies that must have an entry before its records "
                   "are acknowledged")
    p.add_argument("--digest", default="xxh3", choices=["xxh3", "hmac-sha256", "none"],
                   help="digest of each entry")
    p.add_argument("--rolling-mb", type=_positive_int, default=256, metavar="MIB",
                   help="the writer starts a new segment after this many MiB of records")
    p.add_argument("--bookies", type=_positive_int, default=3,
                   help="bookies of the local cluster (without --metadata-uri)")
    p.add_argument("--warmup", type=int, default=20_000, metavar="RECORDS",
                   help="records written before measuring")
    p.add_argument("--keep", action="store_true",
                   help="keep the benchmark's namespace and stream afterwards (default: "
                   "deleted)")
    _add_bench_output_options(p)
    _add_log_options(p)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="asyncbk", description="asyncbk: an asyncio-native replicated log "
                     "service (bookies, ledgers, metadata in etcd).")
    parser.add_argument("--version", action="version", version=f"asyncbk {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("standalone", help="run etcd and N bookies on this machine until Ctrl-C",
                       description="Run a local cluster: an etcd server and N bookie processes "
                       "on loopback. Prints the metadata URI, runs until Ctrl-C, then stops "
                       "everything cleanly. Data stays in --data-dir across runs.")
    p.add_argument("--bookies", type=_positive_int, default=3, help="number of bookies (default 3)")
    p.add_argument("--data-dir", default="asyncbk-data",
                   help="where etcd and the bookies keep their data (default ./asyncbk-data)")
    p.add_argument("--root", default="asyncbk", help="key prefix in etcd (default asyncbk)")
    p.add_argument("--etcd-port", type=_port, default=None,
                   help=f"etcd's client port (default: the port of the last run on --data-dir, "
                   f"else {ETCD_PORT_STANDALONE} when it is free, else a free port; the "
                   f"metadata URI printed says which)")
    _add_log_options(p)

    p = sub.add_parser("bookie", help="run one bookie server",
                       description="Run one bookie: a storage server that journals, stores and "
                       "serves ledger entries, registered in etcd under a lease.")
    p.add_argument("--metadata-uri", help="etcd://host:port[,host:port...]/<root>")
    p.add_argument("--port", type=_port, help="TCP port to listen on (the bookie id is host:port)")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--advertised-host", help="host part of the bookie id, if not --host")
    p.add_argument("--rack", metavar="/REGION/RACK",
                   help="network location of this bookie, /region/rack or /rack, registered "
                   "for clients' rack- and region-aware placement (default: "
                   "/default-region/default-rack)")
    p.add_argument("--journal-dir", action="append",
                   help="directory of the journal (write-ahead log); repeat it (or separate "
                   "with commas) for several, at most one per ledger directory")
    p.add_argument("--ledger-dir", action="append",
                   help="directory of entry logs and the index; repeat it (or separate with "
                   "commas) for several: each holds whole ledgers, new ledgers go to the "
                   "one holding fewest")
    p.add_argument("--allow-storage-expansion", action="store_true", default=None,
                   help="accept empty ledger directories appended to those this bookie's "
                   "cookie records, and record them (default: a changed list refuses to "
                   "start)")
    p.add_argument("--http-port", type=_port,
                   help="serve the HTTP admin endpoint (/metrics, /healthz, /api/v1/bookie/...) "
                   "on this port")
    p.add_argument("--http-host", help="address of the HTTP admin endpoint (default 127.0.0.1)")
    p.add_argument("--config", help="TOML file of bookie settings (command-line options win)")
    p.add_argument("--autorecovery", action="store_true",
                   help="also run auto-recovery (auditor candidate + replication worker) in "
                   "this process")
    p.add_argument("--tls-cert", metavar="FILE",
                   help="serve the bookie protocol over TLS with this certificate (PEM)")
    p.add_argument("--tls-key", metavar="FILE", help="the key of --tls-cert (PEM)")
    p.add_argument("--tls-ca", metavar="FILE",
                   help="CA of client certificates (PEM); also what in-process "
                   "auto-recovery checks other bookies against")
    p.add_argument("--tls-require-client-cert", action="store_true", default=None,
                   help="refuse clients without a certificate signed by --tls-ca (mutual TLS)")
    p.add_argument("--auth-tokens-file", metavar="FILE",
                   help="accept requests only from connections that authenticate with one of "
                   "the tokens in this file (one per line)")
    add_etcd_security_options(p)
    _add_autorecovery_options(p)
    g = p.add_argument_group("placement of --autorecovery's copies",
                             "the placement settings of the in-process auto-recovery's client")
    add_client_placement_options(g)
    _add_log_options(p)

    p = sub.add_parser("autorecovery", help="run auto-recovery (auditor + replication worker)",
                       description="Run auto-recovery: one process of any number is elected "
                       "auditor (through etcd) and marks the ledgers of lost bookies "
                       "under-replicated; every process re-replicates marked ledgers. Runs "
                       "until Ctrl-C / SIGTERM.")
    p.add_argument("--metadata-uri", required=True,
                   help="etcd://host:port[,host:port...]/<root>")
    p.add_argument("--id", help="name of this process in the election (default host:pid)")
    p.add_argument("--http-port", type=_port,
                   help="serve /healthz, /metrics and /api/v1/autorecovery/... on this port")
    p.add_argument("--http-host", default="127.0.0.1", help="address of the HTTP endpoint")
    p.add_argument("--http-tls-cert", metavar="FILE",
                   help="serve the HTTP endpoint over HTTPS with this certificate (PEM; "
                   "default: plain HTTP)")
    p.add_argument("--http-tls-key", metavar="FILE", help="the key of --http-tls-cert (PEM)")
    add_client_security_options(p)
    add_client_placement_options(p)
    _add_autorecovery_options(p)
    _add_log_options(p)

    p = sub.add_parser("bench", help="benchmarks: write and read throughput and latency",
                       description="Benchmarks. Each starts its own local cluster (etcd + "
                       "bookies as separate processes) unless --metadata-uri is given, and "
                       "prints a summary; --json and --plot save the results.")
    bsub = p.add_subparsers(dest="workload", metavar="WORKLOAD", parser_class=_Parser)
    w = bsub.add_parser("write", help="append throughput and latency",
                        formatter_class=_DefaultsFormatter, description="Append N entries over L ledgers, K in flight (closed "
                        "loop) or at a fixed --rate (open loop); report throughput and latency "
                        "percentiles.")
    _add_bench_options(w, default_quorum=2)
    r = bsub.add_parser("read", help="catch-up and tailing read throughput and latency",
                        formatter_class=_DefaultsFormatter, description="catchup: write N entries (not timed), close the ledgers, "
                        "read them back in ranges of --batch. tail: follow ledgers with tail() "
                        "while a writer appends; latency from append to delivery.")
    r.add_argument("--mode", choices=["catchup", "tail"], default="catchup",
                   help="catchup (closed ledgers) or tail (behind a live writer)")
    r.add_argument("--batch", type=_positive_int, default=1000,
                   help="entries per read call in catchup mode")
    _add_bench_options(r, default_quorum=3)
    st = bsub.add_parser("stream", help="stream write throughput and tailing latency",
                         formatter_class=_DefaultsFormatter,
                         description="write: N records of --record-size bytes to one stream, "
                         "--inflight records in flight (closed loop) or at --rate (open "
                         "loop); the writer batches a loop turn's records into one entry; "
                         "latency per record from the write call to durable. tail: a reader "
                         "follows the stream while the writer writes; latency from the "
                         "write call to the reader.")
    _add_bench_stream_options(st)

    p = sub.add_parser("stream", help="namespaces and streams: create, list, info, write, "
                       "tail, truncate, delete",
                       description="Namespaces and streams (see docs/streams.md): create, "
                       "list and delete them, write stdin lines as records, tail records as "
                       "text or JSON, show segments, truncate.")
    stsub = p.add_subparsers(dest="stream_command", metavar="STREAM_COMMAND",
                             parser_class=_Parser)
    from . import stream

    stream.add_commands(stsub, _add_log_options, _DefaultsFormatter)

    p = sub.add_parser("shell", help="admin commands", description="Admin commands.")
    ssub = p.add_subparsers(dest="shell_command", metavar="SHELL_COMMAND", parser_class=_Parser)
    from . import shell

    shell.add_commands(ssub, _add_log_options)
    return parser


def _configure_logging(args: argparse.Namespace, default: str = "info") -> None:
    from ..log import configure

    configure(getattr(args, "log_level", None) or default, getattr(args, "log_json", False))


def _run(coro_fn: Callable[[], Coroutine[Any, Any, int | None]]) -> int:
    import uvloop

    return uvloop.run(coro_fn()) or 0


def cmd_bookie(args: argparse.Namespace) -> int:
    from ..bookie.server import run_bookie
    from ..config import BookieConfig, from_mapping, load_toml

    values: dict[str, Any] = load_toml(args.config) if args.config else {}
    for opt in ("metadata_uri", "port", "host", "advertised_host", "journal_dir", "ledger_dir",
                "http_port", "http_host", "rack"):
        v = getattr(args, opt)
        if isinstance(v, list):  # --journal-dir / --ledger-dir, repeatable
            v = ",".join(v)
        if v is not None:
            values[opt] = v
    if args.allow_storage_expansion:
        values["allow_storage_expansion"] = True
    for opt, key in (("tls_cert", "tls_cert_file"), ("tls_key", "tls_key_file"),
                     ("tls_ca", "tls_ca_file"), ("auth_tokens_file", "auth_tokens_file"),
                     ("tls_require_client_cert", "tls_require_client_cert"),
                     ("etcd_ca", "etcd_tls_ca_file"), ("etcd_cert", "etcd_tls_cert_file"),
                     ("etcd_key", "etcd_tls_key_file"), ("etcd_user", "etcd_user"),
                     ("etcd_password_file", "etcd_password_file")):
        v = getattr(args, opt)
        if v is not None:
            values[key] = v
    if args.http_port is not None:
        values["http_enabled"] = True
    for required, flag in (("metadata_uri", "--metadata-uri"), ("port", "--port"),
                           ("journal_dir", "--journal-dir"), ("ledger_dir", "--ledger-dir")):
        if not values.get(required):
            raise CliError(f"{flag} is required (or set {required} in --config)")
    config = from_mapping(BookieConfig, values, args.config or "options")
    placement = client_placement_options(args, read_file=True)
    if placement and not args.autorecovery:
        raise CliError("the placement options are for the in-process auto-recovery's client: "
                       "give --autorecovery too (the bookie's own location is --rack)")
    if args.fix_placement and not args.autorecovery:
        raise CliError("--fix-placement is an auto-recovery option: give --autorecovery too")
    _configure_logging(args)
    if not args.autorecovery:
        return _run(lambda: run_bookie(config))
    ar_config = _autorecovery_config(args)

    async def companion(server: Any) -> Any:
        from ..autorecovery.http import AutoRecoveryCollector, routes
        from ..autorecovery.service import AutoRecovery
        from ..client.client import BookKeeper

        security = await asyncio.to_thread(_bookie_client_security, config)
        bk = await BookKeeper.connect(config.metadata_uri, **security, **placement)
        ar = AutoRecovery(bk, ar_config, process_id=f"bookie-{server.bookie_id}",
                          owns_client=True)
        server.http_extra_routes.extend(routes(ar))
        server.http_extra_collectors.append(AutoRecoveryCollector(ar))
        return ar

    return _run(lambda: run_bookie(config, companion_factory=companion))


def _bookie_client_security(config: Any) -> dict[str, Any]:
    """What a bookie's in-process client presents to other bookies: its own CA and
    certificate, and the first of its tokens; to etcd, what the bookie does."""
    from ..net.etcd_security import bookie_etcd_security
    from ..net.security import client_context, load_tokens

    ctx = client_context(config.tls_ca_file, config.tls_cert_file, config.tls_key_file) \
        if config.tls_cert_file else None
    token = load_tokens(config.auth_tokens_file)[0].decode() if config.auth_tokens_file \
        else None
    return {"ssl": ctx, "token": token, **bookie_etcd_security(config).connect_options()}


def cmd_autorecovery(args: argparse.Namespace) -> int:
    from ..meta.uri import parse_metadata_uri

    parse_metadata_uri(args.metadata_uri)
    if bool(args.http_tls_cert) != bool(args.http_tls_key):
        raise CliError("HTTPS needs both --http-tls-cert and --http-tls-key")
    if args.http_tls_cert and args.http_port is None:
        raise CliError("--http-tls-cert is for the HTTP endpoint: give --http-port too")
    ar_config = _autorecovery_config(args)
    client_placement_options(args, read_file=True)
    _configure_logging(args)

    async def run() -> int:
        import signal

        from ..autorecovery.http import AutoRecoveryHttpServer
        from ..autorecovery.service import AutoRecovery
        from ..net.security import server_context

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        http_tls = await asyncio.to_thread(server_context, args.http_tls_cert,
                                           args.http_tls_key) if args.http_tls_cert else None
        bk = await connect_client(args)
        ar = AutoRecovery(bk, ar_config, process_id=args.id, owns_client=True)
        http = None
        try:
            await ar.start()
            if args.http_port is not None:
                http = AutoRecoveryHttpServer(ar, args.http_host, args.http_port,
                                              ssl_context=http_tls)
                await http.start()
            print(f"ready autorecovery {ar.id}", flush=True)
            await stop.wait()
        finally:
            if http is not None:
                await http.close()
            await ar.close()
        return 0

    return _run(run)


def cmd_standalone(args: argparse.Namespace) -> int:
    from ..local import LocalCluster

    _configure_logging(args, "warning")

    async def run() -> int:
        import signal

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        data_dir = Path(args.data_dir)
        cluster = LocalCluster(bookies=args.bookies, data_dir=data_dir, root=args.root,
                               etcd_port=args.etcd_port,
                               etcd_port_preferred=ETCD_PORT_STANDALONE,
                               owner="asyncbk standalone")
        print(f"starting etcd and {args.bookies} bookies in {data_dir} ...", flush=True)
        async with cluster as c:
            for note in c.notes:
                print(f"note: {note}")
            print(f"metadata URI: {c.metadata_uri}")
            if c.etcd is not None:
                print(f"etcd {c.etcd.endpoint}  pid {c.etcd.pid}  log {c.etcd.log_path}")
            for b in c.bookies:
                print(f"bookie {b.id}  pid {b.pid}  admin {b.http_url}  log {b.log_path}")
            print("ready; press Ctrl-C to stop", flush=True)
            await stop.wait()
            print("stopping ...", flush=True)
        print("stopped", flush=True)
        return 0

    return _run(run)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.workload not in ("write", "read", "stream"):
        raise CliError("choose a workload: asyncbk bench write --help, asyncbk bench read "
                       "--help, asyncbk bench stream --help")
    from .bench import run_bench
    from .bench_record import check_extras

    check_extras(args)  # before anything is started

    _configure_logging(args, "warning")
    return _run(lambda: run_bench(args))


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "bookie": cmd_bookie, "standalone": cmd_standalone, "bench": cmd_bench,
        "autorecovery": cmd_autorecovery,
    }
    prog = f"asyncbk {args.command}" if args.command else "asyncbk"
    if args.command == "stream" and args.stream_command:
        prog += f" {args.stream_command}"
    try:
        if args.command is None:
            parser.print_help()
            sys.exit(EXIT_USAGE)
        if args.command == "shell":
            from .shell import run_shell

            code = run_shell(args, _run, _configure_logging)
        elif args.command == "stream":
            from .stream import run_stream

            code = run_stream(args, _run, _configure_logging)
        else:
            code = handlers[args.command](args)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except (CliError, BKError, ConfigError, ValueError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_ERROR)
    sys.exit(code)


if __name__ == "__main__":
    main()
