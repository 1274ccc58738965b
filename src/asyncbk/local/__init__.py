"""A cluster on this machine: a real etcd and bookie processes on loopback.

``asyncbk standalone`` and ``asyncbk bench`` run it; ``asyncbk.testing``
re-exports it for tests.  See :class:`LocalCluster`.
"""

from .cluster import LocalAutoRecovery, LocalBookie, LocalCluster, free_port
from .etcd import EtcdServer, EtcdServerError, find_etcd_binary
from .process import ClusterRunningError, LocalClusterError

__all__ = [
    "ClusterRunningError",
    "EtcdServer",
    "EtcdServerError",
    "LocalAutoRecovery",
    "LocalBookie",
    "LocalCluster",
    "LocalClusterError",
    "find_etcd_binary",
    "free_port",
]
