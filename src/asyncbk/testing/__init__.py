"""Test harnesses: LocalCluster (real processes), the etcd runner, a fault-injecting
proxy, the simulator.

``from asyncbk.testing import LocalCluster`` is the documented entry point; the
cluster runner itself lives in :mod:`asyncbk.local`.  ``LocalCluster(topology=
Topology(...))`` runs each bookie on a host of its own (a network namespace) with
latency and partitions (docs/topology-testing.md).
"""

from ..local.cluster import LocalBookie, LocalCluster
from ..local.network import Latency, Network, NetworkError, Topology, network_unavailable

__all__ = ["Latency", "LocalBookie", "LocalCluster", "Network", "NetworkError", "Topology",
           "network_unavailable"]
