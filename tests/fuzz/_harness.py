"""What the atheris harnesses (``tests/fuzz/fuzz_*.py``) share.

Each harness module defines ``check(data: bytes) -> None``: one input through one
decoder, raising only on a finding (an exception outside the decoder's documented
errors, a broken invariant, an allocation past the bound) and ``seeds()``: valid
inputs made with the real encoders, plus truncated ones (``make_corpus.py`` writes
them to ``corpus/<harness>/``).  ``run(check)`` fuzzes ``check`` under atheris;
``tests/unit/test_fuzz_props.py`` runs the same ``check`` functions under hypothesis.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shlex
import sys
from collections.abc import Callable
from typing import Any

STRICT = os.environ.get("ASYNCBK_FUZZ_STRICT") == "1"
ADDRESS_SPACE_EXTRA_BYTES = 1 << 30
"""How much address space a fuzzing process may take beyond what it had at start: a
decoder that believed a declared length of 2**31 fails with MemoryError (a finding)."""
MESSAGE_CHARS_MAX = 1024
"""An error message longer than this (one that quotes the input) is a finding."""

_seen: set[str] = set()


class Finding(AssertionError):
    """The code under test broke its contract on this input."""


def known(finding_id: str) -> bool:
    """A known, reported finding (tests/fuzz/README.md) was hit: True to skip the input
    (the default while it is unfixed), False under ``ASYNCBK_FUZZ_STRICT=1`` (crash)."""
    if finding_id not in _seen:
        _seen.add(finding_id)
        what = "a crash under ASYNCBK_FUZZ_STRICT=1" if STRICT else "input skipped"
        sys.stderr.write(f"known finding {finding_id} hit ({what})\n")
    return not STRICT


def known_hits() -> set[str]:
    return set(_seen)


def split(data: bytes, n: int) -> list[bytes]:
    """``n`` sections of ``data``: each but the last has a 2-byte little-endian length
    prefix; the last takes the rest (missing sections are empty)."""
    out: list[bytes] = []
    pos = 0
    for _ in range(n - 1):
        size = int.from_bytes(data[pos:pos + 2], "little")
        out.append(data[pos + 2:pos + 2 + size])
        pos += 2 + size
    out.append(data[pos:])
    return out


def join(sections: list[bytes]) -> bytes:
    """The inverse of :func:`split` (for seeds)."""
    head = b"".join(len(s).to_bytes(2, "little") + s for s in sections[:-1])
    return head + sections[-1]


def _limit_address_space() -> None:
    with open("/proc/self/status") as fh:
        vm_kib = next(int(line.split()[1]) for line in fh if line.startswith("VmSize:"))
    limit = vm_kib * 1024 + ADDRESS_SPACE_EXTRA_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def instrumented(fuzzing: bool) -> Any:
    """Wrap a harness's imports of asyncbk: when ``fuzzing`` (run as ``__main__``), atheris
    instruments the asyncbk modules imported inside (coverage feedback from them only;
    the harness, the standard library and C extensions run at full speed)."""
    if not fuzzing:
        return contextlib.nullcontext()
    import atheris

    return atheris.instrument_imports(include=["asyncbk"])


def run(check: Callable[[bytes], None]) -> None:
    """Fuzz ``check`` with atheris; ``sys.argv`` holds libFuzzer's flags and corpus dirs."""
    import atheris

    _limit_address_space()
    # libFuzzer re-runs argv[0] through the shell for -merge, -fork and -jobs: make it
    # "python -m tests.fuzz.fuzz_x" (the harness imports its package relatively)
    main = sys.modules["__main__"].__spec__
    argv0 = f"{shlex.quote(sys.executable)} -m {main.name}" if main else sys.argv[0]
    atheris.Setup([argv0, *sys.argv[1:]], check)
    atheris.Fuzz()
