"""The PySpark data source: ``spark.read.format("asyncbk")``, Structured Streaming,
and an exactly-once sink (Spark 4; ``pip install asyncbk[spark]``).

    from asyncbk.spark import AsyncbkDataSource
    spark.dataSource.register(AsyncbkDataSource)
    df = (spark.read.format("asyncbk").option("metadataUri", uri)
          .option("namespace", "orders").option("streams", "eu,us").load())

See docs/spark.md.  The rest of asyncbk never imports this package (nor pyspark).
"""

from __future__ import annotations

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("asyncbk.spark needs PySpark 4: pip install 'asyncbk[spark]'") from exc

from .session import local_session
from .sink import AsyncbkCommitMessage
from .source import LEDGER_SCHEMA, STREAM_SCHEMA, AsyncbkDataSource, AsyncbkPartition

__all__ = ["LEDGER_SCHEMA", "STREAM_SCHEMA", "AsyncbkCommitMessage", "AsyncbkDataSource",
           "AsyncbkPartition", "local_session"]
