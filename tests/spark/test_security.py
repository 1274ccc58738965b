"""The Spark source against a cluster with mutual TLS, a token and etcd's own
authentication: it reads and writes with the options tlsCaFile, tlsCertFile,
tlsKeyFile, authTokenFile, etcdUser and etcdPasswordFile, and gets nothing without
them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from .conftest import ClusterThread


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterThread]:
    ct = ClusterThread(tmp_path_factory.mktemp("secure"), tls=True, auth_token="spark-tok",
                       etcd_auth=True)
    try:
        ct.start()
        yield ct
    finally:
        ct.stop()


def test_reads_and_writes_with_tls_and_a_token(spark: SparkSession,
                                               secure: ClusterThread) -> None:
    cluster = secure.cluster
    assert cluster is not None and cluster.tls is not None
    tls = cluster.tls
    access = {"metadataUri": secure.metadata_uri, "namespace": "sec",
              "tlsCaFile": str(tls.ca), "tlsCertFile": str(tls.client_cert),
              "tlsKeyFile": str(tls.client_key),
              "authTokenFile": str(Path(cluster.data_dir) / "tls" / "tokens"),
              "etcdUser": str(cluster.etcd_user),
              "etcdPasswordFile": str(Path(cluster.data_dir) / "tls" / "etcd-password")}

    async def setup() -> None:
        assert secure.bk is not None
        ns = await secure.bk.namespace("sec", create=True, ensemble_size=3, write_quorum=2,
                                       ack_quorum=2)
        await ns.create_stream("in")
        async with await ns.open_writer("in") as w:
            for i in range(100):
                w.write_nowait(b"r%d" % i)

    secure.run(setup())
    df = spark.read.format("asyncbk").options(**access, streams="in").load()
    assert sorted(r.data for r in df.collect()) == sorted(b"r%d" % i for i in range(100))
    df.select("data").write.format("asyncbk").options(**access, stream="out") \
        .mode("append").save()
    back = spark.read.format("asyncbk").options(**access, streams="out").load().collect()
    # what came back over TLS is what was written: every record, each once, its bytes
    assert sorted(bytes(r.data) for r in back) == sorted(b"r%d" % i for i in range(100))
    assert {r.stream for r in back} == {"out"}
    without_token = {k: v for k, v in access.items() if k != "authTokenFile"}
    with pytest.raises(Exception, match="UNAUTHORIZED|unauthorized|refused"):
        spark.read.format("asyncbk").options(**without_token, streams="in").load().collect()
    without_etcd_user = {k: v for k, v in access.items() if not k.startswith("etcd")}
    with pytest.raises(Exception, match="requires authentication"):
        spark.read.format("asyncbk").options(**without_etcd_user, streams="in").load().collect()
    with pytest.raises(Exception, match="tlsCertFile and tlsKeyFile"):
        spark.read.format("asyncbk").options(
            **{k: v for k, v in access.items() if k != "tlsKeyFile"}, streams="in").load() \
            .collect()
