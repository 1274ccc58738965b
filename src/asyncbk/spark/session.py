"""A SparkSession on this machine with ``format("asyncbk")`` registered: for
examples, benchmarks, tests and trying things out.  Production jobs build their
own session (``spark-submit``); see docs/spark.md."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any


def local_session(app_name: str = "asyncbk", master: str = "local[2]",
                  conf: Mapping[str, Any] | None = None) -> Any:
    """A SparkSession (``master`` local by default) with the asyncbk source registered.

    Spark's Python workers run this interpreter (``PYSPARK_PYTHON``, unless set), the
    driver binds to loopback, the web UI is off, shuffles use 2 partitions; ``conf``
    adds or replaces Spark settings (``{"spark.local.dir": "/tmp/x"}``)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from .source import AsyncbkDataSource

    settings = {
        "spark.driver.memory": "1g",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.streaming.stopTimeout": "30s",
    }
    settings.update({k: str(v) for k, v in (conf or {}).items()})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(AsyncbkDataSource)
    return spark


def activate_session(spark: Any) -> Any:
    """Make ``spark`` the active session of the calling thread's JVM side; returns it.

    Spark looks up a Python data source for a *write* (``df.write.format("asyncbk")``,
    ``writeStream.format("asyncbk")``) through the JVM thread's active session.  A
    Python thread other than the one that built the session (``asyncio.to_thread``, a
    thread pool, a web handler) talks to a JVM thread that has none, and the write
    fails with ``[DATA_SOURCE_NOT_FOUND] Failed to find the data source:
    asyncbk.DefaultSource`` while reads in that thread work.  Call this first in such
    a thread (``SparkSession.builder.getOrCreate()`` there does not help).  A Spark
    Connect session has no JVM here and needs nothing: it is returned as it is."""
    jvm = getattr(spark, "_jvm", None)
    jsession = getattr(spark, "_jsparkSession", None)
    if jvm is not None and jsession is not None:
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)
    return spark
