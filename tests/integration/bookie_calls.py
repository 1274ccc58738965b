"""Asking one bookie directly, past the ledger handle: what the bookie itself answers
(an add's status, its state), not what a writer makes of it (a retry, an ensemble
change)."""

from __future__ import annotations

from typing import Any

import aiohttp

from asyncbk.client.digest import master_key
from asyncbk.proto import AddFlag, AddRequest, AddResponse, Status
from asyncbk.testing import LocalBookie

CALL_TIMEOUT_S = 5.0


async def add_status(bk: Any, bookie: str, ledger_id: int, entry_id: int,
                     password: bytes = b"pw", body: bytes = b"sent directly") -> Status:
    """Send one plain ADD (not a recovery add) of ``entry_id`` of ``ledger_id`` to
    ``bookie`` over ``bk``'s channel and return the bookie's status."""
    ch = bk.bookie_client.channel(bookie)
    resp = await ch.request(AddRequest(ch.next_request_id(), ledger_id, entry_id,
                                       master_key(password), AddFlag.NONE, -1, body),
                            CALL_TIMEOUT_S)
    assert isinstance(resp, AddResponse), resp
    return Status(resp.status)


async def bookie_state(bookie: LocalBookie) -> dict[str, Any]:
    """The bookie's ``GET /api/v1/bookie/state``: ``{"state", "read_only", "reasons"}``."""
    async with aiohttp.ClientSession() as s, s.get(
            f"{bookie.http_url}/api/v1/bookie/state",
            timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)) as r:
        assert r.status == 200, await r.text()
        return dict(await r.json())
