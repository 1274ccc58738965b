"""``asyncbk shell``: admin commands against a running cluster."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def add_commands(sub: Any, add_log_options: Callable[[argparse.ArgumentParser], None]) -> None:
    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--metadata-uri", required=True, help="etcd://host:port[,...]/<root>")
        add_log_options(p)
        return p

    command("listbookies", "list registered bookies (writable and read-only)")
    p = command("listledgers", "list ledger ids")
    p.add_argument("--meta", action="store_true", help="print each ledger's metadata too")
    p = command("ledgermetadata", "print one ledger's metadata as JSON")
    p.add_argument("ledger_id", type=int)
    p = command("readledger", "read entries of a ledger")
    p.add_argument("ledger_id", type=int)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--last", type=int, default=None, help="default: the last confirmed entry")
    p.add_argument("--password", default="", help="the ledger's password (text)")
    p.add_argument("--format", choices=["text", "hex", "json"], default="text")
    p = command("simpletest", "create a ledger, write N entries, read them back, delete it")
    p.add_argument("--entries", type=int, default=100)
    p.add_argument("--ensemble", type=int, default=3)
    p.add_argument("--write-quorum", type=int, default=2)
    p.add_argument("--ack-quorum", type=int, default=2)
    p = command("bookieformat", "forget a bookie's identity (delete its cookie) and optionally "
                "wipe its directories, so it can start again as a new bookie")
    p.add_argument("--bookie-id", required=True, help="host:port")
    p.add_argument("--delete-cookie", action="store_true", help="delete the cookie in etcd")
    p.add_argument("--wipe", nargs="*", default=[], metavar="DIR",
                   help="also delete the contents of these directories")
    p.add_argument("--force", action="store_true",
                   help="required: confirms that the identity (and data) may be destroyed")


def _wipe(path: Path) -> bool:
    if not path.is_dir():
        return False
    for child in path.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()
    return True


def _md_json(md: Any) -> dict[str, Any]:
    return {
        "ledger_id": md.ledger_id, "state": md.state.value,
        "ensemble_size": md.ensemble_size, "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum, "digest": md.digest, "last_entry_id": md.last_entry_id,
        "length": md.length, "ctime": md.ctime,
        "ensembles": [[first, list(bookies)] for first, bookies in md.ensembles],
        "custom": {k: v.hex() for k, v in md.custom.items()}, "version": md.version,
    }


def run_shell(args: argparse.Namespace, run: Callable[..., int],
              configure_logging: Callable[..., None]) -> int:
    from ..client.client import BookKeeper
    from .main import CliError

    if args.shell_command is None:
        raise CliError("choose a command: asyncbk shell --help")
    configure_logging(args, "warning")

    async def go() -> int:
        async with await BookKeeper.connect(args.metadata_uri) as bk:
            cmd = args.shell_command
            if cmd == "listbookies":
                view = await bk.meta.list_bookies()
                if not view:
                    print("no bookies registered")
                for bid in sorted(view):
                    print(f"{bid}\t{'readonly' if view[bid].readonly else 'writable'}")
            elif cmd == "listledgers":
                async for lid in bk.list_ledgers():
                    if args.meta:
                        print(json.dumps(_md_json(await bk.ledger_metadata(lid))))
                    else:
                        print(lid)
            elif cmd == "ledgermetadata":
                print(json.dumps(_md_json(await bk.ledger_metadata(args.ledger_id)), indent=2))
            elif cmd == "readledger":
                rh = await bk.open_ledger(args.ledger_id, password=args.password.encode(),
                                          recovery=False)
                last = rh.last_add_confirmed if args.last is None else args.last
                if last >= args.first:
                    for e in await rh.read_unconfirmed(args.first, last):
                        if args.format == "hex":
                            print(f"{e.entry_id}\t{e.data.hex()}")
                        elif args.format == "json":
                            print(json.dumps({"entry_id": e.entry_id,
                                              "data": e.data.decode("utf-8", "backslashreplace")}))
                        else:
                            print(f"{e.entry_id}\t{e.data.decode('utf-8', 'backslashreplace')}")
            elif cmd == "simpletest":
                t0 = time.perf_counter()
                lh = await bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum)
                futs = [lh.append(f"entry-{i}".encode()) for i in range(args.entries)]
                for f in futs:
                    await f
                await lh.close()
                rh = await bk.open_ledger(lh.id)
                entries = await rh.read(0, rh.last_add_confirmed) if args.entries else []
                ok = [e.data for e in entries] == [f"entry-{i}".encode()
                                                   for i in range(args.entries)]
                await bk.delete_ledger(lh.id)
                print(f"ledger {lh.id}: wrote and read back {len(entries)} entries "
                      f"in {time.perf_counter() - t0:.3f}s: {'OK' if ok else 'MISMATCH'}")
                return 0 if ok else 1
            elif cmd == "bookieformat":
                if not args.force:
                    raise CliError("bookieformat destroys a bookie's identity; add --force")
                if args.delete_cookie:
                    await bk.meta.delete_cookie(args.bookie_id)
                    print(f"deleted cookie of {args.bookie_id}")
                for d in args.wipe:
                    if await asyncio.to_thread(_wipe, Path(d)):
                        print(f"wiped {d}")
            return 0

    return run(go)
