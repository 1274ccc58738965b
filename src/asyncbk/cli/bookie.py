"""``asyncbk bookie``: one bookie server (with ``--autorecovery``, auto-recovery in the
same process)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from ..errors import ConfigError
from .autorecovery import add_autorecovery_options, autorecovery_config
from .common import (
    CliError,
    FileCheck,
    Subparsers,
    add_check_config_option,
    add_client_placement_options,
    add_log_options,
    check_etcd_rules,
    client_placement_options,
    configure_logging,
    dry_run,
    port,
    run_async,
)
from .offload import add_offload_options, check_object_store, object_store_of, offloader_options
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
    p.add_argument("--otel-exporter", metavar="otlp|jsonl:FILE",
                   help="OpenTelemetry spans of the requests that carry a client's trace "
                   "context (asyncbk[otel]): otlp sends them over OTLP/HTTP to where the "
                   "OTEL_EXPORTER_OTLP_* variables say, jsonl:FILE appends them to FILE "
                   "(default: no spans)")
    add_etcd_security_options(p)
    add_autorecovery_options(p)
    t = p.add_argument_group("tiered storage", "run the offloader in this process (one "
                             "process at a time makes passes, of all those running it)")
    add_offload_options(t, "--offload-object-store")
    g = p.add_argument_group("placement of --autorecovery's copies",
                             "the placement settings of the in-process auto-recovery's client")
    add_client_placement_options(g)
    add_log_options(p)
    add_check_config_option(p)
    return p


SETTING_OPTIONS = ("metadata_uri", "port", "host", "advertised_host", "journal_dir",
                   "ledger_dir", "http_port", "http_host", "rack", "otel_exporter")
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


def companion_placement(args: argparse.Namespace, read_file: bool = True) -> dict[str, Any]:
    """The in-process auto-recovery's placement settings, checked (with ``read_file``,
    its rack file read): CliError when they are given without ``--autorecovery``."""
    placement = client_placement_options(args, read_file=read_file)
    if placement and not args.autorecovery:
        raise CliError("the placement options are for the in-process auto-recovery's client: "
                       "give --autorecovery too (the bookie's own location is --rack)")
    if args.fix_placement and not args.autorecovery:
        raise CliError("--fix-placement is an auto-recovery option: give --autorecovery too")
    return placement


WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "")
"""Hosts that listen everywhere but that no client can connect to."""


def check_config(args: argparse.Namespace) -> str:
    """``--check-config``: the settings checked as a start checks them before it
    touches its directories or the network (the settings, the metadata URI), plus a
    bookie id that clients can reach (a start takes ``0.0.0.0:PORT`` as it is); with
    mode ``files``, the files a start reads
    (TLS material, tokens, etcd's password, the object store's credentials, the rack
    file) read and the directories checked.  The OK line's summary (no secret)."""
    from ..meta.uri import parse_metadata_uri
    from ..net.etcd_security import bookie_etcd_security
    from ..net.security import load_tokens, server_context

    files = FileCheck(args.check_config)
    config = bookie_config(args)
    companion_placement(args, read_file=files.path("--bookie-racks-file",
                                                   args.bookie_racks_file))
    ar = autorecovery_config(args) if args.autorecovery else None
    parse_metadata_uri(config.metadata_uri)
    host = config.advertised_host or config.host
    if host in WILDCARD_HOSTS:
        raise ConfigError(f"the bookie id would be {host or '(empty)'}:{config.port}, an "
                          "address no client can connect to: give --advertised-host (or "
                          "advertised_host), the name or address clients reach this bookie at")
    for d in config.journal_dirs:
        files.directory("journal_dir", d)
    for d in config.ledger_dirs:
        files.directory("ledger_dir", d)
    tls = [files.path("tls_cert_file", config.tls_cert_file),
           files.path("tls_key_file", config.tls_key_file),
           files.path("tls_ca_file", config.tls_ca_file)]
    if any(tls) and config.tls_cert_file:  # what the bookie's _security does
        server_context(config.tls_cert_file, config.tls_key_file, config.tls_ca_file,
                       config.tls_require_client_cert)
        server_context(config.tls_cert_file, config.tls_key_file)
    if files.path("auth_tokens_file", config.auth_tokens_file):
        load_tokens(config.auth_tokens_file)
    etcd_files = [files.path("etcd_tls_ca_file", config.etcd_tls_ca_file),
                  files.path("etcd_tls_cert_file", config.etcd_tls_cert_file),
                  files.path("etcd_tls_key_file", config.etcd_tls_key_file),
                  files.path("etcd_password_file", config.etcd_password_file)]
    own = bool(config.etcd_tls_ca_file or config.etcd_tls_cert_file
               or config.etcd_tls_key_file)
    if files.read:
        if ar is not None or args.object_store:
            _bookie_client_security(config)  # what the in-process clients read
        else:
            bookie_etcd_security(config)
    elif not any(etcd_files):
        check_etcd_rules(config.metadata_uri, own,
                         (config.etcd_tls_cert_file, config.etcd_tls_key_file) if own
                         else (config.tls_cert_file, config.tls_key_file),
                         config.etcd_user, config.etcd_password_file)
    store = check_object_store(args, files) if args.object_store else "no offloader"
    tls_text = ("off" if not config.tls_cert_file else
                "mutual" if config.tls_require_client_cert else "on")
    etcd = "etcd TLS" if config.metadata_uri.lower().startswith("etcds://") else "etcd plain"
    if config.etcd_user:
        etcd += ", etcd user"
    return (f"bookie id {config.advertised_host or config.host}:{config.port}, rack "
            f"{config.rack or '/default-region/default-rack'}, metadata {config.metadata_uri}, "
            f"journal {len(config.journal_dirs)} dir(s), ledgers {len(config.ledger_dirs)} "
            f"dir(s), TLS {tls_text}, tokens {'on' if config.auth_tokens_file else 'off'}, "
            f"{etcd}, autorecovery {'on' if ar is not None else 'off'}, {store}, HTTP "
            f"{f'{config.http_host}:{config.http_port}' if config.http_enabled else 'off'}; "
            f"{files.summary()}")


def run(args: argparse.Namespace) -> int:
    """Check the settings, then serve until SIGTERM / Ctrl-C (with ``--autorecovery``,
    auto-recovery beside it, sharing its HTTP endpoint; with ``--check-config``, only
    check, see :func:`check_config`)."""
    from ..bookie.server import run_bookie

    if args.check_config is not None:
        return dry_run("asyncbk bookie", lambda: check_config(args))
    config = bookie_config(args)
    placement = companion_placement(args)
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
