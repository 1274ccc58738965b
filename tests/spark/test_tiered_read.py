"""Spark over tiered storage: batch and streaming reads of a stream whose older half
is offloaded (its ledgers deleted from the bookies) and whose newer half is on the
bookies read the same rows as before the offload.  The tasks read the objects with
the credentials named by the ``objectStoreCredentialsFile`` option."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import SparkSession

from asyncbk.offload.offloader import Offloader, OffloaderOptions
from asyncbk.tiered.location import Credentials, ObjectStoreUri
from asyncbk.tiered.store import S3ObjectStore

from .test_streaming import Collector, put, run_available_now, source

if TYPE_CHECKING:
    from .conftest import ClusterThread

pytestmark = pytest.mark.spark


def offload_older_half(sc: ClusterThread, ns: str, stream: str) -> list[str]:
    """Offload the first half of ``stream``'s segments and delete their ledgers; each
    segment's storage afterwards."""

    async def go() -> list[str]:
        cluster, bk = sc.cluster, sc.bk
        assert cluster is not None and bk is not None
        creds = cluster.object_store_credentials()
        assert creds is not None
        store = S3ObjectStore(ObjectStoreUri.parse(cluster.object_store_uri),
                              Credentials(*creds))
        nsobj = await bk.namespace(ns)
        segs = [s for s in await nsobj.md.segments(ns, stream) if s.records]
        half = len(segs) // 2
        off = Offloader(bk, store, OffloaderOptions(segments_per_pass=half))
        sm = await nsobj.md.stream(ns, stream)
        ctx = nsobj.context
        for seg in segs[:half]:
            done = await off.offload_segment(ctx, stream, seg)
            assert done is not None
            await off.delete_bookie_copy(ctx, stream, done)
        del sm
        return [s.storage for s in (await nsobj.stream_info(stream)).segments if s.records]

    return sc.run(go())


def test_batch_and_streaming_reads_over_a_half_offloaded_stream(
        spark: SparkSession, spark_cluster: ClusterThread, ns: str, tmp_path: Path) -> None:
    written = put(spark_cluster, ns, "h", 1000, create=True, rolling_entries=200)
    cluster = spark_cluster.cluster
    assert cluster is not None and cluster.object_store is not None
    creds_file = str(cluster.object_store.credentials_path)

    def batch() -> list[tuple[str, str, int, bytes]]:
        df = (spark.read.format("asyncbk").option("metadataUri", spark_cluster.metadata_uri)
              .option("namespace", ns).option("streams", "h")
              .option("objectStoreCredentialsFile", creds_file)
              .option("maxRecordsPerPartition", 300).load())
        return sorted((r.stream, r.position, r.txid, bytes(r.data)) for r in df.collect())

    before = batch()
    assert before == sorted(written)
    storage = offload_older_half(spark_cluster, ns, "h")
    assert storage.count("object") >= 2 and storage[-1] == "bookies", storage
    assert batch() == before
    sink = Collector()
    run_available_now(source(spark, spark_cluster, ns, streams="h", maxRecordsPerTrigger=350,
                             startingPositions="earliest",
                             objectStoreCredentialsFile=creds_file), sink, tmp_path / "ckpt")
    assert sorted(sink.records()) == before
