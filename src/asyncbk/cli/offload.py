"""``asyncbk offload``: the tiered-storage offloader as a process (one pass with
``--once``, else a pass every ``--interval-s`` until Ctrl-C); and the options that
``asyncbk bookie --offload-object-store`` shares."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from typing import Any

from .common import (
    CliError,
    FileCheck,
    Subparsers,
    add_check_config_option,
    add_log_options,
    check_client_security,
    configure_logging,
    connect_client,
    dry_run,
    non_negative_float,
    on_stop_signals,
    positive_float,
    positive_int,
    require_cluster,
    run_async,
)
from .security import add_client_security_options


def add_offload_options(p: argparse._ActionsContainer, flag: str = "--object-store") -> None:
    """Where to offload and how fast (see :func:`offloader_options`)."""
    p.add_argument(flag, dest="object_store", metavar="URI",
                   required=flag == "--object-store",
                   help="s3://BUCKET/PREFIX?endpoint=URL: where segments go (endpoint: any "
                   "S3-compatible server; without it, AWS). Credentials come from "
                   "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or --credentials-file")
    p.add_argument("--credentials-file", metavar="FILE",
                   help="the object store's credentials: an AWS credentials file ([default] "
                   "aws_access_key_id=..., aws_secret_access_key=...) or AWS_ACCESS_KEY_ID=... "
                   "lines; readable by its owner only (default: the AWS_* variables)")
    p.add_argument("--offload-interval-s", "--interval-s", dest="offload_interval_s",
                   type=positive_float,
                   default=60.0, metavar="SECONDS",
                   help="how often the offloader looks for segments due (default 60)")
    p.add_argument("--segments-per-pass", type=positive_int, default=16, metavar="N",
                   help="segments copied at most per pass (default 16)")
    p.add_argument("--rate-mbps", type=non_negative_float, default=0.0, metavar="MB_PER_S",
                   help="megabytes read from the bookies per second at most, 0 = no limit "
                   "(default 0)")
    p.add_argument("--sweep-grace-s", type=non_negative_float, default=3600.0,
                   metavar="SECONDS",
                   help="an object no segment names, whose segment still exists (a failed "
                   "or running copy), is deleted once this old (default 3600)")


def offloader_options(args: argparse.Namespace) -> Any:
    """The ``OffloaderOptions`` of :func:`add_offload_options`' options."""
    from ..offload.offloader import OffloaderOptions

    return OffloaderOptions(segments_per_pass=args.segments_per_pass,
                            rate_bytes_per_s=args.rate_mbps * 1_000_000,
                            sweep_grace_s=args.sweep_grace_s)


def object_store_of(args: argparse.Namespace) -> Any:
    """The store of ``--object-store`` with the credentials of ``--credentials-file`` or
    the environment (blocking: reads the file)."""
    from ..tiered.location import Credentials, ObjectStoreUri
    from ..tiered.store import S3ObjectStore

    uri = ObjectStoreUri.parse(args.object_store)
    creds = (Credentials.from_file(args.credentials_file) if args.credentials_file
             else Credentials.from_env())
    if creds is None:
        raise CliError("no object store credentials: set AWS_ACCESS_KEY_ID and "
                       "AWS_SECRET_ACCESS_KEY, or give --credentials-file")
    return S3ObjectStore(uri, creds)


def check_object_store(args: argparse.Namespace, files: FileCheck) -> str:
    """``--check-config`` of the offload options: the store's URI and credentials as
    :func:`object_store_of` checks them (mode ``files``: the credentials file read;
    ``paths``: its path only), nothing contacted; a summary (no secret in it)."""
    from ..tiered.location import Credentials, ObjectStoreUri

    offloader_options(args)
    if files.path("--credentials-file", args.credentials_file) or not args.credentials_file:
        store = object_store_of(args)
        where = store.uri
    else:
        where = ObjectStoreUri.parse(args.object_store)
    creds = ("credentials file" if args.credentials_file
             else "credentials from AWS_*" if Credentials.from_env() is not None else "")
    return f"object store {where} ({creds})"


async def check_store(store: Any) -> None:
    """Reach the bucket and sign in, or one clear line (CliError)."""
    from ..errors import ObjectStoreError

    try:
        await store.check()
    except ObjectStoreError as exc:
        raise CliError(f"object store {store.uri}: {exc}") from None


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser("offload", help="copy completed stream segments to an object store",
                       description="Tiered storage: copy each completed segment older than "
                       "its namespace's offload_after_s (or over offload_after_bytes) to an "
                       "S3-compatible object store, verify it, record it in the segment's "
                       "metadata, and delete its ledger from the bookies "
                       "offload_deletion_lag_s later. Readers then read it from the store. "
                       "Runs until Ctrl-C / SIGTERM, or one pass with --once.")
    p.add_argument("--metadata-uri", required=True,
                   help="etcd://host:port[,host:port...]/<root>")
    add_offload_options(p)
    p.add_argument("--namespace", action="append", dest="namespaces", metavar="NAME",
                   help="offload this namespace only (repeat for more; default: all)")
    p.add_argument("--once", action="store_true",
                   help="one pass, a summary, then exit (1 if a segment failed)")
    add_client_security_options(p)
    add_log_options(p)
    add_check_config_option(p)
    return p


def _summary(report: Any) -> str:
    return (f"offloaded {len(report.offloaded)} segment(s), {report.offloaded_bytes} bytes; "
            f"deleted {len(report.ledgers_deleted)} ledger(s) from the bookies; swept "
            f"{report.swept} object(s); {len(report.failures)} failure(s)")


def check_config(args: argparse.Namespace) -> str:
    """``--check-config``: what a start checks, and the files it reads (mode
    ``files``), without connecting; the OK line's summary (no secret in it)."""
    from ..meta.uri import parse_metadata_uri

    files = FileCheck(args.check_config)
    parse_metadata_uri(args.metadata_uri)
    store = check_object_store(args, files)
    security = check_client_security(args, files)
    namespaces = ", ".join(args.namespaces) if args.namespaces else "all"
    return (f"metadata {args.metadata_uri}, {store}, namespaces {namespaces}, "
            f"{security}; {files.summary()}")


def run(args: argparse.Namespace) -> int:
    """Check the options, then offload (with ``--check-config``: only check, see
    :func:`check_config`)."""
    from ..meta.uri import parse_metadata_uri

    if args.check_config is not None:
        return dry_run("asyncbk offload", lambda: check_config(args))
    parse_metadata_uri(args.metadata_uri)
    options = offloader_options(args)
    store = object_store_of(args)
    configure_logging(args, "warning")

    async def go() -> int:
        from ..offload.offloader import Offloader, hold_hook_from_env
        from ..offload.service import OffloadService

        def say(line: str) -> None:
            print(line, flush=True)

        await check_store(store)
        stop = asyncio.Event()
        on_stop_signals(stop.set)
        bk = await connect_client(args, options={})
        try:
            await require_cluster(bk, args.metadata_uri)
            offloader = Offloader(bk, store, options, progress=say,
                                  step_hook=hold_hook_from_env(say))
            if args.once:
                report = await offloader.run_pass(args.namespaces)
                for line in report.failures:
                    print(f"failed: {line}", file=sys.stderr)
                print(_summary(report), flush=True)
                return 1 if report.failures else 0
            service = OffloadService(
                bk, store, options, args.offload_interval_s, f"offload-{socket.gethostname()}-"
                f"{os.getpid()}", namespaces=args.namespaces,
                progress=say, step_hook=hold_hook_from_env(say),
                on_pass=lambda r: print(_summary(r), flush=True)
                if r.offloaded or r.ledgers_deleted or r.swept or r.failures else None)
            await service.start()
            try:
                print(f"ready offload to {store.uri}", flush=True)
                await stop.wait()
            finally:
                await service.close()
            return 0
        finally:
            await bk.close()

    return run_async(go)
