"""``asyncbk autorecovery``: the auditor candidate and replication worker as a process;
and the auto-recovery options that ``asyncbk bookie --autorecovery`` shares."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from .common import (
    CliError,
    FileCheck,
    Subparsers,
    add_check_config_option,
    add_client_placement_options,
    add_log_options,
    check_client_security,
    client_placement_options,
    configure_logging,
    connect_client,
    dry_run,
    non_negative_float,
    on_stop_signals,
    port,
    positive_float,
    run_async,
)
from .security import add_client_security_options


def add_autorecovery_options(p: argparse.ArgumentParser) -> None:
    """What auto-recovery does and how fast (see :func:`autorecovery_config`)."""
    p.add_argument("--lost-bookie-delay", "--grace-s", dest="lost_bookie_delay",
                   type=non_negative_float, default=30.0, metavar="SECONDS",
                   help="a bookie gone this long is lost and its ledgers re-replicated "
                   "(default 30; --grace-s is another name for it)")
    p.add_argument("--audit-interval", type=positive_float, default=60.0, metavar="SECONDS",
                   help="how often the auditor checks every ledger (default 60)")
    p.add_argument("--open-ledger-grace", type=non_negative_float, default=30.0,
                   metavar="SECONDS", help="how long an open ledger's writer gets to replace a "
                   "lost bookie itself before the ledger is fenced and copied (default 30)")
    p.add_argument("--rate", type=non_negative_float, default=5000.0, metavar="ENTRIES",
                   help="entries copied per second by this worker, 0 = no limit (default 5000)")
    p.add_argument("--fix-placement", action="store_true",
                   help="the auditor also checks, every --audit-interval, each ledger "
                   "against its own placement (create_ledger(placement=...), namespaces) or "
                   "else --placement-policy (random: nothing to check), and moves fragments "
                   "whose write sets violate it, given where the bookies are now, to bookies "
                   "that comply (default: off)")


def autorecovery_config(args: argparse.Namespace) -> Any:
    """The ``AutoRecoveryConfig`` of :func:`add_autorecovery_options`' options, checked."""
    from ..autorecovery.service import AutoRecoveryConfig

    return AutoRecoveryConfig(lost_bookie_delay_s=args.lost_bookie_delay,
                              audit_interval_s=args.audit_interval,
                              open_ledger_grace_s=args.open_ledger_grace,
                              rate_entries_per_s=args.rate,
                              fix_placement=args.fix_placement).validate()


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser("autorecovery", help="run auto-recovery (auditor + replication worker)",
                       description="Run auto-recovery: one process of any number is elected "
                       "auditor (through etcd) and marks the ledgers of lost bookies "
                       "under-replicated; every process re-replicates marked ledgers. Runs "
                       "until Ctrl-C / SIGTERM.")
    p.add_argument("--metadata-uri", required=True,
                   help="etcd://host:port[,host:port...]/<root>")
    p.add_argument("--id", help="name of this process in the election (default host:pid)")
    p.add_argument("--http-port", type=port,
                   help="serve /healthz, /metrics and /api/v1/autorecovery/... on this port")
    p.add_argument("--http-host", default="127.0.0.1", help="address of the HTTP endpoint")
    p.add_argument("--http-tls-cert", metavar="FILE",
                   help="serve the HTTP endpoint over HTTPS with this certificate (PEM; "
                   "default: plain HTTP)")
    p.add_argument("--http-tls-key", metavar="FILE", help="the key of --http-tls-cert (PEM)")
    add_client_security_options(p)
    add_client_placement_options(p)
    add_autorecovery_options(p)
    add_log_options(p)
    add_check_config_option(p)
    return p


def checked_config(args: argparse.Namespace, read_files: bool = True) -> Any:
    """The checks of a start before anything is contacted (CliError, ConfigError): the
    URI, the HTTPS pair, the auto-recovery settings, the placement (with
    ``read_files``, its rack file read); the AutoRecoveryConfig."""
    from ..meta.uri import parse_metadata_uri

    parse_metadata_uri(args.metadata_uri)
    if bool(args.http_tls_cert) != bool(args.http_tls_key):
        raise CliError("HTTPS needs both --http-tls-cert and --http-tls-key")
    if args.http_tls_cert and args.http_port is None:
        raise CliError("--http-tls-cert is for the HTTP endpoint: give --http-port too")
    ar_config = autorecovery_config(args)
    client_placement_options(args, read_file=read_files)
    return ar_config


def check_config(args: argparse.Namespace) -> str:
    """``--check-config``: what a start checks, and the files it reads (mode
    ``files``), without connecting; the OK line's summary (no secret in it)."""
    from ..net.security import server_context

    files = FileCheck(args.check_config)
    reads_rack_file = files.path("--bookie-racks-file", args.bookie_racks_file)
    checked_config(args, read_files=reads_rack_file)
    security = check_client_security(args, files)
    https = [files.path("--http-tls-cert", args.http_tls_cert),
             files.path("--http-tls-key", args.http_tls_key)]
    if all(https) and args.http_tls_cert:
        server_context(args.http_tls_cert, args.http_tls_key)
    http = ("no HTTP endpoint" if args.http_port is None else
            f"HTTP{'S' if args.http_tls_cert else ''} on {args.http_host}:{args.http_port}")
    return (f"metadata {args.metadata_uri}, {security}, {http}, placement "
            f"{args.placement_policy or 'random'}; {files.summary()}")


def run(args: argparse.Namespace) -> int:
    """Check the options, then run auto-recovery (and its HTTP endpoint) until Ctrl-C /
    SIGTERM (with ``--check-config``: only check, see :func:`check_config`)."""
    if args.check_config is not None:
        return dry_run("asyncbk autorecovery", lambda: check_config(args))
    ar_config = checked_config(args)
    configure_logging(args)

    async def go() -> int:
        from ..autorecovery.http import AutoRecoveryHttpServer
        from ..autorecovery.service import AutoRecovery
        from ..net.security import server_context

        stop = asyncio.Event()
        on_stop_signals(stop.set)
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

    return run_async(go)
