"""``benchmarks/floor.py`` runs end to end (tiny counts): three servers that append,
sync and answer, and a client that counts each append done at the second answer."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.modules import load_script

FLOOR = Path(__file__).resolve().parents[2] / "benchmarks" / "floor.py"


def test_floor_measures_every_mode(tmp_path: Path) -> None:
    out = tmp_path / "floor.json"
    done = subprocess.run(
        [sys.executable, str(FLOOR), "--rounds", "1", "--sequential-entries", "30",
         "--entries", "600", "--inflight", "64", "--dir", str(tmp_path),
         "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result) == {"loop", "thread", "none"}
    for mode in result.values():
        median = mode["median"]
        assert 0 < median["sequential_p50_us"] <= median["sequential_p99_us"]
        assert median["pipelined_eps"] > 0
    assert not [p for p in tmp_path.rglob("server*.dat")]  # (its files removed)


def test_floor_refuses_an_unknown_mode() -> None:
    done = subprocess.run([sys.executable, str(FLOOR), "--modes", "loop,disk"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--modes takes loop, thread, uring and none" in done.stderr


def test_floor_measures_the_io_uring_mode(tmp_path: Path) -> None:
    """The servers' writes and syncs submitted through io_uring from the loop (liburing,
    in the test extra), completions read from the ring's eventfd."""
    out = tmp_path / "floor.json"
    done = subprocess.run(
        [sys.executable, str(FLOOR), "--modes", "uring", "--rounds", "1",
         "--sequential-entries", "30", "--entries", "600", "--inflight", "64",
         "--dir", str(tmp_path), "--json", str(out)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    median = json.loads(out.read_text())["uring"]["median"]
    assert 0 < median["sequential_p50_us"] <= median["sequential_p99_us"]
    assert median["pipelined_eps"] > 0


class _Answers:
    """Stands for a client's transport: what the server answered."""

    def __init__(self, expected: int) -> None:
        self.written: list[bytes] = []
        self.expected = expected
        self.all_in = asyncio.Event()

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.written.append(data)
        if len(self.written) == self.expected:
            self.all_in.set()


async def test_the_io_uring_writer_writes_each_chunk_at_its_offset(tmp_path: Path) -> None:
    """Each chunk lands where it was sent (liburing's io_uring_prep_write takes the
    offset as its fourth argument: given the length there, every chunk went to the
    same place, and the mode measured rewrites of one block)."""
    floor = load_script(FLOOR, "floor_bench")
    path = tmp_path / "server.dat"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        writer = floor.UringWriter(fd, asyncio.get_running_loop())
        chunks = [bytes([65 + i]) * (100 + i) for i in range(5)]
        answers = _Answers(len(chunks))
        offset = 0
        for i, chunk in enumerate(chunks):
            writer.submit(chunk, offset, b"%d" % i, answers)
            offset += len(chunk)
        await asyncio.wait_for(answers.all_in.wait(), 10)
        assert await asyncio.to_thread(path.read_bytes) == b"".join(chunks)
        assert sorted(answers.written) == [b"%d" % i for i in range(5)]
        asyncio.get_running_loop().remove_reader(writer.efd)
        writer.L.io_uring_queue_exit(writer.ring)
        os.close(writer.efd)
    finally:
        os.close(fd)
