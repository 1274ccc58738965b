"""``asyncbk stream``: namespaces and streams from the command line.

Commands (each takes ``--metadata-uri``):

* ``namespaces``, ``create-namespace NS [settings]``, ``delete-namespace NS [--force]``;
* ``list NS [--prefix P]``, ``create NS STREAM [settings]``, ``info NS STREAM [--json]``,
  ``delete NS STREAM [--force]``, ``truncate NS STREAM --before POSITION``;
* ``write NS STREAM``: one record per line of stdin (without its newline), pipelined,
  then a summary;
* ``tail NS STREAM``: records as ``position txid data`` lines or JSON lines, from a
  position or a txid, following the stream until Ctrl-C (or ``--no-follow``: up to
  the end it had when the command started; ``--count N``: N records).

Deleting asks on a terminal and needs ``--force`` otherwise.  Errors are one line
saying what to do.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import re
import signal
import stat
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..errors import (
    BKError,
    EndOfStreamError,
    EntryTooLargeError,
    InvalidTxidError,
    NamespaceExistsError,
    NamespaceNotEmptyError,
    NoSuchLedgerError,
    NoSuchNamespaceError,
    NoSuchStreamError,
    TooManyRequestsError,
    TruncatedError,
)
from ..meta.model import DIGESTS
from ..stream import codec
from ..stream.meta import (
    StreamConfig,
    StreamMetadata,
    check_namespace_name,
    check_stream_name,
    config_from,
)
from ..stream.position import Position
from . import argtypes
from .security import add_client_security_options, client_security

STDIN_CHUNK_BYTES = 1 << 20
"""How much of stdin ``write`` reads at once."""

TAIL_BATCH_RECORDS = 1000
"""Records ``tail`` takes from its reader (and prints) at once."""

TAIL_WAIT_S = 0.5
"""How long ``tail`` waits for a batch before looking again."""

_DEFAULTS = StreamConfig()
_UNSAFE_TEXT = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_TXID_LINE = re.compile(rb"([0-9]+)[ \t](.*)", re.DOTALL)

# ------------------------------------------------------------------ argument types


def _size(text: str) -> int:
    """Bytes, with an optional binary suffix: 4096, 64K, 256M, 1G (0 turns it off)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    factor = 1
    if t and t[-1] in "KMGT":
        factor = 1024 ** ("KMGT".index(t[-1]) + 1)
        t = t[:-1]
    try:
        value = int(t) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected bytes (e.g. 268435456, 256M, 1G), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


_positive = argtypes.positive_int
_non_negative = argtypes.non_negative_int
_seconds = argtypes.non_negative_float


def _position(text: str) -> Position:
    try:
        return Position.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ------------------------------------------------------------------ the parser

_SETTINGS: list[tuple[str, str, Callable[[str], Any], str, str]] = [
    # flag, StreamConfig field, type, metavar, help
    ("--ensemble-size", "ensemble_size", _positive, "E",
     "bookies each segment's ledger is striped over"),
    ("--write-quorum", "write_quorum", _positive, "QW", "bookies each entry is written to"),
    ("--ack-quorum", "ack_quorum", _positive, "QA",
     "bookies that must have made an entry durable before its records are acknowledged"),
    ("--digest", "digest", str, "DIGEST", f"digest of each entry ({', '.join(DIGESTS)})"),
    ("--rolling-bytes", "rolling_bytes", _size, "BYTES",
     "start a new segment after this many bytes of records (suffixes K, M, G; 0: never)"),
    ("--rolling-s", "rolling_s", _seconds, "SECONDS",
     "start a new segment after this long (0: never)"),
    ("--rolling-entries", "rolling_entries", _non_negative, "RECORDS",
     "start a new segment after this many records (0: never)"),
    ("--retention-s", "retention_s", _seconds, "SECONDS",
     "drop segments completed longer ago than this (0: keep them until truncated)"),
]


def _add_settings(p: argparse.ArgumentParser, for_stream: bool) -> None:
    for flag, field, kind, metavar, text in _SETTINGS:
        choices = DIGESTS if field == "digest" else None
        if for_stream:
            p.add_argument(flag, dest=field, type=kind, metavar=metavar, default=None,
                           choices=choices, help=f"{text} (default: the namespace's)")
        else:
            p.add_argument(flag, dest=field, type=kind, metavar=metavar, choices=choices,
                           default=getattr(_DEFAULTS, field), help=text)


def add_commands(sub: Any, add_log_options: Callable[[argparse.ArgumentParser], None],
                 formatter: type[argparse.HelpFormatter]) -> None:
    """The ``asyncbk stream`` subcommands, on the subparsers ``sub``."""

    def command(name: str, help_text: str, description: str = "") -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(
            name, help=help_text, description=description or help_text,
            formatter_class=formatter)
        p.add_argument("--metadata-uri", required=True,
                       help="required: the cluster, etcd://host:port[,host:port...]/<root>")
        add_client_security_options(p)
        add_log_options(p)
        return p

    def names(p: argparse.ArgumentParser, stream: bool = True) -> None:
        p.add_argument("namespace", metavar="NS", help="namespace name")
        if stream:
            p.add_argument("stream", metavar="STREAM", help="stream name (may contain '/')")

    command("namespaces", "list the namespaces")
    p = command("create-namespace", "create a namespace with the defaults of its streams",
                "Create a namespace. Its settings are the defaults of the streams created "
                "in it (each stream may override them).")
    names(p, stream=False)
    _add_settings(p, for_stream=False)
    p = command("delete-namespace", "delete a namespace (and, with --force, its streams)",
                "Delete a namespace. One that still has streams is deleted with them only "
                "after confirmation on a terminal, or with --force.")
    names(p, stream=False)
    p.add_argument("--force", action="store_true",
                   help="also delete its streams, without asking (required when stdin is "
                   "not a terminal)")

    p = command("list", "list the streams of a namespace")
    names(p, stream=False)
    p.add_argument("--prefix", default="", help="only streams whose name starts with this")
    p = command("create", "create a stream", "Create an empty stream. Settings not given "
                "are the namespace's.")
    names(p)
    _add_settings(p, for_stream=True)
    p = command("info", "a stream's settings and segments",
                "A stream's settings and its segments: number, ledger, state, first and "
                "last position, first and last txid, records, bytes. For the open segment, "
                "what is durable so far.")
    names(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p = command("delete", "delete a stream and its segments' ledgers",
                "Delete a stream: fences its writer, removes it, deletes its segments' "
                "ledgers. Asks first unless --force.")
    names(p)
    p.add_argument("--force", action="store_true",
                   help="delete without asking (required when stdin is not a terminal)")
    p = command("truncate", "drop the segments wholly before a position",
                "Drop the completed segments whose records all lie before POSITION, and "
                "their ledgers. The open segment and the last one are never dropped.")
    names(p)
    p.add_argument("--before", type=_position, required=True, metavar="POSITION",
                   help="required: SEGMENT:ENTRY:SLOT, as tail and info print it")

    p = command("retention", "drop segments older than their stream's retention_s",
                "Apply retention now: drop the completed segments (and their ledgers) "
                "completed longer ago than the stream's retention_s, in STREAM or in every "
                "stream of the namespace. Writers do this when they open and roll; run "
                "this (e.g. from cron) for streams that no writer writes any more.")
    p.add_argument("namespace", help="the namespace")
    p.add_argument("stream", nargs="?", help="one stream (default: every stream of it)")
    p = command("write", "write stdin to a stream, one record per line",
                "Write each line of stdin as one record (without its newline; an empty "
                "line is an empty record), pipelined: many records are in flight and "
                "batched into ledger entries. Prints a summary once every record is "
                "durable. Each run opens a new writer, which fences any other writer "
                "of the stream and starts a new segment.")
    names(p)
    p.add_argument("--create", action="store_true",
                   help="create the stream first if it does not exist")
    p.add_argument("--txid", type=_non_negative, default=None, metavar="TXID",
                   help="txid of the first record, the next ones counting up from it "
                   "(default: the stream's last txid + 1)")
    p.add_argument("--with-txid", action="store_true",
                   help="each line is 'TXID DATA' (one space or tab between): the record "
                   "is DATA with that txid")
    p.add_argument("--end", action="store_true",
                   help="after the last line, end the stream: readers stop there and no "
                   "writer can open it again")
    p = command("tail", "print a stream's records, following it",
                "Print records as 'POSITION TXID DATA' lines (DATA as text when it is "
                "UTF-8 without control characters other than tab, else 'hex:' and its hex "
                "digits) or as JSON lines. Follows the stream until Ctrl-C unless --no-follow or --count.")
    names(p)
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from", dest="start", type=_position, default=Position.EARLIEST,
                       metavar="POSITION",
                       help="SEGMENT:ENTRY:SLOT, 'earliest' or 'latest' (only new records)")
    start.add_argument("--txid", type=_non_negative, default=None, metavar="TXID",
                       help="start at the first record whose txid is >= TXID (default: "
                       "use --from)")
    p.add_argument("--json", action="store_true",
                   help='JSON lines: {"position", "txid", "data"} ("data" null and '
                   '"data_hex" when the data is not UTF-8)')
    p.add_argument("--count", type=_positive, default=None, metavar="N",
                   help="stop after N records (default: no limit)")
    p.add_argument("--no-follow", action="store_true",
                   help="stop at the end the stream had when the command started")


# ------------------------------------------------------------------ helpers


def _cli_error(message: str) -> Exception:
    from .main import CliError

    return CliError(message)


def _explain(exc: BKError, args: argparse.Namespace) -> BKError | Exception:
    """The client's error with what to do next, for the errors a user meets."""
    ns = getattr(args, "namespace", "")
    name = getattr(args, "stream", "")
    if isinstance(exc, NoSuchNamespaceError):
        return _cli_error(f"no namespace {ns!r}; create it with `asyncbk stream "
                          f"create-namespace {ns}`; `asyncbk stream namespaces` lists them")
    if isinstance(exc, NoSuchStreamError):
        return _cli_error(f"{exc}; create it with `asyncbk stream create {ns} {name}` (or "
                          f"`write --create`); `asyncbk stream list {ns}` lists the streams")
    if isinstance(exc, NamespaceNotEmptyError):
        return _cli_error(f"namespace {ns!r} still has streams: delete them first, or add "
                          "--force to delete them with it")
    if isinstance(exc, NamespaceExistsError):
        return _cli_error(f"namespace {ns!r} exists already")
    if isinstance(exc, TruncatedError) and args.stream_command == "tail":
        return _cli_error(f"{exc}; start with --from earliest")
    return exc


def _records(n: int) -> str:
    return f"{n:,} record" + ("" if n == 1 else "s")


def _text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _format_text(pos: Position, txid: int, data: bytes) -> bytes:
    if _UNSAFE_TEXT.search(data) is None and _text(data) is not None:
        shown = data
    else:
        shown = b"hex:" + data.hex().encode()
    return b"%s %d %s\n" % (str(pos).encode(), txid, shown)


def _format_json(pos: Position, txid: int, data: bytes) -> bytes:
    text = _text(data)
    rec: dict[str, Any] = {"position": str(pos), "txid": txid, "data": text}
    if text is None:
        rec["data_hex"] = data.hex()
    return json.dumps(rec, ensure_ascii=False).encode() + b"\n"


def _stdout_gone() -> None:
    """stdout was closed by its reader (``| head``): stop writing to it, quietly."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


async def _read_chunks(fd: int, stop: asyncio.Event) -> AsyncIterator[bytes]:
    """What can be read from ``fd`` (stdin), chunk by chunk, without blocking the event
    loop: files are read directly, pipes and terminals once they are readable.  Ends
    at the end of input or once ``stop`` is set."""
    loop = asyncio.get_running_loop()
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISBLK(mode)):
        stopping: asyncio.Future[Any] = loop.create_task(stop.wait())
        try:
            while not stop.is_set():
                ready: asyncio.Future[Any] = loop.create_future()

                def readable(ready: asyncio.Future[Any] = ready) -> None:
                    if not ready.done():
                        ready.set_result(None)

                try:
                    loop.add_reader(fd, readable)
                except (OSError, ValueError):  # /dev/null and the like: never block
                    break
                try:
                    await asyncio.wait([ready, stopping], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    loop.remove_reader(fd)
                if stop.is_set():
                    return
                try:
                    chunk = os.read(fd, STDIN_CHUNK_BYTES)
                except BlockingIOError:
                    continue
                if not chunk:
                    return
                yield chunk
        finally:
            stopping.cancel()
    while not stop.is_set() and (chunk := os.read(fd, STDIN_CHUNK_BYTES)):
        yield chunk
        await asyncio.sleep(0)


async def _lines(fd: int, stop: asyncio.Event) -> AsyncIterator[list[bytes]]:
    """Lines of ``fd`` without their newline, a chunk's worth at a time; a last line
    without a newline counts."""
    rest = b""
    async for chunk in _read_chunks(fd, stop):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        if lines:
            yield lines
    if rest:
        yield [rest]


async def _confirm(question: str, refusal: str) -> None:
    """Ask ``question`` on the terminal; CliError(``refusal``) unless the answer is yes.
    Without a terminal, refuse at once."""
    from .shell import _read_line

    if not sys.stdin.isatty():
        raise _cli_error(f"{refusal} without confirmation (stdin is not a terminal); add "
                         "--force")
    print(f"{question} This cannot be undone. Type yes to delete: ", end="", flush=True)
    answer = await _read_line(sys.stdin)
    if answer.strip().lower() != "yes":
        raise _cli_error(f"{refusal}: not confirmed")


# ------------------------------------------------------------------ segments


async def _segment_rows(ns: Any, info: Any) -> list[dict[str, Any]]:
    """One dict per segment; the open one filled in with what is durable so far (its
    ledger's last add confirmed)."""
    rows = []
    for s in info.segments:
        row: dict[str, Any] = {
            "seq": s.seq, "ledger_id": s.ledger_id, "state": s.state,
            "first_position": str(s.first_position),
            "last_position": str(s.last_position) if s.last_position else None,
            "first_txid": s.first_txid if s.records else None,
            "last_txid": s.last_txid if s.records else None,
            "records": s.records, "start_sequence": s.start_sequence,
            "size_bytes": s.size_bytes, "ctime_ms": s.ctime_ms,
            "completion_ms": s.completion_ms or None,
        }
        if s.state != "completed":
            row.update(await _durable_so_far(ns, s.seq, s.ledger_id))
        rows.append(row)
    return rows


async def _durable_so_far(ns: Any, seq: int, ledger_id: int) -> dict[str, Any]:
    """Records, txids and last position of an open segment, up to its last add
    confirmed (nothing is fenced)."""
    try:
        rh = await ns.bk.open_ledger(ledger_id, recovery=False)
    except NoSuchLedgerError:
        return {"records": None, "note": "its ledger is gone"}
    md = rh.metadata
    last = md.last_entry_id if md.is_closed else rh.last_add_confirmed
    where = f"stream {ns.name} segment {seq}"
    out: dict[str, Any] = {"records": 0, "size_bytes": None, "so_far": True}
    entry = last
    while entry >= 0:
        batch = codec.decode((await rh.read_unconfirmed(entry, entry))[0].data,
                             f"{where} entry {entry}")
        if batch.records:
            first = codec.decode((await rh.read_unconfirmed(0, 0))[0].data, f"{where} entry 0")
            out.update(records=batch.records_before + len(batch.records),
                       first_txid=(first.records or batch.records)[0][0],
                       last_txid=batch.records[-1][0],
                       last_position=str(Position(seq, entry, len(batch.records) - 1)))
            break
        entry -= 1
    return out


def _last_position(rows: list[dict[str, Any]]) -> Position | None:
    """The last durable record's position, or None when there is none."""
    for row in reversed(rows):
        if row.get("last_position"):
            return Position.parse(row["last_position"])
    return None


def _fmt_ms(ms: int | None) -> str:
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _print_info(info: Any, rows: list[dict[str, Any]]) -> None:
    cfg = info.config
    records = sum(r["records"] or 0 for r in rows)
    last = _last_position(rows)
    txids = [r[k] for r in rows for k in ("first_txid", "last_txid") if r.get(k) is not None]
    print(f"stream {info.namespace}/{info.stream}: {len(rows)} segment(s), {_records(records)}"
          + (f", positions {rows[0]['first_position']} .. {last}" if last else "")
          + (f", txids {min(txids)} .. {max(txids)}" if txids else "")
          + (", ENDED" if info.ended else ""))
    print(f"settings: ensemble {cfg.ensemble_size}, write quorum {cfg.write_quorum}, ack "
          f"quorum {cfg.ack_quorum}, digest {cfg.digest}; rolling at {cfg.rolling_bytes} "
          f"bytes / {cfg.rolling_s:g} s / {cfg.rolling_entries} records (0: off); "
          f"retention {cfg.retention_s:g} s (0: until truncated)")
    if not rows:
        print("no segments yet (nothing was ever written)")
        return
    head = ["seq", "ledger", "state", "first", "last", "first_txid", "last_txid", "records",
            "bytes", "created", "completed"]
    table = [head]
    for r in rows:
        def cell(key: str, row: dict[str, Any] = r) -> str:
            v = row.get(key)
            return "-" if v is None else str(v)

        state = r["state"] + (" (so far)" if r.get("so_far") else "")
        table.append([cell("seq"), cell("ledger_id"), state, cell("first_position"),
                      cell("last_position"), cell("first_txid"), cell("last_txid"),
                      cell("records"), cell("size_bytes"), _fmt_ms(r["ctime_ms"]),
                      _fmt_ms(r["completion_ms"])])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


# ------------------------------------------------------------------ write and tail


class _Written:
    """What ``write`` has sent: the futures not yet seen resolved, the first one, counts."""

    def __init__(self) -> None:
        self.outstanding: collections.deque[asyncio.Future[Position]] = collections.deque()
        self.first: asyncio.Future[Position] | None = None
        self.last: asyncio.Future[Position] | None = None
        self.count = 0
        self.first_txid = self.last_txid = -1

    def add(self, fut: asyncio.Future[Position], txid: int) -> None:
        if self.first is None:
            self.first, self.first_txid = fut, txid
        self.last, self.last_txid = fut, txid
        self.outstanding.append(fut)
        self.count += 1

    def check(self) -> None:
        """Forget the resolved futures at the front; raise the first failure."""
        out = self.outstanding
        while out and out[0].done():
            out.popleft().result()

    async def room(self, writer: Any) -> None:
        """The writer is full (TooManyRequestsError): wait for its oldest record."""
        self.check()
        if self.outstanding:
            await asyncio.wait([self.outstanding[0]])
        else:
            await writer.flush()

    def summary(self, ns: str, name: str) -> str:
        if self.first is None or self.last is None:
            return f"wrote 0 records to {ns}/{name}"
        return (f"wrote {_records(self.count)} to {ns}/{name}: positions "
                f"{self.first.result()} .. {self.last.result()}, txids {self.first_txid} .. "
                f"{self.last_txid}")


async def _write(ns: Any, args: argparse.Namespace, interrupted: asyncio.Event) -> int:
    name = args.stream
    if args.create and not await ns.stream_exists(name):
        with contextlib.suppress(BKError):  # created meanwhile by someone else: fine
            await ns.create_stream(name)
    sm = await ns.md.stream(ns.name, name)  # NoSuchStreamError before reading stdin
    if sm.ended:
        raise _cli_error(f"stream {ns.name}/{name} was ended: it takes no more writes")
    writer = None
    done = _Written()
    txid = args.txid
    line_no = 0
    bad_input: str | None = None
    try:
        async for lines in _lines(sys.stdin.fileno(), interrupted):
            if writer is None:
                writer = await ns.open_writer(name)
            for line in lines:
                line_no += 1
                if args.with_txid:
                    m = _TXID_LINE.fullmatch(line)
                    if m is None:
                        bad_input = (f"line {line_no}: expected 'TXID DATA' (--with-txid), "
                                     f"got {line[:40]!r}")
                        break
                    txid, line = int(m.group(1)), m.group(2)
                while True:
                    try:
                        fut = writer.write_nowait(line, txid)
                        break
                    except TooManyRequestsError:
                        await done.room(writer)
                    except (InvalidTxidError, EntryTooLargeError) as exc:
                        bad_input = f"line {line_no}: {exc}"
                        break
                if bad_input is not None:
                    break
                done.add(fut, writer.last_txid)
                txid = None
            done.check()  # a failed writer stops the run here
            if bad_input is not None:
                break
        if writer is not None:
            if args.end and bad_input is None and not interrupted.is_set():
                await writer.mark_end_of_stream()
            else:
                await writer.close()
    except BaseException:
        if writer is not None:
            await writer.abort()
        raise
    if bad_input is not None:
        raise _cli_error(f"{bad_input}; stopped there ({done.summary(ns.name, name)})")
    ended = ""
    if args.end and not interrupted.is_set():
        if writer is None:  # nothing written: end the stream all the same
            writer = await ns.open_writer(name)
            await writer.mark_end_of_stream()
        ended = "; stream ended"
    print(done.summary(ns.name, name) + ended
          + ("; interrupted" if interrupted.is_set() else ""))
    return 130 if interrupted.is_set() else 0


async def _tail(ns: Any, args: argparse.Namespace) -> int:
    name = args.stream
    end: Position | None = None
    if args.no_follow:
        rows = await _segment_rows(ns, await ns.stream_info(name))
        end = _last_position(rows)
        if end is None:
            return 0
    reader = await ns.open_reader(name, None if args.txid is not None else args.start,
                                  txid=args.txid)
    fmt = _format_json if args.json else _format_text
    out = sys.stdout.buffer
    printed = 0
    try:
        if end is not None and reader.start > end:
            return 0
        failed: BKError | None = None
        while True:
            try:
                batch = await reader.read_batch(TAIL_BATCH_RECORDS, TAIL_WAIT_S)
            except BKError as exc:
                # read_batch may raise the end of the stream (or an error) that came
                # after records it already holds; the next call hands those over, and
                # raises again once there are none.
                if failed is None:
                    failed = exc
                    continue
                if isinstance(exc, EndOfStreamError):
                    return 0
                raise
            if not batch:
                continue
            parts = []
            done = False
            for rec in batch:
                if end is not None and rec.position > end:
                    done = True
                    break
                parts.append(fmt(rec.position, rec.txid, rec.data))
                printed += 1
                if (end is not None and rec.position == end) or printed == args.count:
                    done = True
                    break
            try:
                out.write(b"".join(parts))
                out.flush()
            except BrokenPipeError:
                _stdout_gone()
                return 0
            if done:
                return 0
    finally:
        await reader.close()


# ------------------------------------------------------------------ the command


async def _run(args: argparse.Namespace) -> int:
    from ..stream.client import BookKeeper
    from .shell import _require_cluster

    cmd = args.stream_command
    security = await asyncio.to_thread(client_security, args)
    async with await BookKeeper.connect(args.metadata_uri, **security) as bk:
        await _require_cluster(bk, args.metadata_uri)
        if cmd == "namespaces":
            async for name in bk.list_namespaces():
                print(name)
            return 0
        if cmd == "create-namespace":
            settings = {f: getattr(args, f) for _, f, *_ in _SETTINGS}
            config = config_from(settings, source=f"namespace {args.namespace!r}")
            await StreamMetadata(bk.meta).create_namespace(args.namespace, config,
                                                           int(time.time() * 1000))
            print(f"created namespace {args.namespace}")
            return 0
        ns = await bk.namespace(args.namespace)
        if cmd == "delete-namespace":
            streams = [s async for s in ns.list_streams()]
            if streams and not args.force:
                shown = ", ".join(streams[:5]) + (", ..." if len(streams) > 5 else "")
                await _confirm(f"delete namespace {ns.name} and its {len(streams)} stream(s) "
                               f"({shown}) with all their records?",
                               f"not deleting namespace {ns.name} and its streams")
            await ns.delete(force=bool(streams))
            print(f"deleted namespace {ns.name}" + (f" and its {len(streams)} stream(s)"
                                                    if streams else ""))
        elif cmd == "list":
            async for name in ns.list_streams(args.prefix):
                print(name)
        elif cmd == "create":
            overrides = {f: v for _, f, *_ in _SETTINGS if (v := getattr(args, f)) is not None}
            await ns.create_stream(args.stream, **overrides)
            print(f"created stream {ns.name}/{args.stream}")
        elif cmd == "info":
            info = await ns.stream_info(args.stream)
            rows = await _segment_rows(ns, info)
            if args.json:
                last = _last_position(rows)
                print(json.dumps({
                    "namespace": info.namespace, "stream": info.stream,
                    "config": dataclasses.asdict(info.config),
                    "ended": info.ended,
                    "first_position": str(info.first_position) if rows else None,
                    "last_position": str(last) if last else None,
                    "records": sum(r["records"] or 0 for r in rows),
                    "segments": rows}, indent=2))
            else:
                _print_info(info, rows)
        elif cmd == "delete":
            info = await ns.stream_info(args.stream)
            if not args.force:
                rows = await _segment_rows(ns, info)
                records = sum(r["records"] or 0 for r in rows)
                live = any(r["state"] != "completed" for r in rows)
                await _confirm(f"delete stream {ns.name}/{args.stream} ({len(rows)} segment(s), "
                               f"{_records(records)}"
                               + ("; a writer may still be writing to it" if live else "")
                               + ")?", f"not deleting stream {ns.name}/{args.stream}")
            await ns.delete_stream(args.stream)
            print(f"deleted stream {ns.name}/{args.stream}")
        elif cmd == "retention":
            names = [args.stream] if args.stream else [n async for n in ns.list_streams()]
            for name in names:
                dropped = await ns.apply_retention(name)
                print(f"{ns.name}/{name}: dropped {dropped} segment(s)")
        elif cmd == "truncate":
            dropped = await ns.truncate(args.stream, args.before)
            info = await ns.stream_info(args.stream)
            start = info.first_position
            print(f"dropped {dropped} segment(s) of {ns.name}/{args.stream}"
                  + (f"; it now starts at {start}" if start is not None else ""))
        elif cmd == "write":
            interrupted = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, interrupted.set)
            return await _write(ns, args, interrupted)
        elif cmd == "tail":
            task = asyncio.current_task()
            assert task is not None
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, task.cancel)
            try:
                return await _tail(ns, args)
            except asyncio.CancelledError:  # Ctrl-C: a normal way to stop tailing
                if task.uncancel() == 0:
                    return 0
                raise
        return 0


def run_stream(args: argparse.Namespace, run: Callable[..., int],
               configure_logging: Callable[..., None]) -> int:
    """``asyncbk stream COMMAND``: see the module docstring."""
    if args.stream_command is None:
        raise _cli_error("choose a command: asyncbk stream --help")
    if hasattr(args, "namespace"):  # bad names fail before anything is contacted
        check_namespace_name(args.namespace)
    if getattr(args, "stream", None) is not None:  # (retention's is optional)
        check_stream_name(args.stream)
    if args.stream_command == "truncate" and args.before.is_marker():
        raise _cli_error("--before needs a position SEGMENT:ENTRY:SLOT (as tail and info "
                         "print them), not earliest or latest")
    if args.stream_command == "write" and args.with_txid and args.txid is not None:
        raise _cli_error("--txid and --with-txid exclude each other: with --with-txid each "
                         "line gives its txid")
    configure_logging(args, "warning")

    async def go() -> int:
        try:
            return await _run(args)
        except BKError as exc:
            raise _explain(exc, args) from None

    try:
        code = run(go)
        sys.stdout.flush()
    except BrokenPipeError:  # `asyncbk stream ... | head`: the reader has seen enough
        _stdout_gone()
        return 0
    return code
