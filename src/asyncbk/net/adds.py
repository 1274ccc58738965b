"""What a sender hands a bookie's channel, and how the answers come back.

A ledger handle queues its adds for each bookie during a loop turn; at the
turn's flush the channel asks it (:class:`AddSource`) for them as one
:class:`AddGroup` per ledger, frames each as ADD_BATCH requests, and hands the
answers to the group's :class:`AddTarget`: one call for a batch answered OK
throughout, one per entry otherwise.  One object per group, none per entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple, Protocol

from ..errors import BKError, BookieUnavailableError
from ..proto import (
    AddBatchRequest,
    AddBatchResponse,
    AddRequest,
    AddResponse,
    Op,
    Response,
    Status,
    add_batch_request_parts,
    add_request_frame,
    add_request_tail,
    encode_request,
    pack_bodies,
)
from ..types import BookieId

ADD_BATCH_ENTRIES_MAX = 512
ADD_BATCH_BYTES_MAX = 2 * 1024 * 1024
"""Adds of one loop turn to one ledger go out as ADD_BATCH frames of at most this many
entries and bytes of bodies (and never more than half the frame limit)."""


class AddTarget(Protocol):
    """Where a channel hands the answers to a group of adds (:class:`AddGroup`)."""

    def acked(self, entry_ids: list[int]) -> None:
        """The bookie made every entry of ``entry_ids`` durable (one call for a batch
        answered OK throughout)."""

    def answered(self, entry_id: int, result: Response | BKError) -> None:
        """``entry_id``'s own answer: an AddResponse (OK or not) or the error that
        replaced it (a refusal, a timeout, a lost connection)."""


class PackedBodies:
    """The bodies of adds that several groups share (the same entries to every bookie
    of an E == Qw ensemble), encoded for the wire once, by the first group framed."""

    __slots__ = ("_packed", "bodies")

    def __init__(self, bodies: list[bytes]) -> None:
        self.bodies = bodies
        self._packed: bytes | None = None

    def packed(self) -> bytes:
        if self._packed is None:
            self._packed = pack_bodies(self.bodies)
        return self._packed


class AddGroup(NamedTuple):
    """Adds of one ledger to one bookie, handed to a channel together
    (:meth:`~asyncbk.net.channel.BookieChannel.send_adds`, :meth:`AddSource.take`) and
    framed at its flush as ADD_BATCH requests (a lone entry as an ADD).  One per
    ledger, bookie and loop turn, not per entry."""

    ledger_id: int
    master_key: bytes
    flags: int
    lac: int
    """The LAC piggybacked on every add of the group."""
    entry_ids: list[int]
    bodies: list[bytes]
    """The sealed entries, in the order of ``entry_ids``."""
    target: AddTarget
    timeout_s: float
    """Each add fails with TimeoutError if not answered this long after it was queued."""
    traces: list[bytes] | None = None
    """Tracing: each entry's span context (or b""), in the order of ``entry_ids``;
    None when the sender does not trace (the frames are then the hot path's)."""
    shared: PackedBodies | None = None
    """``bodies`` shared with other groups (their encoding made once), or None."""


class AddSource(Protocol):
    """A sender with adds for a bookie, asked for them at the channel's flush
    (:meth:`~asyncbk.net.channel.BookieChannel.add_source`)."""

    def take(self, bookie_id: BookieId) -> Iterable[AddGroup]:
        """The groups of adds for ``bookie_id`` queued since the last call (each handed
        over once)."""


ADD_OK = AddResponse(0, Status.OK, 0, 0)
"""What an add's callback gets for an OK entry of a batch answer (only its type and
status are read)."""


class GroupCallback:
    """A channel's callback for one ADD or ADD_BATCH request of a group: hands the
    answer to the group's target, ``target.acked(entry_ids)`` when every entry is OK
    (one call), else ``target.answered(entry_id, AddResponse or error)`` for each."""

    __slots__ = ("entry_ids", "ledger_id", "target")

    def __init__(self, target: AddTarget, ledger_id: int, entry_ids: list[int]) -> None:
        self.target = target
        self.ledger_id = ledger_id
        self.entry_ids = entry_ids

    def __call__(self, result: Response | BKError) -> None:
        target, entry_ids = self.target, self.entry_ids
        if isinstance(result, AddResponse) and len(entry_ids) == 1:  # a group of one: an ADD
            if result.status == Status.OK:
                target.acked(entry_ids)
            else:
                target.answered(entry_ids[0], result)
            return
        if isinstance(result, AddBatchResponse) and len(result.statuses) == len(entry_ids):
            if not any(result.statuses):
                target.acked(entry_ids)
                return
            ledger_id = self.ledger_id
            for entry_id, status in zip(entry_ids, result.statuses, strict=True):
                target.answered(entry_id, ADD_OK if status == 0
                                else AddResponse(0, status, ledger_id, entry_id))
            return
        error = result if isinstance(result, BKError) else BookieUnavailableError(
            f"malformed answer to a batch of adds: {type(result).__name__}")
        for entry_id in entry_ids:
            target.answered(entry_id, error)


class FramedAdds(NamedTuple):
    """One request :func:`frame_adds` framed: its id, op (ADD or ADD_BATCH) and entries."""

    request_id: int
    op: Op
    entry_ids: list[int]


def frame_adds(group: AddGroup, nbytes: int, request_ids: Iterator[int],
               frame_bytes_max: int, out: list[bytes]) -> list[FramedAdds]:
    """``group`` (whose bodies are ``nbytes``) as frames appended to ``out``: ADD_BATCH
    requests of at most ``ADD_BATCH_ENTRIES_MAX`` entries and ``bytes_max`` of bodies
    (an entry near the frame limit goes on its own, or the batch's frame would pass
    the bookie's limit); a lone entry as an ADD, cheaper to frame and to answer than a
    batch of one.  With trace contexts the general encoder frames them.  Returns the
    requests, each with an id from ``request_ids``."""
    ledger_id, master_key, flags, lac, entry_ids, bodies, _, _, traces, shared = group
    count = len(entry_ids)
    bytes_max = min(ADD_BATCH_BYTES_MAX, frame_bytes_max // 2)
    if count <= ADD_BATCH_ENTRIES_MAX and nbytes <= bytes_max:  # (the usual case)
        parts = [(0, count)]
    else:
        parts = []
        i = 0
        while i < count:
            j = i + 1
            size = len(bodies[i])
            while j < count and j - i < ADD_BATCH_ENTRIES_MAX \
                    and size + len(bodies[j]) <= bytes_max:
                size += len(bodies[j])
                j += 1
            parts.append((i, j))
            i = j
    framed = []
    for i, j in parts:
        ids, part = (entry_ids, bodies) if j - i == count else (entry_ids[i:j], bodies[i:j])
        rid = next(request_ids)
        if traces is not None:  # (tracing: the general encoder, with the contexts)
            out.append(encode_request(
                AddRequest(rid, ledger_id, ids[0], master_key, flags, lac, part[0], traces[i])
                if len(ids) == 1 else
                AddBatchRequest(rid, ledger_id, master_key, flags, lac, ids, part,
                                traces[i:j])))
            op = Op.ADD if len(ids) == 1 else Op.ADD_BATCH
        elif len(ids) == 1:
            out.extend(add_request_frame(rid, add_request_tail(
                ledger_id, ids[0], master_key, flags, lac, part[0])))
            op = Op.ADD
        else:  # (two parts: the bodies go out as they were encoded, maybe once for all)
            packed = shared.packed() if shared is not None and j - i == count \
                else pack_bodies(part)
            out.extend(add_batch_request_parts(rid, ledger_id, master_key, flags, lac, ids,
                                               packed))
            op = Op.ADD_BATCH
        framed.append(FramedAdds(rid, op, ids))
    return framed


__all__ = ["ADD_BATCH_BYTES_MAX", "ADD_BATCH_ENTRIES_MAX", "ADD_OK", "AddGroup", "AddSource",
           "AddTarget", "FramedAdds", "GroupCallback", "PackedBodies", "frame_adds"]
