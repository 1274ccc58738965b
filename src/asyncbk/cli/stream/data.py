"""The ``asyncbk stream`` data path: ``write`` (stdin lines as records, pipelined)
and ``tail`` (records as text or JSON lines, following the stream)."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ...errors import (
    BKError,
    EndOfStreamError,
    EntryTooLargeError,
    InvalidTxidError,
    TooManyRequestsError,
)
from ...stream.position import Position
from ...stream.reader import StreamRecord
from ..common import EXIT_INTERRUPTED, CliError, on_stop_signals
from .common import records_text, stdout_gone
from .segments import last_position, segment_rows

STDIN_CHUNK_BYTES = 1 << 20
"""How much of stdin ``write`` reads at once."""

TAIL_BATCH_RECORDS = 1000
"""Records ``tail`` takes from its reader (and prints) at once."""

TAIL_WAIT_S = 0.5
"""How long ``tail`` waits for a batch before looking again."""

_UNSAFE_TEXT = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_TXID_LINE = re.compile(rb"([0-9]+)[ \t](.*)", re.DOTALL)

# ------------------------------------------------------------------ write


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
        return (f"wrote {records_text(self.count)} to {ns}/{name}: positions "
                f"{self.first.result()} .. {self.last.result()}, txids {self.first_txid} .. "
                f"{self.last_txid}")


async def _write(ns: Any, args: argparse.Namespace, interrupted: asyncio.Event) -> int:
    name = args.stream
    if args.create and not await ns.stream_exists(name):
        with contextlib.suppress(BKError):  # created meanwhile by someone else: fine
            await ns.create_stream(name)
    sm = await ns.md.stream(ns.name, name)  # NoSuchStreamError before reading stdin
    if sm.ended:
        raise CliError(f"stream {ns.name}/{name} was ended: it takes no more writes")
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
        raise CliError(f"{bad_input}; stopped there ({done.summary(ns.name, name)})")
    ended = ""
    if args.end and not interrupted.is_set():
        if writer is None:  # nothing written: end the stream all the same
            writer = await ns.open_writer(name)
            await writer.mark_end_of_stream()
        ended = "; stream ended"
    print(done.summary(ns.name, name) + ended
          + ("; interrupted" if interrupted.is_set() else ""))
    return EXIT_INTERRUPTED if interrupted.is_set() else 0


# ------------------------------------------------------------------ tail


def _text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def format_text(r: StreamRecord) -> bytes:
    """``POSITION TXID DATA`` (DATA as text when it is safe UTF-8, else ``hex:...``)."""
    data = r.data
    if _UNSAFE_TEXT.search(data) is None and _text(data) is not None:
        shown = data
    else:
        shown = b"hex:" + data.hex().encode()
    return b"%s %d %s\n" % (str(r.position).encode(), r.txid, shown)


def _shown(value: bytes) -> str:
    text = _text(value)
    return text if text is not None else "hex:" + value.hex()


def format_json(r: StreamRecord) -> bytes:
    """One JSON line: position, txid, timestamp_ms, data (and key, headers if any)."""
    text = _text(r.data)
    rec: dict[str, Any] = {"position": str(r.position), "txid": r.txid,
                           "timestamp_ms": r.timestamp_ms, "data": text}
    if text is None:
        rec["data_hex"] = r.data.hex()
    if r.key is not None:
        rec["key"] = _shown(r.key)
    if r.headers:
        rec["headers"] = {k: _shown(v) for k, v in r.headers.items()}
    return json.dumps(rec, ensure_ascii=False).encode() + b"\n"


async def _tail(ns: Any, args: argparse.Namespace) -> int:
    name = args.stream
    end: Position | None = None
    if args.no_follow:
        rows = await segment_rows(ns, await ns.stream_info(name))
        end = last_position(rows)
        if end is None:
            return 0
    by_time = getattr(args, "from_time", None)
    reader = await ns.open_reader(
        name, None if args.txid is not None or by_time is not None else args.start,
        txid=args.txid, timestamp_ms=by_time)
    fmt = format_json if args.json else format_text
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
                parts.append(fmt(rec))
                printed += 1
                if (end is not None and rec.position == end) or printed == args.count:
                    done = True
                    break
            try:
                out.write(b"".join(parts))
                out.flush()
            except BrokenPipeError:
                stdout_gone()
                return 0
            if done:
                return 0
    finally:
        await reader.close()



# ------------------------------------------------------------------ the commands


async def _write_command(ns: Any, args: argparse.Namespace) -> int:
    """``write``: Ctrl-C (or SIGTERM) stops reading stdin; what was written is made
    durable and summed up, and the exit code is 130."""
    interrupted = asyncio.Event()
    on_stop_signals(interrupted.set)
    return await _write(ns, args, interrupted)


async def _tail_command(ns: Any, args: argparse.Namespace) -> int:
    """``tail``: Ctrl-C (or SIGTERM) cancels the command's task, a normal way to stop
    tailing (exit code 0)."""
    task = asyncio.current_task()
    assert task is not None
    on_stop_signals(task.cancel)
    try:
        return await _tail(ns, args)
    except asyncio.CancelledError:  # Ctrl-C: a normal way to stop tailing
        if task.uncancel() == 0:
            return 0
        raise


ON_NAMESPACE: dict[str, Callable[[Any, argparse.Namespace], Awaitable[int]]] = {
    "write": _write_command,
    "tail": _tail_command,
}
"""The data-path commands, run on the namespace ``args.namespace`` (``ns``)."""
