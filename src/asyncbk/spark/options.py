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
from ..stream.meta import check_namespace_name, check_stream_name
from ..stream.position import Position
from .errors import SparkOptionError

MAX_RECORDS_PER_PARTITION = 100_000
OPERATION_TIMEOUT_S = 120.0

KNOWN = {
    "metadatauri", "namespace", "streams", "streamspattern", "ledgers", "startingpositions",
    "endingpositions", "failondataloss", "maxrecordspertrigger", "maxrecordsperpartition",
    "minpartitions", "stream", "sinkid", "batchid", "operationtimeouts", "path",
    "tlscafile", "tlscertfile", "tlskeyfile", "authtokenfile", "etcduser", "etcdpasswordfile",
    "etcdtlscafile", "etcdtlscertfile", "etcdtlskeyfile",
}
SECURITY = {"tlscafile", "tlscertfile", "tlskeyfile", "authtokenfile", "etcduser",
            "etcdpasswordfile", "etcdtlscafile", "etcdtlscertfile", "etcdtlskeyfile"}
"""Lower-cased names this source knows (``path`` is what ``load(x)``/``save(x)`` set)."""

GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class StartSpec:
    """Where one stream starts (or ends): ``earliest``, ``latest``, a position or a txid."""

    kind: str  # "earliest" | "latest" | "position" | "txid"
    position: Position | None = None
    txid: int | None = None

    def __str__(self) -> str:
        if self.kind == "position":
            return str(self.position)
        if self.kind == "txid":
            return f"txid {self.txid}"
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
    stream: str
    sink_id: str | None = None
    batch_id: int | None = None
    """With ``sink_id``, makes a batch write idempotent (for ``foreachBatch``)."""
    timeout_s: float = OPERATION_TIMEOUT_S


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
               "operationtimeouts", *SECURITY}
    allowed |= {"maxrecordspertrigger"} if streaming else {"endingpositions"}
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
        for name in ("startingPositions", "endingPositions"):
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
    ending = parse_positions(_get(options, "endingPositions"), "endingPositions", LATEST)
    if any(s.kind == "earliest" for s in [ending.default, *ending.per_stream.values()]):
        raise SparkOptionError("option endingPositions cannot be earliest: use latest, a "
                               "position or {\"txid\": N}")
    ro = ReadOptions(uri, namespace, tuple(dict.fromkeys(names)), tuple(globs),
                     pattern.strip() if pattern and pattern.strip() else None, (), starting,
                     ending, fail, _int(options, "maxRecordsPerTrigger", 1), per_partition,
                     min_partitions, timeout_s, **_security(options))
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
                             "operationtimeouts", *SECURITY}
                   | (set() if streaming else {"batchid"}), what)
    uri = _metadata_uri(options)
    namespace = _namespace(options, "to write")
    stream = _get(options, "stream") or _get(options, "path")
    if not stream or not stream.strip():
        raise SparkOptionError("option stream is required to write: the stream to append to "
                               "(created if absent), e.g. .option(\"stream\", \"out\")")
    try:
        check_stream_name(stream.strip())
    except InvalidNameError as exc:
        raise SparkOptionError(f"option stream: {exc}") from None
    sink_id = _get(options, "sinkId")
    if sink_id is not None and not sink_id.strip():
        raise SparkOptionError("option sinkId cannot be empty")
    batch_id = _int(options, "batchId", 0)
    if batch_id is not None and not sink_id:
        raise SparkOptionError("option batchId needs the option sinkId: a batch is recorded "
                               "as written under the sink's id")
    return WriteOptions(uri, namespace, stream.strip(), sink_id.strip() if sink_id else None,
                        batch_id, _timeout(options), **_security(options))
