"""Quarantine, with real bookie processes: a paused bookie fails its adds and is
quarantined; with no spare its writer's appends wait; once resumed it answers the
writer's health probe and is taken back at once, long before ``bookie_quarantine_s``
is over (README, "Bookies restart one after another")."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from asyncbk.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]

QUARANTINE_S = 60.0
ADD_TIMEOUT_S = 1.0
PROBE_TIMEOUT_S = 0.5
PAUSED_S = 4.0
TAKEN_BACK_S_MAX = 10.0
"""From the resume to the appends acknowledged: a probe round (the writer retries with
back-off up to ``ensemble_change_backoff_s_max``, 1 s) and the resent adds; far less
than ``QUARANTINE_S``."""


def payload(i: int) -> bytes:
    return b"q%d-" % i + b"q" * 200


async def test_a_paused_bookie_with_no_spare_is_taken_back_when_it_answers_a_probe(
        tmp_path: Path, finding: Any) -> None:
    # A lease far longer than the pause: the bookie stays registered in the same session
    # throughout, so only the health probe (not a new registration) can release it.
    async with LocalCluster(bookies=3, data_dir=tmp_path / "c",
                            bookie_config={"lease_ttl_s": 30}) as cluster:
        bk = await cluster.client(add_timeout_s=ADD_TIMEOUT_S, probe_timeout_s=PROBE_TIMEOUT_S,
                                  bookie_quarantine_s=QUARANTINE_S,
                                  ensemble_change_timeout_s=QUARANTINE_S)
        lh = await bk.create_ledger(3, 3, 3, password=b"pw")  # every bookie, no spare
        assert await asyncio.gather(*(lh.append(payload(i)) for i in range(10))) \
            == list(range(10))
        paused = cluster.bookies[1]
        session = (await bk.meta.list_bookies())[paused.id].session
        assert session is not None

        paused.pause()
        t_paused = time.monotonic()
        try:
            waiting = [asyncio.ensure_future(lh.append(payload(i))) for i in range(10, 20)]
            await asyncio.sleep(PAUSED_S)
            # its adds timed out: quarantined, and with no spare and no ack quorum
            # (Qa 3) the appends wait for it, they do not fail
            assert paused.id in bk.quarantine.active()
            assert not any(f.done() for f in waiting), [f for f in waiting if f.done()]
        finally:
            paused.resume()
        t_resumed = time.monotonic()
        _, pending = await asyncio.wait(waiting, timeout=TAKEN_BACK_S_MAX)
        if pending:
            pytest.fail(f"{paused.id} not taken back within {TAKEN_BACK_S_MAX}s of its "
                        f"resume: {len(pending)} appends still wait (quarantined: "
                        f"{sorted(bk.quarantine.active())})")
        back_after = time.monotonic() - t_resumed
        assert [f.result() for f in waiting] == list(range(10, 20))
        # taken back: out of quarantine, in its own position, in the same registration
        assert paused.id not in bk.quarantine.active()
        assert time.monotonic() - t_paused < QUARANTINE_S
        assert len(lh.metadata.ensembles) == 1 and paused.id in lh.metadata.ensembles[0][1]
        assert (await bk.meta.list_bookies())[paused.id].session == session
        assert lh.ensemble_changes == 0
        # and taking adds again (Qa 3 needs it)
        assert await asyncio.gather(*(lh.append(payload(i)) for i in range(20, 30))) \
            == list(range(20, 30))
        await lh.close()
        rh = await (await cluster.client()).open_ledger(lh.id, password=b"pw")
        assert [e.data for e in await rh.read(0, 29)] == [payload(i) for i in range(30)]
        finding(f"paused {PAUSED_S:.0f} s with no spare: appends done {back_after:.1f} s "
                f"after the resume (quarantine {QUARANTINE_S:.0f} s, add timeout "
                f"{ADD_TIMEOUT_S} s, probe timeout {PROBE_TIMEOUT_S} s)")
