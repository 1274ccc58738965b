"""``asyncbk shell``: admin commands against a running cluster (here and in
:mod:`.shell_admin`), and offline commands that read a stopped bookie's directories
(:mod:`.shell_local`, and ``lastmark`` here)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ..errors import BKError
from ..topology import location_of
from . import shell_admin, shell_local
from .common import (
    CliError,
    LedgerLocks,
    Parser,
    Subparsers,
    add_client_placement_options,
    add_log_options,
    client_placement_options,
    configure_logging,
    confirm,
    connect_client,
    non_negative_float,
    positive_int,
    progress,
    require_cluster,
    run_async,
)
from .security import add_client_security_options, client_security
from .shell_admin import ask_bookie_info


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """``asyncbk shell`` and its commands."""
    p = sub.add_parser("shell", help="admin commands", description="Admin commands.")
    ssub = p.add_subparsers(dest="shell_command", metavar="SHELL_COMMAND", parser_class=Parser)
    add_commands(ssub)
    return p


def add_commands(sub: Subparsers) -> None:
    """The ``asyncbk shell`` commands, on the subparsers ``sub``."""
    from ..topology import POLICIES

    def command(name: str, help_text: str, description: str = "") -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text,
                                                    description=description or help_text)
        p.add_argument("--metadata-uri", required=True,
                       help="required: the cluster, etcd://host:port[,...]/<root>")
        add_client_security_options(p)
        add_client_placement_options(p)
        add_log_options(p)
        return p

    p = command("listbookies", "list registered bookies (writable and read-only), with "
                "their network location")
    p.add_argument("--json", action="store_true",
                   help="print a JSON list instead of tab-separated lines (default: text)")
    p = command("listledgers", "list ledger ids")
    p.add_argument("--meta", action="store_true", help="print each ledger's metadata too")
    p = command("ledgermetadata", "print one ledger's metadata as JSON")
    p.add_argument("ledger_id", type=int, metavar="LEDGER_ID")
    p = command("readledger", "read entries of a ledger")
    p.add_argument("ledger_id", type=int, metavar="LEDGER_ID")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--last", type=int, default=None, help="default: the last confirmed entry")
    p.add_argument("--password-file", metavar="FILE", default=None,
                   help="a file whose first line is the ledger's password (or the "
                   "ASYNCBK_LEDGER_PASSWORD variable; never the password itself on the "
                   "command line, where other users see it; default: no password)")
    p.add_argument("--format", choices=["text", "hex", "json"], default="text")
    p = command("deleteledger", "delete a ledger (its metadata; bookies reclaim the space "
                "later); asks first unless --force")
    p.add_argument("ledger_id", type=int, metavar="LEDGER_ID")
    p.add_argument("--force", action="store_true",
                   help="delete without asking (required when stdin is not a terminal)")
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
    command("listunderreplicated", "list ledgers marked under-replicated, with their lost "
            "bookies")
    command("whoisauditor", "print which auto-recovery process is the auditor")
    p = command("recover", "re-replicate every fragment that has a replica on BOOKIE (dead "
                "or alive) to other bookies, then drop BOOKIE from the ledgers' metadata")
    p.add_argument("bookie_id", metavar="BOOKIE", help="host:port")
    p.add_argument("--dry-run", action="store_true", help="only print what would be copied")
    p.add_argument("--rate", type=float, default=0.0,
                   help="entries copied per second (default 0: no limit)")
    p.add_argument("--skip-open", action="store_true",
                   help="leave open ledgers whose last fragment is on BOOKIE (default: fence "
                   "and close them, then copy)")
    p = command("decommission", "drain a live bookie for good: make it read-only, copy "
                "everything it holds elsewhere, delete its cookie (then stop it)")
    p.add_argument("bookie_id", metavar="BOOKIE", help="host:port")
    p.add_argument("--rate", type=float, default=0.0,
                   help="entries copied per second (default 0: no limit)")
    p = command("placementcheck", "list ledger fragments whose write sets violate a rack- or "
                "region-aware placement policy, given where the bookies are now; --fix moves "
                "them", "List the ledgers (fragment, first entry, why) whose write sets "
                "span fewer racks or regions than the policy requires, given the bookies' "
                "current locations (their --rack, or --bookie-racks-file, "
                "--bookie-racks-script). Each write set must span min(minimum, write quorum, "
                "racks available) racks (region-aware: regions, then racks). The open "
                "fragment of an open ledger is its writer's: reported, not moved. A ledger "
                "created with its own placement (a namespace's segments) is checked against "
                "that placement; the policy options apply to the others. Exits 0 "
                "when nothing violates the policy (with --fix: when nothing is left), 1 "
                "otherwise. See docs/placement.md.")
    p.add_argument("--policy", choices=POLICIES, default=None,
                   help="the policy to check the ledgers without their own placement "
                   "against (default: --placement-policy, the "
                   "client's, itself random by default, which nothing can violate)")
    p.add_argument("--min-racks", type=positive_int, default=None, metavar="N",
                   help="racks each write set must span (default: "
                   "--min-racks-per-write-quorum, 2)")
    p.add_argument("--min-regions", type=positive_int, default=None, metavar="N",
                   help="region-aware: regions each write set must span (default: "
                   "--min-regions-per-write-quorum, 2)")
    p.add_argument("--fix", action="store_true",
                   help="move the violating fragments of closed ledgers (and the earlier "
                   "fragments of open ones) to bookies the policy chooses: copy their "
                   "entries, then swap the bookies in the metadata (default: only report)")
    p.add_argument("--dry-run", action="store_true",
                   help="with --fix: only print what would be moved (default: move)")
    p.add_argument("--rate", type=non_negative_float, default=0.0, metavar="ENTRIES",
                   help="with --fix: entries copied per second (default 0: no limit)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document instead of text (default: text)")
    shell_admin.add_commands(command)
    p = command("bookiesanity", "write entries to one bookie and read them back")
    p.add_argument("bookie_id", metavar="BOOKIE", help="host:port")
    p.add_argument("--entries", type=int, default=10)
    p = sub.add_parser("lastmark", help="print a bookie's checkpoint mark and journal files "
                       "(offline: reads its directories)",
                       description="Print the checkpoint of a bookie's ledger directory (the "
                       "journal position replay starts from, the current entry log) and its "
                       "journal files. Reads files only; the bookie may be running or not.")
    p.add_argument("--ledger-dir", required=True,
                   help="the bookie's ledger directory (with several: one of them)")
    p.add_argument("--journal-dir", required=True,
                   help="its journal directory (with several ledger directories: the i-th "
                   "journal directory, or ledgers-<i> inside one; see docs/storage.md)")
    add_log_options(p)
    shell_local.add_commands(sub)


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
        "custom": {k: _custom_value(v) for k, v in md.custom.items()}, "version": md.version,
    }


def _custom_value(value: bytes) -> str | dict[str, str]:
    """Custom metadata as text when it is UTF-8, else ``{"hex": "..."}``."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": value.hex()}


def _unexpected(what: str, resp: Any, expected: type) -> BKError:
    """A bookie answered a request with the wrong kind of message."""
    from ..errors import BadRequestError

    return BadRequestError(f"{what}: the bookie answered with {type(resp).__name__}, "
                           f"expected {expected.__name__}")


def _lastmark(args: argparse.Namespace) -> int:
    from ..bookie.journal_files import list_journal_files
    from ..bookie.storage import read_checkpoint

    ledger_dir, journal_dir = Path(args.ledger_dir), Path(args.journal_dir)
    for d in (ledger_dir, journal_dir):
        if not d.is_dir():
            raise CliError(f"{d} is not a directory")
    cp = read_checkpoint(ledger_dir)
    if cp is None:
        print("no checkpoint yet: replay starts at the beginning of the journal")
    else:
        print(f"checkpoint mark: journal file {cp['journal_seq']:016x} offset "
              f"{cp['journal_offset']}; entry log {cp['entry_log_id']} length "
              f"{cp['entry_log_length']}; index length {cp['index_length']}; "
              f"{len(cp['ledgers'])} ledgers")
    files = list_journal_files(journal_dir)
    print(f"{len(files)} journal file(s):")
    for _, path in files:
        print(f"  {path.name}\t{path.stat().st_size} bytes")
    return 0


async def _recover_one(bk: Any, md: Any, bookie: str, available: set[str], writable: list[str],
                       limiter: Any, stats: Any, dry_run: bool, skip_open: bool) -> bool:
    from ..autorecovery.replication import needs_recovery_first, replicate_ledger

    try:
        if needs_recovery_first(md, available):
            if skip_open:
                print(f"ledger {md.ledger_id}: open, last fragment on {bookie}: skipped")
                return True
            if dry_run:
                print(f"ledger {md.ledger_id}: open, would be fenced and closed first")
            else:
                await bk.open_ledger(md.ledger_id, password=md.password, recovery=True)
                print(f"ledger {md.ledger_id}: open: fenced and closed")
        lines = await replicate_ledger(
            bk, md.ledger_id, available, writable, limiter, stats,
            progress=None if dry_run else progress(f"ledger {md.ledger_id}"), dry_run=dry_run)
        for line in lines:
            print(("would copy " if dry_run else "copied ") + line)
        return True
    except BKError as exc:
        print(f"ledger {md.ledger_id}: FAILED: {exc}")
        return False


async def _recover(bk: Any, bookie: str, rate: float, dry_run: bool, skip_open: bool) -> int:
    """Copy every fragment on ``bookie`` elsewhere; returns the number of problems."""
    from ..autorecovery.replication import RateLimiter, ReplicationStats

    view = await bk.meta.list_bookies()
    available = set(view) - {bookie}
    writable = sorted(b for b, reg in view.items() if not reg.readonly and b != bookie)
    stats = ReplicationStats()
    limiter = RateLimiter(rate)
    problems = 0
    ledgers = [lid async for lid in bk.list_ledgers()]
    todo = []
    for lid in ledgers:
        md = await bk.ledger_metadata(lid)
        if bookie in md.all_bookies():
            todo.append(md)
    print(f"{len(todo)} of {len(ledgers)} ledgers have a fragment on {bookie}")
    # Each ledger is copied under its lock, bound to a lease kept alive for the run.
    async with LedgerLocks(bk, f"shell-recover-{os.getpid()}",
                            enabled=bool(todo) and not dry_run) as locks:
        for md in todo:
            async with locks.hold(md.ledger_id) as holder:
                if holder is not None:  # an auto-recovery worker (or GC) is on it
                    problems += 1
                    print(f"ledger {md.ledger_id}: busy ({holder} holds it); run again later")
                    continue
                problems += not await _recover_one(bk, md, bookie, available, writable,
                                                   limiter, stats, dry_run, skip_open)
    if not dry_run:
        print(f"done: {stats.fragments} fragments, {stats.entries} entries, {stats.bytes} bytes "
              f"copied; {problems} ledger(s) failed")
    return problems


async def _bookie_info(bk: Any, bookie: str) -> str:
    """Free disk and version of a bookie, asked over the protocol (BOOKIE_INFO)."""
    resp = await ask_bookie_info(bk, bookie)
    if isinstance(resp, str):
        return resp
    free_gib = resp.free_bytes / 2**30
    used = 1 - resp.free_bytes / resp.total_bytes if resp.total_bytes else 0.0
    return f"free {free_gib:.1f} GiB ({used:.0%} used)\tversion {resp.version}"


async def _listbookies(bk: Any, as_json: bool) -> None:
    """Each registered bookie: id, writable or read-only, network location (the
    default one, /default-region/default-rack, for a bookie without one), free disk
    and version."""
    view = await bk.meta.list_bookies()
    locations = await bk.bookies.current_locations(bk.config.metadata_timeout_s)
    bookies = sorted(view)
    if as_json:
        answers = await asyncio.gather(*(ask_bookie_info(bk, b) for b in bookies))
        out = []
        for bid, resp in zip(bookies, answers, strict=True):
            row: dict[str, Any] = {"id": bid,
                                   "state": "readonly" if view[bid].readonly else "writable",
                                   "rack": location_of(bid, locations)}
            if isinstance(resp, str):
                row["error"] = resp.strip("()")
            else:
                row.update(free_bytes=resp.free_bytes, total_bytes=resp.total_bytes,
                           version=resp.version)
            out.append(row)
        print(json.dumps(out, indent=2))
        return
    if not view:
        print("no bookies registered")
    infos = await asyncio.gather(*(_bookie_info(bk, b) for b in bookies))
    for bid, info in zip(bookies, infos, strict=True):
        print(f"{bid}\t{'readonly' if view[bid].readonly else 'writable'}\t"
              f"{location_of(bid, locations)}\t{info}")


async def _bookie_admin(bk: Any, bookie: str) -> str:
    view = await bk.meta.list_bookies()
    reg = view.get(bookie)
    if reg is None:
        raise CliError(f"bookie {bookie} is not registered (it must be running)")
    url = reg.info.get("http")
    if not url:
        raise CliError(f"bookie {bookie} serves no HTTP admin endpoint; start it with "
                       "--http-port so it can be switched to read-only")
    return str(url)


LEDGER_PASSWORD_ENV = "ASYNCBK_LEDGER_PASSWORD"


def _ledger_password(path: str | None) -> bytes:
    """``readledger``'s password: the first line of ``path``, else the variable, else
    none (a ledger made without one)."""
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.readline().rstrip("\r\n").encode()
        except OSError as exc:
            raise CliError(f"cannot read the password file {path}: {exc.strerror}") from None
    return os.environ.get(LEDGER_PASSWORD_ENV, "").encode()


async def _make_read_only(args: argparse.Namespace, url: str) -> None:
    """PUT the bookie's state read-only at its admin endpoint ``url``, with this
    command's TLS (the CA that signed the bookie: its endpoint is HTTPS when the bookie
    has TLS) and token (asked for by a bookie with a tokens file)."""
    import aiohttp

    security = await asyncio.to_thread(client_security, args)
    headers = {"Authorization": f"Bearer {security['token']}"} if security["token"] else {}
    ssl = security["ssl"] if url.startswith("https:") and security["ssl"] is not None \
        else True  # (aiohttp's default: the system's CAs)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s, \
                s.put(f"{url}/api/v1/bookie/state", json={"read_only": True},
                      headers=headers, ssl=ssl) as r:
            if r.status == 401:
                raise CliError(f"the admin endpoint of {args.bookie_id} refused this "
                               "command's token: give the bookies' token with "
                               "--auth-token-file (or ASYNCBK_AUTH_TOKEN)")
            if r.status != 200:
                raise CliError(f"could not make {args.bookie_id} read-only: "
                               f"{r.status} {await r.text()}")
    except aiohttp.ClientSSLError as exc:
        raise CliError(f"TLS with the admin endpoint of {args.bookie_id} ({url}) failed: "
                       f"{exc}; give the CA that signed the bookies with --tls-ca") from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise CliError(f"cannot reach the admin endpoint of {args.bookie_id} "
                       f"({url}): {exc}; is the bookie running? (for a dead "
                       "bookie use: asyncbk shell recover)") from None


async def _bookiesanity(bk: Any, bookie: str, entries: int) -> bool:
    import os as _os

    from ..proto import AddRequest, AddResponse, ReadRequest, ReadResponse, Status

    ledger_id = await bk.meta.allocate_ledger_id()  # an id nobody else uses; no metadata
    key = _os.urandom(20)
    ch = bk.bookie_client.channel(bookie)
    timeout = bk.config.add_timeout_s
    for e in range(entries):
        resp = await ch.request(AddRequest(ch.next_request_id(), ledger_id, e, key, 0, e - 1,
                                           b"sanity-%d" % e), timeout)
        if not isinstance(resp, AddResponse):
            raise _unexpected(f"add {e} to {bookie}", resp, AddResponse)
        if resp.status != Status.OK:
            print(f"add {e} answered {Status(resp.status).name}")
            return False
    for e in range(entries):
        resp = await ch.request(ReadRequest(ch.next_request_id(), ledger_id, e, 0, b""), timeout)
        if not isinstance(resp, ReadResponse):
            raise _unexpected(f"read {e} from {bookie}", resp, ReadResponse)
        if resp.status != Status.OK or resp.body != b"sanity-%d" % e:
            print(f"read {e} answered {Status(resp.status).name}")
            return False
    return True


async def _confirm_delete(md: Any) -> None:
    """Ask on the terminal before deleting; refuse (CliError) without a terminal."""
    lid = md.ledger_id
    entries = md.last_entry_id + 1 if md.state.value == "CLOSED" else None
    what = (f"{md.state.value}, {entries} entries, {md.length} bytes" if entries is not None
            else f"{md.state.value}: a writer may still be appending to it")
    custom = json.dumps({k: _custom_value(v) for k, v in md.custom.items()})
    await confirm(f"delete ledger {lid} ({what}; custom metadata {custom})?",
                  no_terminal=f"not deleting ledger {lid} without confirmation (stdin is not "
                  f"a terminal); add --force to delete it",
                  declined=f"ledger {lid} not deleted")


def run(args: argparse.Namespace) -> int:
    """``asyncbk shell COMMAND``: check the options, connect, run the command."""
    if args.shell_command is None:
        raise CliError("choose a command: asyncbk shell --help")
    if args.shell_command in shell_local.OFFLINE_COMMANDS:
        configure_logging(args, "warning")
        return shell_local.run(args)
    if args.shell_command != "lastmark":
        client_placement_options(args, read_file=True)  # bad options: before connecting
    if args.shell_command == "placementcheck" and args.dry_run and not args.fix:
        raise CliError("--dry-run shows what --fix would move: give --fix too")
    configure_logging(args, "warning")
    if args.shell_command == "lastmark":
        return _lastmark(args)

    async def go() -> int:
        async with await connect_client(args) as bk:
            cmd = args.shell_command
            if cmd != "bookieformat":  # that one must work with every bookie down
                await require_cluster(bk, args.metadata_uri)
            if cmd in shell_admin.ADMIN_COMMANDS:
                return await shell_admin.run(bk, args)
            if cmd == "listbookies":
                await _listbookies(bk, args.json)
            elif cmd == "placementcheck":
                from .placementcheck import placementcheck

                return await placementcheck(bk, args)
            elif cmd == "listledgers":
                async for lid in bk.list_ledgers():
                    if args.meta:
                        print(json.dumps(_md_json(await bk.ledger_metadata(lid))))
                    else:
                        print(lid)
            elif cmd == "ledgermetadata":
                print(json.dumps(_md_json(await bk.ledger_metadata(args.ledger_id)), indent=2))
            elif cmd == "readledger":
                password = await asyncio.to_thread(_ledger_password, args.password_file)
                rh = await bk.open_ledger(args.ledger_id, password=password,
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
            elif cmd == "deleteledger":
                md = await bk.ledger_metadata(args.ledger_id)
                if not args.force:
                    await _confirm_delete(md)
                await bk.delete_ledger(args.ledger_id)
                print(f"deleted ledger {args.ledger_id}")
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
            elif cmd == "listunderreplicated":
                marks = await bk.meta.list_underreplicated()
                if not marks:
                    print("no under-replicated ledgers")
                now_ms = time.time() * 1000
                for m in marks:
                    print(f"{m.ledger_id}\tlost {','.join(sorted(m.bookies))}\t"
                          f"marked {(now_ms - m.marked_ms) / 1000:.0f}s ago")
            elif cmd == "whoisauditor":
                holder = await bk.meta.lock_holder("auditor")
                print(holder if holder else "no auditor (no auto-recovery process is running)")
                return 0 if holder else 1
            elif cmd == "recover":
                return 1 if await _recover(bk, args.bookie_id, args.rate, args.dry_run,
                                           args.skip_open) else 0
            elif cmd == "decommission":
                url = await _bookie_admin(bk, args.bookie_id)
                await _make_read_only(args, url)
                print(f"{args.bookie_id} is read-only")
                if await _recover(bk, args.bookie_id, args.rate, False, False):
                    raise CliError("some ledgers could not be copied; run decommission again")
                await bk.meta.delete_cookie(args.bookie_id)
                print(f"deleted the cookie of {args.bookie_id}; stop it now (it holds nothing "
                      "the cluster needs)")
            elif cmd == "bookiesanity":
                ok = await _bookiesanity(bk, args.bookie_id, args.entries)
                print(f"{args.bookie_id}: {'OK' if ok else 'FAILED'}")
                return 0 if ok else 1
            elif cmd == "bookieformat":
                if not args.force:
                    raise CliError("bookieformat destroys a bookie's identity; add --force")
                if args.bookie_id in await bk.meta.list_bookies():
                    raise CliError(
                        f"bookie {args.bookie_id} is registered: it is running (or stopped "
                        f"less than a lease ago). Never format a live bookie: to retire it, "
                        f"use `asyncbk shell decommission {args.bookie_id}`; otherwise stop "
                        f"it and wait until it is no longer listed by listbookies")
                if args.delete_cookie:
                    await bk.meta.delete_cookie(args.bookie_id)
                    print(f"deleted cookie of {args.bookie_id}")
                for d in args.wipe:
                    if await asyncio.to_thread(_wipe, Path(d)):
                        print(f"wiped {d}")
            return 0

    return run_async(go)
