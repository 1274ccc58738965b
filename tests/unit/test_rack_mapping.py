"""Where bookies are, as a client maps them: the rack file's format (ids, hosts,
IPv6, comments, each error naming file:line), a rack script's output, the
precedence static > file > script > registered, and :class:`RackMapping` with real
files and real scripts (cached answers, batches of SCRIPT_HOSTS_MAX hosts, failures
and timeouts as warnings retried later, no secrets passed, no output logged, the
file re-read when it changes and kept when its new version is bad); the client
refusing a bad rack file before contacting anything, and the settings' checks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from asyncbk.client import bookies as bookies_module
from asyncbk.client import client as client_module
from asyncbk.client.bookies import (
    SCRIPT_ENV_HIDDEN,
    SCRIPT_HOSTS_MAX,
    BookieWatcher,
    RackMapping,
)
from asyncbk.client.client import BookKeeper
from asyncbk.clock import ManualClock
from asyncbk.config import ClientConfig, from_mapping
from asyncbk.errors import ConfigError
from asyncbk.meta.memory import MemoryMetadataStore
from asyncbk.net.etcd_security import PASSWORD_ENV
from asyncbk.net.security import TOKEN_ENV
from asyncbk.topology import (
    DEFAULT_LOCATION,
    RackFile,
    host_of,
    parse_rack_file,
    parse_script_output,
    resolve_locations,
)
from tests.meta_contract import reg

pytestmark = pytest.mark.usefixtures("loop_errors")

# ---------------------------------------------------------------- parse_rack_file


def test_rack_file_ids_hosts_comments_and_blank_lines() -> None:
    text = """
# rack file of the eu cluster
10.0.0.5:3181   /eu-west/r12     # this bookie only
10.0.0.5        /eu-west/r13
bookie-7.example.com /r7

\t10.0.0.6:3182 /eu-west/r12\t
"""
    rf = parse_rack_file(text, "racks.txt")
    assert rf.by_id == {"10.0.0.5:3181": "/eu-west/r12", "10.0.0.6:3182": "/eu-west/r12"}
    assert rf.by_host == {"10.0.0.5": "/eu-west/r13",
                          "bookie-7.example.com": "/default-region/r7"}
    # an id's line wins over its host's; a host alone matches every port
    assert rf.lookup("10.0.0.5:3181") == "/eu-west/r12"
    assert rf.lookup("10.0.0.5:3999") == "/eu-west/r13"
    assert rf.lookup("bookie-7.example.com:3181") == "/default-region/r7"
    assert rf.lookup("10.0.0.6:3181") is None  # listed with another port only
    assert rf.lookup("10.0.0.9:3181") is None
    # mapped: every id listed, and the given bookies the file maps
    assert rf.mapped(["10.0.0.5:4000", "10.0.0.9:3181"]) == {
        "10.0.0.5:3181": "/eu-west/r12", "10.0.0.6:3182": "/eu-west/r12",
        "10.0.0.5:4000": "/eu-west/r13"}


def test_rack_file_empty_and_comment_only() -> None:
    assert parse_rack_file("", "f") == RackFile()
    assert parse_rack_file("# nothing\n   \n#x y z\n", "f") == RackFile()


def test_rack_file_ipv6_bracketed_and_bare() -> None:
    rf = parse_rack_file("[::1]:3181 /v6/a\n"
                         "[fe80::2] /v6/b\n"
                         "2001:db8::5 /v6/c\n"
                         "::7 /v6/d\n", "f")
    assert rf.by_id == {"[::1]:3181": "/v6/a"}
    assert rf.by_host == {"fe80::2": "/v6/b", "2001:db8::5": "/v6/c", "::7": "/v6/d"}
    assert host_of("[fe80::2]:3181") == "fe80::2"
    assert rf.lookup("[::1]:3181") == "/v6/a"
    assert rf.lookup("[::1]:3182") is None
    assert rf.lookup("[fe80::2]:3181") == "/v6/b"
    assert rf.lookup("[2001:db8::5]:4181") == "/v6/c"
    assert rf.lookup("[::7]:1") == "/v6/d"


def test_rack_file_bracketed_and_bare_ipv6_host_are_the_same_key() -> None:
    assert parse_rack_file("[::1] /r1\n::1 /r1\n", "f").by_host == {"::1": "/default-region/r1"}
    with pytest.raises(ConfigError, match=r"^f:2: ::1 is given another location on line 1"):
        parse_rack_file("[::1] /r1\n::1 /r2\n", "f")


@pytest.mark.parametrize(("text", "message"), [
    ("10.0.0.5\n", r"^racks\.txt:1: expected two fields, <bookie-id or host> <location>, "
                   r"e\.g\. 10\.0\.0\.5:3181 /eu-west/r12; got 1$"),
    ("# c\n\n10.0.0.5 /r1 extra\n", r"^racks\.txt:3: expected two fields, .*; got 3$"),
    ("a:1 /r1\nb:1 eu/r2\n", r"^racks\.txt:2: a network location is an absolute path "
                             r"such as /region/rack or /rack, not 'eu/r2'$"),
    ("a:1 /eu/r1/x\n", r"^racks\.txt:1: a network location is /region/rack or /rack"),
    ("a:1 /eu/r 1\n", r"^racks\.txt:1: expected two fields"),
    ("a:1 /e*u/r1\n", r"^racks\.txt:1: a network location is /region/rack or /rack"),
    ("a:1 /r1\n\nb:1 /r2\na:1 /r3\n",
     r"^racks\.txt:4: a:1 is given another location on line 1; keep one of the two lines$"),
    ("h /r1\nh /eu/r1\n",
     r"^racks\.txt:2: h is given another location on line 1; keep one of the two lines$"),
    # keys that could never match a bookie
    ("a:1 /r1\nh:0 /r1\n", r"^racks\.txt:2: h:0 is not a bookie id or a host: port '0' is "
                            r"not a number from 1 to 65535; expected host:port or "
                            r"\[IPv6\]:port \(port 1-65535\), or a host alone"),
    ("h:99999 /r1\n", r"^racks\.txt:1: h:99999 is not a bookie id or a host: port '99999' "
                      r"is not a number from 1 to 65535; expected host:port"),
    ("h: /r1\n", r"^racks\.txt:1: h: is not a bookie id or a host: port '' is not a number"),
    ("h:x1 /r1\n", r"^racks\.txt:1: h:x1 is not a bookie id or a host: port 'x1'"),
    (":3181 /r1\n", r"^racks\.txt:1: :3181 is not a bookie id or a host: it has no host "
                    r"before the ':'; expected host:port"),
    ("[::1]:0 /r1\n", r"^racks\.txt:1: \[::1\]:0 is not a bookie id or a host: port '0'"),
    ("[::1]:70000 /r1\n", r"^racks\.txt:1: \[::1\]:70000 is not a bookie id or a host: "
                          r"port '70000'"),
    ("# x\n[::1 /r1\n", r"^racks\.txt:2: \[::1 is not a bookie id or a host: its brackets "
                        r"are unbalanced; expected host:port or \[IPv6\]:port"),
    ("::1] /r1\n", r"^racks\.txt:1: ::1\] is not a bookie id or a host: its brackets are "
                   r"unbalanced; expected"),
    ("[::1]]:1 /r1\n", r"^racks\.txt:1: \[::1\]\]:1 is not a bookie id or a host: its "
                       r"brackets are unbalanced"),
    ("[[::1]:1 /r1\n", r"^racks\.txt:1: \[\[::1\]:1 is not a bookie id or a host: its "
                       r"brackets are unbalanced"),
    ("[::1]3181 /r1\n", r"^racks\.txt:1: \[::1\]3181 is not a bookie id or a host: '3181' "
                        r"follows the closing bracket"),
    ("[] /r1\n", r"^racks\.txt:1: \[\] is not a bookie id or a host: it has nothing "
                 r"between its brackets"),
])
def test_rack_file_errors_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_rack_file(text, "racks.txt")


def test_rack_file_port_with_leading_zeros_is_the_bookie_ids_port() -> None:
    rf = parse_rack_file("h:03181 /r1\n[::1]:0080 /r2\n", "f")
    assert rf.by_id == {"h:3181": "/default-region/r1", "[::1]:80": "/default-region/r2"}
    assert rf.lookup("h:3181") == "/default-region/r1"
    assert rf.lookup("[::1]:80") == "/default-region/r2"
    with pytest.raises(ConfigError, match=r"^f:2: h:3181 is given another location on line 1"):
        parse_rack_file("h:03181 /r1\nh:3181 /r2\n", "f")


def test_rack_file_duplicate_with_the_same_location_is_accepted() -> None:
    # the same location, written as /r1 once and normalized once
    rf = parse_rack_file("a:1 /r1\nh /eu/r2\na:1 /default-region/r1\nh /eu/r2\n", "f")
    assert rf.by_id == {"a:1": "/default-region/r1"}
    assert rf.by_host == {"h": "/eu/r2"}
    # an id and its host are different keys: both allowed, the id wins for its port
    rf = parse_rack_file("h:1 /r1\nh /r2\n", "f")
    assert (rf.lookup("h:1"), rf.lookup("h:2")) == ("/default-region/r1", "/default-region/r2")


# ---------------------------------------------------------------- parse_script_output


def test_script_output_one_location_per_host_whitespace_separated() -> None:
    found, bad = parse_script_output("/eu/r1\n/r2  /us/r3\n", ["a", "b", "c"])
    assert found == {"a": "/eu/r1", "b": "/default-region/r2", "c": "/us/r3"}
    assert bad == []
    assert parse_script_output("", []) == ({}, [])


@pytest.mark.parametrize(("output", "hosts", "counts"), [
    ("/r1\n", ["a", "b"], "1 location(s) for 2 host(s)"),
    ("/r1 /r2 /r3\n", ["a", "b"], "3 location(s) for 2 host(s)"),
    ("", ["a"], "0 location(s) for 1 host(s)"),
])
def test_script_output_count_mismatch(output: str, hosts: list[str], counts: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"it printed {counts}")):
        parse_script_output(output, hosts)


def test_script_output_bad_answers_are_listed() -> None:
    found, bad = parse_script_output("/eu/r1 nowhere /a/b/c /us/r2 /x*y",
                                     ["a", "b", "c", "d", "e"])
    assert found == {"a": "/eu/r1", "d": "/us/r2"}
    assert bad == ["b", "c", "e"]


# ---------------------------------------------------------------- resolve_locations


def test_precedence_static_over_mapped_over_registered() -> None:
    registered = {"a:1": "/reg/a", "b:1": "/reg/b", "c:1": "/reg/c", "d:1": "not a location",
                  "e:1": ""}
    mapped = {"a:1": "/map/a", "b:1": "/map/b", "x:1": "/map/x"}
    static = {"a:1": "/static/a", "y:1": "/y"}
    assert resolve_locations(registered, static, mapped) == {
        "a:1": "/static/a", "b:1": "/map/b", "c:1": "/reg/c", "d:1": DEFAULT_LOCATION,
        "e:1": DEFAULT_LOCATION, "x:1": "/map/x", "y:1": "/default-region/y"}
    assert resolve_locations(registered)["b:1"] == "/reg/b"
    assert resolve_locations({"a:1": "/eu/r1/extra"}) == {"a:1": DEFAULT_LOCATION}


# ---------------------------------------------------------------- RackMapping: scripts


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def recording_script(tmp_path: Path, answer: str = 'echo "/eu/rack-$h"') -> tuple[str, Path]:
    """A script that appends its arguments (one line per run) to ``runs`` and prints
    ``answer`` for each host ``$h``; returns (its command, the runs file)."""
    runs = tmp_path / "runs"
    script = write_script(tmp_path / "racks.sh",
                          f'echo "$*" >> {shlex.quote(str(runs))}\n'
                          f'for h in "$@"; do {answer}; done\n')
    return shlex.quote(str(script)), runs


def runs_of(runs: Path) -> list[list[str]]:
    """The hosts of each run of a recording script."""
    return [line.split() for line in runs.read_text().splitlines()] if runs.exists() else []


def warnings(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["log_level"] == "warning"]


def pids_in(path: Path) -> list[int]:
    """The pids a script wrote to ``path``, one a line."""
    return [int(p) for p in path.read_text().split()] if path.exists() else []


async def eventually(check: Any, timeout_s: float = 5.0) -> None:
    """Wait until ``check()`` is true (polling; fails after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the condition never became true"
        await asyncio.sleep(0.01)


async def test_script_answers_are_cached_per_host(tmp_path: Path) -> None:
    command, runs = recording_script(tmp_path)
    mapping = RackMapping(script=command)
    got = await mapping.resolve(["h1:3181", "h2:3181", "h1:3182"])
    assert got == {"h1:3181": "/eu/rack-h1", "h2:3181": "/eu/rack-h2",
                   "h1:3182": "/eu/rack-h1"}
    assert runs_of(runs) == [["h1", "h2"]]  # each host once, whatever its ports
    assert await mapping.resolve(["h1:3181", "h2:3181", "h2:9"]) == {
        "h1:3181": "/eu/rack-h1", "h2:3181": "/eu/rack-h2", "h2:9": "/eu/rack-h2"}
    assert runs_of(runs) == [["h1", "h2"]]  # not run again
    assert (await mapping.resolve(["h3:3181", "h1:3181"]))["h3:3181"] == "/eu/rack-h3"
    assert runs_of(runs) == [["h1", "h2"], ["h3"]]  # only the new host asked
    assert mapping.mapped(["h2:1", "zz:1"]) == {"h2:1": "/eu/rack-h2"}  # no I/O: no run
    assert len(runs_of(runs)) == 2


async def test_script_asked_in_batches_of_at_most_100_hosts(tmp_path: Path) -> None:
    assert SCRIPT_HOSTS_MAX == 100
    command, runs = recording_script(tmp_path)
    hosts = [f"h{i:03}" for i in range(150)]
    got = await RackMapping(script=command).resolve([f"{h}:3181" for h in hosts])
    assert got == {f"{h}:3181": f"/eu/rack-{h}" for h in hosts}
    batches = runs_of(runs)
    assert [len(b) for b in batches] == [100, 50]
    assert sorted(batches[0] + batches[1]) == hosts


@pytest.mark.parametrize(("body", "reason"), [
    ("exit 3", "it exited with status 3"),
    ('for h in "$@"; do :; done; echo /r1', "it printed 1 location(s) for 2 host(s)"),
])
async def test_failed_script_warns_and_leaves_hosts_unmapped(tmp_path: Path, body: str,
                                                             reason: str) -> None:
    script = write_script(tmp_path / "racks.sh", body + "\n")
    with structlog.testing.capture_logs() as logs:
        mapping = RackMapping(script=str(script))
        assert await mapping.resolve(["a:1", "b:1"]) == {}
    [event] = warnings(logs)
    assert event["event"] == "rack script gave no location; using the default location for now"
    assert event["reason"] == reason
    assert event["hosts"] == 2 and event["retry_s"] == 60.0
    assert event["script"] == str(script)


async def test_script_bad_answer_for_one_host(tmp_path: Path) -> None:
    command, runs = recording_script(
        tmp_path, 'if [ "$h" = b ]; then echo "b-is-nowhere"; else echo "/eu/$h"; fi')
    with structlog.testing.capture_logs() as logs:
        mapping = RackMapping(script=command)
        assert await mapping.resolve(["a:1", "b:1", "c:1"]) == {"a:1": "/eu/a", "c:1": "/eu/c"}
    [event] = warnings(logs)
    assert event["hosts"] == 1
    assert event["reason"] == "its answer for these hosts is not a location"
    assert "b-is-nowhere" not in repr(logs)


async def test_script_that_cannot_be_run(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        mapping = RackMapping(script=str(tmp_path / "no-such-script"))
        assert await mapping.resolve(["a:1"]) == {}
    [event] = warnings(logs)
    assert event["reason"].startswith("it cannot be run: ")


async def test_failed_host_is_asked_again_after_the_retry_delay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bookies_module, "SCRIPT_RETRY_S", 0.2)
    ok = tmp_path / "ok"
    command, runs = recording_script(
        tmp_path, f"[ -e {shlex.quote(str(ok))} ] || exit 1; echo /eu/r1")
    mapping = RackMapping(script=command)
    with structlog.testing.capture_logs() as logs:
        assert await mapping.resolve(["a:1"]) == {}
        assert await mapping.resolve(["a:1"]) == {}  # within the delay: not asked
    assert runs_of(runs) == [["a"]]
    assert len(warnings(logs)) == 1
    ok.touch()
    await asyncio.sleep(0.25)
    assert await mapping.resolve(["a:1"]) == {"a:1": "/eu/r1"}
    assert runs_of(runs) == [["a"], ["a"]]
    assert await mapping.resolve(["a:1"]) == {"a:1": "/eu/r1"}  # now cached
    assert len(runs_of(runs)) == 2


@pytest.fixture
def leftover_pids(tmp_path: Path) -> Iterator[Path]:
    """A file where a script writes the pids of children it leaves behind; they are
    killed at the end of the test."""
    pids = tmp_path / "pids"
    yield pids
    if pids.exists():
        for line in pids.read_text().split():
            try:
                os.kill(int(line), signal.SIGKILL)
            except ProcessLookupError:
                pass


async def test_slow_script_is_killed_after_its_timeout(tmp_path: Path,
                                                       leftover_pids: Path) -> None:
    """The script's child keeps the output pipe open after the script is killed:
    resolve still returns once the timeout is over."""
    script = write_script(tmp_path / "slow.sh",
                          f"sleep 5 &\necho $! >> {shlex.quote(str(leftover_pids))}\nwait\n")
    with structlog.testing.capture_logs() as logs:
        mapping = RackMapping(script=str(script), script_timeout_s=0.3)
        started = time.monotonic()
        assert await mapping.resolve(["a:1", "b:2"]) == {}
        took = time.monotonic() - started
    assert 0.3 <= took < 2.0
    [event] = warnings(logs)
    assert event["reason"] == "it did not finish within 0.3 s (bookie_racks_script_timeout_s)"
    assert event["hosts"] == 2


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a killed orphan may stay a
    zombie for a while when nothing reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_timed_out_script_is_killed_with_its_children(tmp_path: Path,
                                                            leftover_pids: Path) -> None:
    """The script runs in a process group of its own, killed whole on timeout: a child
    it started in the background (which would outlive a kill of the script alone)
    dies too."""
    script = write_script(tmp_path / "slow.sh",
                          f"sleep 30 &\necho $! >> {shlex.quote(str(leftover_pids))}\nwait\n")
    with structlog.testing.capture_logs():
        mapping = RackMapping(script=str(script), script_timeout_s=0.5)
        assert await mapping.resolve(["a:1"]) == {}
    [pid] = pids_in(leftover_pids)
    await eventually(lambda: not alive(pid), 3.0)  # the script's child is gone


async def test_script_that_finishes_in_time_is_not_killed(tmp_path: Path) -> None:
    """A script that exits in time, having started a child that closes its output,
    is not killed (nor is the child): only a timeout kills."""
    pids = tmp_path / "pids"
    script = write_script(tmp_path / "quick.sh",
                          "sleep 30 >/dev/null 2>&1 &\n"
                          f"echo $! >> {shlex.quote(str(pids))}\n"
                          'for h in "$@"; do echo /r1; done\n')
    try:
        got = await RackMapping(script=str(script), script_timeout_s=5.0).resolve(["a:1"])
        assert got == {"a:1": "/default-region/r1"}
        [pid] = pids_in(pids)
        assert alive(pid)
    finally:
        for pid in pids_in(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_slow_script_does_not_block_the_event_loop(tmp_path: Path,
                                                         leftover_pids: Path) -> None:
    script = write_script(tmp_path / "slow.sh",
                          f"sleep 5 &\necho $! >> {shlex.quote(str(leftover_pids))}\nwait\n")
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        with structlog.testing.capture_logs():
            await RackMapping(script=str(script), script_timeout_s=0.4).resolve(["a:1"])
    finally:
        ticker.cancel()
    assert ticks >= 5  # the loop ran while the script did


async def test_script_does_not_get_the_secret_env_vars(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(SCRIPT_ENV_HIDDEN) == {TOKEN_ENV, PASSWORD_ENV}
    monkeypatch.setenv(TOKEN_ENV, "token-value-4711")
    monkeypatch.setenv(PASSWORD_ENV, "etcd-password-0815")
    monkeypatch.setenv("ASYNCBK_TEST_VISIBLE", "visible-value-42")
    env_out = tmp_path / "env"
    script = write_script(tmp_path / "env.sh",
                          f"env > {shlex.quote(str(env_out))}\n"
                          'for h in "$@"; do echo /r1; done\n')
    assert await RackMapping(script=str(script)).resolve(["a:1"]) == {"a:1": "/default-region/r1"}
    seen = env_out.read_text()
    assert "ASYNCBK_TEST_VISIBLE=visible-value-42" in seen  # the rest is passed
    assert "token-value-4711" not in seen and f"{TOKEN_ENV}=" not in seen
    assert "etcd-password-0815" not in seen and f"{PASSWORD_ENV}=" not in seen
    assert os.environ[TOKEN_ENV] == "token-value-4711"  # this process keeps its own


@pytest.mark.parametrize("body", [
    # a wrong count, the text on stdout and stderr
    'echo "SECRET-OUT-1 SECRET-OUT-2 SECRET-OUT-3"; echo SECRET-ERR >&2',
    # a non-location answer
    'for h in "$@"; do echo "SECRET-OUT-$h"; done; echo SECRET-ERR >&2',
    # a failure
    'echo SECRET-OUT; echo SECRET-ERR >&2; exit 9',
])
async def test_script_output_is_never_logged(tmp_path: Path, body: str) -> None:
    script = write_script(tmp_path / "racks.sh", body + "\n")
    with structlog.testing.capture_logs() as logs:
        assert await RackMapping(script=str(script)).resolve(["a:1", "b:1"]) == {}
    assert len(warnings(logs)) == 1
    assert "SECRET" not in repr(logs)


# ---------------------------------------------------------------- RackMapping: the file


async def test_load_refuses_a_missing_or_malformed_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.txt"
    with pytest.raises(ConfigError, match=re.escape(
            f"bookie_racks_file {missing} does not exist; create it or leave the setting "
            "empty")):
        await RackMapping(file=str(missing)).load()
    bad = tmp_path / "racks.txt"
    bad.write_text("a:1 /r1\nb:1 r2\n")
    with pytest.raises(ConfigError, match=re.escape(f"{bad}:2: a network location")):
        await RackMapping(file=str(bad)).load()
    # resolve() loads a file never loaded, with the same error
    with pytest.raises(ConfigError, match=re.escape(f"{bad}:2:")):
        await RackMapping(file=str(bad)).resolve(["a:1"])


async def test_file_is_re_read_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "racks.txt"
    path.write_text("h1 /eu/r1\n")
    mapping = RackMapping(file=str(path))
    await mapping.load()
    assert mapping.mapped(["h1:1"]) == {"h1:1": "/eu/r1"}
    assert await mapping.resolve(["h1:1", "h2:1"]) == {"h1:1": "/eu/r1"}
    path.write_text("h1 /eu/r22\nh2:1 /us/r1\n")  # another size
    assert await mapping.resolve(["h1:1", "h2:1"]) == {"h1:1": "/eu/r22", "h2:1": "/us/r1"}
    # the same size, only a later mtime
    st = path.stat()
    path.write_text("h1 /eu/r33\nh2:1 /us/r1\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    assert await mapping.resolve(["h1:1"]) == {"h1:1": "/eu/r33", "h2:1": "/us/r1"}


async def test_bad_new_file_keeps_the_old_content_and_warns_once(tmp_path: Path) -> None:
    path = tmp_path / "racks.txt"
    path.write_text("h1 /eu/r1\n")
    mapping = RackMapping(file=str(path))
    await mapping.load()
    path.write_text("h1 /eu/r2\nh2 /eu/r2 oops\n")
    with structlog.testing.capture_logs() as logs:
        assert await mapping.resolve(["h1:1", "h2:1"]) == {"h1:1": "/eu/r1"}
        assert await mapping.resolve(["h1:1"]) == {"h1:1": "/eu/r1"}  # still bad: no new warning
    [event] = warnings(logs)
    assert event["event"] == "rack file unusable, keeping its previous content"
    assert event["error"].startswith(f"{path}:2: expected two fields")
    path.write_text("h1 /eu/r3\n")  # fixed
    with structlog.testing.capture_logs() as logs:
        assert await mapping.resolve(["h1:1"]) == {"h1:1": "/eu/r3"}
    assert not warnings(logs)
    path.unlink()  # gone: the last good content stays, with a warning
    with structlog.testing.capture_logs() as logs:
        assert await mapping.resolve(["h1:1"]) == {"h1:1": "/eu/r3"}
    [event] = warnings(logs)
    assert "does not exist" in event["error"]


async def test_file_wins_over_script_and_the_script_is_not_asked(tmp_path: Path) -> None:
    path = tmp_path / "racks.txt"
    path.write_text("h1 /file/r1\nh3:1 /file/r3\n")
    command, runs = recording_script(tmp_path, 'echo "/script/$h"')
    mapping = RackMapping(str(path), command)
    got = await mapping.resolve(["h1:1", "h1:2", "h2:1", "h3:1", "h3:2"])
    assert got == {"h1:1": "/file/r1", "h1:2": "/file/r1", "h2:1": "/script/h2",
                   "h3:1": "/file/r3", "h3:2": "/script/h3"}
    # h3:2 is not in the file (only h3:1 is): its host is asked
    assert runs_of(runs) == [["h2", "h3"]]


async def test_watcher_locations_static_file_script_registered(tmp_path: Path) -> None:
    """End to end through the bookie watcher: static > file > script > registered."""
    path = tmp_path / "racks.txt"
    path.write_text("a:1 /file/a\nb /file/b\n")
    command, runs = recording_script(
        tmp_path, 'if [ "$h" = d ]; then echo "?"; else echo "/script/$h"; fi')
    store = MemoryMetadataStore("/t")
    try:
        lease = await store.grant_lease(30)
        for name in "abcde":
            await store.register_bookie(reg(f"{name}:1", rack=f"/reg/{name}"), lease)
        watcher = BookieWatcher(store, static_locations={"a:1": "/static/a"},
                                rack_mapping=RackMapping(str(path), command))
        with structlog.testing.capture_logs() as logs:
            got = await watcher.current_locations(5.0)
        assert got == {"a:1": "/static/a", "b:1": "/file/b", "c:1": "/script/c",
                       "d:1": "/reg/d", "e:1": "/script/e"}
        assert runs_of(runs) == [["c", "d", "e"]]
        assert len(warnings(logs)) == 1  # d's answer
        await watcher.close()
    finally:
        await store.close()


class Registered(list[str]):
    """A watcher's ``on_registered``: the bookies its registry watch delivered."""

    def __call__(self, bookie: str, session: Any) -> None:
        self.append(bookie)


async def watch_delivered(registered: Registered, bookie: str) -> None:
    """Wait until the watcher's registry watch has delivered its first view (with
    ``bookie``), which locates the bookies too: what changes after that is the refresh's."""
    await eventually(lambda: bookie in registered)


class CountingStore(MemoryMetadataStore):
    """An in-memory store that counts the views its bookie watches deliver."""

    views = 0

    async def watch_bookies(self) -> Any:
        async for view in super().watch_bookies():
            self.views += 1
            yield view


async def test_watcher_picks_up_rack_file_edits_without_registry_changes(
        tmp_path: Path) -> None:
    path = tmp_path / "racks.txt"
    path.write_text("a:1 /file/r1\n")
    store = CountingStore("/t")
    try:
        lease = await store.grant_lease(30)
        for name in "ab":
            await store.register_bookie(reg(f"{name}:1", rack=f"/reg/{name}"), lease)
        registered = Registered()
        watcher = BookieWatcher(store, registered, rack_mapping=RackMapping(str(path)), refresh_s=0.05)
        watcher.start()
        try:
            assert await watcher.current_locations(5.0) == {"a:1": "/file/r1", "b:1": "/reg/b"}
            await watch_delivered(registered, "a:1")
            assert store.views == 1
            path.write_text("a:1 /file/r2\nb /file/b\n")
            await eventually(lambda: watcher.locations() == {"a:1": "/file/r2",
                                                             "b:1": "/file/b"})
            assert await watcher.current_locations(5.0) == {"a:1": "/file/r2", "b:1": "/file/b"}
            assert store.views == 1  # no registry change did it
            path.write_text("")  # lines removed: back to the registered locations
            await eventually(lambda: watcher.locations() == {"a:1": "/reg/a", "b:1": "/reg/b"})
            assert store.views == 1
        finally:
            await watcher.close()
    finally:
        await store.close()


async def test_watcher_refresh_sleeps_on_its_clock(tmp_path: Path) -> None:
    path = tmp_path / "racks.txt"
    path.write_text("a:1 /file/r1\n")
    store = MemoryMetadataStore("/t")
    clock = ManualClock()
    try:
        await store.register_bookie(reg("a:1"), await store.grant_lease(30))
        registered = Registered()
        watcher = BookieWatcher(store, registered, rack_mapping=RackMapping(str(path)), refresh_s=30.0,
                                clock=clock)
        watcher.start()
        try:
            assert await watcher.current_locations(5.0) == {"a:1": "/file/r1"}
            await watch_delivered(registered, "a:1")
            path.write_text("a:1 /file/r2 # edited\n")
            await asyncio.sleep(0.2)
            assert watcher.locations() == {"a:1": "/file/r1"}  # not yet refreshed
            clock.advance(29.0)
            await asyncio.sleep(0.2)
            assert watcher.locations() == {"a:1": "/file/r1"}
            clock.advance(1.0)
            await eventually(lambda: watcher.locations() == {"a:1": "/file/r2"})
        finally:
            await watcher.close()
    finally:
        await store.close()


async def test_watcher_refresh_asks_the_script_again_for_failed_hosts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bookies_module, "SCRIPT_RETRY_S", 0.1)
    ok = tmp_path / "ok"
    command, runs = recording_script(
        tmp_path, f"[ -e {shlex.quote(str(ok))} ] || exit 1; echo /eu/r1")
    store = CountingStore("/t")
    try:
        await store.register_bookie(reg("a:1", rack="/reg/a"), await store.grant_lease(30))
        registered = Registered()
        watcher = BookieWatcher(store, registered, rack_mapping=RackMapping(script=command), refresh_s=0.05)
        watcher.start()
        try:
            with structlog.testing.capture_logs() as logs:
                assert await watcher.current_locations(5.0) == {"a:1": "/reg/a"}
                await watch_delivered(registered, "a:1")
            assert len(warnings(logs)) == 1
            assert store.views == 1
            ok.touch()
            await eventually(lambda: watcher.locations() == {"a:1": "/eu/r1"})
            assert store.views == 1
            assert runs_of(runs)[-1] == ["a"] and len(runs_of(runs)) >= 2
        finally:
            await watcher.close()
    finally:
        await store.close()


async def test_watcher_refresh_survives_errors_and_wakes_waiters(tmp_path: Path) -> None:
    path = tmp_path / "racks.txt"
    path.write_text("a:1 /file/r1\n")
    mapping = RackMapping(str(path))
    real_resolve = mapping.resolve
    failures = 0

    async def flaky_resolve(bookies: Any) -> dict[str, str]:
        nonlocal failures
        if failures < 3:
            failures += 1
            raise RuntimeError("mapping broke")
        return await real_resolve(bookies)

    store = MemoryMetadataStore("/t")
    try:
        await store.register_bookie(reg("a:1"), await store.grant_lease(30))
        registered = Registered()
        watcher = BookieWatcher(store, registered, rack_mapping=mapping, refresh_s=0.05)
        await watcher.use_rack_mapping(mapping)  # loads the file, locates what is known
        watcher.start()
        try:
            assert await watcher.current_locations(5.0) == {"a:1": "/file/r1"}
            await watch_delivered(registered, "a:1")
            mapping.resolve = flaky_resolve  # type: ignore[method-assign]
            path.write_text("a:1 /file/r2 # edited\n")
            with structlog.testing.capture_logs() as logs:
                await watcher.wait_for_change(5.0)  # woken by the location change
                assert watcher.locations() == {"a:1": "/file/r2"}
            assert failures == 3
            failed = [e for e in warnings(logs)
                      if e["event"] == "rack mapping refresh failed; trying again later"]
            assert len(failed) == 3
            assert failed[0]["error"] == "mapping broke" and failed[0]["retry_s"] == 0.05
            refresh = watcher._refresh_task
            assert refresh is not None and not refresh.done()
        finally:
            await watcher.close()
        assert refresh.cancelled()  # closed: cancelled and awaited
        assert watcher._refresh_task is None
    finally:
        await store.close()


async def test_watcher_without_mapping_has_no_refresh_task() -> None:
    store = MemoryMetadataStore("/t")
    try:
        watcher = BookieWatcher(store, refresh_s=0.01)
        watcher.start()
        assert watcher._refresh_task is None
        await watcher.close()
    finally:
        await store.close()


def test_watcher_refresh_interval_must_be_positive() -> None:
    store = MemoryMetadataStore("/t")
    with pytest.raises(ValueError, match="refresh_s must be > 0"):
        BookieWatcher(store, refresh_s=0)


async def test_client_refreshes_every_bookie_racks_refresh_s(tmp_path: Path) -> None:
    """BookKeeper passes bookie_racks_refresh_s to its watcher."""
    path = tmp_path / "racks.txt"
    path.write_text("a:1 /file/r1\n")
    store = MemoryMetadataStore("/t")
    config = ClientConfig(bookie_racks_file=str(path), bookie_racks_refresh_s=0.05)
    mapping = RackMapping.from_config(config)
    assert mapping is not None
    await mapping.load()
    bk = BookKeeper(store, config, rack_mapping=mapping)
    try:
        await store.register_bookie(reg("a:1"), await store.grant_lease(30))
        bk.bookies.start()
        assert (await bk.bookies.current_locations(5.0)) == {"a:1": "/file/r1"}
        path.write_text("a:1 /file/r2 # edited\n")
        await eventually(lambda: bk.bookie_locations() == {"a:1": "/file/r2"})
    finally:
        await bk.close()


def test_from_config() -> None:
    assert RackMapping.from_config(ClientConfig()) is None
    mapping = RackMapping.from_config(from_mapping(ClientConfig, {
        "bookie_racks_file": "/etc/racks", "bookie_racks_script": "topo.sh --dc 'eu west'",
        "bookie_racks_script_timeout_s": 2}))
    assert mapping is not None
    assert (mapping.file, mapping.script, mapping.script_timeout_s) == \
        ("/etc/racks", "topo.sh --dc 'eu west'", 2.0)
    only_script = RackMapping.from_config(ClientConfig(bookie_racks_script="topo.sh"))
    assert only_script is not None and only_script.file == ""


# ---------------------------------------------------------------- the client and settings


@pytest.mark.parametrize(("content", "message"), [
    (None, "does not exist"),
    ("10.0.0.5:3181 /eu/r1\n10.0.0.6:3181\n", r":2: expected two fields"),
])
async def test_connect_refuses_a_bad_rack_file_before_contacting_etcd(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None,
        message: str) -> None:
    path = tmp_path / "racks.txt"
    if content is not None:
        path.write_text(content)
    contacted: list[str] = []

    async def no_store(uri: str, **kwargs: Any) -> Any:
        contacted.append(uri)
        raise AssertionError("the metadata store was contacted")

    monkeypatch.setattr(client_module, "open_metadata_store", no_store)
    started = time.monotonic()
    with pytest.raises(ConfigError, match=message):
        await BookKeeper.connect("etcd://127.0.0.1:1/x", bookie_racks_file=str(path))
    assert time.monotonic() - started < 2.0
    assert contacted == []


@pytest.mark.parametrize(("values", "message"), [
    ({"bookie_racks_script": "topo.sh 'eu west"},
     r"bookie_racks_script: No closing quotation; quote it as a shell would"),
    ({"bookie_racks_script": "   "}, r"bookie_racks_script has no program to run"),
    ({"bookie_racks_script_timeout_s": 0}, r"bookie_racks_script_timeout_s must be > 0"),
    ({"bookie_racks_script_timeout_s": -1.5}, r"bookie_racks_script_timeout_s must be > 0"),
    ({"bookie_racks_file": 3}, r"'bookie_racks_file' must be str"),
    ({"bookie_racks_refresh_s": 0}, r"bookie_racks_refresh_s must be > 0"),
    ({"bookie_racks_refresh_s": -30}, r"bookie_racks_refresh_s must be > 0"),
])
def test_client_config_checks_the_rack_settings(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_mapping(ClientConfig, values)


def test_client_config_accepts_the_rack_settings() -> None:
    cfg = from_mapping(ClientConfig, {"bookie_racks_file": "racks.txt",
                                      "bookie_racks_script": "/usr/bin/topo --zone 'a b'",
                                      "bookie_racks_script_timeout_s": 0.5})
    assert (cfg.bookie_racks_file, cfg.bookie_racks_script_timeout_s) == ("racks.txt", 0.5)
    assert ClientConfig().bookie_racks_refresh_s == 30.0
    assert from_mapping(ClientConfig, {"bookie_racks_refresh_s": 5}).bookie_racks_refresh_s == 5.0
