"""Batch writes made idempotent by sinkId and batchId, for writes inside
``foreachBatch`` (which Spark may run again for the same batch id)."""

from __future__ import annotations

from pyspark.sql import SparkSession

from .conftest import ClusterThread


def test_a_batch_id_written_before_is_not_written_again(spark: SparkSession,
                                                         spark_cluster: ClusterThread,
                                                         ns: str) -> None:
    def write(rows: list[bytes], batch_id: int) -> None:
        (spark.createDataFrame([(r,) for r in rows], "data binary").write.format("asyncbk")
         .option("metadataUri", spark_cluster.metadata_uri).option("namespace", ns)
         .option("stream", "out").option("sinkId", "fb").option("batchId", batch_id)
         .mode("append").save())

    write([b"a", b"b"], 3)
    write([b"a", b"b"], 3)  # the same batch again: nothing added
    write([b"c"], 4)
    rows = (spark.read.format("asyncbk").option("metadataUri", spark_cluster.metadata_uri)
            .option("namespace", ns).option("streams", "out").load()
            .orderBy("position").collect())
    assert [r.data for r in rows] == [b"a", b"b", b"c"]
    # and the replay's own staged ledgers are gone: nothing is left staged
    from asyncbk.meta import keys

    async def staged() -> int:
        assert spark_cluster.bk is not None
        nsobj = await spark_cluster.bk.namespace(ns)
        return len(await spark_cluster.bk.meta.kv_range(
            keys.staging_prefix(nsobj.md.root, ns, "out")))

    assert spark_cluster.run(staged()) == 0
