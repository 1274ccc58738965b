"""nox sessions: tests, lint, typecheck (bench and sim arrive with their issues)."""

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
    """Benchmarks (never part of the default test run): write baseline to bench-results/."""
    session.install("-e", ".[bench]")
    session.run("python", "benchmarks/limits.py")
    session.run("python", "benchmarks/write_baseline.py", *session.posargs)
    session.run("python", "benchmarks/peers.py")


@nox.session
def sim(session: nox.Session) -> None:
    """Many more simulator seeds than the default test run (SIM_SEEDS, default 5000)."""
    session.install("-e", ".[test]")
    session.env.setdefault("SIM_SEEDS", "5000")
    session.env["PYTHONHASHSEED"] = "0"
    session.run("pytest", "tests/sim", "-q", *session.posargs)
