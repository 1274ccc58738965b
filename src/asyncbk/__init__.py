"""asyncbk: an asyncio-native replicated log service, modelled on Apache BookKeeper.

``import asyncbk`` is cheap: the client classes are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import build as _build

# ASYNCBK_PURE=1: the pure-Python reference, even if compiled (and a stale compiled
# module never): before any compiled module can be imported
_build.install_finder()

from . import errors  # noqa: E402
from ._version import __version__  # noqa: E402
from .types import LedgerEntry  # noqa: E402

if TYPE_CHECKING:
    from .client.client import PlacementSpec
    from .client.ledger import LedgerHandle, ReadHandle
    from .meta.model import LedgerMetadata, LedgerState
    from .stream.client import BookKeeper
    from .stream.namespace import Namespace
    from .stream.position import Position
    from .stream.reader import StreamReader, StreamRecord
    from .stream.subscription import Subscription, SubscriptionInfo
    from .stream.writer import StreamWriter

_LAZY = {
    "BookKeeper": ("asyncbk.stream.client", "BookKeeper"),
    "Namespace": ("asyncbk.stream.namespace", "Namespace"),
    "Position": ("asyncbk.stream.position", "Position"),
    "StreamRecord": ("asyncbk.stream.reader", "StreamRecord"),
    "StreamReader": ("asyncbk.stream.reader", "StreamReader"),
    "StreamWriter": ("asyncbk.stream.writer", "StreamWriter"),
    "Subscription": ("asyncbk.stream.subscription", "Subscription"),
    "SubscriptionInfo": ("asyncbk.stream.subscription", "SubscriptionInfo"),
    "LedgerHandle": ("asyncbk.client.ledger", "LedgerHandle"),
    "ReadHandle": ("asyncbk.client.ledger", "ReadHandle"),
    "LedgerMetadata": ("asyncbk.meta.model", "LedgerMetadata"),
    "LedgerState": ("asyncbk.meta.model", "LedgerState"),
    "PlacementSpec": ("asyncbk.client.client", "PlacementSpec"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'asyncbk' has no attribute {name!r}")


__all__ = [
    "BookKeeper", "LedgerEntry", "LedgerHandle", "LedgerMetadata", "LedgerState", "Namespace",
    "PlacementSpec", "Position", "ReadHandle", "StreamReader", "StreamRecord", "StreamWriter", "Subscription",
    "SubscriptionInfo", "__version__",
    "errors",
]
