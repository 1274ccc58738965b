"""Run the atheris harnesses one after the other and sum up (``nox -s fuzz`` runs this).

``python -m tests.fuzz.run [--quick] [--runs N] [--max-total-time S] [harness ...]
[-- libFuzzer flags]``.  Each harness starts from its seeds (``corpus/<harness>/``,
never written to) and the inputs it found before (``build/fuzz/<harness>/``); its
output goes to ``build/fuzz/<harness>.log``, crashing inputs to ``build/fuzz/crashes/``.
The summary gives, per harness: inputs executed, coverage (libFuzzer's ``cov``: code
edges; ``ft``: features), corpus size, time, the known findings hit, and the crash if
any.  The exit status is 1 if a harness crashed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HARNESSES = ("requests", "journal", "frames", "storage")
HERE = Path(__file__).parent
BUILD = Path("build/fuzz")
_STATUS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
_EXECUTED = re.compile(r"^stat::number_of_executed_units: (\d+)")
_KNOWN = re.compile(r"^known finding (\w+) hit")


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


@dataclass
class Result:
    harness: str
    inputs: int = 0
    cov: int = 0
    ft: int = 0
    corpus: int = 0
    seconds: float = 0.0
    status: int = 0
    known: set[str] = field(default_factory=set)
    crash: str = ""


def fuzz(harness: str, runs: int, max_total_time: int, extra: list[str]) -> Result:
    work = BUILD / harness
    work.mkdir(parents=True, exist_ok=True)
    (BUILD / "crashes").mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", f"tests.fuzz.fuzz_{harness}", f"-runs={runs}",
           f"-max_total_time={max_total_time}", "-max_len=4096", "-timeout=10",
           "-rss_limit_mb=2048", "-print_final_stats=1",
           f"-artifact_prefix={BUILD / 'crashes'}/{harness}-", *extra,
           str(work), str(HERE / "corpus" / harness)]
    say(f"== {harness}: {' '.join(cmd[1:])}")
    r = Result(harness)
    started = time.monotonic()
    with (BUILD / f"{harness}.log").open("w") as log, subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if m := _STATUS.match(line):
                r.inputs, r.cov, r.ft, r.corpus = int(m[1]), int(m[2]), int(m[3]), int(m[4])
            elif m := _EXECUTED.match(line):
                r.inputs = int(m[1])
            elif m := _KNOWN.match(line):
                r.known.add(m[1])
            elif "Test unit written to" in line or "Uncaught Python exception" in line:
                r.crash = line.strip()
                say(line.rstrip())
    r.seconds = round(time.monotonic() - started, 1)
    r.status = proc.returncode
    return r


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("harnesses", nargs="*", help=f"some of {', '.join(HARNESSES)}")
    parser.add_argument("--quick", action="store_true", help="20,000 inputs, 60 s at most")
    parser.add_argument("--runs", type=int, default=2_000_000, help="inputs per harness")
    parser.add_argument("--max-total-time", type=int, default=600, help="seconds per harness")
    args = parser.parse_args(argv)
    if unknown := set(args.harnesses) - set(HARNESSES):
        parser.error(f"no harness {', '.join(sorted(unknown))}")
    runs, max_s = (20_000, 60) if args.quick else (args.runs, args.max_total_time)
    results = [fuzz(h, runs, max_s, extra) for h in args.harnesses or HARNESSES]
    say(f"\n{'harness':<10}{'inputs':>11}{'cov':>6}{'ft':>7}{'corpus':>8}{'seconds':>9}  "
        "known findings hit / crash")
    for r in results:
        note = r.crash or ", ".join(sorted(r.known)) or "-"
        say(f"{r.harness:<10}{r.inputs:>11}{r.cov:>6}{r.ft:>7}{r.corpus:>8}{r.seconds:>9}  "
            f"{note}")
    return 1 if any(r.status for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
