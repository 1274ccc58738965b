"""A bookie turns read-only when a disk fills up and writable again below the low mark."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from asyncbk.bookie import server as server_module
from asyncbk.bookie.processor import BookieState
from asyncbk.bookie.server import BookieServer
from asyncbk.config import BookieConfig
from asyncbk.meta.uri import open_metadata_store
from asyncbk.testing.cluster import free_port
from asyncbk.testing.etcd import EtcdServer

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]


async def _readonly_flag(uri: str, bookie_id: str) -> bool | None:
    meta = await open_metadata_store(uri)
    try:
        reg = (await meta.list_bookies()).get(bookie_id)
        return None if reg is None else reg.readonly
    finally:
        await meta.close()


async def _wait_flag(uri: str, bookie_id: str, want: bool) -> None:
    async with asyncio.timeout(15):
        while await _readonly_flag(uri, bookie_id) is not want:  # noqa: ASYNC110 - polling etcd
            await asyncio.sleep(0.05)


async def test_disk_thresholds_switch_read_only_and_back(
        etcd_server: EtcdServer, root: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    used = {"fraction": 0.5}
    total = 100 << 30

    def fake_usage() -> tuple[int, int]:
        return int(total * (1 - used["fraction"])), total

    monkeypatch.setattr(server_module, "_statvfs", lambda _path: fake_usage())
    cfg = BookieConfig(metadata_uri=etcd_server.uri(root), port=free_port(),
                       journal_dir=str(tmp_path / "j"), ledger_dir=str(tmp_path / "l"),
                       disk_check_interval_s=0.05, disk_usage_threshold=0.9,
                       disk_usage_lwm_threshold=0.8).validate()
    server = BookieServer(cfg)
    await server.start()
    try:
        assert server.storage is not None and server.processor is not None
        monkeypatch.setattr(server.storage, "disk_usage", fake_usage)
        uri, bid = cfg.metadata_uri, server.bookie_id
        await _wait_flag(uri, bid, False)
        used["fraction"] = 0.95  # past the threshold
        await _wait_flag(uri, bid, True)
        assert server.processor.state is BookieState.READ_ONLY
        used["fraction"] = 0.85  # between the marks: stays read-only
        await asyncio.sleep(0.5)
        assert await _readonly_flag(uri, bid) is True
        used["fraction"] = 0.7  # below the low mark
        await _wait_flag(uri, bid, False)
        assert server.processor.state is BookieState.WRITABLE
    finally:
        await server.stop()
    assert await _readonly_flag(cfg.metadata_uri, server.bookie_id) is None  # lease revoked
