"""``asyncbk bookie``: one bookie server (with ``--autorecovery``, auto-recovery in the
same process)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from .autorecovery import add_autorecovery_options, autorecovery_config
from .common import (
    CliError,
    Subparsers,
    add_client_placement_options,
    add_log_options,
    client_placement_options,
    configure_logging,
    port,
    run_async,
)
from .offload import add_offload_options, object_store_of, offloader_options
from .security import add_etcd_security_options


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser("bookie", help="run one bookie server",
                       description="Run one bookie: a storage server that journals, stores and "
                       "serves ledger entries, registered in etcd under a lease.")
    p.add_argument("--metadata-uri", help="etcd://host:port[,host:port...]/<root>")
    p.add_argument("--port", type=port, help="TCP port to listen on (the bookie id is host:port)")
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
    p.add_argument("--http-port", type=port,
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
    add_autorecovery_options(p)
    t = p.add_argument_group("tiered storage", "run the offloader in this process (one "
                             "process at a time makes passes, of all those running it)")
    add_offload_options(t, "--offload-object-store")
    g = p.add_argument_group("placement of --autorecovery's copies",
                             "the placement settings of the in-process auto-recovery's client")
    add_client_placement_options(g)
    add_log_options(p)
    return p


SETTING_OPTIONS = ("metadata_uri", "port", "host", "advertised_host", "journal_dir",
                   "ledger_dir", "http_port", "http_host", "rack")
"""Options that set the BookieConfig field of the same name."""

RENAMED_SETTING_OPTIONS = (
    ("tls_cert", "tls_cert_file"), ("tls_key", "tls_key_file"), ("tls_ca", "tls_ca_file"),
    ("auth_tokens_file", "auth_tokens_file"),
    ("tls_require_client_cert", "tls_require_client_cert"),
    ("etcd_ca", "etcd_tls_ca_file"), ("etcd_cert", "etcd_tls_cert_file"),
    ("etcd_key", "etcd_tls_key_file"), ("etcd_user", "etcd_user"),
    ("etcd_password_file", "etcd_password_file"))
"""Options (dest) that set a BookieConfig field of another name."""

REQUIRED_SETTINGS = (("metadata_uri", "--metadata-uri"), ("port", "--port"),
                     ("journal_dir", "--journal-dir"), ("ledger_dir", "--ledger-dir"))
"""The settings a bookie cannot start without, with the option that gives each."""


def bookie_config(args: argparse.Namespace) -> Any:
    """The BookieConfig of ``--config`` and the options (which win), checked: CliError
    for a missing required setting, ConfigError for a bad one."""
    from ..config import BookieConfig, from_mapping, load_toml

    values: dict[str, Any] = load_toml(args.config) if args.config else {}
    for opt in SETTING_OPTIONS:
        v = getattr(args, opt)
        if isinstance(v, list):  # --journal-dir / --ledger-dir, repeatable
            v = ",".join(v)
        if v is not None:
            values[opt] = v
    if args.allow_storage_expansion:
        values["allow_storage_expansion"] = True
    for opt, key in RENAMED_SETTING_OPTIONS:
        v = getattr(args, opt)
        if v is not None:
            values[key] = v
    if args.http_port is not None:
        values["http_enabled"] = True
    for required, flag in REQUIRED_SETTINGS:
        if not values.get(required):
            raise CliError(f"{flag} is required (or set {required} in --config)")
    return from_mapping(BookieConfig, values, args.config or "options")


def run(args: argparse.Namespace) -> int:
    """Check the settings, then serve until SIGTERM / Ctrl-C (with ``--autorecovery``,
    auto-recovery beside it, sharing its HTTP endpoint)."""
    from ..bookie.server import run_bookie

    config = bookie_config(args)
    placement = client_placement_options(args, read_file=True)
    if placement and not args.autorecovery:
        raise CliError("the placement options are for the in-process auto-recovery's client: "
                       "give --autorecovery too (the bookie's own location is --rack)")
    if args.fix_placement and not args.autorecovery:
        raise CliError("--fix-placement is an auto-recovery option: give --autorecovery too")
    configure_logging(args)
    store = object_store_of(args) if args.object_store else None
    if store is None and not args.autorecovery:
        return run_async(lambda: run_bookie(config))
    ar_config = autorecovery_config(args) if args.autorecovery else None
    off_options = offloader_options(args) if store is not None else None

    async def companion(server: Any) -> Any:
        from ..autorecovery.http import AutoRecoveryCollector, routes
        from ..autorecovery.service import AutoRecovery
        from ..client.client import BookKeeper
        from ..offload.service import OffloadService

        security = await asyncio.to_thread(_bookie_client_security, config)
        parts: list[Any] = []
        if ar_config is not None:
            bk = await BookKeeper.connect(config.metadata_uri, **security, **placement)
            ar = AutoRecovery(bk, ar_config, process_id=f"bookie-{server.bookie_id}",
                              owns_client=True)
            server.http_extra_routes.extend(routes(ar))
            server.http_extra_collectors.append(AutoRecoveryCollector(ar))
            parts.append(ar)
        if store is not None:
            bk = await BookKeeper.connect(config.metadata_uri, **security)
            assert off_options is not None
            parts.append(OffloadService(bk, store, off_options, args.offload_interval_s,
                                        f"bookie-{server.bookie_id}", owns_client=True))
        return Companions(parts)

    return run_async(lambda: run_bookie(config, companion_factory=companion))


class Companions:
    """Auto-recovery and the offloader beside a bookie: started in order, closed in
    reverse."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts

    async def start(self) -> None:
        for part in self.parts:
            await part.start()

    async def close(self) -> None:
        """Close every part (each may never have started)."""
        for part in reversed(self.parts):
            await part.close()


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
