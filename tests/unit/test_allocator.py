"""The bookie's glibc malloc settings (``malloc_tuning``)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

from asyncbk.bookie.allocator import tune_malloc


def test_the_operators_malloc_variables_win() -> None:
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        assert tune_malloc({name: "131072"}) == "environment"


def test_tuned_on_glibc() -> None:
    expected = "tuned" if platform.libc_ver()[0] == "glibc" else "not glibc"
    # (in a child: the setting is for a whole process)
    out = subprocess.run(
        [sys.executable, "-c",
         "from asyncbk.bookie.allocator import tune_malloc; print(tune_malloc({}))"],
        capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert out == expected


def test_large_buffers_reused_once_tuned() -> None:
    """What the setting is for: a 256 KiB buffer made and dropped again and again costs
    page faults untuned (fresh pages each time), next to none tuned."""
    if platform.libc_ver()[0] != "glibc":
        assert tune_malloc({}) == "not glibc"
        return
    probe = ("import resource, sys\n"
             "from asyncbk.bookie.allocator import tune_malloc\n"
             "if sys.argv[1] == 'tuned': tune_malloc({})\n"
             "ba = bytearray(256 * 1024)\n"
             "bytes(ba[0:len(ba)])\n"
             "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
             "for _ in range(200): bytes(ba[0:len(ba)])\n"
             "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    faults = {}
    for mode in ("default", "tuned"):
        faults[mode] = int(subprocess.run(
            [sys.executable, "-c", probe, mode], capture_output=True, text=True,
            timeout=60, check=True, env=env).stdout)
    assert faults["tuned"] < 100 <= faults["default"], faults  # (64 pages a buffer)
