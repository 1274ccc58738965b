"""The bookie and auto-recovery processes of a :class:`~asyncbk.local.cluster.LocalCluster`:
how each is started (its command line, configuration file and environment), waited
for, signalled, paused and stopped."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..bookie.startup import port_free, port_user
from ..errors import BKError
from .ports import free_port
from .process import LocalClusterError, guarded

if TYPE_CHECKING:
    from .cluster import LocalCluster

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
_HTTP_PORT_RETRIES = 3


def _last_error(path: Path) -> str:
    """The line of a child's log that says why it stopped: its command's one-line error
    (``asyncbk bookie: error: ...``, without that prefix), else the last line."""
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    for line in reversed(lines):
        if line.startswith("asyncbk ") and ": error: " in line:
            return line.split(": error: ", 1)[1]
    return lines[-1] if lines else "(empty log)"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))


class ChildProcess:
    """Signals and stopping of one child process of a LocalCluster."""

    cluster: LocalCluster
    process: asyncio.subprocess.Process | None = None
    log_path: Path
    name: str = "process"
    argv: list[str]
    """The command line of the last start (what ``/proc/<pid>/cmdline`` shows)."""

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def _spawn(self, command: list[str], env: dict[str, str], ready: str,
                     prefix: list[str] | None = None) -> None:
        """Start ``command`` (stderr to the log; on another host with ``prefix``, which
        execs it) and wait for the line ``ready`` on stdout."""
        log = await asyncio.to_thread(open, self.log_path, "ab")
        try:
            self.argv = list(command)
            self.process = await asyncio.create_subprocess_exec(
                *guarded([*(prefix or ()), *command]), stdout=asyncio.subprocess.PIPE, stderr=log,
                stdin=asyncio.subprocess.DEVNULL, env=env, start_new_session=True)
        finally:
            log.close()
        assert self.process.stdout is not None
        try:
            await self.cluster.record_processes()
            async with asyncio.timeout(READY_TIMEOUT_S):
                while True:
                    line = await self.process.stdout.readline()
                    if not line:
                        code = await self.process.wait()
                        why = await asyncio.to_thread(_last_error, self.log_path)
                        raise BKError(f"{self.name} exited with code {code} before it was "
                                      f"ready: {why} (log {self.log_path})")
                    if line.decode(errors="replace").strip() == ready:
                        return
        except TimeoutError:
            self.kill()
            why = await asyncio.to_thread(_last_error, self.log_path)
            raise BKError(f"{self.name} not ready after {READY_TIMEOUT_S}s; last in its log: "
                          f"{why} (log {self.log_path})") from None
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL: the process dies at once; whatever it had not fsynced is lost."""
        self._signal(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: the process hangs (connections stay open, nothing is answered)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        if self.running:
            assert self.process is not None
            try:
                self.process.send_signal(sig)
            except ProcessLookupError:
                pass

    async def wait(self) -> int:
        assert self.process is not None
        return await self.process.wait()

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Graceful stop (SIGTERM); SIGKILL if it has not exited after ``timeout_s``."""
        if self.process is None:
            return
        if self.running:
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(timeout_s):
                    await self.process.wait()
            except TimeoutError:
                self.kill()
        await self.process.wait()



class LocalBookie(ChildProcess):
    """One bookie process of a LocalCluster."""

    def __init__(self, cluster: LocalCluster, index: int, port: int,
                 http_port: int | None = None, host: str = "127.0.0.1",
                 command_prefix: list[str] | None = None) -> None:
        self.cluster = cluster
        self.index = index
        self.port = port
        self.host = host
        """The address it listens on: loopback, or its host's on a network
        (``LocalCluster(topology=)``)."""
        self.command_prefix = list(command_prefix or [])
        """What runs it on its host (``ip netns exec <ns>``); empty on this one."""
        self.http_port = http_port or free_port()
        """Port of the bookie's HTTP admin endpoint (metrics, health, state)."""
        self.id = f"{host}:{port}"
        self.dir = cluster.data_dir / f"bookie-{index}"
        self.journal_dir = self.dir / "journal"
        self.ledger_dir = self.dir / "ledgers"
        self.journal_dirs = [self.journal_dir] + [
            self.dir / f"journal-{i}" for i in range(1, cluster.journal_dirs_per_bookie)]
        """The bookie's journal directories (``LocalCluster(journal_dirs=)``)."""
        self.ledger_dirs = [self.ledger_dir] + [
            self.dir / f"ledgers-{i}" for i in range(1, cluster.ledger_dirs_per_bookie)]
        """The bookie's ledger directories (``LocalCluster(ledger_dirs=)``; see
        :meth:`add_ledger_dir`)."""
        self.allow_storage_expansion = False
        self.log_path = self.dir / "bookie.log"
        self.config_path = self.dir / "bookie.toml"
        self.name = f"bookie {self.id}"
        self.process = None
        self.argv = []

    @property
    def http_url(self) -> str:
        scheme = "https" if self.cluster.tls is not None else "http"
        return f"{scheme}://{self.host}:{self.http_port}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "asyncbk", "bookie",
            "--metadata-uri", self.cluster.metadata_uri,
            "--host", self.host, "--port", str(self.port),
            *(a for d in self.journal_dirs for a in ("--journal-dir", str(d))),
            *(a for d in self.ledger_dirs for a in ("--ledger-dir", str(d))),
            "--config", str(self.config_path),
            *(("--allow-storage-expansion",) if self.allow_storage_expansion else ()),
        ]

    def add_ledger_dir(self) -> Path:
        """Append a new, empty ledger directory, used from the bookie's next start
        (``await bookie.stop(); bookie.add_ledger_dir(); await bookie.start()``):
        the bookie records it in its cookie (``--allow-storage-expansion``) and places
        new ledgers there until it holds as many as the others.  Kept while this
        LocalCluster object lives (a new LocalCluster on the same data directory
        starts its bookies with ``ledger_dirs`` directories)."""
        path = self.dir / f"ledgers-{len(self.ledger_dirs)}"
        self.ledger_dirs.append(path)
        self.allow_storage_expansion = True
        return path

    def _prepare_dir(self, config_text: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(config_text)

    async def start(self) -> None:
        """Start the process (same id, same directories) and wait for its ready line."""
        if self.process is not None:
            try:  # a kill() just before: give the process a moment to be reaped
                async with asyncio.timeout(5):
                    await self.process.wait()
            except TimeoutError:
                raise RuntimeError(f"bookie {self.id} is already running") from None
        await asyncio.to_thread(self._prepare_dir, self._config_text())
        if not self.command_prefix and not await asyncio.to_thread(
                port_free, "127.0.0.1", self.port):
            who = await asyncio.to_thread(port_user, self.port)
            raise LocalClusterError(
                f"{self.name} cannot start: port {self.port} is in use (by "
                f"{who or 'another process'}); a bookie's id is host:port, so it keeps its "
                f"port: free it, or use another data directory")
        for attempt in range(_HTTP_PORT_RETRIES):
            try:
                await self._spawn(self.command(), self.cluster.child_env(), f"ready {self.id}",
                                  self.command_prefix)
                return
            except BKError as exc:
                # the admin port (not part of the id) was taken between choosing and binding
                taken = f"('{self.host}', {self.http_port}): address already in use"
                if (taken not in str(exc) or attempt + 1 == _HTTP_PORT_RETRIES
                        or self.command_prefix):
                    raise
            self.http_port = free_port()
            await asyncio.to_thread(self._prepare_dir, self._config_text())
            await asyncio.to_thread(self.cluster.save_layout)

    def _config_text(self) -> str:
        values = {"http_enabled": True, "http_port": self.http_port,
                  **self.cluster.bookie_config}
        if self.command_prefix:
            values["http_host"] = self.host
        if self.index < len(self.cluster.racks):
            values["rack"] = self.cluster.racks[self.index]
        return "[bookie]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items())


class LocalAutoRecovery(ChildProcess):
    """An ``asyncbk autorecovery`` process of a LocalCluster."""

    def __init__(self, cluster: LocalCluster, name: str, options: dict[str, Any]) -> None:
        self.cluster = cluster
        self.id = name
        self.name = f"autorecovery {name}"
        self.options = options
        self.http_port = free_port()
        self.log_path = cluster.data_dir / f"autorecovery-{name}.log"
        self.process = None
        self.argv = []

    @property
    def http_url(self) -> str:
        """Its HTTP endpoint (HTTPS, with the bookies' certificate, in a TLS cluster)."""
        scheme = "https" if self.cluster.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.http_port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "asyncbk", "autorecovery",
               "--metadata-uri", self.cluster.metadata_uri, "--id", self.id,
               "--http-port", str(self.http_port)]
        if self.cluster.tls is not None:
            cmd += ["--http-tls-cert", str(self.cluster.tls.server_cert),
                    "--http-tls-key", str(self.cluster.tls.server_key)]
        for k, v in self.options.items():
            flag = f"--{k.replace('_', '-')}"
            if v is True:  # a switch (enforce_placement=True, fix_placement=True)
                cmd.append(flag)
            elif v is not False and v is not None:
                cmd += [flag, str(v)]
        return cmd + self.cluster.client_options()

    async def start(self) -> None:
        await self._spawn(self.command(), self.cluster.child_env(),
                          f"ready autorecovery {self.id}")
