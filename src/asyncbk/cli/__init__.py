"""The asyncbk command line."""
