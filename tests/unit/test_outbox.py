"""client/outbox.py: a turn's sends grouped by bookie, taken once, answers routed by
position, and trace contexts only where an entry was sampled."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from asyncbk.client.outbox import Outbox
from asyncbk.errors import BKError
from asyncbk.proto import Response


@dataclass
class Op:
    body: bytes
    trace: bytes = b""


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
    ops = [Op(b"e%d" % i) for i in range(4)]
    box.queue([(0, 0), (0, 1), (1, 1), (1, 2)], 3, ensemble, ops, 0)
    box.queue([(2, 2), (2, 0)], 5, ensemble, ops, 0)
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
    box.queue([(3, 0)], -1, ensemble, ops, 0)
    (a,) = box.take("a")
    assert (a.entry_ids, a.lac) == ([3], -1)


def test_discard_sends_nothing() -> None:
    box, _, _ = _outbox()
    box.queue([(0, 0)], 0, ["a"], [Op(b"x")], 0)
    box.discard()
    assert box.take("a") == []


def test_traces_go_only_where_an_entry_was_sampled() -> None:
    box, _, _ = _outbox(traced=True)
    ops = [Op(b"x", b""), Op(b"y", b"t" * 26)]
    box.queue([(0, 0), (1, 0), (0, 1)], 0, ["a", "b"], ops, 0)
    (a,) = box.take("a")
    assert a.traces == [b"", b"t" * 26]
    (b,) = box.take("b")
    assert b.traces is None  # none sampled: the untraced frames


def test_a_position_given_to_another_bookie_gets_a_new_target() -> None:
    box, _, calls = _outbox()
    box.queue([(0, 0)], 0, ["a"], [Op(b"x"), Op(b"y")], 0)
    (first,) = box.take("a")
    box.queue([(1, 0)], 1, ["d"], [Op(b"x"), Op(b"y")], 0)
    (second,) = box.take("d")
    assert first.target is not second.target
    second.target.acked([1])
    assert calls == [("acks", [1], 0, "d")]
