"""client/outbox.py: a turn's sends grouped by bookie, taken once, answers routed by
position, and trace contexts only where an entry was sampled."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from asyncbk.client.outbox import Outbox
from asyncbk.errors import BKError
from asyncbk.proto import Response


class Entries:
    """The pending entries' bodies and trace contexts, by id (the Queued protocol)."""

    def __init__(self, bodies: list[bytes], traces: list[bytes] | None = None) -> None:
        self.bodies = bodies
        self.traces = traces or [b""] * len(bodies)

    def body(self, entry_id: int) -> bytes:
        return self.bodies[entry_id]

    def trace(self, entry_id: int) -> bytes:
        return self.traces[entry_id]


@dataclass
class Channel:
    sources: list[Any] = field(default_factory=list)

    def add_source(self, source: Any) -> None:
        self.sources.append(source)


class Client:
    def __init__(self) -> None:
        self.channels: dict[str, Channel] = {}

    def channel(self, bookie: str) -> Channel:
        return self.channels.setdefault(bookie, Channel())


def _outbox(traced: bool = False) -> tuple[Outbox, Client, list[Any]]:
    calls: list[Any] = []
    client = Client()

    def on_acks(ids: list[int], pos: int, bookie: str) -> None:
        calls.append(("acks", ids, pos, bookie))

    def on_answer(eid: int, pos: int, bookie: str, result: Response | BKError) -> None:
        calls.append(("answer", eid, pos, bookie, result))

    box = Outbox(client, 7, b"key", 0, 3, 10.0, on_acks=on_acks,  # type: ignore[arg-type]
                 on_answer=on_answer, traced=traced)
    return box, client, calls


def test_a_turns_sends_go_to_each_bookie_once_with_the_highest_lac() -> None:
    box, client, calls = _outbox()
    ensemble = ["a", "b", "c"]
    ops = Entries([b"e%d" % i for i in range(4)])
    box.queue([(0, 0), (0, 1), (1, 1), (1, 2)], 3, ensemble, ops)
    box.queue([(2, 2), (2, 0)], 5, ensemble, ops)
    assert {b: len(c.sources) for b, c in client.channels.items()} == {"a": 1, "b": 1, "c": 1}
    (a,) = box.take("a")
    assert (a.ledger_id, a.lac, a.entry_ids, a.bodies, a.traces) == \
        (7, 5, [0, 2], [b"e0", b"e2"], None)
    assert box.take("a") == []  # handed over once
    (c,) = box.take("c")
    assert c.entry_ids == [1, 2]
    a.target.acked([0, 2])
    c.target.answered(1, BKError("x"))
    assert calls[0] == ("acks", [0, 2], 0, "a")
    assert calls[1][:4] == ("answer", 1, 2, "c")
    (b,) = box.take("b")
    assert b.entry_ids == [0, 1]
    # the turn is over: a new one starts with no LAC carried over
    box.queue([(3, 0)], -1, ensemble, ops)
    (a,) = box.take("a")
    assert (a.entry_ids, a.lac) == ([3], -1)


def test_discard_sends_nothing() -> None:
    box, _, _ = _outbox()
    box.queue([(0, 0)], 0, ["a"], Entries([b"x"]))
    box.queue_entry(1, (0,), 0, ("a",), b"y", b"")
    box.discard()
    assert box.take("a") == []


def test_traces_go_only_where_an_entry_was_sampled() -> None:
    box, _, _ = _outbox(traced=True)
    ops = Entries([b"x", b"y"], [b"", b"t" * 26])
    box.queue([(0, 0), (1, 0), (0, 1)], 0, ["a", "b"], ops)
    (a,) = box.take("a")
    assert a.traces == [b"", b"t" * 26]
    (b,) = box.take("b")
    assert b.traces is None  # none sampled: the untraced frames


def test_a_position_given_to_another_bookie_gets_a_new_target() -> None:
    box, _, calls = _outbox()
    box.queue([(0, 0)], 0, ["a"], Entries([b"x", b"y"]))
    (first,) = box.take("a")
    box.queue([(1, 0)], 1, ["d"], Entries([b"x", b"y"]))
    (second,) = box.take("d")
    assert first.target is not second.target
    second.target.acked([1])
    assert calls == [("acks", [1], 0, "d")]


def test_new_entries_are_kept_once_and_shared_when_every_bookie_stores_them() -> None:
    box, client, _ = _outbox()
    ensemble = ("a", "b", "c")
    for i in range(4):
        box.queue_entry(i, ((i + 0) % 3, (i + 1) % 3, (i + 2) % 3), i - 1, ensemble,
                        b"e%d" % i, b"")
    assert {b: len(c.sources) for b, c in client.channels.items()} == {"a": 1, "b": 1, "c": 1}
    groups = [box.take(b) for b in ensemble]
    assert all(len(g) == 1 for g in groups)
    (a,), (b,), (c,) = groups
    assert a.entry_ids == [0, 1, 2, 3] and a.bodies == [b"e0", b"e1", b"e2", b"e3"]
    assert a.lac == 2 and a.traces is None
    assert a.entry_ids is b.entry_ids is c.entry_ids  # one list, not one per bookie
    assert (a.target.position, b.target.position, c.target.position) == (0, 1, 2)
    assert box.take("a") == []
    # every bookie took its part: the next turn has new lists, and the old ones stay
    box.queue_entry(4, (1, 2, 0), 3, ensemble, b"e4", b"")
    assert a.entry_ids == [0, 1, 2, 3]
    assert [g.entry_ids for g in box.take("b")] == [[4]]


def test_a_write_set_short_of_the_ensemble_sends_each_bookie_its_entries() -> None:
    box, client, _ = _outbox()
    ensemble = ("a", "b", "c")
    for i in range(5):  # E3 Qw2
        box.queue_entry(i, (i % 3, (i + 1) % 3), -1, ensemble, b"e%d" % i, b"")
    parts = {bookie: box.take(bookie)[0] for bookie in ensemble}
    assert parts["a"].entry_ids == [0, 2, 3] and parts["a"].bodies == [b"e0", b"e2", b"e3"]
    assert parts["b"].entry_ids == [0, 1, 3, 4]
    assert parts["c"].entry_ids == [1, 2, 4]


def test_a_bookie_that_takes_late_gets_only_what_came_after_its_last_part() -> None:
    box, client, _ = _outbox()
    ensemble = ("a", "b")
    box.queue_entry(0, (0, 1), -1, ensemble, b"e0", b"")
    assert [g.entry_ids for g in box.take("a")] == [[0]]
    box.queue_entry(1, (1, 0), -1, ensemble, b"e1", b"")
    assert len(client.channels["a"].sources) == 2  # asked again for the new entry
    assert [g.entry_ids for g in box.take("a")] == [[1]]  # not entry 0 again
    assert [g.entry_ids for g in box.take("b")] == [[0, 1]]
    assert box.take("b") == []


def test_an_ensemble_change_in_the_turn_keeps_the_queued_entries_bookies() -> None:
    box, _, _ = _outbox()
    box.queue_entry(0, (0, 1), -1, ("a", "b"), b"e0", b"")
    box.queue_entry(1, (1, 0), -1, ("a", "d"), b"e1", b"")  # b replaced by d meanwhile
    assert [(g.entry_ids, g.bodies) for g in box.take("b")] == [([0], [b"e0"])]
    assert sorted(g.entry_ids for g in box.take("a")) == [[0], [1]]
    assert [g.entry_ids for g in box.take("d")] == [[1]]


def test_traced_new_entries_carry_their_contexts() -> None:
    box, _, _ = _outbox(traced=True)
    box.queue_entry(0, (0,), -1, ("a",), b"x", b"")
    box.queue_entry(1, (0,), -1, ("a",), b"y", b"t" * 26)
    (a,) = box.take("a")
    assert a.traces == [b"", b"t" * 26]


def test_shared_bodies_are_encoded_once_and_frame_as_the_general_encoder() -> None:
    import itertools

    from asyncbk.net.adds import frame_adds
    from asyncbk.proto import AddBatchRequest, encode_request

    box, _, _ = _outbox()
    ensemble = ("a", "b", "c")
    for i in range(3):
        box.queue_entry(i, ((i + 0) % 3, (i + 1) % 3, (i + 2) % 3), 1, ensemble,
                        b"body%d" % i, b"")
    groups = [box.take(b)[0] for b in ensemble]
    assert groups[0].shared is not None
    assert all(g.shared is groups[0].shared for g in groups)
    rids = itertools.count(40)
    frames = []
    for g in groups:
        out: list[bytes] = []
        frame_adds(g, sum(map(len, g.bodies)), rids, 1 << 20, out)
        assert len(out) == 2  # the head, then the bodies as encoded once
        frames.append(out)
    assert frames[0][1] is frames[1][1] is frames[2][1]
    for rid, out in zip(range(40, 43), frames, strict=True):
        assert b"".join(out) == encode_request(AddBatchRequest(
            rid, 7, b"key", 0, 1, [0, 1, 2], [b"body0", b"body1", b"body2"]))


def test_a_channel_that_takes_at_once_leaves_the_other_bookies_their_part() -> None:
    """A channel that cannot send takes (and refuses) its part as soon as the outbox
    registers: the entry still goes to the entry's other bookies."""
    box, client, _ = _outbox()
    taken: list[Any] = []

    class Refusing(Channel):
        def add_source(self, source: Any) -> None:
            taken.extend(source.take("a"))

    client.channels["a"] = Refusing()
    box.queue_entry(0, (0, 1, 2), -1, ("a", "b", "c"), b"e0", b"")
    assert [g.entry_ids for g in taken] == [[0]]
    assert [g.entry_ids for g in box.take("b")] == [[0]]
    assert [g.entry_ids for g in box.take("c")] == [[0]]
