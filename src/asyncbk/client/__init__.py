"""The ledger client."""
