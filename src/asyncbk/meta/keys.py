"""The whole key layout of asyncbk in the metadata store, in one place.

Every key lives under the root prefix of the metadata URI
(``etcd://host:port/<root>``)::

    <root>/instanceid                  cluster instance id (uuid4 text), created once
    <root>/idgen                       written to allocate ledger ids: the id is the
                                       store revision of that write (unique, increasing)
    <root>/ledgers/<id:020d>           ledger metadata (msgpack, see meta.model);
                                       zero-padded so a range scan lists ids in order
    <root>/bookies/writable/<bookie>   registration of a writable bookie, bound to its lease
    <root>/bookies/readonly/<bookie>   registration of a read-only bookie, bound to its lease
    <root>/cookies/<bookie>            cookie binding a bookie id to its directories
    <root>/underreplication/ledgers/<id:020d>
                                       a ledger that lost replicas (msgpack map:
                                       bookies, marked_ms)
    <root>/underreplication/locks/<name>
                                       lease-bound locks: "auditor" (the elected
                                       auditor), "ledger-<id>" (a replication worker)
    <root>/streams/ns/<namespace>      a namespace: its defaults (msgpack map)
    <root>/streams/log/<namespace>/<stream>
                                       a stream: its overrides, the highest segment
                                       number it ever had, end-of-stream (msgpack map)
    <root>/streams/seg/<namespace>/<stream>/<segment:020d>
                                       one segment of a stream (msgpack map; see
                                       asyncbk.stream.meta); a range lists them in order
    <root>/streams/sink/<namespace>/<stream>/<sink id>
                                       the last batch a Spark sink committed to the stream
    <root>/streams/batch/<namespace>/<sink id>
                                       the last batch a Spark sink committed to the
                                       namespace's streams (one transaction each)
    <root>/streams/staging/<namespace>/<stream>/<ledger id>
                                       a ledger a Spark task wrote for the stream, not
                                       (yet) adopted as a segment

Stream names may hold any character but control characters; in keys they are
percent-encoded (``/`` too), so a stream key has no ``/`` of its own and a name's
prefix is a key prefix.

Values of registrations are msgpack maps (``BookieRegistration.info``).
"""

from __future__ import annotations

import urllib.parse

LEDGER_ID_DIGITS = 20


def normalize_root(root: str) -> str:
    root = "/" + root.strip("/")
    return "" if root == "/" else root


def instance_id(root: str) -> str:
    return f"{root}/instanceid"


def idgen(root: str) -> str:
    return f"{root}/idgen"


def ledgers_prefix(root: str) -> str:
    return f"{root}/ledgers/"


def ledger(root: str, ledger_id: int) -> str:
    return f"{root}/ledgers/{ledger_id:0{LEDGER_ID_DIGITS}d}"


def ledger_id_from_key(root: str, key: str) -> int:
    return int(key[len(ledgers_prefix(root)) :])


def bookies_prefix(root: str) -> str:
    return f"{root}/bookies/"


def bookie_writable(root: str, bookie_id: str) -> str:
    return f"{root}/bookies/writable/{bookie_id}"


def bookie_readonly(root: str, bookie_id: str) -> str:
    return f"{root}/bookies/readonly/{bookie_id}"


def parse_bookie_key(root: str, key: str) -> tuple[str, bool] | None:
    """``(bookie_id, readonly)`` for a registration key, else None."""
    rest = key[len(bookies_prefix(root)) :] if key.startswith(bookies_prefix(root)) else None
    if rest is None:
        return None
    kind, _, bookie_id = rest.partition("/")
    if kind == "writable" and bookie_id:
        return bookie_id, False
    if kind == "readonly" and bookie_id:
        return bookie_id, True
    return None


def cookie(root: str, bookie_id: str) -> str:
    return f"{root}/cookies/{bookie_id}"


def underreplication_prefix(root: str) -> str:
    return f"{root}/underreplication/"


def underreplicated_prefix(root: str) -> str:
    return f"{root}/underreplication/ledgers/"


def underreplicated(root: str, ledger_id: int) -> str:
    return f"{root}/underreplication/ledgers/{ledger_id:0{LEDGER_ID_DIGITS}d}"


def lock(root: str, name: str) -> str:
    return f"{root}/underreplication/locks/{name}"


AUDITOR_LOCK = "auditor"
"""The lock whose holder is the elected auto-recovery auditor."""


OFFLOADER_LOCK = "offloader"
"""The lock whose holder runs the tiered-storage offloader's passes (one process at a
time of those started with an object store)."""


def ledger_lock(ledger_id: int) -> str:
    """The lock on one ledger held by whoever changes where its replicas are: replication
    workers, ``shell recover``, and a bookie's GC dropping a copy it no longer owns."""
    return f"ledger-{ledger_id}"


SEGMENT_DIGITS = 20


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def namespaces_prefix(root: str) -> str:
    return f"{root}/streams/ns/"


def namespace(root: str, name: str) -> str:
    return f"{root}/streams/ns/{_quote(name)}"


def namespace_from_key(root: str, key: str) -> str:
    return urllib.parse.unquote(key[len(namespaces_prefix(root)):])


def streams_prefix(root: str, namespace: str, name_prefix: str = "") -> str:
    return f"{root}/streams/log/{_quote(namespace)}/{_quote(name_prefix)}"


def stream(root: str, namespace: str, name: str) -> str:
    return f"{root}/streams/log/{_quote(namespace)}/{_quote(name)}"


def stream_from_key(root: str, namespace: str, key: str) -> str:
    return urllib.parse.unquote(key[len(streams_prefix(root, namespace)):])


def segments_prefix(root: str, namespace: str, name: str) -> str:
    return f"{root}/streams/seg/{_quote(namespace)}/{_quote(name)}/"


def segment(root: str, namespace: str, name: str, seq: int) -> str:
    return f"{segments_prefix(root, namespace, name)}{seq:0{SEGMENT_DIGITS}d}"


def sinks_prefix(root: str, namespace: str, name: str) -> str:
    """The exactly-once markers of the Spark sinks writing a stream."""
    return f"{root}/streams/sink/{_quote(namespace)}/{_quote(name)}/"


def sink(root: str, namespace: str, name: str, sink_id: str) -> str:
    return f"{sinks_prefix(root, namespace, name)}{_quote(sink_id)}"


def batch_mark(root: str, namespace: str, sink_id: str) -> str:
    """The last batch a Spark sink committed to streams of ``namespace``."""
    return f"{root}/streams/batch/{_quote(namespace)}/{_quote(sink_id)}"


def subscriptions_prefix(root: str, namespace: str, name: str) -> str:
    """The subscriptions (durable cursors) of a stream."""
    return f"{root}/streams/sub/{_quote(namespace)}/{_quote(name)}/"


def subscription(root: str, namespace: str, name: str, subscription: str) -> str:
    return f"{subscriptions_prefix(root, namespace, name)}{_quote(subscription)}"


def subscription_from_key(root: str, namespace: str, name: str, key: str) -> str:
    return urllib.parse.unquote(key[len(subscriptions_prefix(root, namespace, name)):])


def staging_prefix(root: str, namespace: str, name: str) -> str:
    """Ledgers written for a stream by Spark tasks, not (yet) part of it."""
    return f"{root}/streams/staging/{_quote(namespace)}/{_quote(name)}/"


def namespace_staging_prefix(root: str, namespace: str) -> str:
    """Ledgers written for any stream of ``namespace`` by Spark tasks."""
    return f"{root}/streams/staging/{_quote(namespace)}/"


def staging_key_parts(root: str, namespace: str, key: str) -> tuple[str, int]:
    """``(stream, ledger id)`` of a key under :func:`namespace_staging_prefix`."""
    stream, ledger_id = key[len(namespace_staging_prefix(root, namespace)):].split("/", 1)
    return urllib.parse.unquote(stream), int(ledger_id)


def staging(root: str, namespace: str, name: str, ledger_id: int) -> str:
    return f"{staging_prefix(root, namespace, name)}{ledger_id:0{LEDGER_ID_DIGITS}d}"


def all_segments_prefix(root: str, namespace: str) -> str:
    return f"{root}/streams/seg/{_quote(namespace)}/"


def prefix_end(prefix: str) -> str:
    """The first key after every key starting with ``prefix`` (for range scans)."""
    b = bytearray(prefix.encode())
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return bytes(b[: i + 1]).decode("latin-1")
    return "\0"
