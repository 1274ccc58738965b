"""asyncbk: an asyncio-native replicated log service, modelled on Apache BookKeeper."""

from . import errors
from .meta.model import LedgerMetadata, LedgerState
from .types import LedgerEntry

__version__ = "0.1.0"

__all__ = ["LedgerEntry", "LedgerMetadata", "LedgerState", "__version__", "errors"]
