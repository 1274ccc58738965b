"""Ledger metadata: the value stored per ledger, and its serialisation."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import InvariantError, MetadataError
from ..types import BookieId

METADATA_FORMAT_VERSION = 1


class LedgerState(enum.StrEnum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


DIGESTS = ("xxh3", "hmac-sha256", "none")

Ensemble = tuple[BookieId, ...]
Fragment = tuple[int, Ensemble]


@dataclass(frozen=True)
class LedgerMetadata:
    """What the metadata store holds for one ledger.

    ``ensembles`` is one ``(first_entry_id, bookies)`` per fragment, in order;
    the first fragment starts at entry 0.  ``version`` is the store's version
    of this value (etcd's mod revision), the token for compare-and-swap; it is
    not serialised.  ``password`` is kept so that recovery tools can write to
    the ledger (as Apache BookKeeper does); it is left out of ``repr``.
    """

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    digest: str
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    ensembles: tuple[Fragment, ...] = ()
    custom: dict[str, bytes] = field(default_factory=dict)
    ctime: int = 0
    """Creation time, milliseconds since the epoch."""
    password: bytes = field(default=b"", repr=False)
    version: int = -1

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def ensemble_at(self, entry_id: int) -> Ensemble:
        """The ensemble of the fragment that holds ``entry_id``."""
        chosen: Ensemble | None = None
        for first, bookies in self.ensembles:
            if first <= max(entry_id, 0):
                chosen = bookies
            else:
                break
        if chosen is None:
            raise InvariantError(f"ledger {self.ledger_id} has no fragment for entry {entry_id}")
        return chosen

    def fragment_bounds(self, index: int) -> tuple[int, int]:
        """First and last entry id (last may be -1/unknown for the open tail) of fragment ``index``."""
        first = self.ensembles[index][0]
        if index + 1 < len(self.ensembles):
            return first, self.ensembles[index + 1][0] - 1
        return first, self.last_entry_id

    def all_bookies(self) -> set[BookieId]:
        return {b for _, ens in self.ensembles for b in ens}

    def replace(self, **changes: Any) -> LedgerMetadata:
        return dataclasses.replace(self, **changes)

    def to_bytes(self) -> bytes:
        return msgpack.packb(
            {
                "format": METADATA_FORMAT_VERSION,
                "ledger_id": self.ledger_id,
                "ensemble_size": self.ensemble_size,
                "write_quorum": self.write_quorum,
                "ack_quorum": self.ack_quorum,
                "digest": self.digest,
                "state": self.state.value,
                "last_entry_id": self.last_entry_id,
                "length": self.length,
                "ensembles": [[first, list(bookies)] for first, bookies in self.ensembles],
                "custom": dict(self.custom),
                "ctime": self.ctime,
                "password": self.password,
            },
            use_bin_type=True,
        )

    @classmethod
    def from_bytes(cls, data: bytes, version: int = -1) -> LedgerMetadata:
        try:
            d = msgpack.unpackb(data, raw=False)
            if d.get("format") != METADATA_FORMAT_VERSION:
                raise ValueError(f"unknown metadata format {d.get('format')!r}")
            return cls(
                ledger_id=int(d["ledger_id"]),
                ensemble_size=int(d["ensemble_size"]),
                write_quorum=int(d["write_quorum"]),
                ack_quorum=int(d["ack_quorum"]),
                digest=str(d["digest"]),
                state=LedgerState(d["state"]),
                last_entry_id=int(d["last_entry_id"]),
                length=int(d["length"]),
                ensembles=tuple((int(f), tuple(str(b) for b in bs)) for f, bs in d["ensembles"]),
                custom={str(k): bytes(v) for k, v in d["custom"].items()},
                ctime=int(d["ctime"]),
                password=bytes(d["password"]),
                version=version,
            )
        except Exception as exc:
            raise MetadataError(f"corrupt ledger metadata: {exc}") from exc


def new_metadata(
    ledger_id: int,
    ensemble: Sequence[BookieId],
    write_quorum: int,
    ack_quorum: int,
    digest: str,
    password: bytes,
    custom: dict[str, bytes] | None,
    ctime_ms: int,
) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=len(ensemble),
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        digest=digest,
        ensembles=((0, tuple(ensemble)),),
        custom=dict(custom or {}),
        ctime=ctime_ms,
        password=password,
    )
