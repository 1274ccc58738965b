"""The ``asyncbk`` command line's shape and what its commands share
(``asyncbk.cli.common``), without a cluster: ``main`` dispatches to one module per
command, errors are one line with their exit code, the terminal helpers, the ledger
locks of the commands that change ledgers."""

from __future__ import annotations

import argparse
import asyncio
import os
import pty
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from asyncbk.cli import bench_args, common, main
from asyncbk.cli.common import CliError
from asyncbk.errors import ConfigError, NoSuchLedgerError
from asyncbk.meta.memory import LEASE_ID_FIRST, MemoryMetadataStore


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_main_registers_each_command_from_its_own_module() -> None:
    """Every command is registered by its module under the name main dispatches on, in
    the order --help lists them; the README's commands are all there."""
    parser = main.build_parser()
    names = list(_subcommands(parser))
    assert names == list(main.COMMANDS) == ["standalone", "bookie", "autorecovery", "offload",
                                            "bench", "stream", "shell"]
    for name, module in main.COMMANDS.items():
        sub = argparse.ArgumentParser(prog="asyncbk").add_subparsers(parser_class=common.Parser)
        assert module.add_parser(sub).prog == f"asyncbk {name}"
        assert list(sub.choices) == [name]


def test_main_dispatches_to_the_command_module(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[argparse.Namespace] = []

    def run(args: argparse.Namespace) -> int:
        seen.append(args)
        return 7

    monkeypatch.setattr(main.standalone, "run", run)
    with pytest.raises(SystemExit) as exit_:
        main.main(["standalone", "--bookies", "2"])
    assert exit_.value.code == 7
    assert seen[0].command == "standalone" and seen[0].bookies == 2


@pytest.mark.parametrize("error", [CliError("no such thing"), ConfigError("no such thing"),
                                   NoSuchLedgerError("no such thing"), OSError("no such thing"),
                                   ValueError("no such thing")])
def test_a_command_error_is_one_line_and_exit_code_1(error: Exception,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    with pytest.raises(SystemExit) as exit_, common.one_line_errors("asyncbk shell"):
        raise error
    assert exit_.value.code == common.EXIT_ERROR == 1
    assert capsys.readouterr().err == f"asyncbk shell: error: {error}\n"


def test_ctrl_c_exits_130_and_a_bug_keeps_its_traceback() -> None:
    with pytest.raises(SystemExit) as exit_, common.one_line_errors("asyncbk"):
        raise KeyboardInterrupt
    assert exit_.value.code == common.EXIT_INTERRUPTED == 130
    with pytest.raises(KeyError), common.one_line_errors("asyncbk"):
        raise KeyError("a bug")


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main.main([])
    assert exit_.value.code == common.EXIT_USAGE == 2
    assert "COMMAND" in capsys.readouterr().out


def test_a_usage_error_names_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main.main(["standalone", "--etcd-port", "70000"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("asyncbk standalone: error: argument --etcd-port: port "
                                       "must be in 1..65535, got 70000 (see asyncbk standalone "
                                       "--help)\n")


@pytest.mark.parametrize(("argv", "prog"), [
    (["stream", "list", "--metadata-uri", "etcd://h:1/r", "orders", "--bogus"],
     "asyncbk stream list"),
    (["shell", "listbookies", "--metadata-uri", "etcd://h:1/r", "--bogus"],
     "asyncbk shell listbookies"),
    (["standalone", "--bogus"], "asyncbk standalone"),
    (["--bogus"], "asyncbk"),
])
def test_an_unknown_argument_names_its_own_commands_help(
        argv: list[str], prog: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main.main(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (f"{prog}: error: unrecognized arguments: --bogus "
                                       f"(see {prog} --help)\n")


def test_bench_without_a_workload_says_which(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main.main(["bench"])
    assert exit_.value.code == 1
    assert "choose a workload: asyncbk bench write --help" in capsys.readouterr().err
    workloads = _subcommands(_subcommands(main.build_parser())["bench"])
    assert tuple(workloads) == bench_args.WORKLOADS


@pytest.mark.parametrize(("kind", "text", "expect"), [
    (common.positive_int, "0", "must be >= 1, got 0"),
    (common.non_negative_int, "x", "expected a whole number, got 'x'"),
    (common.positive_float, "0", "must be > 0, got 0"),
    (common.non_negative_float, "-0.5", "must be >= 0, got -0.5"),
    (common.port, "0", "port must be in 1..65535, got 0"),
    (common.port, "http", "expected a port number, got 'http'"),
    (bench_args.id_list, "1,x", "expected ids separated by commas, got '1,x'"),
])
def test_argument_types_refuse_bad_values(kind: Any, text: str, expect: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=expect):
        kind(text)


def test_argument_types_accept_good_values() -> None:
    assert common.positive_int("3") == 3
    assert common.non_negative_float("0") == 0.0
    assert common.port("65535") == 65535
    assert bench_args.id_list("4,,9") == [4, 9]


def test_defaults_formatter_shows_defaults_not_twice() -> None:
    p = argparse.ArgumentParser(formatter_class=common.DefaultsFormatter)
    p.add_argument("--a", default=5, help="some a")
    p.add_argument("--b", default=6, help="some b (default 6)")
    p.add_argument("--c", help="some c")
    text = " ".join(p.format_help().split())
    assert "some a (default: 5)" in text
    assert "some b (default 6)" in text and "(default: 6)" not in text
    assert "some c --" not in text and "some c (default" not in text


def test_placement_options_are_checked_and_the_rack_file_read(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    common.add_client_placement_options(p)
    assert common.client_placement_options(p.parse_args([])) == {}
    args = p.parse_args(["--placement-policy", "rack-aware", "--min-racks-per-write-quorum",
                         "3"])
    assert common.client_placement_options(args) == {"placement_policy": "rack-aware",
                                                       "min_racks_per_write_quorum": 3}
    missing = p.parse_args(["--bookie-racks-file", str(tmp_path / "none")])
    assert common.client_placement_options(missing) == {
        "bookie_racks_file": str(tmp_path / "none")}  # not read unless asked
    with pytest.raises(ConfigError, match="does not exist; create it or leave out"):
        common.client_placement_options(missing, read_file=True)
    bad = tmp_path / "racks"
    bad.write_text("127.0.0.1 /r1\nnot a line at all\n")
    with pytest.raises(ConfigError, match=f"{bad}:2"):
        common.client_placement_options(p.parse_args(["--bookie-racks-file", str(bad)]),
                                        read_file=True)


async def test_require_cluster_refuses_a_root_where_no_cluster_lives() -> None:
    bk = SimpleNamespace(meta=MemoryMetadataStore("/nothing-here"))
    with pytest.raises(CliError, match="no asyncbk cluster at etcd://h:1/nothing-here: no "
                       "bookie ever started under root '/nothing-here'"):
        await common.require_cluster(bk, "etcd://h:1/nothing-here")
    await bk.meta.get_or_create_instance_id()  # what the first bookie does
    await common.require_cluster(bk, "etcd://h:1/nothing-here")


class _Terminal:
    """A pseudo-terminal as stdin: what is typed on it is read by the command."""

    def __init__(self) -> None:
        self.primary, secondary = pty.openpty()
        self.stdin = os.fdopen(secondary, "r")

    def type(self, text: str) -> None:
        os.write(self.primary, text.encode())

    def close(self) -> None:
        self.stdin.close()
        os.close(self.primary)


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Any:
    t = _Terminal()
    monkeypatch.setattr(sys, "stdin", t.stdin)
    yield t
    t.close()


@pytest.mark.parametrize(("answer", "goes_on"), [("yes\n", True), (" YES \n", True),
                                                  ("no\n", False), ("y\n", False)])
async def test_confirm_goes_on_only_on_yes(terminal: _Terminal, answer: str, goes_on: bool,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    terminal.type(answer)
    confirming = common.confirm("delete it?", no_terminal="no terminal", declined="kept it")
    if goes_on:
        await confirming
    else:
        with pytest.raises(CliError, match="^kept it$"):
            await confirming
    assert capsys.readouterr().out == "delete it? This cannot be undone. Type yes to delete: "


async def test_confirm_without_a_terminal_refuses_at_once(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    read, write = os.pipe()
    os.write(write, b"yes\n")
    with os.fdopen(read) as pipe:
        monkeypatch.setattr(sys, "stdin", pipe)
        with pytest.raises(CliError, match="^add --force$"):
            await common.confirm("delete it?", no_terminal="add --force", declined="kept")
    os.close(write)
    assert capsys.readouterr().out == ""


async def test_read_line_leaves_the_loop_running(terminal: _Terminal) -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    try:
        asyncio.get_running_loop().call_later(0.1, terminal.type, "hello\n")
        assert await asyncio.wait_for(common.read_line(sys.stdin), 5) == "hello\n"
        assert ticks >= 5  # the loop ran while the line was awaited
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)


def test_progress_is_throttled_and_ends_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    report = common.progress("ledger 3")
    for done in range(1, 11):
        report(done, 10)
    err = capsys.readouterr().err
    assert err == "\rledger 3: 1/10 entries copied\rledger 3: 10/10 entries copied\n"


async def test_ledger_locks_one_holder_at_a_time_then_released() -> None:
    meta = MemoryMetadataStore("/c")
    bk = SimpleNamespace(meta=meta, config=SimpleNamespace(metadata_timeout_s=5.0))
    async with common.LedgerLocks(bk, "shell-a") as a, common.LedgerLocks(bk, "shell-b") as b:
        async with a.hold(7) as holder:
            assert holder is None
            assert await meta.lock_holder("ledger-7") == "shell-a"
            async with b.hold(7) as other:
                assert other == "shell-a"  # b must leave ledger 7 alone
            async with b.hold(8) as free:
                assert free is None
        assert await meta.lock_holder("ledger-7") is None
        leases = [LEASE_ID_FIRST, LEASE_ID_FIRST + 1]  # a's and b's, the first granted
        assert all(meta.state.lease_alive(lease) for lease in leases)
    # revoked on exit, not left to expire after a TTL
    assert not any(meta.state.lease_alive(lease) for lease in leases)


async def test_ledger_locks_disabled_for_a_dry_run_take_nothing() -> None:
    meta = MemoryMetadataStore("/c")
    bk = SimpleNamespace(meta=meta, config=SimpleNamespace(metadata_timeout_s=5.0))
    async with common.LedgerLocks(bk, "shell-dry", enabled=False) as locks, \
            locks.hold(7) as holder:
        assert holder is None
        assert await meta.lock_holder("ledger-7") is None
