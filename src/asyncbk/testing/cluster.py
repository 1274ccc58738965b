"""``LocalCluster`` for tests; it lives in :mod:`asyncbk.local` (what ``asyncbk
standalone`` runs), and this module keeps the import path tests use."""

from ..local.children import READY_TIMEOUT_S, STOP_TIMEOUT_S, LocalAutoRecovery, LocalBookie
from ..local.cluster import LocalCluster, free_port

__all__ = ["READY_TIMEOUT_S", "STOP_TIMEOUT_S", "LocalAutoRecovery", "LocalBookie",
           "LocalCluster", "free_port"]
