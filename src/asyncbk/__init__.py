"""asyncbk: an asyncio-native replicated log service, modelled on Apache BookKeeper.

``import asyncbk`` is cheap: the client classes are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import errors
from ._version import __version__
from .types import LedgerEntry

if TYPE_CHECKING:
    from .client.client import BookKeeper
    from .client.ledger import LedgerHandle, ReadHandle
    from .meta.model import LedgerMetadata, LedgerState

_LAZY = {
    "BookKeeper": ("asyncbk.client.client", "BookKeeper"),
    "LedgerHandle": ("asyncbk.client.ledger", "LedgerHandle"),
    "ReadHandle": ("asyncbk.client.ledger", "ReadHandle"),
    "LedgerMetadata": ("asyncbk.meta.model", "LedgerMetadata"),
    "LedgerState": ("asyncbk.meta.model", "LedgerState"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'asyncbk' has no attribute {name!r}")


__all__ = [
    "BookKeeper", "LedgerEntry", "LedgerHandle", "LedgerMetadata", "LedgerState", "ReadHandle",
    "__version__", "errors",
]
