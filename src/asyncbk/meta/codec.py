"""Value encodings shared by both metadata stores (etcd and memory): bookie
registrations and under-replication marks.  Ledger metadata encodes itself
(:class:`~asyncbk.meta.model.LedgerMetadata`); key layout is in
:mod:`asyncbk.meta.keys`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgpack

from ..errors import MetadataError
from ..log import get_logger
from ..types import BookieId
from . import keys
from .api import BookieRegistration, UnderReplicated

_log = get_logger(component="meta")


# --- bookie registrations ------------------------------------------------------


def pack_registration_info(info: dict[str, Any]) -> bytes:
    """The stored value of a registration: its ``info`` map as msgpack."""
    return msgpack.packb(dict(info), use_bin_type=True)


def unpack_registration_info(value: bytes) -> dict[str, Any]:
    """Inverse of :func:`pack_registration_info`; a value that is not a msgpack
    map (written by something else) reads as an empty map rather than hiding
    the bookie from every client."""
    try:
        info = msgpack.unpackb(value, raw=False) if value else {}
    except Exception as exc:
        _log.warning("undecodable bookie registration value", error=str(exc))
        return {}
    if not isinstance(info, dict):
        _log.warning("bookie registration value is not a map", value_type=type(info).__name__)
        return {}
    return {str(k): v for k, v in info.items()}


def registrations_from_items(
    root: str, items: Iterable[tuple[str, bytes]]
) -> dict[BookieId, BookieRegistration]:
    """The registry view from ``(key, value)`` pairs under the bookies prefix.

    A bookie registered both ways at once (only possible if something other
    than ``register_bookie`` wrote the keys) is reported read-only: clients
    must not send it writes.  Keys that are not registrations are ignored.
    """
    view: dict[BookieId, BookieRegistration] = {}
    for key, value in items:
        parsed = keys.parse_bookie_key(root, key)
        if parsed is None:
            continue
        bookie_id, readonly = parsed
        existing = view.get(bookie_id)
        if existing is not None and existing.readonly and not readonly:
            continue
        view[bookie_id] = BookieRegistration(
            bookie_id=bookie_id, readonly=readonly, info=unpack_registration_info(value)
        )
    return view


# --- under-replication marks ---------------------------------------------------


def pack_underreplicated(bookies: set[BookieId] | frozenset[BookieId], marked_ms: int) -> bytes:
    return msgpack.packb({"bookies": sorted(bookies), "marked_ms": marked_ms},
                         use_bin_type=True)


def unpack_underreplicated(ledger_id: int, value: bytes, version: int) -> UnderReplicated:
    try:
        d = msgpack.unpackb(value, raw=False)
        return UnderReplicated(ledger_id, frozenset(str(b) for b in d["bookies"]),
                               int(d["marked_ms"]), version)
    except Exception as exc:
        raise MetadataError(f"corrupt under-replication mark of ledger {ledger_id}: "
                            f"{exc}") from exc
