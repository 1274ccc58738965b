"""The client's live view of registered bookies (:class:`BookieWatcher`), and where
they are (:class:`RackMapping`: a rack file and a rack script)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import shlex
import signal
import subprocess
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..clock import LOOP_CLOCK, Clock
from ..config import ClientConfig
from ..errors import ConfigError
from ..log import get_logger
from ..meta.api import BookieRegistration, MetadataStore
from ..net.etcd_security import PASSWORD_ENV
from ..net.security import TOKEN_ENV
from ..topology import (
    LOCATION_KEY,
    RackFile,
    host_of,
    parse_rack_file,
    parse_script_output,
    resolve_locations,
)
from ..types import BookieId

WRITABLE_STATE = "writable"
"""The state a bookie reports in BOOKIE_INFO when it takes adds."""

SCRIPT_HOSTS_MAX = 100
"""Hosts passed to one run of the rack script at most (BookKeeper's default too)."""
SCRIPT_RETRY_S = 60.0
"""A host the rack script gave no location for is asked again after this long."""
SCRIPT_ENV_HIDDEN = (TOKEN_ENV, PASSWORD_ENV)
"""Environment variables holding this process's secrets, not passed to the script."""


@dataclass(frozen=True)
class _ScriptResult:
    locations: dict[str, str]
    failed: list[str]
    """Hosts without a location from this run."""
    error: str = ""
    """Why the whole run failed ("" if it did not)."""


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process group ``proc`` leads (it was started in its own session),
    so that what it started dies with it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _run_script(argv: list[str], hosts: list[str], timeout_s: float) -> _ScriptResult:
    """Run the rack script for ``hosts`` (blocking: call it in a thread).  It runs in
    a session (and process group) of its own; on timeout the whole group is killed,
    the script and whatever it started."""
    env = {k: v for k, v in os.environ.items() if k not in SCRIPT_ENV_HIDDEN}
    try:
        proc = subprocess.Popen([*argv, *hosts], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, start_new_session=True)
    except OSError as exc:
        return _ScriptResult({}, hosts, f"it cannot be run: {exc.strerror or exc}")
    with proc:  # closes the pipes and waits for the script on the way out
        try:
            stdout, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)  # before waiting: the group still exists, its id not reused
            return _ScriptResult({}, hosts, f"it did not finish within {timeout_s:g} s "
                                 "(bookie_racks_script_timeout_s)")
        except BaseException:
            _kill_group(proc)
            raise
    if proc.returncode != 0:
        return _ScriptResult({}, hosts, f"it exited with status {proc.returncode}")
    try:
        found, bad = parse_script_output(stdout, hosts)
    except ValueError as exc:
        return _ScriptResult({}, hosts, str(exc))
    return _ScriptResult(found, bad, "")


class RackMapping:
    """Bookie locations from a rack file and a rack script (``ClientConfig``'s
    ``bookie_racks_file`` and ``bookie_racks_script``; see docs/placement.md).

    The file wins over the script.  Both are read off the event loop: the file at
    :meth:`load` (a bad one raises ConfigError naming ``file:line``) and again
    whenever it changed, at :meth:`resolve` (a bad one then logs a warning and the
    previous content stays); the script, by :meth:`resolve`, only for hosts it has
    not answered yet (answers are kept for the process's life), at most
    ``SCRIPT_HOSTS_MAX`` hosts a run, killed after ``script_timeout_s`` (with the
    processes it started: it runs in a process group of its own).  A script that
    fails or gives no location for a host logs a warning; that host is in the
    default location (or where its bookie registered) until the script is asked
    again, at a :meth:`resolve` ``SCRIPT_RETRY_S`` or more later.  The script's
    output and error text are never logged, and it does not get this process's
    token or etcd password variables."""

    def __init__(self, file: str = "", script: str = "", script_timeout_s: float = 5.0, *,
                 log: Any = None) -> None:
        self.file = file
        self.script = script
        self._argv = shlex.split(script) if script else []
        self.script_timeout_s = script_timeout_s
        self._log = log if log is not None else get_logger(component="rack-mapping")
        self._rack_file = RackFile()
        self._file_stamp: tuple[int, int] | None = None
        self._loaded = False
        self._answers: dict[str, str] = {}
        self._retry_at: dict[str, float] = {}
        self._lock = asyncio.Lock()

    @classmethod
    def from_config(cls, config: ClientConfig) -> RackMapping | None:
        """The mapping ``config`` asks for, None if it sets neither file nor script."""
        if not config.bookie_racks_file and not config.bookie_racks_script:
            return None
        return cls(config.bookie_racks_file, config.bookie_racks_script,
                   config.bookie_racks_script_timeout_s)

    # ------------------------------------------------------------------ the file

    def _read_file(self) -> tuple[RackFile, tuple[int, int]] | None:
        """The file parsed and its (mtime, size), None if unchanged (blocking)."""
        path = Path(self.file)
        try:
            st = path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._file_stamp:
                return None
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"bookie_racks_file {self.file} does not exist; create it or "
                              "leave the setting empty") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"bookie_racks_file {self.file} cannot be read: {exc}") from None
        return parse_rack_file(text, self.file), stamp

    async def load(self) -> None:
        """Read the file (if one is set); ConfigError if it is missing or malformed."""
        if self.file:
            read = await asyncio.to_thread(self._read_file)
            if read is not None:
                self._rack_file, self._file_stamp = read
        self._loaded = True

    async def _reload_if_changed(self) -> None:
        try:
            read = await asyncio.to_thread(self._read_file)
        except ConfigError as exc:
            if self._file_stamp is not None:  # warn once per bad version, keep the old one
                self._log.warning("rack file unusable, keeping its previous content",
                                  error=str(exc))
                self._file_stamp = None
            return
        if read is not None:
            self._rack_file, self._file_stamp = read
            self._log.info("rack file read", file=self.file,
                           bookies=len(read[0].by_id), hosts=len(read[0].by_host))

    # ------------------------------------------------------------------ the script

    async def _ask_script(self, hosts: list[str]) -> None:
        loop = asyncio.get_running_loop()
        for i in range(0, len(hosts), SCRIPT_HOSTS_MAX):
            batch = hosts[i:i + SCRIPT_HOSTS_MAX]
            result = await asyncio.to_thread(_run_script, self._argv, batch,
                                             self.script_timeout_s)
            self._answers.update(result.locations)
            for host in result.locations:
                self._retry_at.pop(host, None)
            if result.failed:
                for host in result.failed:
                    self._retry_at[host] = loop.time() + SCRIPT_RETRY_S
                self._log.warning(
                    "rack script gave no location; using the default location for now",
                    script=self._argv[0], hosts=len(result.failed),
                    reason=result.error or "its answer for these hosts is not a location",
                    retry_s=SCRIPT_RETRY_S)

    # ------------------------------------------------------------------ lookups

    async def resolve(self, bookies: Collection[BookieId]) -> dict[BookieId, str]:
        """The locations of ``bookies`` (and of every bookie id the file lists) that the
        file or, failing it, the script gives, normalized.  Never raises for a bad
        file or script once :meth:`load` succeeded."""
        async with self._lock:
            if not self._loaded:
                await self.load()
            elif self.file:
                await self._reload_if_changed()
            if self._argv:
                now = asyncio.get_running_loop().time()
                ask = sorted({host_of(b) for b in bookies if self._rack_file.lookup(b) is None}
                             - self._answers.keys())
                ask = [h for h in ask if self._retry_at.get(h, 0.0) <= now]
                if ask:
                    await self._ask_script(ask)
            return self.mapped(bookies)

    def mapped(self, bookies: Collection[BookieId]) -> dict[BookieId, str]:
        """What :meth:`resolve` returns, from what is known now (no I/O)."""
        out: dict[BookieId, str] = {}
        for bookie in bookies:
            answer = self._answers.get(host_of(bookie))
            if answer is not None:
                out[bookie] = answer
        out.update(self._rack_file.mapped(bookies))
        return out


class BookieWatcher:
    """The live view of registered bookies, kept by a watch on the metadata store.

    ``on_registered(bookie, session)`` is called for each registration the watch
    delivers that is new (a bookie that appeared, or registered anew after a restart
    or a lost lease).  Locations (:meth:`locations`): ``static_locations`` (bookie id
    -> ``/region/rack``) win over ``rack_mapping`` (a rack file, then a rack script),
    which wins over the locations bookies registered.  A view of the registry is
    published once the mapping has located its bookies.

    With a rack mapping, from :meth:`start` to :meth:`close`, the bookies known are
    also located again every ``refresh_s`` (``ClientConfig.bookie_racks_refresh_s``,
    slept on ``clock``): an edited rack file, or a script host due for another try,
    then changes :meth:`locations` without any change of the registry."""

    def __init__(self, meta: MetadataStore,
                 on_registered: Callable[[BookieId, Any], None] = lambda b, s: None,
                 static_locations: Mapping[BookieId, str] | None = None,
                 rack_mapping: RackMapping | None = None, *,
                 refresh_s: float = ClientConfig.bookie_racks_refresh_s,
                 clock: Clock = LOOP_CLOCK) -> None:
        if not refresh_s > 0:
            raise ValueError(f"refresh_s must be > 0, got {refresh_s!r}")
        self._meta = meta
        self._on_registered = on_registered
        self._static_locations = dict(static_locations or {})
        self._rack_mapping = rack_mapping
        self._refresh_s = refresh_s
        self._clock = clock
        self._log = get_logger(component="rack-mapping")
        self._mapped: dict[BookieId, str] = {}
        self._locations: dict[BookieId, str] | None = None
        self._listed: dict[BookieId, BookieRegistration] = {}
        self._view: dict[BookieId, BookieRegistration] | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._started = False

    def start(self) -> None:
        """Follow the registry (and, with a rack mapping, refresh the locations) until
        :meth:`close`."""
        self._started = True
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._start_refresh()

    def _start_refresh(self) -> None:
        if self._started and self._rack_mapping is not None and self._refresh_task is None:
            self._refresh_task = asyncio.get_running_loop().create_task(self._refresh())

    def _known(self) -> dict[BookieId, BookieRegistration]:
        return self._view if self._view is not None else self._listed

    async def _refresh(self) -> None:
        """Every ``refresh_s``: locate the bookies known again; a change of their mapped
        locations drops the cached :meth:`locations` and wakes :meth:`wait_for_change`.
        An error is logged and the next round tried; cancelled by :meth:`close`."""
        while True:
            await self._clock.sleep(self._refresh_s)
            mapping = self._rack_mapping
            if mapping is None:
                continue
            try:
                await mapping.resolve(self._known())
                # what is known now: the registry may have changed during resolve
                mapped = mapping.mapped(self._known())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep refreshing, whatever happened
                self._log.warning("rack mapping refresh failed; trying again later",
                                  error=str(exc) or type(exc).__name__,
                                  retry_s=self._refresh_s)
                continue
            if mapping is self._rack_mapping and mapped != self._mapped:
                self._mapped = mapped
                self._locations = None
                self._log.info("bookie locations changed", bookies=len(mapped))
                self._changed.set()
                self._changed = asyncio.Event()

    async def _run(self) -> None:
        async for view in self._meta.watch_bookies():
            if self._rack_mapping is not None:
                await self._locate(view)
            before = self._view or {}
            self._view = view
            self._locations = None
            for bookie, reg in view.items():
                old = before.get(bookie)
                if old is None or old.session != reg.session:
                    self._on_registered(bookie, reg.session)
            self._changed.set()
            self._changed = asyncio.Event()

    async def _locate(self, bookies: Collection[BookieId]) -> None:
        """Ask the rack mapping where ``bookies`` are."""
        mapping = self._rack_mapping
        try:
            self._mapped = await mapping.resolve(bookies) if mapping is not None else {}
        except ConfigError as exc:  # a file never loaded: what use_rack_mapping reports
            self._log.warning(
                "rack file unusable: bookies are where they registered", error=str(exc))
            self._mapped = {}
        self._locations = None

    async def use_rack_mapping(self, mapping: RackMapping | None) -> None:
        """Locate bookies with ``mapping`` (None: no file, no script) from now on: loads
        its file (ConfigError if bad) and locates the bookies known."""
        if mapping is not None:
            await mapping.load()
        self._rack_mapping = mapping
        await self._locate(self._known())
        self._start_refresh()

    def session(self, bookie: BookieId) -> Any:
        """The bookie's current registration (None if not registered or not known yet)."""
        reg = (self._view or {}).get(bookie)
        return reg.session if reg is not None else None

    async def writable(self, timeout_s: float) -> list[BookieId]:
        if self._view is None:
            # Not yet delivered by the watch: ask directly.
            async with asyncio.timeout(timeout_s):
                view = await self._meta.list_bookies()
            if self._rack_mapping is not None:
                await self._locate(view)
            self._listed = view
            self._locations = None
        else:
            view = self._view
        return sorted(b for b, reg in view.items() if not reg.readonly)

    async def current_locations(self, timeout_s: float) -> dict[BookieId, str]:
        """:meth:`locations`, once the registry has been read (at most ``timeout_s``)."""
        await self.writable(timeout_s)
        return dict(self.locations())

    def locations(self) -> dict[BookieId, str]:
        """Normalized network locations of the bookies known (registered ones from the
        registry, the rack mapping's and the static ones winning); bookies absent are
        in the default location.  Kept until the registry or the mapped locations
        change: do not modify."""
        if self._locations is None:
            view = self._known()
            registered = {b: str(reg.info.get(LOCATION_KEY, "")) for b, reg in view.items()}
            self._locations = resolve_locations(registered, self._static_locations,
                                                self._mapped)
        return self._locations

    async def wait_for_change(self, timeout_s: float) -> None:
        """Return when the registry (or, with a rack mapping, a bookie's mapped
        location) changes next, or after ``timeout_s``."""
        with contextlib.suppress(builtins.TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._changed.wait()

    async def close(self) -> None:
        self._started = False
        tasks = [t for t in (self._task, self._refresh_task) if t is not None]
        self._task = self._refresh_task = None
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
