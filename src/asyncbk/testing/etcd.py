"""The etcd runner for tests; it lives in :mod:`asyncbk.local.etcd`, and this module
keeps the import path tests use."""

from ..local.etcd import EtcdServer, EtcdServerError, find_etcd_binary, free_port

__all__ = ["EtcdServer", "EtcdServerError", "find_etcd_binary", "free_port"]
