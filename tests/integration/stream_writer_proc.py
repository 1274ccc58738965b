"""The writer processes of the stream tests (``test_streams.py``).

``python stream_writer_proc.py fight URI NAMESPACE STREAM NAME SECONDS SEED``
fights over the stream with another such process for SECONDS: it opens a
writer (taking the stream over, which fences the other process's writer),
writes pipelined rounds of records until a write fails (it was fenced), then
waits about a second and opens again.  Each record's txid is above the
writer's ``last_txid`` (``max(last_txid + 1, wall clock in microseconds)``)
and its data is ``NAME:GENERATION:SEQ`` (generation: how many writers this
process opened).  At the end it closes its writer if it still has one.

``python stream_writer_proc.py write URI NAMESPACE STREAM`` opens a writer and
writes pipelined rounds until killed, with default txids (the previous one
+ 1); record ``txid`` holds ``r<txid>``.

Lines on stdout:

- ``O <generation> <last_txid>``: a writer was opened;
- ``A <txid> <data>``: that record was acknowledged (durable);
- ``F <generation> <error type>``: a write of that writer failed;
- ``X <error type> <message>``: opening a writer failed;
- ``C <error type or ok>``: the final close;
- ``D``: the process is done.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time

import uvloop

import asyncbk
from asyncbk.errors import BKError
from asyncbk.stream import Position, StreamWriter

ROUND_RECORDS = 20
ROUND_PAUSE_S = 0.02
"""A steady load of a few hundred records a second per process, so the tests'
final read-back stays short."""


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def write_round(w: StreamWriter, records: list[tuple[int | None, str]]) -> BKError | None:
    """Submit ``records`` (txid or None for the default, data), report each
    acknowledged one, and return the first error (None if all were acknowledged)."""
    submitted: list[tuple[int, str, asyncio.Future[Position]]] = []
    error: BKError | None = None
    for txid, data in records:
        expected = w.last_txid + 1 if txid is None else txid
        try:
            fut = w.write_nowait(data.encode(), txid)
        except BKError as exc:
            error = exc
            break
        submitted.append((expected, data, fut))
    for txid, data, fut in submitted:
        try:
            await fut
        except BKError as exc:
            error = error or exc
            continue
        say(f"A {txid} {data}")
    return error


async def fight(uri: str, namespace: str, stream: str, name: str, seconds: float,
                seed: int) -> int:
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    async with await asyncbk.BookKeeper.connect(uri) as bk:
        ns = await bk.namespace(namespace)
        deadline = loop.time() + seconds
        generation = 0
        writer: StreamWriter | None = None
        while loop.time() < deadline:
            try:
                writer = await ns.open_writer(stream)
            except BKError as exc:
                say(f"X {type(exc).__name__} {exc}")
                await asyncio.sleep(rng.uniform(0.2, 0.5))
                continue
            generation += 1
            say(f"O {generation} {writer.last_txid}")
            seq = 0
            while loop.time() < deadline:
                base = max(writer.last_txid + 1, time.time_ns() // 1000)
                records: list[tuple[int | None, str]] = [
                    (base + k, f"{name}:{generation}:{seq + k}") for k in range(ROUND_RECORDS)]
                seq += ROUND_RECORDS
                error = await write_round(writer, records)
                if error is not None:
                    say(f"F {generation} {type(error).__name__}")
                    await writer.abort()
                    writer = None
                    await asyncio.sleep(rng.uniform(0.8, 1.2))
                    break
                await asyncio.sleep(ROUND_PAUSE_S)
        if writer is not None:
            try:
                await writer.close()
                say("C ok")
            except BKError as exc:
                say(f"C {type(exc).__name__}")
    say("D")
    return 0


async def write_forever(uri: str, namespace: str, stream: str) -> int:
    async with await asyncbk.BookKeeper.connect(uri) as bk:
        ns = await bk.namespace(namespace)
        writer = await ns.open_writer(stream)
        say(f"O 1 {writer.last_txid}")
        while True:
            records: list[tuple[int | None, str]] = [
                (None, f"r{writer.last_txid + 1 + k}") for k in range(ROUND_RECORDS)]
            error = await write_round(writer, records)
            if error is not None:
                say(f"F 1 {type(error).__name__}")
                return 1
            await asyncio.sleep(ROUND_PAUSE_S / 4)


def main(argv: list[str]) -> int:
    mode, *args = argv
    if mode == "fight":
        uri, namespace, stream, name, seconds, seed = args
        return uvloop.run(fight(uri, namespace, stream, name, float(seconds), int(seed)))
    if mode == "write":
        uri, namespace, stream = args
        return uvloop.run(write_forever(uri, namespace, stream))
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
