"""Shared fixtures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import structlog
from hypothesis import HealthCheck, settings

# The machine is shared and noisy: a property test's examples are judged on their
# outcome, never on how long one took (no per-example deadline, no "too slow").
settings.register_profile("asyncbk", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("asyncbk")


@pytest_asyncio.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Fail the test if anything reached the event loop's exception handler
    ("Task exception was never retrieved" and the like are bugs, not noise)."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    yield seen
    loop.set_exception_handler(previous)
    assert not seen, f"unhandled errors on the event loop: {seen}"


_FINDINGS = pytest.StashKey[list[str]]()


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """A test that runs a command in this process (``asyncbk.cli.main.main``) configures
    structlog for a process (a level, stderr as it was then): undo it, so the next
    tests' loggers (and ``capture_logs``) are as they would be alone."""
    configured = structlog.is_configured()
    saved = structlog.get_config()
    yield
    if structlog.get_config() != saved or structlog.is_configured() != configured:
        structlog.reset_defaults()
        if configured:
            structlog.configure(**saved)


@pytest.fixture
def finding(request: pytest.FixtureRequest) -> Any:
    """``finding("...")``: a line about what the test observed (timings, counts),
    listed under "findings" at the end of the run."""
    lines = request.config.stash.setdefault(_FINDINGS, [])

    def note(text: str) -> None:
        lines.append(f"{request.node.nodeid}: {text}")
    return note


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    lines = config.stash.get(_FINDINGS, [])
    if lines:
        terminalreporter.section("findings")
        for line in lines:
            terminalreporter.write_line(line)
