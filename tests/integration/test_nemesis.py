"""Nemesis: a writer process keeps appending to three ledgers (E3 Qw2 Qa2) while
bookies are SIGKILLed and restarted, or SIGSTOPped and resumed, one at a time,
every 1-3 s.  The writer must keep writing throughout; after a final SIGKILL of
the writer, recovery must find every entry it had acknowledged, with its bytes.

``NEMESIS_S`` sets how long the faults go on (default 35 s; ``nox -s nemesis``
runs longer); ``NEMESIS_SEED`` picks the fault sequence (which bookie, kill or pause,
how long), a new one each run without it.  Every run prints its seed (captured output,
shown on failure, and a line under "findings" at the end of the run), and every failure
names it, so ``NEMESIS_SEED=<seed>`` replays the same faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from asyncbk.testing import LocalCluster

from .nemesis_writer import payload

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]

NEMESIS_S = float(os.environ.get("NEMESIS_S", "35"))
WRITER = Path(__file__).with_name("nemesis_writer.py")


def seed_from(environ: Mapping[str, str]) -> int:
    """``NEMESIS_SEED`` (to replay a run's faults), else a new seed."""
    text = environ.get("NEMESIS_SEED", "").strip()
    if not text:
        return secrets.randbelow(1 << 30)
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"NEMESIS_SEED must be an integer (the seed a nemesis run "
                         f"printed), not {text!r}") from None


SEED = seed_from(os.environ)
REPLAY = f"NEMESIS_SEED={SEED}"
"""What replays this run's fault sequence; in every failure message."""


@contextlib.contextmanager
def seed_on_failure() -> Iterator[None]:
    """Whatever fails in the block (an assertion, a timeout, an error) says the seed."""
    try:
        yield
    except BaseException as exc:
        exc.add_note(f"replay the same faults with {REPLAY}")
        raise


class WriterProcess:
    """The writer's process and what it reported."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.ledgers: list[int] = []
        self.acked: dict[int, int] = {}
        self.changes = 0
        self.error: str | None = None
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            kind, *rest = line.decode().split(maxsplit=1)
            if kind == "L":
                self.ledgers.append(int(rest[0]))
            elif kind == "A":
                lid, eid = (int(x) for x in rest[0].split())
                self.acked[lid] = max(self.acked.get(lid, -1), eid)
            elif kind == "C":
                self.changes = int(rest[0])
            elif kind == "E":
                self.error = rest[0].strip()

    def total_acked(self) -> int:
        return sum(v + 1 for v in self.acked.values())

    def check_alive(self) -> None:
        if self.error is not None or self.process.returncode is not None:
            raise AssertionError(f"the writer died (exit {self.process.returncode}): "
                                 f"{self.error} ({REPLAY})")


async def test_writer_survives_rolling_kills_and_pauses(tmp_path: Path, finding: Any) -> None:
    sys.stdout.write(f"nemesis: {REPLAY}, faults for {NEMESIS_S} s\n")
    finding(f"{REPLAY} (faults for {NEMESIS_S} s)")
    with seed_on_failure():
        await rolling_kills_and_pauses(tmp_path, random.Random(SEED), finding)


async def rolling_kills_and_pauses(tmp_path: Path, rng: random.Random, finding: Any) -> None:
    async with LocalCluster(bookies=5, data_dir=tmp_path / "c",
                            bookie_config={"lease_ttl_s": 3}) as cluster:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(WRITER), cluster.metadata_uri, "3",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        writer = WriterProcess(proc)
        try:
            async with asyncio.timeout(30):
                while len(writer.acked) < 3:
                    writer.check_alive()
                    await asyncio.sleep(0.1)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + NEMESIS_S
            faults = {"kill": 0, "pause": 0}
            progress: list[int] = []
            while loop.time() < deadline:
                victim = rng.choice(cluster.bookies)
                out_s = rng.uniform(1, 3)
                before = writer.total_acked()
                if rng.random() < 0.5:
                    faults["kill"] += 1
                    victim.kill()
                    await victim.wait()
                    await asyncio.sleep(out_s)
                    await victim.start()
                else:
                    faults["pause"] += 1
                    victim.pause()
                    await asyncio.sleep(out_s)
                    victim.resume()
                await asyncio.sleep(rng.uniform(0.5, 1.5))
                writer.check_alive()
                progress.append(writer.total_acked() - before)
            # The writer keeps writing: it made progress across the faults, and after them.
            settled = writer.total_acked()
            await asyncio.sleep(3)
            writer.check_alive()
            assert writer.total_acked() > settled, f"the writer stopped writing ({REPLAY})"
            assert sum(p > 0 for p in progress) >= len(progress) // 2, \
                f"no progress across most faults: {progress} ({REPLAY})"
            assert faults["kill"] and faults["pause"], f"not both kinds: {faults} ({REPLAY})"
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)  # the writer dies mid-batch
            await proc.wait()
            await writer.reader
        finding(f"faults {faults}, ensemble changes {writer.changes}, acknowledged "
                f"{writer.total_acked()} ({REPLAY})")
        bk = await cluster.client()
        for lid in writer.ledgers:
            acked = writer.acked[lid]
            rh = await bk.open_ledger(lid, password=b"pw", recovery=True)
            last = rh.metadata.last_entry_id
            assert last >= acked, \
                f"ledger {lid}: entry {acked} was acknowledged, recovered {last} ({REPLAY})"
            entries = await rh.read(0, last)
            assert [e.entry_id for e in entries] == list(range(last + 1)), \
                f"ledger {lid}: entry ids not 0..{last} ({REPLAY})"
            bad = [e.entry_id for e in entries if e.data != payload(lid, e.entry_id)]
            assert not bad, f"ledger {lid}: wrong bytes at {bad[:10]} ({REPLAY})"
