"""The PySpark data source: ``spark.read.format("asyncbk")``, Structured Streaming,
and an exactly-once sink (Spark 4; ``pip install asyncbk[spark]``).

    from asyncbk.spark import AsyncbkDataSource
    spark.dataSource.register(AsyncbkDataSource)
    df = (spark.read.format("asyncbk").option("metadataUri", uri)
          .option("namespace", "orders").option("streams", "eu,us").load())

See docs/spark.md.  The rest of asyncbk never imports this package (nor pyspark).
The names below are loaded on first use, so that the parts that need no PySpark
(:mod:`asyncbk.spark.errors`, the options and the planner) import without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .session import activate_session, local_session
    from .sink import AsyncbkCommitMessage
    from .source import (
        LEDGER_SCHEMA,
        STREAM_SCHEMA,
        STREAM_SCHEMA_WITH_HEADERS,
        AsyncbkDataSource,
        AsyncbkPartition,
    )

__all__ = ["LEDGER_SCHEMA", "STREAM_SCHEMA", "STREAM_SCHEMA_WITH_HEADERS", "AsyncbkCommitMessage",
           "AsyncbkDataSource", "AsyncbkPartition", "activate_session", "local_session"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        import pyspark  # noqa: F401
    except ImportError:
        from ..errors import MissingExtraError

        raise MissingExtraError("asyncbk.spark needs PySpark 4: pip install 'asyncbk[spark]'",
                                name="pyspark") from None
    from .session import activate_session, local_session
    from .sink import AsyncbkCommitMessage
    from .source import (
        LEDGER_SCHEMA,
        STREAM_SCHEMA,
        STREAM_SCHEMA_WITH_HEADERS,
        AsyncbkDataSource,
        AsyncbkPartition,
    )

    found = {"LEDGER_SCHEMA": LEDGER_SCHEMA, "STREAM_SCHEMA": STREAM_SCHEMA,
             "STREAM_SCHEMA_WITH_HEADERS": STREAM_SCHEMA_WITH_HEADERS,
             "AsyncbkCommitMessage": AsyncbkCommitMessage,
             "AsyncbkDataSource": AsyncbkDataSource, "AsyncbkPartition": AsyncbkPartition,
             "activate_session": activate_session, "local_session": local_session}
    globals().update(found)
    return found[name]
