"""Test harnesses: LocalCluster (real processes), the etcd runner, a fault-injecting
proxy, the simulator.

``from asyncbk.testing import LocalCluster`` is the documented entry point; the
cluster runner itself lives in :mod:`asyncbk.local`.
"""

from ..local.cluster import LocalBookie, LocalCluster

__all__ = ["LocalBookie", "LocalCluster"]
