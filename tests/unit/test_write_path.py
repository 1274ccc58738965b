from __future__ import annotations

import asyncio

from asyncbk.config import ClientConfig
from asyncbk.testing.sim import SimCluster, run_sim

PW = b"pw"


def config(**kw: object) -> ClientConfig:
    base: dict[str, object] = dict(add_timeout_s=0.5, read_timeout_s=0.5, connect_timeout_s=0.3,
                                   reconnect_backoff_s_max=0.2, explicit_lac_interval_s=0.0,
                                   add_quorum_timeout_s=30.0)
    base.update(kw)
    return ClientConfig(**base).validate()  # type: ignore[arg-type]


def test_cancelled_append_future_does_not_wedge_the_ledger() -> None:
    async def body() -> None:
        c = SimCluster(1, 3)
        await c.start()
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        first = lh.append(b"a")
        first.cancel()
        assert await asyncio.wait_for(lh.append(b"b"), 10) == 1
        assert lh.last_add_confirmed == 1
        await lh.close()
        await c.stop()

    run_sim(body)


def test_append_submitted_while_going_degraded_is_sent() -> None:
    async def body() -> None:
        c = SimCluster(1, 3)
        await c.start()
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        assert await lh.append(b"e0") == 0
        await asyncio.sleep(1)  # all three have acknowledged it
        dead = c.bookie(lh.metadata.ensembles[0][1][0])
        await dead.crash(torn=False)
        later: asyncio.Future[asyncio.Future[int]] = asyncio.get_running_loop().create_future()
        add = bk.quarantine.add

        def quarantined(bookie: str, session: object = None) -> None:
            add(bookie, session)
            if not later.done():  # the add that failed: append again before the change runs
                asyncio.get_running_loop().call_soon(lambda: later.set_result(lh.append(b"e2")))

        bk.quarantine.add = quarantined
        f1 = lh.append(b"e1")  # its add to the dead bookie fails: an ensemble change starts
        f2 = await later
        assert await asyncio.wait_for(asyncio.gather(f1, f2), 10) == [1, 2]
        await lh.close()
        await c.stop()

    run_sim(body)
