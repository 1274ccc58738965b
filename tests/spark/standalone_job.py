"""The driver of tests/spark/test_standalone_cluster.py, run as its own process.

Only one SparkContext can live in a process, and the test session already has a
``local[2]`` one (the ``spark`` fixture), so the ``spark://`` session runs here:

    python tests/spark/standalone_job.py '{"master": "spark://127.0.0.1:P", ...}'

It connects to the standalone master, waits until both executors are registered,
then

1. batch-reads stream ``source`` of the namespace (``maxRecordsPerPartition`` small,
   so the partitions spread over both executors);
2. runs a streaming query with ``Trigger.AvailableNow`` from ``source`` (from
   ``earliest``, publishing its progress as the subscription ``etl``) with
   ``writeStream.format("asyncbk")`` (the exactly-once sink, its tasks on the
   executors), a ``stream`` column routing even txids to ``<sink>-even`` and odd
   ones to ``<sink>-odd`` (created on first use);
3. batch-reads both back;

and prints one line ``RESULT <json>`` on stdout: the rows of both reads (data as
hex), the executors seen and the streaming query's progress.  Spark's own log goes
to stderr.  Every wait is bounded; the session is stopped on the way out.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

QUERY_TIMEOUT_S = 90
EXECUTORS_TIMEOUT_S = 60.0


def rows(df: Any) -> list[list[Any]]:
    return [[r.stream, r.position, r.txid, bytes(r.data).hex()] for r in df.collect()]


def rows_and_partitions(df: Any) -> tuple[list[list[Any]], int]:
    """The rows of ``df`` and how many partitions held rows (without a second plan)."""
    from pyspark.sql.functions import spark_partition_id

    got = df.withColumn("_partition", spark_partition_id()).collect()
    return ([[r.stream, r.position, r.txid, bytes(r.data).hex()] for r in got],
            len({r._partition for r in got}))


def main(args: dict[str, Any]) -> dict[str, Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from asyncbk.spark import AsyncbkDataSource

    started = time.monotonic()
    spark = (SparkSession.builder.master(args["master"])
             .appName("asyncbk-standalone-test")
             .config("spark.driver.memory", "512m")
             .config("spark.executor.memory", "512m")
             .config("spark.executor.cores", "1")
             .config("spark.cores.max", "2")
             .config("spark.pyspark.python", sys.executable)
             .config("spark.driver.extraJavaOptions", args["jvm_opts"])
             .config("spark.executor.extraJavaOptions", args["jvm_opts"])
             .config("spark.ui.enabled", "false")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.port", str(args["driver_port"]))
             .config("spark.driver.blockManager.port", str(args["block_manager_port"]))
             .config("spark.local.dir", args["local_dir"])
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
             .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "60s")
             .config("spark.sql.streaming.stopTimeout", "30s")
             .getOrCreate())
    try:
        spark.sparkContext.setLogLevel("WARN")
        spark.dataSource.register(AsyncbkDataSource)
        session_s = time.monotonic() - started

        deadline = time.monotonic() + EXECUTORS_TIMEOUT_S
        executors: list[str] = []
        while time.monotonic() < deadline:
            # getExecutorInfos lists the driver too
            executors = sorted(f"{e.host()}:{e.port()}" for e in
                               spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos())
            if len(executors) >= 3:
                break
            time.sleep(0.5)

        common = {"metadataUri": args["metadata_uri"], "namespace": args["namespace"],
                  "maxRecordsPerPartition": str(args["per_partition"])}

        t = time.monotonic()
        batch_df = spark.read.format("asyncbk").options(**common) \
            .option("streams", args["source"]).load()
        batch, batch_partitions = rows_and_partitions(batch_df)
        batch_s = time.monotonic() - t

        from pyspark.sql import functions as F

        t = time.monotonic()
        sink = args["sink"]
        q = (spark.readStream.format("asyncbk").options(**common)
             .option("streams", args["source"]).option("startingPositions", "earliest")
             .option("subscription", "etl").load()
             .withColumn("stream", F.when(F.col("txid") % 2 == 0, F.lit(f"{sink}-even"))
                         .otherwise(F.lit(f"{sink}-odd")))
             .writeStream.format("asyncbk")
             .option("metadataUri", args["metadata_uri"]).option("namespace", args["namespace"])
             .option("createStreams", "true")
             .option("checkpointLocation", args["checkpoint"])
             .trigger(availableNow=True).start())
        try:
            finished = q.awaitTermination(QUERY_TIMEOUT_S)
            if not finished:
                raise TimeoutError(f"availableNow query not done after {QUERY_TIMEOUT_S:g} s: "
                                   f"{q.status}")
            error = q.exception()
            if error is not None:
                raise RuntimeError(f"streaming query failed: {error}")
            progress = [{"batchId": p["batchId"], "numInputRows": p["numInputRows"]}
                        for p in q.recentProgress]
        finally:
            q.stop()
        streaming_s = time.monotonic() - t

        written = rows(spark.read.format("asyncbk").options(**common)
                       .option("streams", f"{sink}-even,{sink}-odd").load())
        return {"executors": executors, "batch": batch, "batch_partitions": batch_partitions,
                "progress": progress, "written": written,
                "seconds": {"session": round(session_s, 1), "batch": round(batch_s, 1),
                            "streaming": round(streaming_s, 1)}}
    finally:
        spark.stop()


if __name__ == "__main__":
    result = main(json.loads(sys.argv[1]))
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
