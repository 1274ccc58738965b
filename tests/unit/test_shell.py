"""Pieces of ``asyncbk shell`` that need no cluster: answers of the wrong kind from a
bookie are typed errors, never assertions; custom metadata shown as text."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from asyncbk.cli.shell import _bookie_info, _bookiesanity, _custom_value
from asyncbk.errors import BadRequestError
from asyncbk.proto import AddResponse, ReadResponse, Status


class _Channel:
    """Answers every request with the next of ``answers``."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.ids = 0

    def next_request_id(self) -> int:
        self.ids += 1
        return self.ids

    async def request(self, request: Any, timeout_s: float) -> Any:
        return self.answers.pop(0)


def _bk(channel: _Channel) -> Any:
    async def allocate_ledger_id() -> int:
        return 7

    return SimpleNamespace(meta=SimpleNamespace(allocate_ledger_id=allocate_ledger_id),
                           bookie_client=SimpleNamespace(channel=lambda bookie: channel),
                           config=SimpleNamespace(add_timeout_s=1.0))


async def test_bookiesanity_wrong_answer_to_an_add_is_a_typed_error() -> None:
    wrong = ReadResponse(1, Status.OK, 7, 0, b"", -1)
    with pytest.raises(BadRequestError, match="add 0 to b:1.*ReadResponse, expected AddResponse"):
        await _bookiesanity(_bk(_Channel([wrong])), "b:1", 1)


async def test_bookiesanity_wrong_answer_to_a_read_is_a_typed_error() -> None:
    answers = [AddResponse(1, Status.OK, 7, 0), AddResponse(2, Status.OK, 7, 0)]
    with pytest.raises(BadRequestError, match="read 0 from b:1.*AddResponse, expected"):
        await _bookiesanity(_bk(_Channel(answers)), "b:1", 1)


async def test_bookie_info_wrong_answer_is_reported_not_asserted() -> None:
    text = await _bookie_info(_bk(_Channel([AddResponse(1, Status.OK, 0, 0)])), "b:1")
    assert text == "(unexpected answer: AddResponse)"


def test_custom_metadata_is_text_when_utf8_else_hex() -> None:
    assert _custom_value(b"demo") == "demo"
    assert _custom_value("caf\u00e9".encode()) == "caf\u00e9"
    assert _custom_value(b"\xff\x00") == {"hex": "ff00"}
