"""Write each harness's seeds to ``tests/fuzz/corpus/<harness>/`` (file name: the
first 16 hex digits of the seed's sha1).  The other files there were found by fuzzing
and merged in (``-merge=1``: only inputs that add coverage); they are kept.

Run: ``python -m tests.fuzz.make_corpus``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from . import fuzz_frames, fuzz_journal, fuzz_requests, fuzz_storage

HARNESSES = {"frames": fuzz_frames, "requests": fuzz_requests, "journal": fuzz_journal,
             "storage": fuzz_storage}
CORPUS = Path(__file__).parent / "corpus"


def main() -> None:
    for name, module in HARNESSES.items():
        directory = CORPUS / name
        directory.mkdir(parents=True, exist_ok=True)
        for seed in module.seeds():
            (directory / hashlib.sha1(seed).hexdigest()[:16]).write_bytes(seed)


if __name__ == "__main__":
    main()
