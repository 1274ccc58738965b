"""The consumer process of the subscription tests (``test_subscriptions.py``).

``python subscription_consumer_proc.py URI NAMESPACE STREAM NAME LAST``
subscribes (taking the subscription over), then handles records one by one:
it prints each, acknowledges it, and now and then pauses a moment (a consumer
doing work), until it has handled the record whose data is ``LAST``; then it
closes the subscription (persisting the last acknowledgement) and says so.

Lines on stdout:

- ``S <position>``: subscribed; the consumer resumes at this position (persisted);
- ``R <position> <data>``: a record was delivered (and is acknowledged next);
- ``E``: the last record was handled and the subscription closed;
- ``F``: its acknowledgement was refused: another consumer took the subscription
  over (SubscriptionFencedError).
"""

from __future__ import annotations

import asyncio
import sys

import uvloop

import asyncbk
from asyncbk.errors import SubscriptionFencedError

PAUSE_EVERY = 5
PAUSE_S = 0.005


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def consume(uri: str, namespace: str, stream: str, name: str, last: str) -> int:
    async with await asyncbk.BookKeeper.connect(uri) as bk:
        ns = await bk.namespace(namespace)
        sub = await ns.subscribe(stream, name, asyncbk.Position.EARLIEST)
        say(f"S {sub.persisted_position}")
        n = 0
        try:
            async for rec in sub:
                say(f"R {rec.position} {rec.data.decode()}")
                await sub.ack(rec.position)
                n += 1
                if n % PAUSE_EVERY == 0:
                    await asyncio.sleep(PAUSE_S)
                if rec.data.decode() == last:
                    break
        except SubscriptionFencedError:
            say("F")
            await sub.close()
            return 0
        await sub.close()
        say("E")
    return 0


if __name__ == "__main__":
    sys.exit(uvloop.run(consume(*sys.argv[1:6])))
