"""Cookies: the bookie's identity, bound to its directories.

A cookie records the bookie id, the cluster instance id and the (absolute)
journal and ledger directories.  It is stored in the metadata store
(``<root>/cookies/<bookie id>``) and as ``COOKIE`` in each directory.

Why: a bookie whose disk was wiped or swapped must not start and answer "no
such entry" for data it once acknowledged; during recovery such answers
could close a ledger short (invariant 6).  So:

* nothing anywhere, directories empty  -> a new bookie: format (write all cookies);
* every copy present and equal         -> start;
* anything else                        -> refuse, with a message saying what
  differs and what the operator can do.

The cookie files are read and written through the storage's file seam
(:class:`~.fileio.FileIO`, blocking calls run through an :class:`~.fileio.Offload`),
so the simulator checks cookies on its simulated disks as the bookie does on real
ones.  The directory lock (:class:`DirectoryLock`) is the seam's other half: a
bookie takes it through a factory (:data:`DirectoryLocker`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from ..errors import CookieError
from ..meta.api import BookieRegistry, CookieStore
from .fileio import OS_FILE_IO, THREAD_OFFLOAD, FileIO, Offload

COOKIE_FILE = "COOKIE"
LOCK_FILE = "LOCK"
COOKIE_FORMAT = 1


@dataclass(frozen=True)
class Cookie:
    bookie_id: str
    instance_id: str
    journal_dir: str
    ledger_dir: str
    format: int = COOKIE_FORMAT

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Cookie:
        try:
            d = json.loads(data)
            return cls(**d)
        except (ValueError, TypeError) as exc:
            raise CookieError(f"cookie in {where} is unreadable ({exc}); the bookie refuses "
                              "to start on directories it cannot identify") from None


class DirectoryLock:
    """An exclusive ``flock`` on ``<dir>/LOCK`` for each directory, held while the
    bookie runs: a second bookie process on the same directories refuses to start
    instead of recovering (and rewriting) storage under the running one."""

    def __init__(self, *directories: Path) -> None:
        self._dirs = directories
        self._fds: list[int] = []

    def acquire(self) -> None:
        import fcntl

        try:
            for d in self._dirs:
                d.mkdir(parents=True, exist_ok=True)
                fd = os.open(d / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
                self._fds.append(fd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise CookieError(
                        f"{d} is in use by another running bookie process; stop it first "
                        "(two processes must never share a bookie's directories)") from None
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)  # closing the descriptor drops the lock


class HeldLock(Protocol):
    """Directories locked for this process (:class:`DirectoryLock`)."""

    def acquire(self) -> None:
        """Take the lock (blocking); CookieError if another process holds it."""
        ...

    def release(self) -> None: ...


DirectoryLocker = Callable[[Sequence[Path]], HeldLock]
"""Makes the lock of a bookie's directories (the OS's: :func:`os_directory_lock`)."""


def os_directory_lock(directories: Sequence[Path]) -> HeldLock:
    """A :class:`DirectoryLock` (``flock``) on ``directories``."""
    return DirectoryLock(*directories)


def _dir_has_data(io: FileIO, path: Path) -> bool:
    try:
        names = io.list_dir(path)
    except FileNotFoundError:
        return False
    return any(name not in (COOKIE_FILE, LOCK_FILE) for name, _ in names)


def _read_local(io: FileIO, path: Path) -> Cookie | None:
    f = path / COOKIE_FILE
    try:
        data = io.read_file(f)
    except FileNotFoundError:
        return None
    return Cookie.from_bytes(data, str(f))


def write_local_cookie(io: FileIO, path: Path, cookie: Cookie) -> None:
    """``path/COOKIE`` replaced atomically and durably (a temporary file, fdatasync,
    rename, directory fsync)."""
    io.makedirs(path)
    tmp = path / (COOKIE_FILE + ".tmp")
    fd = io.create(tmp, exclusive=False)
    try:
        io.write(fd, cookie.to_bytes())
        io.fdatasync(fd)
    finally:
        io.close(fd)
    io.replace(tmp, path / COOKIE_FILE)
    io.fsync_dir(path)


def _write_all(io: FileIO, directories: Sequence[Path], cookie: Cookie) -> None:
    for d in directories:
        write_local_cookie(io, d, cookie)


class CookieMetadata(CookieStore, BookieRegistry, Protocol):
    """What the cookie check uses of the metadata store: the cookies, and the registry
    (to tell a live bookie with the same id from a dead one)."""


async def _missing_local_cookie(meta: BookieRegistry, bookie_id: str, d: Path) -> str:
    """Why a bookie with a registered cookie but none in ``d`` refuses to start, and
    what to do.  Deleting the cookie is advised only while no bookie with this id is
    registered: never against a live bookie."""
    problem = (f"bookie {bookie_id} has a cookie in the metadata store, but {d} has none: "
               f"its disk was wiped or replaced, or this is not its directory, and serving "
               f"from it could lose acknowledged entries.")
    if bookie_id in await meta.list_bookies():
        return (f"{problem} A bookie with id {bookie_id} is registered right now: if it "
                f"runs, leave it alone and give this one its own --port and directories; if "
                f"it died moments ago, wait until its registration expires and check the "
                f"directories again.")
    return (f"{problem} First check that the directories are right (a typo, an unmounted "
            f"disk). Only if its data is really gone or unwanted: re-replicate its ledgers "
            f"(`asyncbk shell recover --metadata-uri URI {bookie_id}`), then remove its identity with `asyncbk "
            f"shell bookieformat --metadata-uri URI --bookie-id {bookie_id} --delete-cookie "
            f"--force` and start it again.")


def _differences(a: Cookie, b: Cookie) -> str:
    other = asdict(b)
    return ", ".join(k for k, v in asdict(a).items() if other[k] != v)


def _dirs(value: str) -> list[str]:
    return value.split(",") if value else []


def _expands(old: Cookie, new: Cookie) -> bool:
    """``new`` is ``old`` with ledger directories appended (nothing else changed)."""
    before, after = _dirs(old.ledger_dir), _dirs(new.ledger_dir)
    return (old.bookie_id == new.bookie_id and old.instance_id == new.instance_id
            and old.format == new.format and old.journal_dir == new.journal_dir
            and len(before) < len(after) and after[:len(before)] == before)


async def check_or_format(
    meta: CookieMetadata, bookie_id: str, journal_dirs: Sequence[Path],
    ledger_dirs: Sequence[Path], *, allow_expansion: bool = False, log: Any = None,
    io: FileIO = OS_FILE_IO, offload: Offload = THREAD_OFFLOAD,
    resolve: Callable[[Path], Path] = Path.resolve,
) -> Cookie:
    """Verify (or, for a brand-new bookie, create) the cookies; raises CookieError.

    Several directories are recorded comma-separated, in order.  With
    ``allow_expansion``, ledger directories appended to the recorded ones (empty,
    or holding this very cookie from an interrupted expansion) are accepted and the
    cookies rewritten: first in the new directories, then in the metadata store
    (compare-and-set), then in the old directories; a crash between the steps is
    finished by the next start with the same option.

    Files are read and written on ``io`` through ``offload``; ``resolve`` makes a
    directory absolute (blocking, run through ``offload`` too)."""
    journal_dirs, ledger_dirs = await offload.run(
        lambda: ([resolve(d) for d in journal_dirs], [resolve(d) for d in ledger_dirs]))
    instance_id = await meta.get_or_create_instance_id()
    expected = Cookie(bookie_id, instance_id, ",".join(map(str, journal_dirs)),
                      ",".join(map(str, ledger_dirs)))
    every = [*journal_dirs, *ledger_dirs]

    def read_dirs() -> dict[Path, tuple[Cookie | None, bool]]:
        return {d: (_read_local(io, d), _dir_has_data(io, d)) for d in every}

    found = await offload.run(read_dirs)
    stored = await meta.read_cookie(bookie_id)
    remote = Cookie.from_bytes(stored[0], "the metadata store") if stored else None

    if remote is None and all(local is None for local, _ in found.values()):
        for d in every:
            if found[d][1]:
                raise CookieError(
                    f"{d} holds files but no cookie: refusing to adopt unknown data as bookie "
                    f"{bookie_id}. Point the bookie at empty directories, or move the files away.")
        await meta.write_cookie(bookie_id, expected.to_bytes(), None)
        await offload.run(_write_all, io, every, expected)
        return expected

    if remote is None:
        raise CookieError(
            f"bookie {bookie_id}: its directories have a cookie but the metadata store has none "
            f"for this id (was the cluster metadata wiped, is this a different cluster, or "
            f"did the bookie id change?). Refusing to start.")
    new_dirs: list[Path] = []
    if not allow_expansion and _expands(remote, expected):
        raise CookieError(_changed(bookie_id, expected, remote))
    if allow_expansion and remote != expected and _expands(remote, expected):
        new_dirs = list(ledger_dirs[len(_dirs(remote.ledger_dir)):])
        for d in new_dirs:
            local, has_data = found[d]
            if local is not None and local != expected:
                raise CookieError(
                    f"bookie {bookie_id}: the new ledger directory {d} holds another cookie "
                    f"(differs in: {_differences(local, expected)}); it belongs to another "
                    f"bookie or cluster. Give an empty directory.")
            if local is None and has_data:
                raise CookieError(
                    f"bookie {bookie_id}: the new ledger directory {d} holds files but no "
                    f"cookie: refusing to adopt unknown data. Give an empty directory.")
    recorded = {*_dirs(remote.journal_dir), *_dirs(remote.ledger_dir)}
    any_local = any(local is not None for local, _ in found.values())
    for d in every:
        if d in new_dirs:
            continue
        local = found[d][0]
        if local is None and str(d) not in recorded and any_local:
            raise CookieError(_changed(bookie_id, expected, remote))  # a directory added
        if local is None:
            raise CookieError(await _missing_local_cookie(meta, bookie_id, d))
        accepted = local == remote or (allow_expansion and (
            (new_dirs and local == expected)  # an earlier expansion stopped half-way
            or (remote == expected and _expands(local, remote))))
        if not accepted:
            hint = (" If ledger directories were added to this bookie, start it with "
                    "--allow-storage-expansion to record them."
                    if _expands(local, remote) else "")
            raise CookieError(
                f"bookie {bookie_id}: the cookie in {d} does not match the registered one "
                f"(differs in: {_differences(local, remote)}); a directory was swapped or "
                f"belongs to another bookie or cluster. Refusing to start.{hint}")
    if new_dirs:
        assert stored is not None
        await offload.run(_write_all, io, new_dirs, expected)
        await meta.write_cookie(bookie_id, expected.to_bytes(), stored[1])
        remote = expected
        if log is not None:
            log.warning("ledger directories added to the cookie",
                        added=[str(d) for d in new_dirs])
    if remote == expected:
        stale = [d for d in every if found[d][0] != expected and d not in new_dirs]
        if stale:
            await offload.run(_write_all, io, stale, expected)
        return remote
    raise CookieError(_changed(bookie_id, expected, remote))


def _changed(bookie_id: str, expected: Cookie, remote: Cookie) -> str:
    hint = ""
    if _expands(remote, expected):
        hint = (" To add ledger directories, append them to --ledger-dir (keeping the "
                "recorded ones first, in order) and start with --allow-storage-expansion.")
    return (f"bookie {bookie_id}: started with different settings than its cookie records "
            f"(differs in: {_differences(expected, remote)}). Use the original "
            f"directories.{hint}")
