"""The on-disk index (``index_backend = "lmdb"``) with real bookie processes: its
write cache is written to LMDB in the background, layer by layer, while entries are
added; every acknowledged entry reads back after every bookie was SIGKILLed (LMDB
then holds some layers past the last checkpoint, the journal the rest)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from asyncbk.testing.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]

LMDB_CONFIG = {"index_backend": "lmdb", "index_write_cache_entries_max": 8000,
               "checkpoint_interval_s": 3600.0}
"""Layers of 2,000 keys (a quarter of the bound): written to LMDB every 1,000 entries
or so, and no checkpoint but the one at start (unless the writes outrun the flushes)."""


async def test_acked_entries_survive_sigkill_with_the_lmdb_index(tmp_path: Path) -> None:
    async with LocalCluster(bookies=3, data_dir=tmp_path / "cluster",
                            bookie_config=LMDB_CONFIG) as cluster:
        bk = await cluster.client()
        handles = [await bk.create_ledger(3, 3, 3, password=b"pw") for _ in range(2)]
        payloads = [b"lmdb-%d-" % i + bytes(200) for i in range(3000)]
        for first in range(0, 3000, 500):
            await asyncio.gather(*(lh.append(p) for lh in handles
                                   for p in payloads[first:first + 500]))
        for b in cluster.bookies:
            b.kill()
        for b in cluster.bookies:
            await b.wait()
        await asyncio.gather(*(b.start() for b in cluster.bookies))
        reader = await cluster.client()
        for lh in handles:
            rh = await reader.open_ledger(lh.id, password=b"pw", recovery=True)
            assert rh.last_add_confirmed == 2999
            got = [e.data for first in range(0, 3000, 1000)
                   for e in await rh.read(first, first + 999)]
            assert got == payloads
        # LMDB was ahead of the checkpoint (the restart cut what the journal put back)
        opened = [line for b in cluster.bookies
                  for line in (await asyncio.to_thread(b.log_path.read_text)).splitlines()
                  if "storage opened" in line]
        assert any(re.search(r"index_entries_cut=[1-9]", line) for line in opened), opened
