"""The ``asyncbk bench`` command line: the options of each workload (``write``,
``read``, ``stream``) and the dispatch to the module that runs it (:mod:`.bench` for
the ledger workloads, :mod:`.bench_stream` for ``stream``)."""

from __future__ import annotations

import argparse

from .common import (
    CliError,
    DefaultsFormatter,
    Parser,
    Subparsers,
    add_log_options,
    configure_logging,
    positive_float,
    positive_int,
    run_async,
)

WORKLOADS = ("write", "read", "stream")


def id_list(text: str) -> list[int]:
    """Ids separated by commas: ``3,5,8``."""
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected ids separated by commas, got {text!r}") from None


def add_output_options(p: argparse.ArgumentParser) -> None:
    """The options every bench workload shares: which cluster, and where results go."""
    p.add_argument("--metadata-uri",
                   help="run against this cluster (default: start a local cluster of "
                   "--bookies bookies on free ports, stopped afterwards)")
    p.add_argument("--json", metavar="FILE",
                   help="write the results as JSON to this file (default: no file)")
    p.add_argument("--plot", metavar="PNG",
                   help="draw latency distribution and throughput to this PNG, needs "
                   "matplotlib (default: no plot)")


def add_ledger_options(p: argparse.ArgumentParser, default_quorum: int) -> None:
    """The options of the ledger workloads, ``write`` and ``read``."""
    p.add_argument("--entries", type=positive_int, default=10_000,
                   help="entries to write or read")
    p.add_argument("--duration", type=positive_float, metavar="SECONDS",
                   help="stop after this many seconds even if --entries are not done "
                   "(default: no time limit)")
    p.add_argument("--inflight", type=positive_int, default=256,
                   help="appends in flight, closed loop")
    p.add_argument("--rate", type=positive_float, metavar="PER_S",
                   help="open loop: offer this many appends per second in total (default: "
                   "closed loop, --inflight appends in flight)")
    p.add_argument("--entry-size", type=positive_int, default=1024, metavar="BYTES",
                   help="bytes per entry")
    p.add_argument("--ledgers", type=positive_int, default=1,
                   help="ledgers written or read in parallel")
    p.add_argument("--clients", type=positive_int, default=1,
                   help="client processes sharing the work")
    p.add_argument("--ensemble", type=positive_int, default=3,
                   help="ensemble size E: bookies each ledger is striped over")
    p.add_argument("--write-quorum", type=positive_int, default=default_quorum,
                   help="write quorum Qw: bookies each entry is written to")
    p.add_argument("--ack-quorum", type=positive_int, default=2,
                   help="ack quorum Qa: bookies that must have an entry before it is "
                   "acknowledged")
    p.add_argument("--digest", default="xxh3", choices=["xxh3", "hmac-sha256", "none"],
                   help="digest of each entry")
    p.add_argument("--bookies", type=positive_int, default=3,
                   help="bookies of the local cluster (without --metadata-uri)")
    p.add_argument("--index-backend", choices=["memory", "lmdb"],
                   help="entry index of the local cluster's bookies, their index_backend "
                   "setting (without --metadata-uri; default: memory)")
    p.add_argument("--warmup", type=int, default=1000, metavar="ENTRIES",
                   help="entries appended before measuring writes")
    add_output_options(p)
    # set by a --clients parent for its client processes
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    p.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    p.add_argument("--ledger-ids", type=id_list, default=[], help=argparse.SUPPRESS)
    add_log_options(p)


def add_stream_options(p: argparse.ArgumentParser) -> None:
    """The options of the ``stream`` workload."""
    p.add_argument("--mode", choices=["write", "tail"], default="write",
                   help="write (latency to durable) or tail (latency to a reader)")
    p.add_argument("--records", type=positive_int, default=200_000,
                   help="records to write")
    p.add_argument("--record-size", type=positive_int, default=100, metavar="BYTES",
                   help="bytes per record")
    p.add_argument("--duration", type=positive_float, metavar="SECONDS",
                   help="stop after this many seconds even if --records are not done "
                   "(default: no time limit)")
    p.add_argument("--inflight", type=positive_int, default=20_000, metavar="RECORDS",
                   help="records written but not yet durable, at most (closed loop; with "
                   "--rate, the bound past which sending waits)")
    p.add_argument("--rate", type=positive_float, metavar="PER_S",
                   help="open loop: offer this many records per second (default: closed "
                   "loop, --inflight records in flight)")
    p.add_argument("--burst", type=positive_int, default=1000, metavar="RECORDS",
                   help="records written in one event-loop turn at most (the writer sends "
                   "a turn's records as one ledger entry, up to 1 MiB)")
    p.add_argument("--ensemble", type=positive_int, default=3,
                   help="ensemble size E of the stream's segments")
    p.add_argument("--write-quorum", type=positive_int, default=3,
                   help="write quorum Qw: bookies each entry is written to")
    p.add_argument("--ack-quorum", type=positive_int, default=2,
                   help="ack quorum Qa: bookies that must have an entry before its records "
                   "are acknowledged")
    p.add_argument("--digest", default="xxh3", choices=["xxh3", "hmac-sha256", "none"],
                   help="digest of each entry")
    p.add_argument("--rolling-mb", type=positive_int, default=256, metavar="MIB",
                   help="the writer starts a new segment after this many MiB of records")
    p.add_argument("--bookies", type=positive_int, default=3,
                   help="bookies of the local cluster (without --metadata-uri)")
    p.add_argument("--warmup", type=int, default=20_000, metavar="RECORDS",
                   help="records written before measuring")
    p.add_argument("--keep", action="store_true",
                   help="keep the benchmark's namespace and stream afterwards (default: "
                   "deleted)")
    add_output_options(p)
    add_log_options(p)


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="benchmarks: write and read throughput and latency",
                       description="Benchmarks. Each starts its own local cluster (etcd + "
                       "bookies as separate processes) unless --metadata-uri is given, and "
                       "prints a summary; --json and --plot save the results.")
    bsub = p.add_subparsers(dest="workload", metavar="WORKLOAD", parser_class=Parser)
    w = bsub.add_parser("write", help="append throughput and latency",
                        formatter_class=DefaultsFormatter,
                        description="Append N entries over L ledgers, K in flight (closed "
                        "loop) or at a fixed --rate (open loop); report throughput and latency "
                        "percentiles.")
    add_ledger_options(w, default_quorum=2)
    r = bsub.add_parser("read", help="catch-up and tailing read throughput and latency",
                        formatter_class=DefaultsFormatter,
                        description="catchup: write N entries (not timed), close the ledgers, "
                        "read them back in ranges of --batch. tail: follow ledgers with tail() "
                        "while a writer appends; latency from append to delivery.")
    r.add_argument("--mode", choices=["catchup", "tail"], default="catchup",
                   help="catchup (closed ledgers) or tail (behind a live writer)")
    r.add_argument("--batch", type=positive_int, default=1000,
                   help="entries per read call in catchup mode")
    add_ledger_options(r, default_quorum=3)
    st = bsub.add_parser("stream", help="stream write throughput and tailing latency",
                         formatter_class=DefaultsFormatter,
                         description="write: N records of --record-size bytes to one stream, "
                         "--inflight records in flight (closed loop) or at --rate (open "
                         "loop); the writer batches a loop turn's records into one entry; "
                         "latency per record from the write call to durable. tail: a reader "
                         "follows the stream while the writer writes; latency from the "
                         "write call to the reader.")
    add_stream_options(st)
    return p


def run(args: argparse.Namespace) -> int:
    """``asyncbk bench WORKLOAD``: the packages it needs are checked before anything is
    started; ``stream`` runs in :mod:`.bench_stream`, the others in :mod:`.bench`."""
    if args.workload not in WORKLOADS:
        raise CliError("choose a workload: asyncbk bench write --help, asyncbk bench read "
                       "--help, asyncbk bench stream --help")
    from .bench_record import check_extras

    check_extras(args)  # before anything is started

    configure_logging(args, "warning")
    if args.workload == "stream":
        from .bench_stream import run_stream_bench

        return run_async(lambda: run_stream_bench(args))
    from .bench import run_bench

    return run_async(lambda: run_bench(args))
