"""The admin endpoint over its BookieAdmin protocol alone: a fake bookie implementing the
protocol (no server, no storage) is enough to serve every route and the metrics."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from asyncbk.bookie.admin import (
    BookieAdmin,
    JournalFigures,
    ListenerFigures,
    ProcessorFigures,
    StateView,
)
from asyncbk.bookie.diskwatch import DiskCheck
from asyncbk.bookie.http import AdminHttpServer
from asyncbk.bookie.state import StateMachine
from asyncbk.errors import MetadataError
from asyncbk.stats import LatencyHistogram

pytestmark = pytest.mark.usefixtures("loop_errors")


class FakeBookie:
    """A :class:`BookieAdmin` that is only its state machine and some figures."""

    bookie_id = "127.0.0.1:7"

    def __init__(self) -> None:
        self.machine = StateMachine()
        self.running = False
        self.registry_down = False
        self.gc_rounds = 0

    def state_view(self) -> StateView:
        return StateView(self.machine.state, tuple(r.value for r in self.machine.reasons))

    def directories(self) -> tuple[str, str]:
        return "/j", "/l"

    def listener_figures(self) -> ListenerFigures | None:
        return ListenerFigures(3, 1) if self.running else None

    def processor_figures(self) -> ProcessorFigures | None:
        if not self.running:
            return None
        counters = dict.fromkeys(("adds", "rejected", "add_errors", "add_bytes", "reads",
                                  "read_entries", "read_bytes", "read_errors", "fences"), 0)
        counters["adds"] = 5
        add = LatencyHistogram()
        add.observe(0.001, 5)
        return ProcessorFigures(counters, add, LatencyHistogram())

    def storage_statistics(self) -> dict[str, Any] | None:
        if not self.running:
            return None
        journal = {"queue_entries": 0, "records": 5, "bytes": 50, "batches": 1,
                   "flush_reasons": {"empty": 1}, "failed": False}
        return {"ledgers": 1, "entries": 5, "disk_free_bytes": 75, "disk_total_bytes": 100,
                "checkpoints": 1, "entry_log_flushes": 0, "journal_files_deleted": 0,
                "ledgers_deleted": 0, "compactions": 0, "compacted_bytes": 0,
                "compaction_moved_bytes": 0, "journal": journal}

    def disk_check(self) -> DiskCheck | None:
        return None

    def journal_figures(self) -> JournalFigures | None:
        return JournalFigures(LatencyHistogram(), LatencyHistogram()) if self.running else None

    async def set_maintenance(self, read_only: bool) -> StateView:
        self.machine.maintenance(read_only)
        if self.registry_down:
            raise MetadataError("store unreachable")
        return self.state_view()

    def gc_statistics(self) -> dict[str, Any] | None:
        return {"runs": self.gc_rounds} if self.running else None

    async def run_gc(self) -> dict[str, Any] | None:
        if not self.running:
            return None
        self.gc_rounds += 1
        return {"deleted": 0, "runs": self.gc_rounds}


async def test_every_route_over_the_protocol() -> None:
    fake = FakeBookie()
    admin: BookieAdmin = fake
    http = AdminHttpServer(admin, "127.0.0.1", 0)
    port = await http.start()
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            async with s.get(f"{url}/healthz") as r:
                assert (r.status, await r.text()) == (503, "not serving: starting\n")
            async with s.put(f"{url}/api/v1/bookie/state", json={"read_only": True}) as r:
                assert r.status == 409  # not serving yet
            async with s.get(f"{url}/api/v1/bookie/gc") as r:
                assert r.status == 409
            async with s.get(f"{url}/metrics") as r:
                text = await r.text()
            assert 'asyncbk_bookie_state{bookie="127.0.0.1:7",state="starting"} 1.0' in text
            assert "asyncbk_bookie_add_requests_total" not in text  # no processor yet

            fake.running = True
            fake.machine.registered(False)
            async with s.get(f"{url}/healthz") as r:
                assert r.status == 200
            async with s.get(f"{url}/api/v1/bookie/info") as r:
                info = await r.json()
            assert info["state"] == "writable" and info["ledgers"] == 1
            assert info["disk"]["used_fraction"] == 0.25 and info["ledger_dir"] == "/l"
            async with s.put(f"{url}/api/v1/bookie/state", json={"read_only": True}) as r:
                assert await r.json() == {"state": "readonly", "read_only": True,
                                          "reasons": ["maintenance"]}
            fake.registry_down = True
            async with s.put(f"{url}/api/v1/bookie/state", json={"read_only": False}) as r:
                assert r.status == 503 and "store unreachable" in (await r.json())["error"]
            async with s.get(f"{url}/api/v1/bookie/state") as r:
                assert (await r.json())["state"] == "writable"  # switched; registry retried
            async with s.put(f"{url}/api/v1/bookie/gc") as r:
                assert (await r.json())["runs"] == 1
            async with s.get(f"{url}/metrics") as r:
                text = await r.text()
            assert 'asyncbk_bookie_add_requests_total{bookie="127.0.0.1:7"} 5.0' in text
            assert 'asyncbk_bookie_connections{bookie="127.0.0.1:7"} 3.0' in text
            assert 'asyncbk_bookie_state{bookie="127.0.0.1:7",state="writable"} 1.0' in text
    finally:
        await http.close()
