"""The writer process of ``test_partitions.py``'s fencing test, run on a host of its own.

``python partition_writer.py URI`` creates a ledger (E3 Qw3 Qa2, password ``pw``),
prints ``L <ledger id>``, then appends sequentially and prints ``A <entry id>`` for
every acknowledged entry, and ``E <error>`` for every failed append (then tries
again after a pause) until killed.  Entry ``i`` holds :func:`payload` ``(i)``.
"""

from __future__ import annotations

import asyncio
import sys

import uvloop

import asyncbk

WRITER_ADD_TIMEOUT_S = 2.0
"""The writer's ``add_timeout_s``: a writer that learned of a fence only through a timed-out
add would take at least this long."""


def payload(entry_id: int) -> bytes:
    return b"entry %d " % entry_id + b"x" * 64


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(uri: str) -> int:
    async with await asyncbk.BookKeeper.connect(
            uri, add_timeout_s=WRITER_ADD_TIMEOUT_S, ensemble_change_timeout_s=3.0, connect_timeout_s=1.0,
            metadata_timeout_s=3.0) as bk:
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        say(f"L {lh.id}")
        next_id = 0
        while True:
            try:
                entry_id = await lh.append(payload(next_id))
            except asyncbk.errors.BKError as exc:
                say(f"E {type(exc).__name__}: {exc}")
                await asyncio.sleep(0.2)
                continue
            say(f"A {entry_id}")
            next_id = entry_id + 1


if __name__ == "__main__":
    sys.exit(uvloop.run(main(sys.argv[1])))
