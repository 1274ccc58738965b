"""The bookie: storage server."""
