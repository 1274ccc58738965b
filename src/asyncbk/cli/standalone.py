"""``asyncbk standalone``: etcd and N bookies on this machine, until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from .common import (
    Subparsers,
    add_log_options,
    configure_logging,
    on_stop_signals,
    port,
    positive_int,
    run_async,
)

ETCD_PORT_STANDALONE = 2379
"""etcd's usual client port: ``asyncbk standalone`` takes it when free, so the URI in the
README (``etcd://127.0.0.1:2379/asyncbk``) works as written."""


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser("standalone", help="run etcd and N bookies on this machine until Ctrl-C",
                       description="Run a local cluster: an etcd server and N bookie processes "
                       "on loopback. Prints the metadata URI, runs until Ctrl-C, then stops "
                       "everything cleanly. Data stays in --data-dir across runs.")
    p.add_argument("--bookies", type=positive_int, default=3, help="number of bookies (default 3)")
    p.add_argument("--data-dir", default="asyncbk-data",
                   help="where etcd and the bookies keep their data (default ./asyncbk-data)")
    p.add_argument("--root", default="asyncbk", help="key prefix in etcd (default asyncbk)")
    p.add_argument("--etcd-port", type=port, default=None,
                   help=f"etcd's client port (default: the port of the last run on --data-dir, "
                   f"else {ETCD_PORT_STANDALONE} when it is free, else a free port; the "
                   f"metadata URI printed says which)")
    add_log_options(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Start the cluster, print where everything is, stop it all on Ctrl-C / SIGTERM."""
    from ..local import LocalCluster

    configure_logging(args, "warning")

    async def go() -> int:
        stop = asyncio.Event()
        on_stop_signals(stop.set)
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

    return run_async(go)
