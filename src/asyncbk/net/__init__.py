"""Asynchronous network I/O: the only code that touches sockets."""
