"""Metadata: ledger metadata, ids, bookie registry and cookies in etcd (or memory)."""

from .api import BookieRegistration, MetadataStore
from .model import DIGESTS, LedgerMetadata, LedgerState

__all__ = ["DIGESTS", "BookieRegistration", "LedgerMetadata", "LedgerState", "MetadataStore"]
