"""The offloader's decisions, as pure functions of the metadata it read and the time:
which segments to copy, whose ledgers to delete, which objects to sweep, and how
objects are named.

- **Copy** a completed segment that holds records and has no object yet, once it was
  completed ``offload_after_s`` ago (when set), or while the stream keeps more than
  ``offload_after_bytes`` on the bookies alone (the oldest first).
- **Delete the ledger** of a segment whose object was recorded at least
  ``offload_deletion_lag_s`` ago (and only then: an object is recorded only after
  it was read back and checked).
- **Sweep** an object no segment names: at once when its segment is gone (dropped,
  or its stream deleted), else (a copy that failed before it was recorded, or one in
  progress) only once it is older than the grace period.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from urllib.parse import quote, unquote

from ..stream.meta import Segment, StreamConfig

OBJECT_SUFFIX = ".seg"


@dataclass(frozen=True, slots=True)
class ObjectKey:
    """What an object's key says: the segment it was made for."""

    namespace: str
    stream: str
    seq: int
    ledger_id: int
    nonce: str

    def __str__(self) -> str:
        return (f"{self.namespace}/{quote(self.stream, safe='')}/"
                f"{self.seq:012d}-{self.ledger_id}-{self.nonce}{OBJECT_SUFFIX}")

    @classmethod
    def parse(cls, key: str) -> ObjectKey | None:
        """The key's parts (None: not an object the offloader makes)."""
        parts = key.split("/")
        if len(parts) != 3 or not parts[2].endswith(OBJECT_SUFFIX):
            return None
        fields = parts[2][:-len(OBJECT_SUFFIX)].split("-")
        if len(fields) != 3 or not fields[0].isdigit() or not fields[1].isdigit():
            return None
        return cls(parts[0], unquote(parts[1]), int(fields[0]), int(fields[1]), fields[2])


def offload_candidates(segs: Sequence[Segment], config: StreamConfig,
                       now_ms: int) -> list[Segment]:
    """The segments to copy now, oldest first (see the module docstring)."""
    waiting = [s for s in segs if s.completed and s.records > 0 and s.offload is None]
    out: list[Segment] = []
    if config.offload_after_s > 0:
        horizon = now_ms - config.offload_after_s * 1000
        out = [s for s in waiting if s.completion_ms <= horizon]
    if config.offload_after_bytes > 0:
        on_bookies = sum(s.size_bytes for s in segs if s.offload is None)
        chosen = {s.seq for s in out}
        on_bookies -= sum(s.size_bytes for s in out)
        for s in waiting:
            if on_bookies <= config.offload_after_bytes:
                break
            if s.seq not in chosen:
                out.append(s)
                on_bookies -= s.size_bytes
        out.sort(key=lambda s: s.seq)
    return out


def deletion_due(segs: Sequence[Segment], config: StreamConfig, now_ms: int) -> list[Segment]:
    """The offloaded segments whose ledgers may now leave the bookies."""
    lag_ms = config.offload_deletion_lag_s * 1000
    return [s for s in segs if s.offload is not None and not s.offload.ledger_deleted_ms
            and s.offload.offloaded_ms + lag_ms <= now_ms]


class Sweep(Enum):
    KEEP = "keep"
    """A segment names it, or it may be a copy in progress."""
    DELETE = "delete"


def sweep_decision(key: ObjectKey, full_key: str, store: str, segs: Sequence[Segment] | None,
                   age_s: float, grace_s: float) -> Sweep:
    """What to do with the object ``key`` (``full_key`` under the store ``store``) given
    its stream's segments (None: the stream is gone) and its age."""
    if segs is None:
        return Sweep.DELETE
    seg = next((s for s in segs if s.seq == key.seq), None)
    if seg is None:
        first = segs[0].seq if segs else None
        # Gone for good if before the stream's first segment; a later number may be a
        # segment of a stream deleted and made again: wait for the grace period.
        if first is not None and key.seq < first:
            return Sweep.DELETE
        return Sweep.DELETE if age_s >= grace_s else Sweep.KEEP
    if seg.offload is not None and seg.offload.key == full_key and seg.offload.store == store:
        return Sweep.KEEP
    return Sweep.DELETE if age_s >= grace_s else Sweep.KEEP
