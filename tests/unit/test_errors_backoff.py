"""The error classes say whether to retry; the one back-off helper."""

from __future__ import annotations

import inspect
import random
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncbk import errors
from asyncbk.backoff import Backoff
from asyncbk.errors import InvariantError, is_retriable

RETRIABLE = {
    "NotEnoughBookiesError", "PlacementError", "BookieUnavailableError",
    "MetadataVersionError", "TimeoutError", "BookieReadOnlyError", "TooManyRequestsError",
    "BookieIOError", "MetadataError", "ReadBeyondLastAddConfirmedError",
    "ObjectStoreUnavailableError",
}


def _error_classes() -> dict[str, type[errors.BKError]]:
    return {name: cls for name, cls in inspect.getmembers(errors, inspect.isclass)
            if issubclass(cls, errors.BKError) and cls.__module__ == errors.__name__}


def test_every_error_says_whether_to_retry() -> None:
    classes = _error_classes()
    assert set(classes) >= RETRIABLE
    for name, cls in classes.items():
        assert isinstance(cls.retriable, bool), name
        assert cls.retriable is (name in RETRIABLE), \
            f"{name}.retriable is {cls.retriable}; the table here says otherwise"
        assert is_retriable(cls("x")) is cls.retriable


def test_final_errors_are_not_retriable() -> None:
    for cls in (errors.LedgerFencedError, errors.WriterFencedError, errors.LedgerClosedError,
                errors.UnauthorizedAccessError, errors.NoSuchLedgerError,
                errors.BadRequestError, errors.EntryTooLargeError, errors.TruncatedError):
        assert not is_retriable(cls("x")), cls.__name__


def test_foreign_exceptions_are_not_retriable() -> None:
    assert not is_retriable(ValueError("x"))
    assert not is_retriable(OSError("x"))


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    b = Backoff(0.1, 1.0)
    assert [round(b.next_s(), 6) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert b.failures == 6
    b.reset()
    assert b.failures == 0
    assert b.next_s() == 0.1


@given(st.floats(0.001, 10), st.floats(1, 100), st.floats(0, 1), st.integers(0, 2**32),
       st.integers(1, 80))
def test_jittered_delays_stay_within_their_band(initial: float, factor: float,
                                                jitter: float, seed: int, n: int) -> None:
    b = Backoff(initial, initial * factor, jitter=jitter, rng=random.Random(seed))
    for _ in range(n):
        full = b.peek_s()
        delay = b.next_s()
        assert full * (1 - jitter) - 1e-12 <= delay <= full + 1e-12
        assert delay <= initial * factor + 1e-12


def test_backoff_jitter_comes_from_the_given_rng() -> None:
    def delays(seed: int) -> list[float]:
        b = Backoff(0.05, 5.0, jitter=0.5, rng=random.Random(seed))
        return [b.next_s() for _ in range(10)]

    assert delays(7) == delays(7)
    assert delays(7) != delays(8)


@pytest.mark.parametrize(("initial", "cap", "jitter"), [(0, 1, 0), (2, 1, 0), (0.1, 1, 1.5)])
def test_backoff_refuses_nonsense_bounds(initial: float, cap: float, jitter: float) -> None:
    with pytest.raises(InvariantError):
        Backoff(initial, cap, jitter=jitter)


# --------------------------------------------------------------------------- Spark's errors

SPARK_RETRIABLE = {"SinkCommitError"}


def test_spark_errors_live_in_the_spark_package_and_say_whether_to_retry() -> None:
    from asyncbk.spark import errors as spark_errors

    classes = {name: cls for name, cls in inspect.getmembers(spark_errors, inspect.isclass)
               if issubclass(cls, errors.BKError) and cls.__module__ == spark_errors.__name__}
    assert set(classes) == {"DataLossError", "SparkOptionError", "SinkCommitError"}
    assert not set(classes) & set(_error_classes()), "asyncbk.errors holds no Spark-only class"
    for name, cls in classes.items():
        assert isinstance(cls.retriable, bool), name
        assert cls.retriable is (name in SPARK_RETRIABLE), name
        assert is_retriable(cls("x")) is cls.retriable
    # their base classes are what callers catch them by
    assert issubclass(spark_errors.DataLossError, errors.TruncatedError)
    assert issubclass(spark_errors.SparkOptionError, errors.ConfigError)
    assert issubclass(spark_errors.SparkOptionError, ValueError)
    assert issubclass(spark_errors.SinkCommitError, errors.BKError)


def test_spark_errors_import_without_pyspark() -> None:
    """``asyncbk.spark.errors`` (and the options and planner) need no PySpark; what does
    need it says which extra to install."""
    code = "\n".join([
        "import sys",
        "sys.modules['pyspark'] = None  # as if PySpark were not installed",
        "from asyncbk.spark.errors import DataLossError, SinkCommitError, SparkOptionError",
        "from asyncbk.spark.options import read_options",
        "from asyncbk.spark.plan import StreamIndex",
        "try:",
        "    from asyncbk.spark import AsyncbkDataSource",
        "except ImportError as exc:",
        "    print('refused:', exc)",
    ])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == \
        "refused: asyncbk.spark needs PySpark 4: pip install 'asyncbk[spark]'", r.stdout
