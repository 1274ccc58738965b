"""Auto-recovery: the auditor, replication workers and manual re-replication."""
