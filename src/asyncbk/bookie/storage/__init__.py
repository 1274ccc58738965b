"""Ledger storage: journal + entry logs + index + checkpoints (see :mod:`.ledger_storage`)."""

from .ledger_storage import (
    CHECKPOINT_FILE,
    CHECKPOINT_VERSION,
    COMPACTION_READ_GRACE_S,
    ENTRYLOG_DIR,
    INDEX_FILE,
    INDEX_GAP_MAX,
    INDEX_RECORD,
    CheckpointMark,
    LedgerIndex,
    LedgerInfo,
    LedgerStorage,
    Location,
    entry_log_name,
    read_checkpoint,
)

__all__ = [
    "CHECKPOINT_FILE",
    "CHECKPOINT_VERSION",
    "COMPACTION_READ_GRACE_S",
    "ENTRYLOG_DIR",
    "INDEX_FILE",
    "INDEX_GAP_MAX",
    "INDEX_RECORD",
    "CheckpointMark",
    "LedgerIndex",
    "LedgerInfo",
    "LedgerStorage",
    "Location",
    "entry_log_name",
    "read_checkpoint",
]
