"""A bookie server: the bookie's composition root.

:class:`BookieServer` builds every part of a bookie (storage, request processor,
listener, registration, disk watch, garbage collection, the admin endpoint) and
takes every I/O seam they stand on from its :class:`~.context.BookieContext`: the
metadata store, file I/O, the disk-usage probe, the directory lock, the network,
the clock and the randomness.  A bookie process runs the real ones; the simulator
runs this same root over its simulated disks, network and virtual time.

The bookie's state (writable, read-only and why, unregistered, draining, closed)
is one :class:`~.state.StateMachine`: the registration, the disk watch and the
admin endpoint feed it events; the request processor reads its admission decision
from it; the server publishes what it says (the registration's read-only flag).

Start order: connect to the metadata store, make sure the port is free and no
bookie with this id is registered and running (``startup``), lock the
directories, check (or create) the cookie, open storage (replaying the
journal), listen, register under a lease.  Only
then does the bookie take adds.

Stop order (graceful): refuse new adds and stop accepting connections, wait
for the adds already accepted to be fsynced and answered, close storage
(flush, fsync, checkpoint), revoke the lease, close connections, cancel
whatever is left.  :meth:`BookieServer.abort` is what a crash does instead (the
simulator's): nothing drained, flushed or revoked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import signal
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from .._version import __version__
from ..build import log_build_once
from ..clock import Clock
from ..config import BookieConfig
from ..errors import BKError, ConfigError
from ..log import get_logger
from ..meta.api import MetadataStore
from ..meta.uri import parse_metadata_uri
from ..net.security import (
    Credential,
    CredentialReloader,
    LiveServerTLS,
    load_tokens,
    server_context,
)
from ..net.server import BookieListener
from ..stats import LatencyHistogram
from ..topology import LOCATION_KEY, normalize_location
from ..tracing import Tracing
from ..tracing import configure as configure_tracing
from ..tracing import shutdown as shutdown_tracing
from .admin import JournalFigures, ListenerFigures, ProcessorFigures, StateView
from .allocator import tune_malloc
from .context import BookieContext
from .cookie import HeldLock, check_or_format
from .diskwatch import DiskCheck, DiskWatch
from .gc import GarbageCollector
from .http import AdminHttpServer
from .processor import RequestProcessor
from .registration import Registration
from .startup import Acceptor, check_not_running
from .state import BookieState, Change, ReadOnlyReason, StateMachine, disk_read_only
from .storage.api import Storage
from .storage.directories import open_storage


class Companion(Protocol):
    """Something run beside a bookie in its process (auto-recovery): started after the
    bookie, closed before it."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class BookieServer:
    """One bookie (module docstring).  ``clock`` is kept for callers that pass only a
    clock; a ``context`` brings every seam (its clock unless ``clock`` is given)."""

    def __init__(self, config: BookieConfig, clock: Clock | None = None, *,
                 context: BookieContext | None = None) -> None:
        if not config.metadata_uri:
            raise ConfigError("a bookie needs --metadata-uri (e.g. etcd://127.0.0.1:2379/asyncbk)")
        if not config.journal_dir or not config.ledger_dir:
            raise ConfigError("a bookie needs --journal-dir and --ledger-dir")
        if config.port == 0:
            raise ConfigError("a bookie needs a fixed --port: its id is host:port")
        parse_metadata_uri(config.metadata_uri)  # bad input fails before anything is touched
        context = context if context is not None else BookieContext()
        if clock is not None:
            context = dataclasses.replace(context, clock=clock)
        self.config = config
        self.context = context
        self.clock = context.clock
        """The time source of every part (storage, GC, registration, disk checks)."""
        host = config.advertised_host or config.host
        self.bookie_id = f"{host}:{config.port}"
        self.log = context.log if context.log is not None else get_logger(
            bookie_id=self.bookie_id)
        self.state_machine = StateMachine(read_only=config.read_only)
        """The bookie's state and read-only reasons (the one copy of them)."""
        self.meta: MetadataStore | None = None
        self.storage: Storage | None = None
        self.processor: RequestProcessor | None = None
        self.listener: BookieListener | None = None
        self.registration: Registration | None = None
        self._acceptor: Acceptor | None = None
        self._stopped = asyncio.Event()
        self._stop_task: asyncio.Task[None] | None = None
        """The stop under way (graceful or an abort): one per server."""
        self._disk_task: asyncio.Task[None] | None = None
        self._disk_watch: DiskWatch | None = None
        self._lock: HeldLock | None = None
        self.http: AdminHttpServer | None = None
        self.gc: GarbageCollector | None = None
        self._gc_task: asyncio.Task[None] | None = None
        self.http_extra_routes: list[Any] = []
        self.http_extra_collectors: list[Any] = []
        self.tls: LiveServerTLS | None = None
        """The bookie protocol's TLS (renewed by ``reloader``)."""
        self.http_tls: LiveServerTLS | None = None
        """The admin endpoint's TLS (renewed by ``reloader``)."""
        self._tracing_provider = False
        """True once this bookie configured the process's tracer provider
        (``otel_exporter``): stopping exports its last spans."""
        self.reloader: CredentialReloader | None = None
        """Reloads the certificate, key, CA and tokens: on :meth:`reload_credentials`
        (SIGHUP) and when their files change."""

    @property
    def state(self) -> BookieState:
        return self.state_machine.state

    async def start(self) -> None:
        cfg = self.config
        ctx = self.context
        try:
            # TLS material and tokens first: a mistake there is said before anything else.
            # (The files are noted first, so a change from now on is reloaded.)
            self.reloader = CredentialReloader(self._credentials(), clock=self.clock,
                                               log=self.log)
            await self.reloader.snapshot()
            tls, http_tls, tokens = await ctx.offload.run(_security, cfg)
            self.tls = LiveServerTLS(tls) if tls is not None else None
            self.http_tls = LiveServerTLS(http_tls) if http_tls is not None else None
            # The store first: a bookie that cannot reach it creates nothing on disk.
            self.meta = await ctx.open_metadata(cfg)
            # Before any verdict on the cookie: a second process for a live bookie (or
            # on a taken port) is told so, not that its disk was wiped.
            await check_not_running(self.meta, self.bookie_id, cfg.host, cfg.port,
                                    network=ctx.network)
            journal_dirs = [Path(d) for d in cfg.journal_dirs]
            ledger_dirs = [Path(d) for d in cfg.ledger_dirs]
            self._lock = ctx.lock_directories([*journal_dirs, *ledger_dirs])
            await ctx.offload.run(self._lock.acquire)
            await check_or_format(self.meta, self.bookie_id, journal_dirs, ledger_dirs,
                                  allow_expansion=cfg.allow_storage_expansion, log=self.log,
                                  io=ctx.io, offload=ctx.offload, resolve=ctx.resolve)
            self.storage = await open_storage(cfg, log=self.log, clock=self.clock, io=ctx.io,
                                              offload=ctx.offload, kv_open=ctx.kv_open,
                                              device_of=ctx.device_of)
            tracing = ctx.tracing
            if tracing is None and cfg.otel_exporter:
                # (a provider of the process's own; its batch exporter runs in a thread)
                provider = await ctx.offload.run(configure_tracing, cfg.otel_exporter,
                                                 "asyncbk-bookie")
                tracing = Tracing(provider.get_tracer("asyncbk.bookie", __version__))
                self._tracing_provider = True
            self.processor = RequestProcessor(self.storage, self.bookie_id, log=self.log,
                                              state_machine=self.state_machine,
                                              tracing=tracing)
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
            for part in self.storage.per_directory:
                # a group commit's answers go out in the loop turn it completed
                part.journal.after_batch = self.listener.write_answers
            self._acceptor = await ctx.network.listen(self.listener, cfg.host, cfg.port)
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
                on_change=self.on_registration_change,
                retry_s_max=cfg.register_retry_s_max,
                clock=self.clock,
                log=self.log,
                rng=ctx.rng,
            )
            self.registration.readonly = self.state_machine.read_only
            await self.registration.start()
            loop = asyncio.get_running_loop()
            self._disk_task = loop.create_task(self._watch_disk())
            registration = self.registration
            self.gc = GarbageCollector(self.storage, self.meta, self.bookie_id, cfg,
                                       lambda: registration.lease_id, self.log,
                                       clock=self.clock)
            self._gc_task = loop.create_task(self.gc.run_forever())
            self.reloader.start()
        except BaseException:
            await self._close_parts(graceful=True)
            self._apply(self.state_machine.close())
            raise
        self.log.info("bookie started", journal_dir=cfg.journal_dir, ledger_dir=cfg.ledger_dir)
        log_build_once(self.log)

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

    # ------------------------------------------------------------------ state

    def _apply(self, change: Change) -> None:
        """Say what ``change`` did (the log, the context's observer)."""
        if not change.changed:
            return
        reasons = [r.value for r in change.reasons]
        if change.before is not change.after:
            # A warning when a running bookie stops taking adds (read-only, lease lost);
            # its start, drain and stop are routine; a start that fails says so itself.
            if change.before is BookieState.STARTING and change.after is BookieState.CLOSED:
                log = self.log.debug
            elif change.after in (BookieState.READ_ONLY, BookieState.UNREGISTERED):
                log = self.log.warning
            else:
                log = self.log.info
            log("bookie state changed", state=change.after.value,
                previous=change.before.value, reasons=reasons)
        else:
            self.log.warning("read-only reasons changed", state=change.after.value,
                             reasons=reasons)
        observer = self.context.on_state_change
        if observer is not None:
            observer(self.bookie_id, change)

    async def _publish(self, change: Change) -> None:
        """Apply ``change`` and write the read-only flag it asks for to the registry
        (BKError if the store refuses; the flag is tried again by the disk watch)."""
        self._apply(change)
        flag = change.publish
        if flag is None or self.registration is None:
            return
        await self.registration.set_readonly(flag)
        self.state_machine.published(flag)

    async def _publish_quietly(self, change: Change) -> None:
        try:
            await self._publish(change)
        except BKError as exc:  # the store is unreachable: the next round tries again
            self.log.warning("could not switch read-only mode", error=str(exc),
                             read_only=change.publish)

    async def _watch_disk(self) -> None:
        """Per ledger directory: mark it full when its disk or its journal's disk is
        nearly full, not full again below the low mark (:mod:`.diskwatch`).  The bookie
        is read-only for a full disk when every directory is full, writable again when
        one is not; read-only for good once every journal has failed."""
        cfg = self.config
        assert self.storage is not None
        probe = self.context.disk_usage if self.context.disk_usage is not None \
            else _default_disk_usage
        watch = self._disk_watch = DiskWatch(self.storage, cfg, probe, self.context.offload,
                                             self.log)
        machine = self.state_machine
        while True:
            report = await watch.check()
            if report.all_full != (ReadOnlyReason.DISK_FULL in machine.reasons):
                self.log.warning("turning read-only" if report.all_full
                                 else "disk usage below the low mark",
                                 disk_used=round(report.used_max, 4),
                                 threshold=cfg.disk_usage_threshold,
                                 lwm_threshold=cfg.disk_usage_lwm_threshold)
            await self._publish_quietly(machine.disk_full(report.all_full))
            if report.journal_failed:
                await self._publish_quietly(machine.journal_failed())
            pending = machine.pending_publish()
            if pending is not None and self.registration is not None:
                try:
                    await self.registration.set_readonly(pending)
                    machine.published(pending)
                except BKError as exc:
                    self.log.warning("could not switch read-only mode", error=str(exc),
                                     read_only=pending)
            await self.clock.sleep(cfg.disk_check_interval_s)

    def read_only_reasons(self) -> list[str]:
        """Why the bookie is (or should be) read-only; empty when it should be writable."""
        return [r.value for r in self.state_machine.reasons]

    async def set_manual_read_only(self, read_only: bool) -> None:
        """Read-only for maintenance (HTTP admin), or back; other reasons still hold."""
        await self.set_maintenance(read_only)

    def on_registration_change(self, registered: bool) -> None:
        """What the registration reports: registered (again), or its lease lost."""
        machine = self.state_machine
        if registered:
            flag = self.registration.readonly if self.registration is not None \
                else machine.read_only
            change = machine.registered(flag)
        else:
            change = machine.lease_lost()
        self._apply(change)

    # ------------------------------------------------------------------ admin

    def state_view(self) -> StateView:
        return StateView(self.state_machine.state, tuple(self.read_only_reasons()))

    def directories(self) -> tuple[str, str]:
        return self.config.journal_dir, self.config.ledger_dir

    def listener_figures(self) -> ListenerFigures | None:
        if self.listener is None:
            return None
        return ListenerFigures(len(self.listener.connections), self.listener.protocol_errors)

    def processor_figures(self) -> ProcessorFigures | None:
        p = self.processor
        if p is None:
            return None
        return ProcessorFigures(p.counters, p.add_latency, p.read_latency)

    def storage_statistics(self) -> dict[str, Any] | None:
        return self.storage.statistics() if self.storage is not None else None

    def disk_check(self) -> DiskCheck | None:
        return None if self._disk_watch is None else self._disk_watch.last

    def journal_figures(self) -> JournalFigures | None:
        if self.storage is None:
            return None
        journals = [part.journal for part in self.storage.per_directory]
        return JournalFigures(
            LatencyHistogram.merged([j.fsync_latency for j in journals]),
            LatencyHistogram.merged([j.batch_records for j in journals]))

    async def set_maintenance(self, read_only: bool) -> StateView:
        """Read-only for maintenance (HTTP admin), or back; other reasons still hold.
        BKError when the registry could not be updated (retried by the disk watch)."""
        change = self.state_machine.maintenance(read_only)
        self.log.warning("read-only for maintenance" if read_only else "maintenance ended",
                         reasons=[r.value for r in change.reasons])
        await self._publish(change)
        return self.state_view()

    def gc_statistics(self) -> dict[str, Any] | None:
        return self.gc.statistics() if self.gc is not None else None

    async def run_gc(self) -> dict[str, Any] | None:
        if self.gc is None:
            return None
        done = await self.gc.run_once(force_compaction=True)
        return {**done, **self.gc.statistics()}

    # ------------------------------------------------------------------ stop

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        """Graceful stop (idempotent: a second call waits for the first)."""
        await self._stop_once(graceful=True)

    async def abort(self) -> None:
        """Stop as if the process had been killed (the simulator's crash): nothing is
        drained, flushed, checkpointed or revoked (the lease is left to expire), and
        the directory lock goes with the process.  Idempotent (and nothing after a
        stop)."""
        await self._stop_once(graceful=False)

    async def _stop_once(self, *, graceful: bool) -> None:
        if self._stop_task is None:
            self._stop_task = asyncio.get_running_loop().create_task(
                self._stop(graceful), name="asyncbk-bookie-stop")
        await asyncio.shield(self._stop_task)

    async def _stop(self, graceful: bool) -> None:
        try:
            if graceful:
                self.log.info("bookie stopping")
                self._apply(self.state_machine.drain())
                if self._acceptor is not None:
                    await self._acceptor.stop_accepting()
                if self.processor is not None:
                    drained = await self.processor.drain(self.config.drain_timeout_s)
                    if not drained:
                        self.log.warning("drain timed out; unanswered adds will be retried "
                                         "by clients")
        finally:
            await self._close_parts(graceful=graceful)
            if self._tracing_provider:  # export the last spans
                self._tracing_provider = False
                await self.context.offload.run(shutdown_tracing)
            self._apply(self.state_machine.close())
            self._stopped.set()
            if graceful:
                self.log.info("bookie stopped")

    async def _close_parts(self, *, graceful: bool) -> None:
        if self.reloader is not None:
            await self.reloader.close()
        if self.http is not None:
            await self.http.close()
            self.http = None
        for task in (self._gc_task, self._disk_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._gc_task = self._disk_task = None
        if graceful:
            if self.storage is not None:
                await self.storage.close()
            if self.registration is not None:
                await self.registration.close()
        else:
            if self.registration is not None:
                await self.registration.abandon()
            if self.storage is not None:
                await self.storage.abort()
        if self.listener is not None:
            await self.listener.close()
        if self.processor is not None:
            await self.processor.close()
        if self.meta is not None:
            await self.meta.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

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


def _default_disk_usage(path: Path) -> tuple[int, int]:
    """The disk probe of a bookie whose context names none: ``statvfs`` (looked up at
    each call)."""
    return _statvfs(path)


async def run_bookie(config: BookieConfig, ready_line: bool = True,
                     companion_factory: Callable[[BookieServer], Awaitable[Companion]]
                     | None = None) -> None:
    """Run a bookie until SIGTERM / SIGINT, then stop it gracefully; SIGHUP reloads its
    certificate, key, CA and tokens.  A companion (made before the bookie starts, so it
    can add HTTP routes) runs beside it."""
    malloc = tune_malloc() if config.malloc_tuning else "off"
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
    server.log.info("malloc settings", malloc=malloc)  # (once started: no line before an error)
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


__all__ = ["BookieServer", "Companion", "disk_read_only", "run_bookie"]
