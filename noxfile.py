"""nox sessions: tests, lint, typecheck (the default); sim, bench and soak when asked."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]  # bench only when asked
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """The default test run: unit, property and integration tests (real etcd and bookies)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, including the flake8-async rules."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", "src", "tests", "benchmarks", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the package."""
    session.install("-e", ".[lint]")
    session.run("mypy")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks (never part of the default test run): the suite of workloads, streams
    against the ledger rate, then the peers (etcd always; NATS / Redis when installed)
    with the physical limits, all to bench-results/.  ``nox -s bench -- --quick`` runs a
    fifth of the suite's entries and of the streams' records."""
    session.install("-e", ".[bench]")
    session.install("nats-py", "redis", "hiredis")  # used only if the servers are installed
    session.run("python", "benchmarks/suite.py", *session.posargs)
    session.run("python", "benchmarks/streams.py", *session.posargs)
    session.run("python", "benchmarks/peers.py", "--json", "bench-results/peers.json")


@nox.session
def bench_spark(session: nox.Session) -> None:
    """Spark reading asyncbk against Spark reading a local file, and streaming latency
    against Spark's socket source, in the same run (needs Java 17+).  ``nox -s bench_spark
    -- --quick`` reads 100,000 records instead of 1,000,000."""
    session.install("-e", ".[bench,spark]")
    session.run("python", "benchmarks/spark.py", "--json", "bench-results/spark.json",
                *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """Bookie memory under a 10-minute open-loop write load."""
    session.install("-e", ".[bench]")
    session.run("python", "benchmarks/soak.py", "--json", "bench-results/soak.json",
                "--plot", "bench-results/soak.png", *session.posargs)


@nox.session
def nemesis(session: nox.Session) -> None:
    """The rolling-fault nemesis for 5 minutes (NEMESIS_S; the default test run gives it
    35 s) and the simulator's rolling-restart scenario over 20 seeds."""
    session.install("-e", ".[test]")
    session.env.setdefault("NEMESIS_S", "300")
    session.env.setdefault("SIM_ROLLING_SEEDS", ",".join(str(s) for s in range(1, 21)))
    session.run("pytest", "tests/integration/test_nemesis.py", "tests/sim/test_rolling.py",
                "-q", "-s", "-o", "timeout=900", *session.posargs)


@nox.session
def sim(session: nox.Session) -> None:
    """Many more simulator seeds than the default test run (SIM_SEEDS, default 5000)."""
    session.install("-e", ".[test]")
    session.env.setdefault("SIM_SEEDS", "5000")
    session.env["PYTHONHASHSEED"] = "0"
    session.run("pytest", "tests/sim", "-q", *session.posargs)
