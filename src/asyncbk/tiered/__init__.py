"""Tiered storage: completed stream segments copied to an S3-compatible object store
(:mod:`asyncbk.offload`), read from there as if nothing moved (:mod:`.reader`), in the
object format of :mod:`.format` (see docs/tiered-storage.md)."""
