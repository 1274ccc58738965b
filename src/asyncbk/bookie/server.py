"""A bookie server: storage + request processor + listener + registration.

Start order: connect to the metadata store, make sure the port is free and no
bookie with this id is registered and running (``startup``), lock the
directories, check (or create) the cookie, open storage (replaying the
journal), listen, register under a lease.  Only
then does the bookie take adds.

Stop order (graceful): refuse new adds and stop accepting connections, wait
for the adds already accepted to be fsynced and answered, close storage
(flush, fsync, checkpoint), revoke the lease, close connections, cancel
whatever is left.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from .._version import __version__
from ..clock import SYSTEM_CLOCK, Clock
from ..config import BookieConfig
from ..errors import BKError, ConfigError
from ..log import get_logger
from ..meta.api import MetadataStore
from ..meta.uri import open_metadata_store, parse_metadata_uri
from ..net.etcd_security import bookie_etcd_security
from ..net.security import (
    Credential,
    CredentialReloader,
    LiveServerTLS,
    load_tokens,
    server_context,
)
from ..net.server import BookieListener
from ..topology import LOCATION_KEY, normalize_location
from .cookie import DirectoryLock, check_or_format
from .gc import GarbageCollector
from .http import AdminHttpServer
from .processor import BookieState, RequestProcessor
from .registration import Registration
from .startup import check_not_running
from .storage.api import Storage
from .storage.directories import open_storage


class Companion(Protocol):
    """Something run beside a bookie in its process (auto-recovery): started after the
    bookie, closed before it."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class BookieServer:
    def __init__(self, config: BookieConfig, clock: Clock = SYSTEM_CLOCK) -> None:
        if not config.metadata_uri:
            raise ConfigError("a bookie needs --metadata-uri (e.g. etcd://127.0.0.1:2379/asyncbk)")
        if not config.journal_dir or not config.ledger_dir:
            raise ConfigError("a bookie needs --journal-dir and --ledger-dir")
        if config.port == 0:
            raise ConfigError("a bookie needs a fixed --port: its id is host:port")
        parse_metadata_uri(config.metadata_uri)  # bad input fails before anything is touched
        self.config = config
        self.clock = clock
        """The time source of every part (storage, GC, registration, disk checks)."""
        host = config.advertised_host or config.host
        self.bookie_id = f"{host}:{config.port}"
        self.log = get_logger(bookie_id=self.bookie_id)
        self.meta: MetadataStore | None = None
        self.storage: Storage | None = None
        self.processor: RequestProcessor | None = None
        self.listener: BookieListener | None = None
        self.registration: Registration | None = None
        self._stopped = asyncio.Event()
        self._stopping = False
        self._disk_task: asyncio.Task[None] | None = None
        self._lock: DirectoryLock | None = None
        self.read_only_for_disk = False
        self.read_only_manual = False
        self.journal_failed = False
        self.http: AdminHttpServer | None = None
        self.gc: GarbageCollector | None = None
        self._gc_task: asyncio.Task[None] | None = None
        self.http_extra_routes: list[Any] = []
        self.http_extra_collectors: list[Any] = []
        self.tls: LiveServerTLS | None = None
        """The bookie protocol's TLS (renewed by ``reloader``)."""
        self.http_tls: LiveServerTLS | None = None
        """The admin endpoint's TLS (renewed by ``reloader``)."""
        self.reloader: CredentialReloader | None = None
        """Reloads the certificate, key, CA and tokens: on :meth:`reload_credentials`
        (SIGHUP) and when their files change."""

    async def start(self) -> None:
        cfg = self.config
        try:
            # TLS material and tokens first: a mistake there is said before anything else.
            # (The files are noted first, so a change from now on is reloaded.)
            self.reloader = CredentialReloader(self._credentials(), clock=self.clock,
                                               log=self.log)
            await self.reloader.snapshot()
            tls, http_tls, tokens = await asyncio.to_thread(_security, cfg)
            self.tls = LiveServerTLS(tls) if tls is not None else None
            self.http_tls = LiveServerTLS(http_tls) if http_tls is not None else None
            # The store first: a bookie that cannot reach it creates nothing on disk.
            etcd = await asyncio.to_thread(bookie_etcd_security, cfg)
            self.meta = await open_metadata_store(cfg.metadata_uri, timeout_s=cfg.metadata_timeout_s,
                                                  **etcd.store_options())
            # Before any verdict on the cookie: a second process for a live bookie (or
            # on a taken port) is told so, not that its disk was wiped.
            await check_not_running(self.meta, self.bookie_id, cfg.host, cfg.port)
            journal_dirs = [Path(d) for d in cfg.journal_dirs]
            ledger_dirs = [Path(d) for d in cfg.ledger_dirs]
            self._lock = DirectoryLock(*journal_dirs, *ledger_dirs)
            await asyncio.to_thread(self._lock.acquire)
            await check_or_format(self.meta, self.bookie_id, journal_dirs, ledger_dirs,
                                  allow_expansion=cfg.allow_storage_expansion, log=self.log)
            self.storage = await open_storage(cfg, log=self.log, clock=self.clock)
            self.processor = RequestProcessor(self.storage, self.bookie_id, log=self.log)
            self.listener = BookieListener(
                self.processor,
                frame_bytes_max=cfg.frame_bytes_max,
                write_buffer_bytes_high=cfg.connection_write_buffer_bytes_high,
                connections_max=cfg.connections_max,
                log=self.log,
                ssl_context=self.tls.context if self.tls is not None else None,
                tokens=tokens,
                auth_timeout_s=cfg.auth_timeout_s,
                requests_max=cfg.connection_requests_max,
                idle_timeout_s=cfg.connection_idle_timeout_s,
            )
            await self.listener.start(cfg.host, cfg.port)
            info: dict[str, Any] = {"version": __version__,
                                    LOCATION_KEY: normalize_location(cfg.rack)}
            if cfg.http_enabled:
                self.http = AdminHttpServer(
                    self, cfg.http_host, cfg.http_port, self.http_extra_routes,
                    self.http_extra_collectors,
                    # HTTPS with the bookie's certificate (no client certificate asked)
                    ssl_context=self.http_tls.context if self.http_tls is not None
                    else None,
                    tokens=tokens,
                    open_reads=cfg.http_open_reads)
                port = await self.http.start()
                public = cfg.http_host
                if public in ("0.0.0.0", "::", ""):  # listening everywhere: the bookie's host
                    public = cfg.advertised_host or cfg.host
                scheme = "https" if cfg.tls_cert_file else "http"
                info["http"] = f"{scheme}://{public}:{port}"
                self.log.info("http admin listening", http_host=cfg.http_host, http_port=port)
            self.registration = Registration(
                self.meta, self.bookie_id, cfg.lease_ttl_s,
                info=info,
                on_change=self._on_registration_change,
                retry_s_max=cfg.register_retry_s_max,
                clock=self.clock,
                log=self.log,
            )
            self.registration.readonly = cfg.read_only
            await self.registration.start()
            self._disk_task = asyncio.get_running_loop().create_task(self._watch_disk())
            registration = self.registration
            self.gc = GarbageCollector(self.storage, self.meta, self.bookie_id, cfg,
                                       lambda: registration.lease_id, self.log,
                                       clock=self.clock)
            self._gc_task = asyncio.get_running_loop().create_task(self.gc.run_forever())
            self.reloader.start()
        except BaseException:
            await self._close_parts()
            raise
        self.log.info("bookie started", journal_dir=cfg.journal_dir, ledger_dir=cfg.ledger_dir)

    def _credentials(self) -> list[Credential]:
        """What ``reloader`` keeps up to date: the TLS material (both contexts, from the
        same files) and the tokens."""
        cfg = self.config
        out = []
        if cfg.tls_cert_file:
            files = (cfg.tls_cert_file, cfg.tls_key_file,
                     *((cfg.tls_ca_file,) if cfg.tls_ca_file else ()))
            out.append(Credential("TLS material", files, lambda: _tls_contexts(cfg),
                                  self._use_tls))
        if cfg.auth_tokens_file:
            path = cfg.auth_tokens_file
            out.append(Credential("tokens", (path,), lambda: load_tokens(path),
                                  self._use_tokens))
        return out

    def _use_tls(self, contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
        if self.tls is not None:
            self.tls.swap(contexts[0])
        if self.http_tls is not None:
            self.http_tls.swap(contexts[1])

    def _use_tokens(self, tokens: list[bytes]) -> None:
        if self.listener is not None:
            self.listener.set_tokens(tokens)
        if self.http is not None:
            self.http.set_tokens(tokens)

    def reload_credentials(self) -> None:
        """Read the certificate, key, CA and tokens files again, off the event loop
        (returns at once; what a SIGHUP does).  New connections use the new
        certificate; connections made already keep theirs.  New handshakes check the
        new tokens; connections that authenticated with a removed token are closed.
        Unusable files change nothing: a warning says what is wrong and the old
        material stays in use."""
        if self.reloader is not None:
            self.reloader.request_reload()

    async def _watch_disk(self) -> None:
        """Per ledger directory: mark it full when its disk or its journal's disk is
        nearly full, not full again below the low mark (adds to its ledgers refused
        meanwhile, new ledgers placed elsewhere).  The bookie turns read-only when every
        directory is full, writable again when one is not; also read-only for good once
        the journal (every journal) has failed."""
        cfg = self.config
        assert self.storage is not None and self.registration is not None
        while True:
            used_max = 0.0
            for part in self.storage.per_directory:
                free, total = part.disk_usage()  # cached by storage, refreshed off-loop
                used = 1 - free / total if total else 0.0
                j_free, j_total = await asyncio.to_thread(_statvfs, part.journal_dir)
                used = max(used, 1 - j_free / j_total if j_total else 0.0)
                used_max = max(used_max, used)
                full = disk_read_only(part.full, used, cfg.disk_usage_threshold,
                                      cfg.disk_usage_lwm_threshold)
                if full != part.full:
                    part.full = full
                    self.log.warning("ledger directory full: its ledgers take no adds"
                                     if full else "ledger directory writable again",
                                     ledger_dir=str(part.ledger_dir),
                                     journal_dir=str(part.journal_dir),
                                     disk_used=round(used, 4))
            want = all(part.full for part in self.storage.per_directory)
            journal_failed = self.storage.journal_failed
            if want != self.read_only_for_disk or (journal_failed and not self.journal_failed):
                self.read_only_for_disk = want
                self.journal_failed = journal_failed
                self.log.warning("turning read-only" if want or journal_failed
                                 else "turning writable", disk_used=round(used_max, 4),
                                 journal_failed=journal_failed,
                                 threshold=cfg.disk_usage_threshold,
                                 lwm_threshold=cfg.disk_usage_lwm_threshold)
                try:
                    await self.set_read_only(bool(self.read_only_reasons()))
                except BKError as exc:  # the store is unreachable: try again next round
                    self.log.warning("could not switch read-only mode", error=str(exc))
                    self.read_only_for_disk = not want
            await self.clock.sleep(cfg.disk_check_interval_s)

    def read_only_reasons(self) -> list[str]:
        """Why the bookie is (or should be) read-only; empty when it should be writable."""
        reasons = []
        if self.config.read_only:
            reasons.append("config")
        if self.read_only_for_disk:
            reasons.append("disk_full")
        if self.journal_failed:
            reasons.append("journal_failed")
        if self.read_only_manual:
            reasons.append("maintenance")
        return reasons

    async def set_manual_read_only(self, read_only: bool) -> None:
        """Read-only for maintenance (HTTP admin), or back; other reasons still hold."""
        self.read_only_manual = read_only
        self.log.warning("read-only for maintenance" if read_only else "maintenance ended",
                         reasons=self.read_only_reasons())
        await self.set_read_only(bool(self.read_only_reasons()))

    async def set_read_only(self, read_only: bool) -> None:
        """Switch between writable and read-only (registration moves with it)."""
        assert self.registration is not None and self.processor is not None
        if self.processor.state in (BookieState.WRITABLE, BookieState.READ_ONLY):
            self.processor.state = BookieState.READ_ONLY if read_only else BookieState.WRITABLE
        await self.registration.set_readonly(read_only)

    def _on_registration_change(self, registered: bool) -> None:
        if self.processor is None or self._stopping:
            return
        if registered:
            self.processor.state = (BookieState.READ_ONLY if self.registration
                                    and self.registration.readonly else BookieState.WRITABLE)
        else:
            self.processor.state = BookieState.UNREGISTERED

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        """Graceful stop (idempotent)."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        self.log.info("bookie stopping")
        try:
            if self.processor is not None:
                self.processor.state = BookieState.DRAINING
            if self.listener is not None:
                await self.listener.stop_accepting()
            if self.processor is not None:
                drained = await self.processor.drain(self.config.drain_timeout_s)
                if not drained:
                    self.log.warning("drain timed out; unanswered adds will be retried by clients")
        finally:
            await self._close_parts()
            self._stopped.set()
            self.log.info("bookie stopped")

    async def _close_parts(self) -> None:
        if self.reloader is not None:
            await self.reloader.close()
        if self.http is not None:
            await self.http.close()
            self.http = None
        if self._gc_task is not None:
            self._gc_task.cancel()
            await asyncio.gather(self._gc_task, return_exceptions=True)
            self._gc_task = None
        if self._disk_task is not None:
            self._disk_task.cancel()
            await asyncio.wait([self._disk_task])
            self._disk_task = None
        if self.storage is not None:
            await self.storage.close()
        if self.registration is not None:
            await self.registration.close()
        if self.listener is not None:
            await self.listener.close()
        if self.processor is not None:
            await self.processor.close()
        if self.meta is not None:
            await self.meta.close()
        if self._lock is not None:
            self._lock.release()

    def statistics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bookie_id": self.bookie_id}
        if self.processor is not None:
            out["processor"] = self.processor.statistics()
        if self.storage is not None:
            out["storage"] = self.storage.statistics()
        return out


def _statvfs(path: Path) -> tuple[int, int]:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def disk_read_only(read_only_now: bool, used: float, threshold: float,
                   lwm_threshold: float) -> bool:
    """Hysteresis: read-only at ``threshold`` and above; writable again only below
    ``lwm_threshold``; in between, stay as we are."""
    if used >= threshold:
        return True
    if used < lwm_threshold:
        return False
    return read_only_now


async def run_bookie(config: BookieConfig, ready_line: bool = True,
                     companion_factory: Callable[[BookieServer], Awaitable[Companion]]
                     | None = None) -> None:
    """Run a bookie until SIGTERM / SIGINT, then stop it gracefully; SIGHUP reloads its
    certificate, key, CA and tokens.  A companion (made before the bookie starts, so it
    can add HTTP routes) runs beside it."""
    server = BookieServer(config)
    companion = await companion_factory(server) if companion_factory is not None else None
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    loop.add_signal_handler(signal.SIGHUP, server.reload_credentials)
    try:
        await server.start()
    except BaseException:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        if companion is not None:
            await companion.close()
        raise
    try:
        if companion is not None:
            await companion.start()
        # Everything alive now (modules, the index loaded at start) lives as long as the
        # process: keep it out of the garbage collector's full passes, which otherwise
        # walk it all and pause the loop for tens of milliseconds.
        gc.freeze()
        if ready_line:
            # Machine-readable line that harnesses wait for.
            print(f"ready {server.bookie_id}", flush=True)  # noqa: T201
        await stop_requested.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        if companion is not None:
            await companion.close()
        await server.stop()


def _security(cfg: BookieConfig) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None,
                                          list[bytes] | None]:
    """The bookie protocol's TLS, the admin endpoint's (no client certificates asked)
    and the tokens, from their files (ConfigError saying what is wrong)."""
    tls, http_tls = _tls_contexts(cfg) if cfg.tls_cert_file else (None, None)
    tokens = load_tokens(cfg.auth_tokens_file) if cfg.auth_tokens_file else None
    return tls, http_tls, tokens


def _tls_contexts(cfg: BookieConfig) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The bookie protocol's TLS and the admin endpoint's (no client certificate asked),
    from the same certificate and key."""
    return (server_context(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_ca_file,
                           cfg.tls_require_client_cert),
            server_context(cfg.tls_cert_file, cfg.tls_key_file))
