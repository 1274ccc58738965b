"""The README as a test: its Python examples run against a real cluster, and every
command (and option) its Commands table names exists.  (The Spark example runs in
tests/spark/test_readme_spark.py, beside the other Spark tests.)"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncbk.testing import LocalCluster

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SNIPPET_TIMEOUT_S = 120
# asyncio.run(main("etcd://...")) -- the URI literal a reader replaces with their own
RUN_MAIN = re.compile(r"""(asyncio\.run\(\s*main\(\s*)(["'])etcd://[^"']*\2""")


@dataclass(frozen=True)
class Block:
    section: str
    code: str


def python_blocks(text: str) -> list[Block]:
    """Every ```python block of ``text``, with the ``##`` section it is in."""
    blocks, section, code = [], "", None
    for line in text.splitlines():
        if code is None:
            if line.startswith("## "):
                section = line[3:].strip()
            elif line.strip() == "```python":
                code = []
        elif line.strip() == "```":
            blocks.append(Block(section, "\n".join(code) + "\n"))
            code = None
        else:
            code.append(line)
    return blocks


def runnable_blocks() -> list[Block]:
    """The examples a reader runs against a cluster: blocks defining ``async def main(uri``."""
    return [b for b in python_blocks(README.read_text()) if "async def main(uri" in b.code]


def test_readme_has_a_runnable_example() -> None:
    blocks = runnable_blocks()
    assert any(b.section == "The client in 15 lines" for b in blocks), \
        [b.section for b in blocks]


def test_every_python_example_is_run_by_a_test() -> None:
    """Each ```python block is a runnable example here, or the Spark one (run by the
    Spark tests): none is left untested."""
    untested = [b.section for b in python_blocks(README.read_text())
                if b not in runnable_blocks() and b.section != "Spark"]
    assert untested == []


def test_the_client_in_15_lines_is_15_lines() -> None:
    (block,) = [b for b in runnable_blocks() if b.section == "The client in 15 lines"]
    assert len(block.code.strip().splitlines()) <= 15


def _with_uri(code: str, uri: str) -> str:
    """The example as written, with its URI literal replaced by ``uri``."""
    new, n = RUN_MAIN.subn(lambda m: f'{m.group(1)}"{uri}"', code)
    assert n == 1, "a runnable README example ends with asyncio.run(main(\"etcd://...\"))"
    return new


@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda b: b.section)
async def test_readme_example_runs(block: Block, tmp_path: Path) -> None:
    async with LocalCluster(bookies=3, data_dir=tmp_path / "cluster") as cluster:
        code = _with_uri(block.code, cluster.metadata_uri)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, cwd=tmp_path, env=cluster.child_env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            async with asyncio.timeout(SNIPPET_TIMEOUT_S):
                out, err = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, err.decode()
        lines = out.decode().splitlines()
        assert lines, "the example printed nothing"
        if block.section == "Streams in 10 lines":
            assert lines == [f"1:0:{i} {i} b'order {i}'" for i in range(100)]
            bk = await cluster.client()
            info = await (await bk.namespace("orders")).stream_info("eu")
            assert [s.state for s in info.segments] == ["completed"]  # closed by the with
            assert info.segments[0].records == 100
        if block.section == "The client in 15 lines":
            assert len(lines) == 1000
            assert lines[0] == "0 b'event 0'"
            assert lines[-1] == "999 b'event 999'"
            assert lines == [f"{i} b'event {i}'" for i in range(1000)]
            bk = await cluster.client()  # the ledger it wrote is really there, sealed
            ids = [lid async for lid in bk.list_ledgers()]
            assert len(ids) == 1
            md = await bk.ledger_metadata(ids[0])
            assert (md.state.value, md.last_entry_id, md.custom) == ("CLOSED", 999,
                                                                      {"app": b"demo"})


def test_snippet_uri_replacement_is_exact() -> None:
    code = 'x = 1\nasyncio.run(main("etcd://127.0.0.1:2379/asyncbk"))   # comment\n'
    assert _with_uri(code, "etcd://h:1/r") == \
        'x = 1\nasyncio.run(main("etcd://h:1/r"))   # comment\n'


# ---------------------------------------------------------------- the Commands table


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def _command_words(snippet: str) -> list[str]:
    """``asyncbk bench read --mode x`` -> ``["bench", "read"]``."""
    words = []
    for token in snippet.split()[1:]:
        if not re.fullmatch(r"[a-z][a-z-]*", token):
            break
        words.append(token)
    return words


def readme_commands() -> dict[tuple[str, ...], set[str]]:
    """Each command named in the README's Commands table (in code spans starting with
    ``asyncbk``, and the shell subcommands its row lists), with the options shown."""
    table = _section(README.read_text(), "Commands")
    commands: dict[tuple[str, ...], set[str]] = {}
    for row in table.splitlines():
        if not row.startswith("| `asyncbk"):
            continue
        for span in re.findall(r"`([^`]+)`", row.replace("\\|", "|")):
            if span.startswith("asyncbk "):
                words = tuple(_command_words(span))
                options = commands.setdefault(words, set())
                after = span.split()[1 + len(words):]
                if not (after and after[0].isupper()):  # `asyncbk shell COMMAND --x`: the
                    options.update(re.findall(r"--[a-z][a-z-]*", span))  # subcommand's
        if row.startswith("| `asyncbk shell "):
            description = row.split("|")[2]
            for name in re.findall(r"`([a-z_]+)(?: [A-Z_]+)?`", description):
                commands.setdefault(("shell", name), set())
    return commands


def test_readme_names_the_commands() -> None:
    commands = readme_commands()
    for expected in [("standalone",), ("bookie",), ("autorecovery",), ("bench", "write"),
                     ("bench", "read"), ("shell",), ("shell", "listbookies"),
                     ("shell", "deleteledger")]:
        assert expected in commands, sorted(commands)


@pytest.mark.parametrize("command", sorted(readme_commands()), ids=" ".join)
def test_readme_command_has_help_and_its_options(command: tuple[str, ...]) -> None:
    r = subprocess.run([sys.executable, "-m", "asyncbk", *command, "--help"],
                       capture_output=True, text=True, timeout=60,
                       env={**LocalCluster().child_env(), "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: asyncbk " + " ".join(command))
    for option in sorted(readme_commands()[command]):
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", r.stdout), \
            f"README shows {option} for asyncbk {' '.join(command)}; its --help does not"


async def test_readme_local_cluster_line_runs() -> None:
    """The README's one-line LocalCluster example, with the import it names."""
    text = README.read_text()
    assert "from asyncbk.testing import LocalCluster" in text
    (line,) = re.findall(r"`(async with LocalCluster\([^`\n]*)`", text)
    namespace: dict[str, object] = {}
    exec("from asyncbk.testing import LocalCluster\n"
         f"async def example():\n    {line}; return [i async for i in bk.list_ledgers()]\n",
         namespace)
    assert await namespace["example"]() == []  # type: ignore[operator]
