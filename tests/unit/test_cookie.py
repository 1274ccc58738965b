"""Cookies over several directories, and ledger directories appended to a bookie
(``allow_storage_expansion``), including an expansion interrupted at each step."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncbk.bookie.cookie import COOKIE_FILE, Cookie, check_or_format
from asyncbk.errors import CookieError
from asyncbk.meta.memory import MemoryMetadataStore

BOOKIE = "127.0.0.1:3181"


def dirs(root: Path, *names: str) -> list[Path]:
    return [root / n for n in names]


def local(d: Path) -> Cookie:
    return Cookie.from_bytes((d / COOKIE_FILE).read_bytes(), str(d))


async def remote(meta: MemoryMetadataStore) -> Cookie:
    stored = await meta.read_cookie(BOOKIE)
    assert stored is not None
    return Cookie.from_bytes(stored[0], "store")


async def test_several_directories_are_recorded_in_order(tmp_path: Path) -> None:
    meta = MemoryMetadataStore()
    j, ls = dirs(tmp_path, "j"), dirs(tmp_path, "a", "b")
    c = await check_or_format(meta, BOOKIE, j, ls)
    assert c.ledger_dir == f"{tmp_path / 'a'},{tmp_path / 'b'}"
    assert all(local(d) == c for d in j + ls) and await remote(meta) == c
    assert await check_or_format(meta, BOOKIE, j, ls) == c  # the same again: starts
    with pytest.raises(CookieError, match="different settings"):
        await check_or_format(meta, BOOKIE, j, ls[::-1])  # order matters
    with pytest.raises(CookieError, match="different settings"):
        await check_or_format(meta, BOOKIE, j, ls[:1], allow_expansion=True)  # one removed


async def test_an_appended_directory_needs_the_option(tmp_path: Path) -> None:
    meta = MemoryMetadataStore()
    j, ls = dirs(tmp_path, "j"), dirs(tmp_path, "a", "b")
    old = await check_or_format(meta, BOOKIE, j, ls)
    more = ls + dirs(tmp_path, "c")
    with pytest.raises(CookieError, match="--allow-storage-expansion"):
        await check_or_format(meta, BOOKIE, j, more)
    assert await remote(meta) == old and not (tmp_path / "c" / COOKIE_FILE).exists()
    new = await check_or_format(meta, BOOKIE, j, more, allow_expansion=True)
    assert new.ledger_dir.endswith(f",{tmp_path / 'c'}")
    assert await remote(meta) == new and all(local(d) == new for d in j + more)
    assert await check_or_format(meta, BOOKIE, j, more) == new  # recorded: no option needed


async def test_a_new_directory_must_be_empty_and_journals_cannot_change(tmp_path: Path) -> None:
    meta = MemoryMetadataStore()
    j, ls = dirs(tmp_path, "j"), dirs(tmp_path, "a")
    await check_or_format(meta, BOOKIE, j, ls)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "stray").write_text("x")
    with pytest.raises(CookieError, match="holds files but no cookie"):
        await check_or_format(meta, BOOKIE, j, ls + dirs(tmp_path, "c"), allow_expansion=True)
    other = MemoryMetadataStore()  # another cluster's bookie directory
    await check_or_format(other, BOOKIE, dirs(tmp_path, "oj"), dirs(tmp_path, "d"))
    with pytest.raises(CookieError, match="holds another cookie"):
        await check_or_format(meta, BOOKIE, j, ls + dirs(tmp_path, "d"), allow_expansion=True)
    with pytest.raises(CookieError, match="different settings"):
        await check_or_format(meta, BOOKIE, j + dirs(tmp_path, "j2"),
                              ls + dirs(tmp_path, "e"), allow_expansion=True)


@pytest.mark.parametrize("stopped_after", ["new directories", "metadata store"])
async def test_an_interrupted_expansion_is_finished_by_the_next_start(
        tmp_path: Path, stopped_after: str) -> None:
    meta = MemoryMetadataStore()
    j, ls = dirs(tmp_path, "j"), dirs(tmp_path, "a")
    old = await check_or_format(meta, BOOKIE, j, ls)
    more = ls + dirs(tmp_path, "b")
    new = Cookie(old.bookie_id, old.instance_id, old.journal_dir,
                 f"{old.ledger_dir},{tmp_path / 'b'}")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / COOKIE_FILE).write_bytes(new.to_bytes())  # step 1 done
    if stopped_after == "metadata store":  # step 2 done too; old directories not rewritten
        stored = await meta.read_cookie(BOOKIE)
        assert stored is not None
        await meta.write_cookie(BOOKIE, new.to_bytes(), stored[1])
    with pytest.raises(CookieError):
        await check_or_format(meta, BOOKIE, j, more)  # without the option: refused
    assert await check_or_format(meta, BOOKIE, j, more, allow_expansion=True) == new
    assert await remote(meta) == new and all(local(d) == new for d in j + more)
