"""The asyncbk command line.

``main`` builds the top-level parser and dispatches; each command is one module (or
package) with ``add_parser(subparsers)`` and ``run(args)``: ``standalone``,
``bookie``, ``autorecovery``, ``bench_args`` (which runs ``bench`` or
``bench_stream``), ``stream`` and ``shell`` (with ``placementcheck``).  What they
share is in ``common``, a client's TLS and token options in ``security``.  Imports
point from ``main`` to the commands to ``common``, never back.
"""
