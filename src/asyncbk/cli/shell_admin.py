"""``asyncbk shell``'s cluster-wide admin commands after BookKeeper's shell:
``bookieinfo``, ``clusterinfo``, ``whatisinstanceid``, ``triggeraudit``,
``cookie_get`` and ``cookie_update``.

``cookie_update`` is the one that writes: it records a stopped bookie's directories
after they were moved with their data (a new mount point), and nothing else.  It
refuses while the bookie is registered or holds its directories, refuses directories
that do not carry this bookie's cookie of this cluster, and keeps the numbers of
journal and ledger directories; the cookie in the metadata store is replaced by
compare-and-swap on the version read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..bookie.cookie import COOKIE_FILE, LOCK_FILE, Cookie, write_local_cookie
from ..bookie.fileio import OS_FILE_IO
from ..errors import BKError, CookieError, MetadataVersionError, NoSuchLedgerError
from .common import CliError

ADMIN_COMMANDS = ("bookieinfo", "clusterinfo", "whatisinstanceid", "triggeraudit",
                  "cookie_get", "cookie_update")
"""The commands of this module (each with ``--metadata-uri``)."""

BOOKIE_INFO_TIMEOUT_S = 5.0

CommandFactory = Callable[..., argparse.ArgumentParser]
"""``command(name, help, description="")``: a shell command's parser with the client
options (``--metadata-uri``, security, placement, logging)."""


def bookie_id(text: str) -> str:
    """A bookie id, ``host:port`` (argparse type)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a bookie id host:port, got {text!r}")
    return text


def add_commands(command: CommandFactory) -> None:
    """Register this module's commands through the shell's ``command`` factory."""
    p = command("bookieinfo", "free and total disk space of every registered bookie, and "
                "the cluster's totals",
                "Ask every registered bookie for its state, free and total disk space and "
                "version (BOOKIE_INFO), and print the cluster's totals. Exits 1 when a "
                "registered bookie does not answer.")
    p.add_argument("--json", action="store_true", help="print JSON (default: text)")
    p = command("clusterinfo", "the cluster at a glance: instance id, bookies by state, "
                "auditor, under-replicated and total ledgers",
                "Print the cluster's instance id; its bookies: writable, read-only, and "
                "those with a cookie but no registration (stopped, dead or retired "
                "without being formatted); the auditor; the numbers of under-replicated "
                "ledgers and of ledgers.")
    p.add_argument("--json", action="store_true", help="print JSON (default: text)")
    command("whatisinstanceid", "print the cluster's instance id (recorded in every "
            "bookie's cookie)")
    p = command("triggeraudit", "audit now: mark every ledger with a fragment on an "
                "unregistered bookie under-replicated, without the lost-bookie delay",
                "Do at once what the auditor does once a bookie has been gone for the "
                "lost-bookie delay: every ledger that has a fragment on a bookie that is "
                "not registered is marked under-replicated, and the auto-recovery "
                "workers copy those fragments. It skips the delay, so a bookie that is "
                "only restarting gets its ledgers copied too; use --bookie to name the "
                "lost ones. Needs a running `asyncbk autorecovery` (or a bookie with "
                "--autorecovery) for the copying; without one, use `asyncbk shell "
                "recover BOOKIE`.")
    p.add_argument("--bookie", type=bookie_id, action="append", default=[],
                   metavar="BOOKIE", help="only this unregistered bookie (repeat for "
                   "several; default: every unregistered bookie ledgers refer to)")
    p.add_argument("--dry-run", action="store_true",
                   help="only print what would be marked (default: mark)")
    p = command("cookie_get", "print a bookie's cookie from the metadata store; with its "
                "directories, compare the copies in them",
                "Print the cookie of BOOKIE in the metadata store: bookie id, cluster "
                "instance id, journal and ledger directories, version. With --journal-dir "
                "/ --ledger-dir, also compare the COOKIE file of each directory with it "
                "(reads only); exits 1 when a copy is missing or differs.")
    p.add_argument("bookie", type=bookie_id, metavar="BOOKIE", help="host:port")
    p.add_argument("--journal-dir", action="append", default=[], metavar="DIR",
                   help="a directory to compare (repeat; default: none)")
    p.add_argument("--ledger-dir", action="append", default=[], metavar="DIR",
                   help="a directory to compare (repeat; default: none)")
    p.add_argument("--json", action="store_true", help="print JSON (default: text)")
    p = command("cookie_update", "record a stopped bookie's directories after they were "
                "moved with their data (the cookie in the metadata store and in each "
                "directory)",
                "Record new paths of a stopped bookie's directories, after the directories "
                "were moved or remounted with their data: the cookie in the metadata "
                "store and the COOKIE file in each directory get the new paths. Give "
                "every directory, in the same order as before. Safe by construction: "
                "refused while BOOKIE is registered (running, or stopped less than a lease "
                "ago) or a process holds the directories; refused unless every directory "
                "already holds a cookie of BOOKIE in this cluster (it never adopts other "
                "data); the numbers of journal and of ledger directories must stay the "
                "same (add ledger directories with `asyncbk bookie "
                "--allow-storage-expansion`); the metadata store's cookie is replaced "
                "only if nobody changed it meanwhile. The bookie id cannot change (a "
                "bookie under another address is a new bookie: `asyncbk shell recover`).")
    p.add_argument("bookie", type=bookie_id, metavar="BOOKIE", help="host:port")
    p.add_argument("--journal-dir", action="append", required=True, metavar="DIR",
                   help="required: a journal directory at its new path (repeat, in order)")
    p.add_argument("--ledger-dir", action="append", required=True, metavar="DIR",
                   help="required: a ledger directory at its new path (repeat, in order)")
    p.add_argument("--dry-run", action="store_true",
                   help="only check and print what would change (default: change)")


# ------------------------------------------------------------------ bookies


async def ask_bookie_info(bk: Any, bookie: str) -> Any:
    """The bookie's BOOKIE_INFO answer, or a text saying why there is none."""
    from ..proto import BookieInfoRequest, BookieInfoResponse

    ch = bk.bookie_client.channel(bookie)
    try:
        resp = await ch.request(BookieInfoRequest(ch.next_request_id()), BOOKIE_INFO_TIMEOUT_S)
    except BKError as exc:
        return f"(no answer: {exc})"
    if not isinstance(resp, BookieInfoResponse):
        return f"(unexpected answer: {type(resp).__name__})"
    return resp


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


async def bookieinfo(bk: Any, as_json: bool) -> int:
    view = await bk.meta.list_bookies()
    bookies = sorted(view)
    answers = await asyncio.gather(*(ask_bookie_info(bk, b) for b in bookies))
    rows: list[dict[str, Any]] = []
    free = total = 0
    silent = 0
    for bid, resp in zip(bookies, answers, strict=True):
        row: dict[str, Any] = {"id": bid,
                               "registered": "readonly" if view[bid].readonly else "writable"}
        if isinstance(resp, str):
            silent += 1
            row["error"] = resp.strip("()")
        else:
            free += resp.free_bytes
            total += resp.total_bytes
            row.update(state=resp.state, free_bytes=resp.free_bytes,
                       total_bytes=resp.total_bytes, version=resp.version)
        rows.append(row)
    if as_json:
        print(json.dumps({"bookies": rows, "free_bytes": free, "total_bytes": total},
                         indent=2))
    else:
        if not rows:
            print("no bookies registered")
        for row in rows:
            if "error" in row:
                print(f"{row['id']}\t{row['registered']}\t({row['error']})")
                continue
            used = 1 - row["free_bytes"] / row["total_bytes"] if row["total_bytes"] else 0.0
            print(f"{row['id']}\t{row['state']}\tfree {_gib(row['free_bytes'])}\t"
                  f"total {_gib(row['total_bytes'])}\t{used:.0%} used\t"
                  f"version {row['version']}")
        print(f"cluster: {len(rows) - silent} bookie(s) answered, free {_gib(free)} of "
              f"{_gib(total)}")
    return 1 if silent else 0


async def _cookie_ids(bk: Any) -> list[str]:
    from ..meta.keys import cookie

    prefix = cookie(bk.meta.root, "")
    return [kv.key[len(prefix):] for kv in await bk.meta.kv_range(prefix)]


async def clusterinfo(bk: Any, as_json: bool) -> int:
    from ..meta.keys import instance_id

    got = await bk.meta.kv_get(instance_id(bk.meta.root))
    view = await bk.meta.list_bookies()
    writable = sorted(b for b, reg in view.items() if not reg.readonly)
    readonly = sorted(b for b, reg in view.items() if reg.readonly)
    unregistered = sorted(set(await _cookie_ids(bk)) - set(view))
    auditor = await bk.meta.lock_holder("auditor")
    marked = len(await bk.meta.list_underreplicated())
    ledgers = 0
    async for _ in bk.list_ledgers():
        ledgers += 1
    info = {"instance_id": got.value.decode() if got is not None else None,
            "writable_bookies": writable, "readonly_bookies": readonly,
            "unregistered_bookies": unregistered, "auditor": auditor,
            "underreplicated_ledgers": marked, "ledgers": ledgers}
    if as_json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"instance id: {info['instance_id'] or '(none)'}")
    print(f"bookies: {len(writable)} writable, {len(readonly)} read-only, "
          f"{len(unregistered)} with a cookie but not registered")
    for title, ids in (("writable", writable), ("read-only", readonly),
                       ("not registered", unregistered)):
        for b in ids:
            print(f"  {b}\t{title}")
    print(f"auditor: {auditor or 'none (no auto-recovery process is running)'}")
    print(f"under-replicated ledgers: {marked}")
    print(f"ledgers: {ledgers}")
    return 0


async def whatisinstanceid(bk: Any) -> int:
    from ..meta.keys import instance_id

    got = await bk.meta.kv_get(instance_id(bk.meta.root))
    if got is None:
        raise CliError("this cluster has no instance id yet (no bookie has started)")
    print(got.value.decode())
    return 0


async def triggeraudit(bk: Any, only: Sequence[str], dry_run: bool) -> int:
    view = await bk.meta.list_bookies()
    running = [b for b in only if b in view]
    if running:
        raise CliError(f"{', '.join(running)} registered (running): only a bookie that is "
                       "gone can be lost; to move data off a live one use "
                       "`asyncbk shell decommission`")
    marked = 0
    lost: set[str] = set()
    async for lid in bk.list_ledgers():
        try:
            md = await bk.ledger_metadata(lid)
        except NoSuchLedgerError:
            continue  # deleted meanwhile
        hit = md.all_bookies() - set(view)
        if only:
            hit &= set(only)
        if not hit:
            continue
        lost |= hit
        marked += 1
        if not dry_run:
            await bk.meta.mark_underreplicated(lid, hit)
        print(f"ledger {lid}: {'would be marked' if dry_run else 'marked'} under-replicated "
              f"(lost {','.join(sorted(hit))})")
    verb = "would mark" if dry_run else "marked"
    print(f"{verb} {marked} ledger(s) with fragments on {len(lost)} unregistered "
          f"bookie(s){': ' + ', '.join(sorted(lost)) if lost else ''}")
    if marked and not dry_run and await bk.meta.lock_holder("auditor") is None:
        print("note: no auto-recovery process is running, so nothing copies them yet: start "
              "`asyncbk autorecovery`, or copy by hand with `asyncbk shell recover BOOKIE`")
    return 0


# ------------------------------------------------------------------ cookies


def _cookie_json(c: Cookie) -> dict[str, Any]:
    return asdict(c)


def _dir_list(value: str) -> list[str]:
    return value.split(",") if value else []


def _read_local(d: Path) -> Cookie | None:
    """The cookie file of ``d``; None if there is none; CliError if ``d`` is missing."""
    if not d.is_dir():
        raise CliError(f"{d} is not a directory")
    path = d / COOKIE_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return Cookie.from_bytes(data, str(path))


async def _remote(bk: Any, bookie: str) -> tuple[Cookie, int]:
    stored = await bk.meta.read_cookie(bookie)
    if stored is None:
        raise CliError(f"no cookie for bookie {bookie} in the metadata store (it never "
                       "started in this cluster, or it was formatted)")
    return Cookie.from_bytes(stored[0], "the metadata store"), stored[1]


def _differs(a: Cookie, b: Cookie) -> list[str]:
    other = asdict(b)
    return [k for k, v in asdict(a).items() if other[k] != v]


async def cookie_get(bk: Any, args: argparse.Namespace) -> int:
    remote, version = await _remote(bk, args.bookie)
    dirs = [Path(d) for d in (*args.journal_dir, *args.ledger_dir)]
    local = await asyncio.to_thread(lambda: {d: _read_local(d) for d in dirs})
    compared = {str(d): ("missing" if c is None else
                         "same" if c == remote else "differs in " + ", ".join(_differs(c, remote)))
                for d, c in local.items()}
    if args.json:
        print(json.dumps({"cookie": _cookie_json(remote), "version": version,
                          "directories": compared}, indent=2))
    else:
        print(f"bookie id: {remote.bookie_id}")
        print(f"instance id: {remote.instance_id}")
        print(f"journal directories: {remote.journal_dir}")
        print(f"ledger directories: {remote.ledger_dir}")
        print(f"format: {remote.format}  version: {version}")
        for d, what in compared.items():
            print(f"{d}/{COOKIE_FILE}: {what}")
    return 0 if all(v == "same" for v in compared.values()) else 1


@contextlib.contextmanager
def _locked(directories: Sequence[Path]) -> Iterator[None]:
    """Exclusive locks on the directories' LOCK files (the ones a bookie takes) for the
    block, so no bookie starts on them while their cookies change."""
    import fcntl

    fds: list[int] = []
    try:
        for d in directories:
            fd = os.open(d / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CliError(f"{d} is in use by a running bookie (or another command): "
                               "stop it first; a running bookie's cookie is never "
                               "changed") from None
        yield
    finally:
        for fd in fds:
            os.close(fd)


def _check_update(bookie: str, remote: Cookie, journal: list[Path], ledger: list[Path],
                  local: dict[Path, Cookie | None]) -> None:
    """CliError unless the directories may be recorded for ``bookie``."""
    for name, given, recorded in (("journal", journal, _dir_list(remote.journal_dir)),
                                  ("ledger", ledger, _dir_list(remote.ledger_dir))):
        if len(given) != len(recorded):
            raise CliError(
                f"{len(given)} {name} directories given, {len(recorded)} recorded: their "
                f"number may not change here (ledger directories are added by starting "
                f"the bookie with --allow-storage-expansion)")
    if len(set(journal + ledger)) != len(journal + ledger):
        raise CliError("a directory is given twice")
    for d, c in local.items():
        if c is None:
            raise CliError(f"{d} holds no cookie: it is not a directory of bookie {bookie} "
                           "(cookie_update only records directories moved with their data)")
        if c.bookie_id != bookie or c.instance_id != remote.instance_id:
            whose = (f"bookie {c.bookie_id}" if c.bookie_id != bookie
                     else "another cluster (instance id differs)")
            raise CliError(f"{d} holds the cookie of {whose}: refusing to record it for "
                           f"bookie {bookie}")


async def cookie_update(bk: Any, args: argparse.Namespace) -> int:
    bookie = args.bookie
    if bookie in await bk.meta.list_bookies():
        raise CliError(f"bookie {bookie} is registered: it is running (or stopped less than "
                       "a lease ago). Stop it and wait until listbookies no longer shows it")
    remote, version = await _remote(bk, bookie)

    def given() -> tuple[list[Path], list[Path]]:
        for d in (*args.journal_dir, *args.ledger_dir):
            if not Path(d).is_dir():
                raise CliError(f"{d} is not a directory")
        return ([Path(d).resolve() for d in args.journal_dir],
                [Path(d).resolve() for d in args.ledger_dir])

    journal, ledger = await asyncio.to_thread(given)
    every = [*journal, *ledger]
    new = Cookie(bookie, remote.instance_id, ",".join(map(str, journal)),
                 ",".join(map(str, ledger)), remote.format)
    with _locked(every):
        try:
            local = await asyncio.to_thread(lambda: {d: _read_local(d) for d in every})
        except CookieError as exc:
            raise CliError(str(exc)) from None
        _check_update(bookie, remote, journal, ledger, local)
        stale = [d for d in every if local[d] != new]
        if remote == new and not stale:
            print(f"the cookie of {bookie} already records these directories: nothing to do")
            return 0
        for name, old, now in (("journal", remote.journal_dir, new.journal_dir),
                               ("ledger", remote.ledger_dir, new.ledger_dir)):
            if old != now:
                print(f"{name} directories: {old} -> {now}")
        if args.dry_run:
            print(f"dry run: would rewrite the COOKIE file of {len(stale)} director"
                  f"{'y' if len(stale) == 1 else 'ies'} and the cookie in the metadata store")
            return 0

        def write_all() -> None:
            for d in stale:
                write_local_cookie(OS_FILE_IO, d, new)

        await asyncio.to_thread(write_all)
        if remote != new:
            try:
                await bk.meta.write_cookie(bookie, new.to_bytes(), version)
            except MetadataVersionError:
                raise CliError(f"the cookie of {bookie} changed in the metadata store while "
                               "this ran; nothing there was overwritten: run "
                               "cookie_update again") from None
    print(f"updated the cookie of {bookie}: start it with exactly these directories, in "
          "this order")
    return 0


async def run(bk: Any, args: argparse.Namespace) -> int:
    """Run ``args.shell_command`` (one of :data:`ADMIN_COMMANDS`) on the client ``bk``."""
    cmd = args.shell_command
    if cmd == "bookieinfo":
        code = await bookieinfo(bk, args.json)
    elif cmd == "clusterinfo":
        code = await clusterinfo(bk, args.json)
    elif cmd == "whatisinstanceid":
        code = await whatisinstanceid(bk)
    elif cmd == "triggeraudit":
        code = await triggeraudit(bk, args.bookie, args.dry_run)
    elif cmd == "cookie_get":
        code = await cookie_get(bk, args)
    else:
        code = await cookie_update(bk, args)
    return code
