"""A namespace's placement with real bookie processes that declare racks: the client
places at random, a namespace says rack-aware (enforced), and every segment of its
streams, whoever writes them (the Python API, a second client taking over, the
``asyncbk stream`` command), has every write set in both racks.  Ledgers created
directly keep the client's policy."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncbk.client.placement import write_set_spread
from asyncbk.stream.client import BookKeeper
from asyncbk.testing.cluster import LocalCluster

from .clitools import cli_env

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]

RACKS = ["/r1", "/r1", "/r2", "/r2"]
SEGMENTS = 8
"""Segments per check: at random, an E4 Qw2 ensemble over 2 + 2 bookies has every
write set in both racks one time in three, so 8 in a row would be 1 in 6,561."""


def stream_cli(uri: str, *args: str, stdin: bytes | None = None) -> dict[str, Any] | str:
    """``asyncbk stream ARGS --metadata-uri URI``: stdout (as JSON when it is)."""
    r = subprocess.run([sys.executable, "-m", "asyncbk", "stream", *args,
                        "--metadata-uri", uri], input=stdin,
                       stdin=None if stdin is not None else subprocess.DEVNULL,
                       capture_output=True, timeout=60, env=cli_env())
    assert r.returncode == 0 and not r.stderr, (args, r.stdout, r.stderr)
    out = r.stdout.decode()
    return json.loads(out) if out.startswith("{") else out


async def segment_ensembles(bk: BookKeeper, ns_name: str, stream: str) -> list[list[str]]:
    """Every ensemble of every segment ledger of the stream."""
    ns = await bk.namespace(ns_name)
    info = await ns.stream_info(stream)
    out = []
    for seg in info.segments:
        md = await bk.ledger_metadata(seg.ledger_id)
        out.extend(list(ensemble) for _, ensemble in md.ensembles)
    return out


def test_namespace_info_help_shows_every_default() -> None:
    r = subprocess.run([sys.executable, "-m", "asyncbk", "stream", "namespace-info", "--help"],
                       capture_output=True, text=True, timeout=60,
                       env={**cli_env(), "COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    options = r.stdout.split("\noptions:\n", 1)[1]
    entries: list[str] = []
    for line in options.splitlines():
        if line.startswith("  -"):
            entries.append(line)
        elif entries:
            entries[-1] += " " + line.strip()
    assert any(e.lstrip().startswith("--json") for e in entries)
    for entry in entries[1:]:  # after -h
        assert "default" in entry or "required" in entry, entry


async def test_a_rack_aware_namespace_on_a_random_client(tmp_path: Path, finding: Any) -> None:
    async with LocalCluster(bookies=4, data_dir=tmp_path / "cluster", racks=RACKS) as cluster:
        bk = await cluster.client()
        assert bk.config.placement_policy == "random"
        ns = await bk.namespace("racked", create=True, ensemble_size=4, write_quorum=2,
                                ack_quorum=2, rolling_entries=1,
                                placement_policy="rack-aware", enforce_placement=True)
        await ns.create_stream("s")
        await bk.create_ledger(1, 1, 1)  # the registry view (racks) is loaded
        locations = bk.bookie_locations()
        assert sorted(locations.values()) == ["/default-region/r1"] * 2 + [
            "/default-region/r2"] * 2

        def spans(ensemble: list[str]) -> bool:
            return write_set_spread(ensemble, 2, locations)[1] == 2

        # one writer rolls SEGMENTS times (one record per segment)...
        async with await ns.open_writer("s") as w:
            for i in range(SEGMENTS):
                await w.write(b"a %d" % i)
        # ...and a second client (random too) takes over and rolls as many more
        other = await cluster.client()
        async with await (await other.namespace("racked")).open_writer("s") as w:
            for i in range(SEGMENTS):
                await w.write(b"b %d" % i)
        ensembles = await segment_ensembles(bk, "racked", "s")
        assert len(ensembles) >= 2 * SEGMENTS
        assert all(spans(e) for e in ensembles), [e for e in ensembles if not spans(e)]
        assert bk.placement.fallbacks == other.placement.fallbacks == 0

        # the CLI: a namespace made rack-aware there, shown, and written by `write`
        uri = cluster.metadata_uri
        out = await asyncio.to_thread(
            stream_cli, uri, "create-namespace", "cli", "--ensemble-size", "4",
            "--write-quorum", "2", "--ack-quorum", "2", "--rolling-entries", "1",
            "--placement-policy", "rack-aware", "--min-racks-per-write-quorum", "2",
            "--enforce-placement")
        assert out == "created namespace cli\n"
        shown = await asyncio.to_thread(stream_cli, uri, "namespace-info", "cli", "--json")
        assert isinstance(shown, dict)
        assert {k: shown["config"][k] for k in ("placement_policy",
                                                "min_racks_per_write_quorum",
                                                "min_regions_per_write_quorum",
                                                "enforce_placement")} == {
            "placement_policy": "rack-aware", "min_racks_per_write_quorum": 2,
            "min_regions_per_write_quorum": None, "enforce_placement": True}
        for _ in range(2):  # each run a new writer, on a new segment
            await asyncio.to_thread(stream_cli, uri, "write", "cli", "t", "--create",
                                    stdin=b"".join(b"%d\n" % i for i in range(SEGMENTS)))
        text = await asyncio.to_thread(stream_cli, uri, "info", "cli", "t")
        assert "placement: policy rack-aware, min racks per write quorum 2, min regions " \
            "per write quorum the client's, enforce yes" in str(text)
        cli_ensembles = await segment_ensembles(bk, "cli", "t")
        assert len(cli_ensembles) >= 2
        assert all(spans(e) for e in cli_ensembles), cli_ensembles

        # ledgers created directly are the client's: random, not held to the racks
        one_rack = 0
        for _ in range(SEGMENTS):
            lh = await bk.create_ledger(4, 2, 2)
            assert lh.placement is bk.placement
            one_rack += not spans(list(lh.metadata.ensembles[0][1]))
            await lh.close()
        finding(f"namespace placement: {len(ensembles)} + {len(cli_ensembles)} segment "
                f"ensembles all span both racks; {one_rack} of {SEGMENTS} random E4 Qw2 "
                "ledgers had a write set in one rack")
