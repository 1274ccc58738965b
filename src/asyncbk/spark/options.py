"""The options of ``format("asyncbk")``, checked once, with one clear error each.

Spark hands a data source its options as strings in a case-insensitive map
(``.option("maxRecordsPerTrigger", 500)`` arrives as ``"500"`` under
``maxrecordspertrigger``).  :func:`read_options` and :func:`write_options`
turn that map into typed, picklable settings, or raise
:class:`~asyncbk.errors.SparkOptionError` saying which option is wrong and what
it takes.  No pyspark here: this module is tested on its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import InvalidNameError
from ..stream.codec import TIMESTAMP_MS_MAX
from ..stream.meta import check_namespace_name, check_stream_name
from ..stream.position import Position
from ..stream.subscription import check_subscription_name
from .errors import SparkOptionError

MAX_RECORDS_PER_PARTITION = 1_000_000
OPERATION_TIMEOUT_S = 120.0
MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
"""``maxTriggerDelay``'s default, as in Spark's Kafka source (15 minutes)."""

KNOWN = {
    "metadatauri", "namespace", "streams", "streamspattern", "ledgers", "startingpositions",
    "endingpositions", "failondataloss", "maxrecordspertrigger", "maxrecordsperpartition",
    "minpartitions", "stream", "sinkid", "batchid", "operationtimeouts", "path",
    "tlscafile", "tlscertfile", "tlskeyfile", "authtokenfile", "etcduser", "etcdpasswordfile",
    "etcdtlscafile", "etcdtlscertfile", "etcdtlskeyfile", "includeheaders",
    "startingtimestamp", "endingtimestamp", "startingpositionsbytimestamp",
    "maxbytespertrigger", "minrecordspertrigger", "maxtriggerdelay", "subscription",
    "createstreams", "objectstorecredentialsfile", "tracing",
}
SECURITY = {"tlscafile", "tlscertfile", "tlskeyfile", "authtokenfile", "etcduser",
            "etcdpasswordfile", "etcdtlscafile", "etcdtlscertfile", "etcdtlskeyfile",
            "objectstorecredentialsfile", "tracing"}
"""Lower-cased names this source knows (``path`` is what ``load(x)``/``save(x)`` set)."""

GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class StartSpec:
    """Where one stream starts (or ends): ``earliest``, ``latest``, a position, a txid,
    or the first record at or after a time (``timestamp``, ms since the epoch)."""

    kind: str  # "earliest" | "latest" | "position" | "txid" | "timestamp"
    position: Position | None = None
    txid: int | None = None
    timestamp_ms: int | None = None

    def __str__(self) -> str:
        if self.kind == "position":
            return str(self.position)
        if self.kind == "txid":
            return f"txid {self.txid}"
        if self.kind == "timestamp":
            return f"time {self.timestamp_ms} ms"
        return self.kind


EARLIEST = StartSpec("earliest")
LATEST = StartSpec("latest")


@dataclass(frozen=True)
class Positions:
    """``startingPositions`` / ``endingPositions``: a default and per-stream values."""

    default: StartSpec
    per_stream: dict[str, StartSpec] = field(default_factory=dict)

    def for_stream(self, stream: str) -> StartSpec:
        return self.per_stream.get(stream, self.default)


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """How a task reaches the cluster: TLS files, the token file, etcd's user and
    password file (paths on every machine of the Spark cluster; a token or password
    itself is never an option: options show in Spark's UI and plans)."""

    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    auth_token_file: str = ""
    etcd_user: str = ""
    etcd_password_file: str = ""
    etcd_tls_ca_file: str = ""
    etcd_tls_cert_file: str = ""
    etcd_tls_key_file: str = ""
    object_store_credentials_file: str = ""
    """Tiered storage: the credentials tasks read offloaded segments with (default:
    the ``AWS_*`` variables of the worker processes)."""
    tracing: bool = False
    """Not a credential, but like them a setting of the tasks' clients (option
    ``tracing``): OpenTelemetry spans of each task's read and its requests, exported as
    ``ASYNCBK_OTEL_EXPORTER`` says in the worker processes (see asyncbk.tracing)."""


@dataclass(frozen=True)
class ReadOptions(Credentials):
    metadata_uri: str
    namespace: str | None
    streams: tuple[str, ...] = ()
    """Plain stream names (each must exist)."""
    globs: tuple[str, ...] = ()
    pattern: str | None = None
    ledgers: tuple[int, ...] = ()
    starting: Positions = Positions(EARLIEST)
    ending: Positions = Positions(LATEST)
    fail_on_data_loss: bool = True
    max_records_per_trigger: int | None = None
    max_records_per_partition: int = MAX_RECORDS_PER_PARTITION
    min_partitions: int | None = None
    timeout_s: float = OPERATION_TIMEOUT_S
    include_headers: bool = False
    max_bytes_per_trigger: int | None = None
    min_records_per_trigger: int | None = None
    max_trigger_delay_ms: int = MAX_TRIGGER_DELAY_MS
    subscription: str | None = None
    """Publish each committed batch's end offset as this subscription of every stream."""

    @property
    def over_ledgers(self) -> bool:
        return bool(self.ledgers)

    def selects(self, stream: str) -> bool:
        """Whether ``stream`` is one of the streams read (named, globbed or matched)."""
        import fnmatch

        return (stream in self.streams
                or any(fnmatch.fnmatchcase(stream, g) for g in self.globs)
                or (self.pattern is not None and re.fullmatch(self.pattern, stream) is not None))

    @property
    def discovers(self) -> bool:
        """Whether streams are chosen by glob or pattern (new ones are picked up)."""
        return bool(self.globs) or self.pattern is not None


@dataclass(frozen=True)
class WriteOptions(Credentials):
    metadata_uri: str
    namespace: str
    stream: str | None
    """Where rows go that have no ``stream`` column, or null in it."""
    sink_id: str | None = None
    batch_id: int | None = None
    """With ``sink_id``, makes a batch write idempotent (for ``foreachBatch``)."""
    timeout_s: float = OPERATION_TIMEOUT_S
    create_streams: bool = False
    """Create the streams a ``stream`` column names on first use."""


def _get(options: Mapping[str, Any], name: str) -> str | None:
    """The option ``name`` whatever the case of its key (Spark's map is case-insensitive;
    a plain dict given by a caller may not be)."""
    low = name.lower()
    for k, v in options.items():
        if str(k).lower() == low:
            return None if v is None else str(v)
    return None


def _check_applies(options: Mapping[str, Any], allowed: set[str], what: str) -> None:
    """Options of this source that mean nothing for ``what`` are errors (others, such as
    Spark's own ``checkpointLocation``, pass through untouched)."""
    for k in options:
        low = str(k).lower()
        if low in KNOWN and low not in allowed and low != "path":
            raise SparkOptionError(f"option {k!r} does not apply to {what}")


def _metadata_uri(options: Mapping[str, Any]) -> str:
    uri = _get(options, "metadataUri")
    if not uri or not uri.strip():
        raise SparkOptionError(
            "option metadataUri is required: the cluster's metadata URI, e.g. "
            "etcd://127.0.0.1:2379/asyncbk (what `asyncbk standalone` prints)")
    uri = uri.strip()
    if not uri.startswith(("etcd://", "etcds://", "memory://")):
        raise SparkOptionError(f"option metadataUri {uri!r} is not a metadata URI: expected "
                               "etcd://HOST:PORT[,HOST:PORT...]/ROOT (etcds:// for TLS)")
    return uri


def _namespace(options: Mapping[str, Any], needed_for: str) -> str:
    ns = _get(options, "namespace")
    if not ns:
        raise SparkOptionError(f"option namespace is required {needed_for}")
    try:
        return check_namespace_name(ns)
    except InvalidNameError as exc:
        raise SparkOptionError(f"option namespace: {exc}") from None


def _int(options: Mapping[str, Any], name: str, minimum: int) -> int | None:
    text = _get(options, name)
    if text is None or text.strip() == "":
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise SparkOptionError(f"option {name} must be an integer >= {minimum}, "
                               f"got {text!r}") from None
    if value < minimum:
        raise SparkOptionError(f"option {name} must be an integer >= {minimum}, got {value}")
    return value


def _timeout(options: Mapping[str, Any]) -> float:
    text = _get(options, "operationTimeoutS")
    if text is None:
        return OPERATION_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise SparkOptionError(f"option operationTimeoutS must be a number of seconds > 0, "
                               f"got {text!r}")
    return value


def _security(options: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`Credentials` fields given, each by its option (``tls_ca_file`` is
    ``tlsCaFile``)."""
    out: dict[str, Any] = {}
    for f in fields(Credentials):
        if f.name == "tracing":
            out["tracing"] = _bool(options, "tracing", False)
            continue
        head, *rest = f.name.split("_")
        value = _get(options, head + "".join(w.capitalize() for w in rest))
        if value is not None and value.strip():
            out[f.name] = value.strip()
    if bool(out.get("tls_cert_file")) != bool(out.get("tls_key_file")):
        raise SparkOptionError("options tlsCertFile and tlsKeyFile go together (a client "
                               "certificate and its key)")
    if bool(out.get("etcd_tls_cert_file")) != bool(out.get("etcd_tls_key_file")):
        raise SparkOptionError("options etcdTlsCertFile and etcdTlsKeyFile go together (a "
                               "client certificate for etcd and its key)")
    if out.get("etcd_password_file") and not out.get("etcd_user"):
        raise SparkOptionError("option etcdPasswordFile needs etcdUser (whose password it is)")
    return out


def _bool(options: Mapping[str, Any], name: str, default: bool) -> bool:
    text = _get(options, name)
    if text is None:
        return default
    t = text.strip().lower()
    if t in ("true", "1", "yes"):
        return True
    if t in ("false", "0", "no"):
        return False
    raise SparkOptionError(f"option {name} must be true or false, got {text!r}")


def _spec(value: Any, option: str, stream: str | None) -> StartSpec:
    where = f"option {option}" + (f" for stream {stream!r}" if stream else "")
    if isinstance(value, dict):
        if set(value) != {"txid"} or not isinstance(value["txid"], int) \
                or isinstance(value["txid"], bool) or value["txid"] < 0:
            raise SparkOptionError(f"{where}: expected {{\"txid\": N}} with an integer N >= 0, "
                                   f"got {json.dumps(value)}")
        return StartSpec("txid", txid=value["txid"])
    if not isinstance(value, str):
        raise SparkOptionError(f"{where}: expected \"earliest\", \"latest\", "
                               f"\"SEGMENT:ENTRY:SLOT\" or {{\"txid\": N}}, got {value!r}")
    try:
        pos = Position.parse(value)
    except ValueError as exc:
        raise SparkOptionError(f"{where}: {exc}") from None
    if pos == Position.EARLIEST:
        return EARLIEST
    if pos == Position.LATEST:
        return LATEST
    return StartSpec("position", position=pos)


def _timestamp(value: Any, where: str) -> int:
    """A time in ms since the epoch, from an option's text or a JSON value."""
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise SparkOptionError(f"{where} must be a time in milliseconds since the epoch "
                                   f"(an integer, e.g. 1767225600000), got {value!r}") from None
    if not isinstance(value, int) or isinstance(value, bool) or \
            not 0 <= value <= TIMESTAMP_MS_MAX:
        raise SparkOptionError(f"{where} must be a time in milliseconds since the epoch "
                               f"(an integer from 0 to {TIMESTAMP_MS_MAX}), got {value!r}")
    return value


def _time_spec(options: Mapping[str, Any], name: str) -> StartSpec | None:
    text = _get(options, name)
    if text is None or not text.strip():
        return None
    return StartSpec("timestamp", timestamp_ms=_timestamp(text, f"option {name}"))


def _by_timestamp(options: Mapping[str, Any], name: str) -> dict[str, StartSpec]:
    """``startingPositionsByTimestamp``: JSON ``{stream: ms}``."""
    text = _get(options, name)
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SparkOptionError(f"option {name} is not valid JSON ({exc.msg} at character "
                               f"{exc.pos}): expected {{\"STREAM\": MILLISECONDS, ...}}") from None
    if not isinstance(value, dict) or not value:
        raise SparkOptionError(f"option {name}: expected a JSON object mapping streams to times "
                               "in ms since the epoch, e.g. {\"orders\": 1767225600000}")
    return {str(k): StartSpec("timestamp", timestamp_ms=_timestamp(
        v, f"option {name} for stream {str(k)!r}")) for k, v in value.items()}


def _duration_ms(options: Mapping[str, Any], name: str, default: int) -> int:
    """A duration as Spark writes them: ``500ms``, ``30s``, ``5m``, ``1h``, ``1d``, or a
    number of milliseconds."""
    text = _get(options, name)
    if text is None or not text.strip():
        return default
    m = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|min|h|d)?\s*", text.lower())
    if m is None:
        raise SparkOptionError(f"option {name} must be a duration such as 500ms, 30s, 5m or "
                               f"1h (a bare number is milliseconds), got {text!r}")
    unit = {"ms": 1, None: 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
            "d": 86_400_000}[m.group(2)]
    return int(m.group(1)) * unit


def include_headers(options: Mapping[str, Any]) -> bool:
    """Whether a read's rows have a ``headers`` column (option ``includeHeaders``)."""
    return _bool(options, "includeHeaders", False)


def parse_positions(text: str | None, option: str, default: StartSpec) -> Positions:
    """``earliest``, ``latest`` or JSON ``{stream: position | "earliest" | "latest" |
    {"txid": N}}``."""
    if text is None or not text.strip():
        return Positions(default)
    t = text.strip()
    if not t.startswith("{"):
        spec = _spec(t, option, None)
        if spec.kind not in ("earliest", "latest"):
            raise SparkOptionError(
                f"option {option}: a single position needs its stream: write JSON "
                f"{{\"STREAM\": \"{t}\"}}, or use earliest / latest")
        return Positions(spec)
    try:
        value = json.loads(t)
    except json.JSONDecodeError as exc:
        raise SparkOptionError(f"option {option} is not valid JSON ({exc.msg} at character "
                               f"{exc.pos}): expected earliest, latest or "
                               "{\"STREAM\": \"SEGMENT:ENTRY:SLOT\", ...}") from None
    if not isinstance(value, dict):
        raise SparkOptionError(f"option {option}: expected a JSON object mapping streams to "
                               "positions")
    return Positions(default, {str(k): _spec(v, option, str(k)) for k, v in value.items()})


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def read_options(options: Mapping[str, Any], streaming: bool) -> ReadOptions:
    """The checked options of a batch (``streaming`` False) or streaming read."""
    what = "a streaming read" if streaming else "a batch read"
    allowed = {"metadatauri", "namespace", "streams", "streamspattern", "ledgers",
               "startingpositions", "failondataloss", "maxrecordsperpartition", "minpartitions",
               "operationtimeouts", "includeheaders", "startingtimestamp",
               "startingpositionsbytimestamp", *SECURITY}
    allowed |= {"maxrecordspertrigger", "maxbytespertrigger", "minrecordspertrigger",
                "maxtriggerdelay", "subscription"} if streaming \
        else {"endingpositions", "endingtimestamp"}
    _check_applies(options, allowed, what)
    uri = _metadata_uri(options)
    streams_opt, pattern, ledgers_opt = (_get(options, n) for n in
                                         ("streams", "streamsPattern", "ledgers"))
    given = [n for n, v in (("streams", streams_opt), ("streamsPattern", pattern),
                            ("ledgers", ledgers_opt)) if v is not None and v.strip()]
    if len(given) != 1:
        raise SparkOptionError(
            "give exactly one of the options streams (names or globs, comma-separated), "
            "streamsPattern (a regular expression) or ledgers (ledger ids, comma-separated)"
            + (f"; got {' and '.join(given)}" if given else ""))
    timeout_s = _timeout(options)
    per_partition = _int(options, "maxRecordsPerPartition", 1) or MAX_RECORDS_PER_PARTITION
    min_partitions = _int(options, "minPartitions", 1)
    fail = _bool(options, "failOnDataLoss", True)
    if ledgers_opt is not None and ledgers_opt.strip():
        if streaming:
            raise SparkOptionError("option ledgers is for batch reads; a streaming read "
                                   "follows streams (option streams or streamsPattern)")
        for name in ("startingPositions", "endingPositions", "startingTimestamp",
                     "endingTimestamp", "startingPositionsByTimestamp", "includeHeaders"):
            if _get(options, name) is not None:
                raise SparkOptionError(f"option {name} applies to streams, not to ledgers")
        ids: list[int] = []
        for item in _csv(ledgers_opt):
            try:
                ids.append(int(item))
            except ValueError:
                raise SparkOptionError(f"option ledgers: {item!r} is not a ledger id "
                                       "(a non-negative integer)") from None
            if ids[-1] < 0:
                raise SparkOptionError(f"option ledgers: {item!r} is not a ledger id")
        return ReadOptions(uri, _get(options, "namespace"), ledgers=tuple(dict.fromkeys(ids)),
                           fail_on_data_loss=fail, max_records_per_partition=per_partition,
                           min_partitions=min_partitions, timeout_s=timeout_s,
                           **_security(options))
    namespace = _namespace(options, "with streams or streamsPattern")
    names: list[str] = []
    globs: list[str] = []
    if streams_opt is not None and streams_opt.strip():
        for item in _csv(streams_opt):
            if GLOB_CHARS & set(item):
                globs.append(item)
                continue
            try:
                names.append(check_stream_name(item))
            except InvalidNameError as exc:
                raise SparkOptionError(f"option streams: {exc}") from None
    if pattern is not None and pattern.strip():
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SparkOptionError(f"option streamsPattern is not a valid regular expression: "
                                   f"{exc}") from None
    starting = parse_positions(_get(options, "startingPositions"), "startingPositions",
                               LATEST if streaming else EARLIEST)
    # As in Spark's Kafka source: startingTimestamp takes precedence over
    # startingPositionsByTimestamp, which takes precedence over startingPositions.
    by_time = _by_timestamp(options, "startingPositionsByTimestamp")
    if (at := _time_spec(options, "startingTimestamp")) is not None:
        starting = Positions(at)
    elif by_time:
        starting = Positions(starting.default, {**starting.per_stream, **by_time})
    ending = parse_positions(_get(options, "endingPositions"), "endingPositions", LATEST)
    if (until := _time_spec(options, "endingTimestamp")) is not None:
        ending = Positions(until)
    if any(s.kind == "earliest" for s in [ending.default, *ending.per_stream.values()]):
        raise SparkOptionError("option endingPositions cannot be earliest: use latest, a "
                               "position or {\"txid\": N}")
    min_records = _int(options, "minRecordsPerTrigger", 1)
    if _get(options, "maxTriggerDelay") is not None and min_records is None:
        raise SparkOptionError("option maxTriggerDelay applies with minRecordsPerTrigger (how "
                               "long a trigger may wait for that many records): set both")
    max_records = _int(options, "maxRecordsPerTrigger", 1)
    if min_records is not None and max_records is not None and min_records > max_records:
        raise SparkOptionError(f"option minRecordsPerTrigger ({min_records}) is above "
                               f"maxRecordsPerTrigger ({max_records}): no trigger could "
                               "satisfy both")
    subscription = _get(options, "subscription")
    if subscription is not None:
        try:
            subscription = check_subscription_name(subscription)
        except InvalidNameError as exc:
            raise SparkOptionError(f"option subscription: {exc}") from None
    ro = ReadOptions(uri, namespace, tuple(dict.fromkeys(names)), tuple(globs),
                     pattern.strip() if pattern and pattern.strip() else None, (), starting,
                     ending, fail, max_records, per_partition,
                     min_partitions, timeout_s, include_headers=include_headers(options),
                     max_bytes_per_trigger=_int(options, "maxBytesPerTrigger", 1),
                     min_records_per_trigger=min_records,
                     max_trigger_delay_ms=_duration_ms(options, "maxTriggerDelay",
                                                       MAX_TRIGGER_DELAY_MS),
                     subscription=subscription, **_security(options))
    for option, positions in (("startingPositions", starting), ("endingPositions", ending)):
        for stream in positions.per_stream:
            if not ro.selects(stream):
                raise SparkOptionError(
                    f"option {option} names stream {stream!r}, which this read does not "
                    "select (add it to the streams option)")
    return ro


def write_options(options: Mapping[str, Any], streaming: bool) -> WriteOptions:
    what = "a streaming write" if streaming else "a batch write"
    _check_applies(options, {"metadatauri", "namespace", "stream", "sinkid",
                             "operationtimeouts", "createstreams", *SECURITY}
                   | (set() if streaming else {"batchid"}), what)
    uri = _metadata_uri(options)
    namespace = _namespace(options, "to write")
    stream = _get(options, "stream") or _get(options, "path")
    if stream is not None and stream.strip():
        stream = stream.strip()
        try:
            check_stream_name(stream)
        except InvalidNameError as exc:
            raise SparkOptionError(f"option stream: {exc}") from None
    else:
        stream = None
    sink_id = _get(options, "sinkId")
    if sink_id is not None and not sink_id.strip():
        raise SparkOptionError("option sinkId cannot be empty")
    batch_id = _int(options, "batchId", 0)
    if batch_id is not None and not sink_id:
        raise SparkOptionError("option batchId needs the option sinkId: a batch is recorded "
                               "as written under the sink's id")
    return WriteOptions(uri, namespace, stream, sink_id.strip() if sink_id else None,
                        batch_id, _timeout(options), _bool(options, "createStreams", False),
                        **_security(options))


NO_STREAM = ("option stream is required to write: the stream to append to (created if "
             "absent), e.g. .option(\"stream\", \"out\"); or give the DataFrame a stream "
             "column naming each row's stream")
