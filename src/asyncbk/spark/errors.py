"""The errors only the Spark data source raises (importable without PySpark).

Each keeps the base classes it always had, so ``except TruncatedError`` or
``except ValueError`` still catches what it caught; ``retriable`` says, as for every
asyncbk error (:func:`asyncbk.errors.is_retriable`), whether the same call may
succeed later.
"""

from __future__ import annotations

from ..errors import BKError, ConfigError, TruncatedError


class DataLossError(TruncatedError):
    """A Spark query's range of a stream was truncated (or the stream deleted) before it
    was read; raised when ``failOnDataLoss`` is true (the default)."""


class SparkOptionError(ConfigError, ValueError):
    """An option of ``format("asyncbk")`` is missing or wrong; the message says which and
    what it takes."""


class SinkCommitError(BKError):
    """A Spark write could not be committed to its stream (nothing of it became visible)."""

    retriable = True


__all__ = ["DataLossError", "SinkCommitError", "SparkOptionError"]
