"""The writer process of the nemesis test (``test_nemesis.py``).

``python nemesis_writer.py URI LEDGERS`` creates LEDGERS ledgers (E3 Qw2 Qa2,
password ``pw``), prints ``L <ledger id>`` for each, then appends to all of
them until killed, pipelined in rounds of 20, and prints ``A <ledger id> <entry id>``
whenever an entry (and all before it) is acknowledged, plus ``C <ensemble
changes>`` now and then.  Any error ends it with ``E <message>`` and exit
code 1.  Entry ``i`` of ledger ``l`` holds :func:`payload` ``(l, i)``.
"""

from __future__ import annotations

import asyncio
import sys

import uvloop

import asyncbk
from asyncbk.client.ledger import LedgerHandle

ROUND_ENTRIES = 20
ROUND_PAUSE_S = 0.02
"""A pause between rounds: a steady load (~1,000 entries/s a ledger here), so the
test's final read-back stays short."""


def payload(ledger_id: int, entry_id: int) -> bytes:
    head = b"%d:%d:" % (ledger_id, entry_id)
    return head + b"x" * (100 - len(head))


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def write_forever(lh: LedgerHandle) -> None:
    next_id = 0
    while True:
        futures = [lh.append(payload(lh.id, next_id + k)) for k in range(ROUND_ENTRIES)]
        next_id += ROUND_ENTRIES
        last = (await asyncio.gather(*futures))[-1]
        say(f"A {lh.id} {last}")
        await asyncio.sleep(ROUND_PAUSE_S)


async def main(uri: str, ledgers: int) -> int:
    # Short add timeouts so that a paused bookie is noticed (and replaced) in time.
    async with await asyncbk.BookKeeper.connect(uri, add_timeout_s=2.0) as bk:
        handles = [await bk.create_ledger(3, 2, 2, password=b"pw") for _ in range(ledgers)]
        for lh in handles:
            say(f"L {lh.id}")
        tasks = [asyncio.create_task(write_forever(lh)) for lh in handles]
        try:
            while True:
                done, _ = await asyncio.wait(tasks, timeout=1.0,
                                             return_when=asyncio.FIRST_EXCEPTION)
                say(f"C {sum(lh.ensemble_changes for lh in handles)}")
                for t in done:
                    t.result()
        except asyncbk.errors.BKError as exc:
            say(f"E {type(exc).__name__}: {exc}")
            return 1
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    sys.exit(uvloop.run(main(sys.argv[1], int(sys.argv[2]))))
