"""``asyncbk shell``'s offline commands: they read a stopped bookie's directories
(journal files, entry logs, the index, the checkpoint) and change nothing.

* ``listfilesondisc``: the files of each directory, with sizes;
* ``readjournal`` / ``readlog``: the records of journal files / of an entry log
  (both hold records of the journal format, :mod:`asyncbk.bookie.journal_format`);
* ``readlogmetadata``: which ledgers an entry log holds, and how many bytes each;
* ``localconsistencycheck``: every entry the index points at is where it says, whole
  and with a good checksum; the checkpoint reads; journals end cleanly.

A running bookie holds an exclusive lock on ``LOCK`` in each of its directories;
these commands take a shared lock on it for as long as they read (never creating a
file), so they refuse to read a running bookie's files, and a bookie started
meanwhile refuses to start until they are done.  Master keys (in LEDGER_KEY records
and checkpoints) are never printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..bookie.cookie import COOKIE_FILE, LOCK_FILE
from ..bookie.fileio import OS_FILE_IO
from ..bookie.journal_files import zeros_only
from ..bookie.journal_format import (
    AddRecord,
    DeleteLedgerRecord,
    ExplicitLacRecord,
    FenceRecord,
    LedgerKeyRecord,
    Record,
    decode_one,
    parse_journal_file_name,
    record_size_at,
)
from ..bookie.storage.checkpoint import CHECKPOINT_FILE, read_checkpoint
from ..bookie.storage.entrylog import ENTRYLOG_DIR, entry_log_name, parse_entry_log_name
from ..bookie.storage.index import (
    INDEX_FILE,
    INDEX_RECORD,
    Location,
    MemoryEntryIndex,
    load_index_records,
)
from ..bookie.storage.indexlog import INDEX_COMPACT_FILE
from ..bookie.storage.kv import LMDB_DIR
from ..errors import BKError
from .common import CliError, Subparsers, add_log_options, non_negative_int

OFFLINE_COMMANDS = ("listfilesondisc", "readjournal", "readlog", "readlogmetadata",
                    "localconsistencycheck")
"""The commands of this module: no metadata URI, no client."""

READ_CHUNK_BYTES = 4 * 1024 * 1024
"""Files are read this much at a time (more when one record is longer)."""

OFFLINE_NOTE = ("Offline: reads the directories of a stopped bookie and changes nothing; "
                "refused while a bookie holds the directories (their LOCK file).")


# ------------------------------------------------------------------ parsers


def add_commands(sub: Subparsers) -> None:
    """Register the offline commands on ``asyncbk shell``'s subparsers."""

    def command(name: str, help_text: str, description: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(
            name, help=help_text + " (offline)", description=f"{description} {OFFLINE_NOTE}")
        add_log_options(p)
        return p

    def dirs(p: argparse.ArgumentParser, journal: bool, ledger: bool, required: bool) -> None:
        if journal:
            p.add_argument("--journal-dir", action="append", default=[], required=required,
                           metavar="DIR", help="a journal directory of the bookie (repeat "
                           "for several)" + ("" if required else "; default: none"))
        if ledger:
            p.add_argument("--ledger-dir", action="append", default=[], required=required,
                           metavar="DIR", help="a ledger directory of the bookie (repeat "
                           "for several)" + ("" if required else "; default: none"))

    p = command("listfilesondisc", "list a bookie's journal files, entry logs and index files",
                "List the files of a bookie's journal and ledger directories: journal "
                "files (sequence number, bytes), entry logs (id, bytes), the index, the "
                "checkpoint and the cookie. Give at least one directory.")
    dirs(p, True, True, False)
    p.add_argument("--journal", action="store_true", help="only journal files")
    p.add_argument("--entrylog", action="store_true", help="only entry logs")
    p.add_argument("--index", action="store_true", help="only index files")

    def record_filters(p: argparse.ArgumentParser) -> None:
        p.add_argument("--ledger-id", type=non_negative_int, default=None,
                       help="only the records of this ledger (default: all)")
        p.add_argument("--entry-id", type=non_negative_int, default=None,
                       help="only this entry (with --ledger-id; default: all)")
        p.add_argument("--msg", action="store_true",
                       help="print each entry's stored body too: the client's envelope "
                       "(ledger, entry, LAC, length, digest), then the payload; escaped "
                       "like a Python bytes literal (with --format json: hex, in "
                       "\"data_hex\")")
        p.add_argument("--format", choices=["text", "json"], default="text",
                       help="text lines, or one JSON object a line (default: text)")

    p = command("readjournal", "print the records of a bookie's journal files",
                "Print the records of journal files, in order: offset, type, ledger, entry "
                "(or fence, LAC, deletion) and size. A torn or damaged tail is reported "
                "where it starts; the bookie cuts it at its next start (it was never "
                "acknowledged when it is the last file's).")
    p.add_argument("journal", nargs="?", default=None, metavar="JOURNAL",
                   help="a journal file: its path, name (0000000000000001.jnl) or sequence "
                   "number in hex (default: every journal file of --journal-dir, in order)")
    p.add_argument("--journal-dir", required=True, metavar="DIR",
                   help="the journal directory (one; the bookie's i-th with several)")
    record_filters(p)

    p = command("readlog", "print the entries of one entry log of a bookie",
                "Print the ADD records of an entry log (ledger_dir/entrylog/<id>.log): "
                "offset, ledger, entry, size. An entry log holds journal-format records, "
                "each with its checksum; a damaged record is reported where it is.")
    p.add_argument("log", metavar="LOG", help="the entry log: its id (decimal, or hex "
                   "as in its name with 0x), its file name (00000000.log) or path")
    p.add_argument("--ledger-dir", required=True, metavar="DIR",
                   help="the ledger directory holding it")
    record_filters(p)

    p = command("readlogmetadata", "print which ledgers one entry log of a bookie holds",
                "Print, for one entry log, each ledger it holds with its entries and bytes, "
                "and the totals. Records of deleted ledgers are counted too: the space "
                "is reclaimed by compaction.")
    p.add_argument("log", metavar="LOG", help="the entry log: its id, file name or path")
    p.add_argument("--ledger-dir", required=True, metavar="DIR",
                   help="the ledger directory holding it")
    p.add_argument("--json", action="store_true", help="print JSON (default: text)")

    p = command("localconsistencycheck", "check a stopped bookie's storage: every indexed "
                "entry readable and intact",
                "Check the storage of a stopped bookie: the checkpoint of each ledger "
                "directory reads; every entry its index (index.log, or the LMDB index) "
                "points at is an intact record of that ledger and entry in an existing "
                "entry log; each journal file decodes to its end (only the last may have "
                "a torn tail, cut at the next start). Exits 0 when consistent, 1 when "
                "something is wrong (each problem on a line).")
    dirs(p, True, True, True)


# ------------------------------------------------------------------ the running check


@contextlib.contextmanager
def offline(directories: Sequence[Path]) -> Iterator[None]:
    """Shared locks on the directories' LOCK files for the block; CliError when a
    directory is missing or a running bookie holds it.  Creates nothing."""
    import fcntl

    fds: list[int] = []
    try:
        for d in directories:
            if not d.is_dir():
                raise CliError(f"{d} is not a directory")
            try:
                fd = os.open(d / LOCK_FILE, os.O_RDONLY)
            except FileNotFoundError:
                continue  # no bookie ever ran on it
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CliError(f"{d} is in use by a running bookie: stop the bookie first "
                               "(offline commands read a stopped bookie's files; use "
                               "asyncbk shell bookieinfo or the bookie's admin endpoint "
                               "for a running one)") from None
        yield
    finally:
        for fd in fds:
            os.close(fd)


# ------------------------------------------------------------------ reading records


@dataclass
class Scan:
    """What :func:`scan_file` found at the end of a file."""

    size: int = 0
    good_end: int = 0
    """Offset just past the last good record (``size``: the file is whole)."""
    records: int = 0


def scan_file(path: Path, scan: Scan) -> Iterator[tuple[int, Record]]:
    """``(offset, record)`` of each good record of a journal-format file, in order,
    read in chunks; stops at the first bad or torn record (``scan.good_end``)."""
    try:
        f = path.open("rb")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    with f:
        scan.size = os.fstat(f.fileno()).st_size
        buf = b""
        base = 0  # file offset of buf[0]
        pos = 0  # offset in buf
        eof = False
        while True:
            need = record_size_at(buf, pos)
            if need is None:
                break  # a bad length: garbage from here
            if pos + need > len(buf):
                if eof:
                    break  # torn: the file ends inside the record
                chunk = f.read(max(READ_CHUNK_BYTES, need))
                eof = not chunk
                buf = buf[pos:] + chunk
                base += pos
                pos = 0
                continue
            got = decode_one(buf, pos)
            if got is None:
                break  # checksum or content
            record, end = got
            scan.records += 1
            yield base + pos, record
            pos = end
        scan.good_end = base + pos


def _describe(record: Record) -> dict[str, Any]:
    """A record as printable fields; a LEDGER_KEY's key is never shown."""
    if isinstance(record, AddRecord):
        return {"type": "ADD", "ledger_id": record.ledger_id, "entry_id": record.entry_id,
                "bytes": len(record.body)}
    if isinstance(record, LedgerKeyRecord):
        return {"type": "LEDGER_KEY", "ledger_id": record.ledger_id,
                "key_bytes": len(record.master_key)}
    if isinstance(record, FenceRecord):
        return {"type": "FENCE", "ledger_id": record.ledger_id}
    if isinstance(record, ExplicitLacRecord):
        return {"type": "EXPLICIT_LAC", "ledger_id": record.ledger_id, "lac": record.lac}
    if isinstance(record, DeleteLedgerRecord):
        return {"type": "DELETE_LEDGER", "ledger_id": record.ledger_id}
    return {"type": type(record).__name__}


def _print_records(path: Path, args: argparse.Namespace) -> Scan:
    scan = Scan()
    for offset, record in scan_file(path, scan):
        if args.ledger_id is not None and getattr(record, "ledger_id", None) != args.ledger_id:
            continue
        if args.entry_id is not None and getattr(record, "entry_id", None) != args.entry_id:
            continue
        row = {"file": path.name, "offset": offset, **_describe(record)}
        if args.format == "json":
            if args.msg and isinstance(record, AddRecord):
                row["data_hex"] = record.body.hex()
            print(json.dumps(row))
            continue
        line = "\t".join(f"{k}={v}" if k not in ("file", "type") else str(v)
                         for k, v in row.items())
        if args.msg and isinstance(record, AddRecord):
            line += "\tdata=" + repr(record.body)[2:-1]  # one line: every control escaped
        print(line)
    return scan


JOURNAL_TAIL = ("; in the last journal file this is the tail of a crash: never acknowledged, "
                "and cut at the next start")
JOURNAL_GAP = "; the journal records after it are not replayed"
ENTRY_LOG_GAP = "; entries indexed past it cannot be read"


def _tail(path: Path, scan: Scan, consequence: str) -> str | None:
    """Why ``path`` did not decode to its end, and ``consequence`` (None: it did)."""
    if scan.good_end == scan.size:
        return None
    return (f"{path}: {scan.size - scan.good_end} bytes from offset {scan.good_end} do not "
            f"decode (torn or damaged){consequence}")


def _journal_tail(path: Path, scan: Scan, last: bool) -> str | None:
    """:func:`_tail` of a journal file: zeros alone after the last file's records are the
    space its writer allocated ahead of itself, which is no damage."""
    if last and scan.good_end < scan.size and zeros_only(OS_FILE_IO, path, scan.good_end,
                                                          scan.size):
        return None
    return _tail(path, scan, JOURNAL_TAIL if last else JOURNAL_GAP)


# ------------------------------------------------------------------ the commands


def _journal_files(journal_dir: Path) -> list[tuple[int, Path]]:
    out = []
    for p in journal_dir.iterdir():
        seq = parse_journal_file_name(p.name)
        if seq is not None:
            out.append((seq, p))
    return sorted(out)


def _one_journal(journal_dir: Path, name: str) -> Path:
    path = Path(name)
    if path.is_file():
        return path
    if parse_journal_file_name(name) is not None:
        path = journal_dir / name
    else:
        try:
            seq = int(name, 16)
        except ValueError:
            raise CliError(f"{name!r} is neither a journal file, a journal file name "
                           "(0000000000000001.jnl) nor a sequence number in hex") from None
        path = journal_dir / f"{seq:016x}.jnl"
    if not path.is_file():
        raise CliError(f"no journal file {path.name} in {journal_dir}")
    return path


def _entry_log(ledger_dir: Path, name: str) -> Path:
    path = Path(name)
    if path.is_file() and parse_entry_log_name(path.name) is not None:
        return path
    if parse_entry_log_name(name) is not None:
        log_id: int | None = parse_entry_log_name(name)
    else:
        try:
            log_id = int(name, 0)
        except ValueError:
            log_id = None
        if log_id is None or not 0 <= log_id <= 0xFFFFFFFF:
            raise CliError(f"{name!r} is not an entry log id (0..4294967295, or 0x... as "
                           "in its file name), file name (00000000.log) or path")
    assert log_id is not None
    path = ledger_dir / ENTRYLOG_DIR / entry_log_name(log_id)
    if not path.is_file():
        raise CliError(f"no entry log {path.name} in {ledger_dir / ENTRYLOG_DIR}")
    return path


def _readjournal(args: argparse.Namespace) -> int:
    journal_dir = Path(args.journal_dir)
    with offline([journal_dir]):
        every = [p for _, p in _journal_files(journal_dir)]
        files = every if args.journal is None else [_one_journal(journal_dir, args.journal)]
        if not files:
            print(f"no journal files in {journal_dir}")
        problems = 0
        for path in files:
            scan = _print_records(path, args)
            is_last = bool(every) and path.resolve() == every[-1].resolve()
            why = _journal_tail(path, scan, is_last)
            if why:
                print(why)
                problems += not is_last
    return 1 if problems else 0


def _readlog(args: argparse.Namespace) -> int:
    ledger_dir = Path(args.ledger_dir)
    with offline([ledger_dir]):
        path = _entry_log(ledger_dir, args.log)
        scan = _print_records(path, args)
    why = _tail(path, scan, ENTRY_LOG_GAP)
    if why:
        print(why)
        return 1
    return 0


def _readlogmetadata(args: argparse.Namespace) -> int:
    ledger_dir = Path(args.ledger_dir)
    with offline([ledger_dir]):
        path = _entry_log(ledger_dir, args.log)
        scan = Scan()
        ledgers: dict[int, list[int]] = {}
        for _, record in scan_file(path, scan):
            if isinstance(record, AddRecord):
                counts = ledgers.setdefault(record.ledger_id, [0, 0])
                counts[0] += 1
                counts[1] += len(record.body)
    total = sum(c[1] for c in ledgers.values())
    bad = scan.size - scan.good_end
    if args.json:
        print(json.dumps({"entry_log": path.name, "file_bytes": scan.size,
                          "payload_bytes": total, "undecodable_bytes": bad,
                          "ledgers": [{"ledger_id": lid, "entries": c[0], "bytes": c[1]}
                                      for lid, c in sorted(ledgers.items())]}, indent=2))
    else:
        print(f"entry log {path.name}: {scan.size} bytes, {len(ledgers)} ledger(s), "
              f"{total} payload bytes")
        for lid, (n, size) in sorted(ledgers.items()):
            print(f"ledger {lid}\t{n} entries\t{size} bytes")
        if bad:
            print(f"{bad} bytes from offset {scan.good_end} do not decode (torn or damaged)")
    return 1 if bad else 0


def _listfilesondisc(args: argparse.Namespace) -> int:
    journal_dirs = [Path(d) for d in args.journal_dir]
    ledger_dirs = [Path(d) for d in args.ledger_dir]
    if not journal_dirs and not ledger_dirs:
        raise CliError("give at least one --journal-dir or --ledger-dir")
    show_all = not (args.journal or args.entrylog or args.index)
    with offline([*journal_dirs, *ledger_dirs]):
        for d in journal_dirs:
            if show_all or args.journal:
                files = _journal_files(d)
                print(f"journal directory {d}: {len(files)} journal file(s)")
                for seq, p in files:
                    print(f"  journal {seq:x}\t{p.name}\t{p.stat().st_size} bytes")
            for sub in sorted(x for x in d.iterdir() if x.is_dir() and x.name.startswith(
                    "ledgers-")) if show_all or args.journal else ():
                files = _journal_files(sub)
                print(f"journal directory {sub}: {len(files)} journal file(s)")
                for seq, p in files:
                    print(f"  journal {seq:x}\t{p.name}\t{p.stat().st_size} bytes")
        for d in ledger_dirs:
            print(f"ledger directory {d}:")
            logs_dir = d / ENTRYLOG_DIR
            if show_all or args.entrylog:
                logs = sorted((parse_entry_log_name(p.name), p) for p in (
                    logs_dir.iterdir() if logs_dir.is_dir() else ())
                    if parse_entry_log_name(p.name) is not None)
                print(f"  {len(logs)} entry log(s)")
                for log_id, p in logs:
                    print(f"  entrylog {log_id}\t{ENTRYLOG_DIR}/{p.name}\t"
                          f"{p.stat().st_size} bytes")
            if show_all or args.index:
                for name in (INDEX_FILE, INDEX_COMPACT_FILE):
                    if (d / name).is_file():
                        print(f"  index\t{name}\t{(d / name).stat().st_size} bytes")
                if (d / LMDB_DIR).is_dir():
                    size = sum(p.stat().st_size for p in (d / LMDB_DIR).iterdir()
                               if p.is_file())
                    print(f"  index\t{LMDB_DIR}/\t{size} bytes")
            if show_all:
                for name in (CHECKPOINT_FILE, COOKIE_FILE):
                    if (d / name).is_file():
                        print(f"  {name.lower()}\t{name}\t{(d / name).stat().st_size} bytes")
    return 0


# ------------------------------------------------------------------ the consistency check


@dataclass
class Check:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    entries: int = 0


def _index_entries(ledger_dir: Path, cp: dict[str, Any] | None,
                   check: Check) -> Iterator[tuple[int, int, Location]]:
    """``(ledger, entry, location)`` of every entry the index holds for the ledgers the
    checkpoint knows (all of them without a checkpoint)."""
    known = None if cp is None else {row[0] for row in cp["ledgers"]}
    if cp is not None and cp.get("index") == "lmdb":
        yield from _lmdb_entries(ledger_dir, known, check)
        return
    name = INDEX_FILE if cp is None else cp.get("index_file", INDEX_FILE)
    path = ledger_dir / name
    if not path.is_file():
        if cp is not None and cp["index_length"]:
            check.problems.append(f"{ledger_dir}: the checkpoint names {name}, which is missing")
        return
    size = path.stat().st_size
    whole = size // INDEX_RECORD.size * INDEX_RECORD.size
    length = whole if cp is None else cp["index_length"]
    if size < length:
        check.problems.append(f"{path}: {size} bytes, shorter than the "
                              f"{length} the checkpoint covers")
        length = whole
    index = MemoryEntryIndex()  # what the bookie loads at start (12 bytes an entry)
    chunk = READ_CHUNK_BYTES // INDEX_RECORD.size * INDEX_RECORD.size
    try:
        with path.open("rb") as f:
            for start in range(0, length, chunk):
                load_index_records(index, f.read(min(chunk, length - start)), 0xFFFFFFFF)
    except BKError as exc:
        check.problems.append(f"{path}: {exc}")
        return
    for ledger_id in index.ledger_ids():
        if known is not None and ledger_id not in known:
            continue  # forgotten by the bookie (deleted): its records are dead
        for entry_id, loc in index.entries(ledger_id):
            yield ledger_id, entry_id, loc


def _lmdb_entries(ledger_dir: Path, known: set[int] | None,
                  check: Check) -> Iterator[tuple[int, int, Location]]:
    import struct

    try:
        import lmdb
    except ImportError:
        check.notes.append(f"{ledger_dir}: its index is LMDB and the lmdb package is not "
                           "installed (pip install 'asyncbk[lmdb]'): entries not checked")
        return
    key, loc = struct.Struct(">cQQ"), struct.Struct("<III")
    path = ledger_dir / LMDB_DIR
    if not path.is_dir():
        check.problems.append(f"{ledger_dir}: the checkpoint says the index is in {LMDB_DIR}, "
                              "which is missing")
        return
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, subdir=True, max_dbs=0)
    except lmdb.Error as exc:
        check.problems.append(f"{path}: cannot be opened: {exc}")
        return
    try:
        with env.begin() as txn:
            cursor = txn.cursor()
            if not cursor.set_range(b"E"):
                return
            for k, v in cursor:
                if not k.startswith(b"E"):
                    break
                if len(k) != key.size or len(v) != loc.size:
                    check.problems.append(f"{path}: a malformed index record ({k.hex()})")
                    continue
                _, ledger_id, entry_id = key.unpack(k)
                if known is None or ledger_id in known:
                    yield ledger_id, entry_id, loc.unpack(v)
    except lmdb.Error as exc:
        check.problems.append(f"{path}: cannot be read: {exc}")
    finally:
        env.close()


def _check_ledger_dir(ledger_dir: Path, check: Check) -> None:
    try:
        cp = read_checkpoint(ledger_dir)
    except BKError as exc:
        check.problems.append(f"{ledger_dir}: {exc}")
        return
    if cp is None:
        check.notes.append(f"{ledger_dir}: no checkpoint (a bookie that never checkpointed "
                           "replays its whole journal at start)")
    fds: dict[int, int] = {}
    try:
        for ledger_id, entry_id, (log_id, offset, length) in _index_entries(ledger_dir, cp,
                                                                          check):
            check.entries += 1
            after_mark = cp is not None and (
                log_id > cp["entry_log_id"]
                or (log_id == cp["entry_log_id"] and offset >= cp["entry_log_length"]))
            where = f"{ledger_dir}: entry {ledger_id}/{entry_id} (entry log {log_id} at {offset})"
            fd = fds.get(log_id)
            if fd is None:
                try:
                    fd = fds[log_id] = os.open(ledger_dir / ENTRYLOG_DIR /
                                               entry_log_name(log_id), os.O_RDONLY)
                except FileNotFoundError:
                    fd = -1
            data = os.pread(fd, length, offset) if fd >= 0 else b""
            got = decode_one(data) if len(data) == length else None
            record = got[0] if got is not None else None
            ok = (isinstance(record, AddRecord) and record.ledger_id == ledger_id
                  and record.entry_id == entry_id)
            if ok:
                continue
            why = ("its entry log is missing" if fd < 0 else
                   "the record there is cut short" if len(data) != length else
                   "the record there fails its checksum" if got is None else
                   "another record is there")
            if after_mark:
                check.notes.append(f"{where}: {why}; it is past the checkpoint, so the next "
                                   "start replays the journal over it")
            else:
                check.problems.append(f"{where}: {why}")
    finally:
        for fd in fds.values():
            if fd >= 0:
                os.close(fd)


def _localconsistencycheck(args: argparse.Namespace) -> int:
    journal_dirs = [Path(d) for d in args.journal_dir]
    ledger_dirs = [Path(d) for d in args.ledger_dir]
    check = Check()
    with offline([*journal_dirs, *ledger_dirs]):
        for d in ledger_dirs:
            _check_ledger_dir(d, check)
        for jd in journal_dirs:
            subdirs = sorted(x for x in jd.iterdir() if x.is_dir() and x.name.startswith(
                "ledgers-"))
            for d in [jd, *subdirs]:
                files = _journal_files(d)
                for i, (_, path) in enumerate(files):
                    scan = Scan()
                    for _ in scan_file(path, scan):
                        pass
                    last = i == len(files) - 1
                    why = _journal_tail(path, scan, last)
                    if why:
                        (check.notes if last else check.problems).append(why)
    for note in check.notes:
        print(f"note: {note}")
    for problem in check.problems:
        print(f"PROBLEM: {problem}")
    print(f"checked {check.entries} indexed entries in {len(ledger_dirs)} ledger "
          f"director{'y' if len(ledger_dirs) == 1 else 'ies'}: "
          + ("consistent" if not check.problems else f"{len(check.problems)} problem(s)"))
    return 1 if check.problems else 0


def run(args: argparse.Namespace) -> int:
    """Run the offline command ``args.shell_command``; its exit code."""
    commands = {"listfilesondisc": _listfilesondisc, "readjournal": _readjournal,
                "readlog": _readlog, "readlogmetadata": _readlogmetadata,
                "localconsistencycheck": _localconsistencycheck}
    try:
        return commands[args.shell_command](args)
    except (OSError, ValueError) as exc:  # an unreadable file: one line
        raise CliError(f"{args.shell_command}: {exc}") from None
