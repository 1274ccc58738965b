"""A cluster on this machine: a real etcd and bookie processes on loopback (and, on
request, a real S3-compatible object store: :class:`SeaweedServer`).

``asyncbk standalone`` and ``asyncbk bench`` run it; ``asyncbk.testing``
re-exports it for tests.  See :class:`LocalCluster`.
"""

from .children import LocalAutoRecovery, LocalBookie
from .cluster import LocalCluster, free_port
from .etcd import EtcdServer, EtcdServerError, find_etcd_binary
from .network import Latency, Network, NetworkError, Topology, network_unavailable
from .process import ClusterRunningError, LocalClusterError
from .seaweed import SeaweedServer, SeaweedServerError, find_weed_binary

__all__ = [
    "ClusterRunningError",
    "EtcdServer",
    "EtcdServerError",
    "Latency",
    "LocalAutoRecovery",
    "LocalBookie",
    "LocalCluster",
    "LocalClusterError",
    "Network",
    "NetworkError",
    "SeaweedServer",
    "SeaweedServerError",
    "Topology",
    "find_etcd_binary",
    "find_weed_binary",
    "free_port",
    "network_unavailable",
]
