"""Configuration: frozen dataclasses, every bound named with its unit last.

A bookie reads an optional TOML file (``asyncbk bookie --config FILE``) whose
keys are the field names of :class:`BookieConfig`; command-line options win
over the file.  Unknown keys and values of the wrong type or range raise
:class:`~asyncbk.errors.ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from .errors import ConfigError, MissingExtraError

FRAME_BYTES_MAX_DEFAULT = 8 * 1024 * 1024
"""Largest wire frame accepted (request or response); an entry is a bit less."""


@dataclass(frozen=True)
class BookieConfig:
    metadata_uri: str = ""
    host: str = "127.0.0.1"
    port: int = 3181
    journal_dir: str = ""
    """Journal directory; several separated by commas (each ledger directory's journal
    then lives in ``journal_dirs[i % count]``, see :attr:`journal_dirs`)."""
    ledger_dir: str = ""
    """Ledger directory (entry logs, index, checkpoint); several separated by commas,
    each holding whole ledgers, new ledgers going to the one that holds fewest."""
    allow_storage_expansion: bool = False
    """Accept ledger directories appended to those the cookie records (empty ones),
    and record them; without it a changed directory list refuses to start."""
    advertised_host: str = ""
    """Host part of the bookie id; defaults to ``host``."""
    rack: str = ""
    """Network location ``/region/rack`` or ``/rack``, registered for clients'
    rack- and region-aware placement (``""``: ``/default-region/default-rack``)."""

    # wire
    frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT
    connection_write_buffer_bytes_high: int = 4 * 1024 * 1024
    connections_max: int = 1024
    connection_requests_max: int = 10_000
    """Requests in flight on one connection; past it the bookie stops reading that
    connection until it has answered a quarter of them (backpressure)."""
    connection_idle_timeout_s: float = 600.0
    """A connection with nothing in flight and no request for this long is closed
    (clients reconnect when they need to; 0: never)."""

    # journal group commit
    journal_group_wait_ms_max: float = 2.0
    journal_group_bytes_max: int = 512 * 1024
    journal_group_entries_max: int = 2048
    journal_flush_when_queue_empty: bool = True
    journal_queue_entries_max: int = 20_000
    journal_file_bytes_max: int = 256 * 1024 * 1024
    journal_preallocate_bytes: int = 16 * 1024 * 1024
    """Allocate the journal file this far ahead of its writes (zeros), so a group
    commit's fdatasync has no file size to make durable (0: none)."""
    journal_sync: bool = True
    """fdatasync the journal before acknowledging (turn off only for tests of the non-durable path)."""
    malloc_tuning: bool = True
    """Keep freed memory for reuse (glibc ``mallopt``: :mod:`asyncbk.bookie.allocator`),
    so the large buffer of each group of adds is not faulted in afresh; MALLOC_*
    environment variables of glibc take precedence."""

    # entry storage
    entry_log_bytes_max: int = 1024 * 1024 * 1024
    entry_log_flush_bytes: int = 1024 * 1024
    """fdatasync the entry log (in the background) after this many bytes were added to
    it, so a checkpoint never has to flush much at once (0: only at checkpoints).  Each
    flush competes with the journal's fdatasyncs on a shared disk: 1 MiB keeps those
    bursts short (open-loop p99 about two thirds of 4 MiB's, same throughput), while
    smaller flushes cost more in file-system commits than they save."""
    checkpoint_interval_s: float = 10.0
    index_backend: str = "memory"
    """Where the entry index lives: ``"memory"`` (rebuilt from ``index.log`` at start)
    or ``"lmdb"`` (on disk, bounded memory; a memory-backend dir is migrated)."""
    index_write_cache_entries_max: int = 200_000
    """With ``index_backend = "lmdb"``: the bound of the index changes kept in memory (a
    write cache in front of LMDB, written to it in the background a layer of up to
    16,384 keys at a time, one synced transaction each, and before every checkpoint);
    past this many keys (about 2 per entry added) a checkpoint starts early."""
    index_log_compaction_bytes_min: int = 16 * 1024 * 1024
    """With ``index_backend = "memory"``: ``index.log`` is rewritten at a checkpoint,
    keeping one record per stored entry, once it is at least this large and at least
    half of its records are dead (superseded, voided by a deletion, of deleted
    ledgers)."""

    # garbage collection and compaction (see asyncbk.bookie.gc)
    gc_interval_s: float = 60.0
    gc_drop_ledgers_not_in_ensemble: bool = True
    gc_tombstone_s: float = 7 * 24 * 3600.0
    """How long a deleted ledger's adds stay refused (a zombie writer's; 0: not at all)."""
    minor_compaction_threshold: float = 0.2
    minor_compaction_interval_s: float = 3600.0
    major_compaction_threshold: float = 0.8
    major_compaction_interval_s: float = 86400.0
    compaction_rate_bytes_per_s: float = 16 * 1024 * 1024
    """Bytes of entry logs read per second by compaction (0: no limit)."""

    # registration
    lease_ttl_s: int = 10
    register_retry_s_max: float = 5.0
    metadata_timeout_s: float = 10.0

    # disk usage and read-only mode
    disk_usage_threshold: float = 0.95
    """At this fraction of a disk used, the bookie turns read-only (adds refused, reads served)."""
    disk_usage_lwm_threshold: float = 0.90
    """Below this fraction a bookie that turned read-only for disk usage is writable again."""
    disk_check_interval_s: float = 10.0
    read_only: bool = False
    """Start (and stay) read-only, e.g. for maintenance."""

    # shutdown
    drain_timeout_s: float = 10.0

    # security: TLS on the bookie protocol, token authentication
    tls_cert_file: str = ""
    """PEM certificate (chain) of the bookie: with ``tls_key_file``, connections are TLS."""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    """CA that signs client certificates (checked when a client presents one)."""
    tls_require_client_cert: bool = False
    auth_tokens_file: str = ""
    """Tokens a client must present (AUTH) before any request is served; one per line."""
    auth_timeout_s: float = 10.0
    """How long a connection may stay unauthenticated (and a TLS handshake may take)."""

    # security towards etcd (see asyncbk.net.etcd_security): TLS with an etcds:// URI
    etcd_tls_ca_file: str = ""
    """CA of etcd's certificate (default: ``tls_ca_file``)."""
    etcd_tls_cert_file: str = ""
    """Client certificate for etcd (default: ``tls_cert_file``, with ``tls_key_file``)."""
    etcd_tls_key_file: str = ""
    etcd_user: str = ""
    """etcd user name, when etcd has authentication enabled."""
    etcd_password_file: str = ""
    """File whose first line is the etcd user's password (or ASYNCBK_ETCD_PASSWORD)."""

    # HTTP admin (/metrics, /healthz, /api/v1/bookie/...)
    http_enabled: bool = False
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    """Port of the HTTP admin endpoint (0: any free port, logged at start)."""
    http_open_reads: bool = True
    """With ``auth_tokens_file``: ``GET /metrics`` and ``/healthz`` need no token (every
    other route does).  The endpoint is HTTPS when the bookie has TLS."""

    # tracing (the otel extra; see asyncbk.tracing)
    otel_exporter: str = ""
    """Where the bookie sends the spans of requests that carry a client's trace
    context: ``otlp`` (OTLP over HTTP, to where the ``OTEL_EXPORTER_OTLP_*`` variables
    say) or ``jsonl:FILE``; ``""``: no spans (the contexts are ignored)."""

    @property
    def ledger_dirs(self) -> list[str]:
        """``ledger_dir`` split at commas."""
        return split_dirs(self.ledger_dir)

    @property
    def journal_dirs(self) -> list[str]:
        """``journal_dir`` split at commas."""
        return split_dirs(self.journal_dir)

    def validate(self) -> BookieConfig:
        _check_positive(self, "frame_bytes_max", "journal_group_bytes_max",
                        "journal_group_entries_max", "journal_queue_entries_max",
                        "journal_file_bytes_max", "entry_log_bytes_max",
                        "checkpoint_interval_s", "lease_ttl_s", "connections_max",
                        "metadata_timeout_s", "drain_timeout_s", "disk_check_interval_s",
                        "register_retry_s_max", "connection_write_buffer_bytes_high",
                        "connection_requests_max")
        if self.connection_idle_timeout_s < 0:
            raise ConfigError("connection_idle_timeout_s must be >= 0")
        if self.journal_preallocate_bytes < 0:
            raise ConfigError("journal_preallocate_bytes must be >= 0 (0: no preallocation)")
        _check_location("rack", self.rack)
        if self.journal_group_wait_ms_max < 0:
            raise ConfigError("journal_group_wait_ms_max must be >= 0")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError("TLS needs both tls_cert_file and tls_key_file "
                              "(--tls-cert and --tls-key)")
        if self.tls_require_client_cert and not (self.tls_cert_file and self.tls_ca_file):
            raise ConfigError("tls_require_client_cert needs TLS (--tls-cert, --tls-key) and "
                              "the CA of the clients' certificates (--tls-ca)")
        if bool(self.etcd_tls_cert_file) != bool(self.etcd_tls_key_file):
            raise ConfigError("a client certificate for etcd needs both etcd_tls_cert_file and "
                              "etcd_tls_key_file (--etcd-cert and --etcd-key)")
        if self.etcd_password_file and not self.etcd_user:
            raise ConfigError("etcd_password_file needs etcd_user (--etcd-user)")
        if self.auth_timeout_s <= 0:
            raise ConfigError("auth_timeout_s must be > 0")
        for name in ("minor_compaction_threshold", "major_compaction_threshold"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{name} must be in 0..1")
        for name in ("gc_interval_s", "minor_compaction_interval_s",
                     "major_compaction_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
        if self.gc_tombstone_s < 0:
            raise ConfigError("gc_tombstone_s must be >= 0")
        if self.compaction_rate_bytes_per_s < 0:
            raise ConfigError("compaction_rate_bytes_per_s must be >= 0")
        if self.index_backend not in ("memory", "lmdb"):
            raise ConfigError(f"index_backend must be \"memory\" or \"lmdb\", "
                              f"not {self.index_backend!r}")
        if self.index_backend == "lmdb":
            require_lmdb()
        if self.otel_exporter:
            from .tracing import check_exporter

            check_exporter(self.otel_exporter)
        if self.index_write_cache_entries_max <= 0:
            raise ConfigError("index_write_cache_entries_max must be > 0")
        if self.index_log_compaction_bytes_min < 0:
            raise ConfigError("index_log_compaction_bytes_min must be >= 0")
        if self.entry_log_flush_bytes < 0:
            raise ConfigError("entry_log_flush_bytes must be >= 0")
        if self.entry_log_bytes_max >= 1 << 32:
            raise ConfigError("entry_log_bytes_max must be below 4 GiB")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if not 0 <= self.http_port < 65536:
            raise ConfigError(f"http_port must be in 0..65535, got {self.http_port}")
        if not 0 < self.disk_usage_lwm_threshold <= self.disk_usage_threshold <= 1:
            raise ConfigError("need 0 < disk_usage_lwm_threshold <= disk_usage_threshold <= 1")
        if self.lease_ttl_s < 2:
            raise ConfigError("lease_ttl_s must be >= 2 (keep-alives are sent every ttl/3)")
        journals, ledgers = self.journal_dirs, self.ledger_dirs
        for name, dirs in (("journal_dir", journals), ("ledger_dir", ledgers)):
            if any(not d.strip() for d in dirs):
                raise ConfigError(f"{name} has an empty directory in its comma-separated "
                                  f"list: {getattr(self, name)!r}")
        every = [str(Path(d).absolute()) for d in journals + ledgers]
        if len(set(every)) != len(every):
            raise ConfigError("each journal and ledger directory must be given once: "
                              "two of them name the same directory")
        if len(journals) > max(1, len(ledgers)):
            raise ConfigError(f"more journal directories ({len(journals)}) than ledger "
                              f"directories ({len(ledgers)}): each journal serves ledger "
                              "directories, so give at most one per ledger directory")
        return self


@dataclass(frozen=True)
class ClientConfig:
    add_timeout_s: float = 10.0
    """A request to one bookie that gets no answer in this time fails that bookie's part."""
    read_timeout_s: float = 10.0
    connect_timeout_s: float = 5.0
    metadata_timeout_s: float = 10.0
    pending_adds_max: int = 50_000
    """Appends in flight on one ledger handle; past it ``append`` raises TooManyRequestsError."""
    frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT
    connection_requests_max: int = 100_000
    """Requests in flight on one bookie connection."""
    connection_write_buffer_bytes_max: int = 64 * 1024 * 1024
    """Bytes of requests one bookie connection holds while the bookie does not read
    them (the socket pushes back); past it, requests to that bookie fail at once with
    TooManyRequestsError (a writer then replaces the bookie)."""
    reconnect_backoff_s_max: float = 2.0
    speculative_read_timeout_s: float = 0.5
    """A read not answered in this time is also sent to the next replica (0: never)."""
    read_batch: bool = True
    """Read ranges with READ_BATCH where a fragment's write quorum is its ensemble."""
    add_quorum_timeout_s: float = 120.0
    """An append not acknowledged by an ack quorum in this time fails the handle with
    TimeoutError (0: no limit).  Slow or dead bookies are replaced long before, after
    add_timeout_s."""
    explicit_lac_interval_s: float = 1.0
    """An idle writer sends its LAC explicitly after this long, so tailing readers see
    the last entries (0: never)."""
    ensemble_changes_max: int = 1000
    """Ensemble changes one ledger handle may make before it gives up (each adds a
    fragment to the ledger's metadata)."""
    bookie_quarantine_s: float = 30.0
    """A bookie that failed an add is left out of new ensembles and replacements for
    this long, or until it registers anew (a restart), whichever comes first (0: no
    quarantine)."""
    ensemble_change_timeout_s: float = 60.0
    """How long a writer with no replacement for a failed bookie, and too few healthy
    ones left for an ack quorum, keeps retrying (appends wait meanwhile) before it
    fails its pending appends with NotEnoughBookiesError."""
    probe_timeout_s: float = 1.0
    """How long a quarantined bookie has to answer a health probe (BOOKIE_INFO) when
    a writer needs it as a replacement."""
    ensemble_change_backoff_s_max: float = 1.0
    """Longest pause between two such retries (a bookie registering ends it early)."""
    bookie_addresses: dict[str, str] = field(default_factory=dict)
    """Connect to another ``host:port`` than the bookie id (e.g. a proxy in front of it)."""

    # placement (see docs/placement.md)
    placement_policy: str = "random"
    """How ensembles are chosen: ``"random"``, ``"rack-aware"`` or ``"region-aware"``."""
    min_racks_per_write_quorum: int = 2
    """Rack- and region-aware: racks every write set spans at least (capped at the
    write quorum), when the bookies available allow it."""
    min_regions_per_write_quorum: int = 2
    """Region-aware: regions every write set spans at least (capped at the write quorum)."""
    enforce_placement: bool = False
    """Fail (PlacementError) when the minimum racks/regions cannot be met, instead of
    using the best ensemble available with a warning."""
    bookie_racks: dict[str, str] = field(default_factory=dict)
    """Bookie id -> network location ``/region/rack``, winning over what the bookies
    registered (a static mapping), and over the file and the script below."""
    bookie_racks_file: str = ""
    """A file of lines ``<bookie-id or host> <location>`` (``#`` comments; a host
    matches every port): bookie locations winning over the script's and the
    registered ones (``""``: none).  Read when the client starts, re-read when it
    changes (looked at every ``bookie_racks_refresh_s`` and whenever the bookie
    registry changes)."""
    bookie_racks_script: str = ""
    """A program (and arguments, split like a shell does) called with bookie hosts as
    arguments, printing one location per host, like BookKeeper's ScriptBasedMapping:
    locations winning over the registered ones; answers are cached, a failure gives a
    warning and the default location (``""``: none)."""
    bookie_racks_script_timeout_s: float = 5.0
    """How long one run of ``bookie_racks_script`` may take before it is killed (its
    hosts then get the default location, asked again later)."""
    bookie_racks_refresh_s: float = 30.0
    """With a rack file or a rack script, how often a running client looks again where
    the bookies it knows are, besides whenever the bookie registry changes: the file
    is re-read if it changed, and hosts the script gave no location are asked again
    (60 s or more after their last failure)."""
    client_location: str = ""
    """This client's network location: reads ask replicas in its rack first, then in
    its region (``""``: no preference, the write set's order)."""
    object_store_credentials_file: str = ""
    """Tiered storage: the credentials this client reads offloaded segments with (an
    AWS credentials file, or ``AWS_ACCESS_KEY_ID=...`` lines; ``""``: the ``AWS_*``
    variables of the environment)."""
    object_store_read_timeout_s: float = 60.0
    """A read of an offloaded segment retries an object store that does not answer
    for this long, then fails naming the object."""
    tracing: bool = False
    """OpenTelemetry spans for appends, reads and recoveries, through the application's
    tracer provider, their context carried to the bookies (the ``otel`` extra; see
    :mod:`asyncbk.tracing`).  Needs bookies of this version or newer: an older bookie
    refuses a request that carries a trace context."""

    def validate(self) -> ClientConfig:
        _check_positive(self, "add_timeout_s", "read_timeout_s", "connect_timeout_s",
                        "metadata_timeout_s", "pending_adds_max", "frame_bytes_max",
                        "connection_requests_max", "ensemble_changes_max",
                        "reconnect_backoff_s_max", "ensemble_change_timeout_s",
                        "ensemble_change_backoff_s_max", "connection_write_buffer_bytes_max",
                        "probe_timeout_s", "object_store_read_timeout_s")
        for name in ("speculative_read_timeout_s", "add_quorum_timeout_s",
                     "explicit_lac_interval_s", "bookie_quarantine_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        from .topology import POLICIES

        if self.placement_policy not in POLICIES:
            raise ConfigError(f"placement_policy must be one of {', '.join(POLICIES)}, "
                              f"not {self.placement_policy!r}")
        _check_positive(self, "min_racks_per_write_quorum", "min_regions_per_write_quorum")
        if self.client_location:
            _check_location("client_location", self.client_location)
        for bookie, location in self.bookie_racks.items():
            if not isinstance(bookie, str) or not isinstance(location, str):
                raise ConfigError("bookie_racks must map bookie ids to locations (str)")
            _check_location(f"bookie_racks[{bookie!r}]", location)
        _check_positive(self, "bookie_racks_script_timeout_s", "bookie_racks_refresh_s")
        if self.bookie_racks_script:
            import shlex

            try:
                argv = shlex.split(self.bookie_racks_script)
            except ValueError as exc:
                raise ConfigError(f"bookie_racks_script: {exc}; quote it as a shell "
                                  "would") from None
            if not argv:
                raise ConfigError("bookie_racks_script has no program to run")
        return self


T = TypeVar("T", BookieConfig, ClientConfig)


def split_dirs(value: str) -> list[str]:
    """A comma-separated directory list (``""``: none)."""
    return [d.strip() for d in value.split(",")] if value else []


LMDB_EXTRA_HINT = "pip install 'asyncbk[lmdb]'"
"""How to install what ``index_backend = "lmdb"`` needs (the ``lmdb`` extra)."""


def require_lmdb() -> None:
    """ConfigError (one line, naming the extra) unless the ``lmdb`` package imports:
    ``index_backend = "lmdb"`` needs it, and a bookie must not get as far as its
    start-up recovery to find out."""
    try:
        import lmdb  # noqa: F401  (optional: only the lmdb index backend needs it)
    except ImportError:
        raise MissingExtraError.of('index_backend = "lmdb"', "lmdb", "lmdb") from None


def _check_positive(cfg: Any, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not value > 0:
            raise ConfigError(f"{name} must be > 0, got {value!r}")


def _check_location(name: str, value: str) -> None:
    from .topology import normalize_location

    try:
        normalize_location(value)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def from_mapping(cls: type[T], values: dict[str, Any], source: str = "options") -> T:
    """Build ``cls`` from a mapping, checking names and types; raises ConfigError."""
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        key_norm = key.replace("-", "_")
        f = known.get(key_norm)
        if f is None:
            raise ConfigError(f"{source}: unknown setting {key!r}")
        default = f.default if f.default is not dataclasses.MISSING else None
        if default is not None and not isinstance(default, dict):
            expected = type(default)
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise ConfigError(
                    f"{source}: {key!r} must be {expected.__name__}, got {type(value).__name__}"
                )
        kwargs[key_norm] = value
    try:
        cfg = cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return cfg.validate()


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file; raises ConfigError (with the path) if unreadable."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None
    section = data.get("bookie", data)
    if not isinstance(section, dict):
        raise ConfigError(f"config file {p}: [bookie] must be a table")
    return section
