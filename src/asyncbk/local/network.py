"""Separate hosts on one machine: Linux network namespaces joined by a bridge, with
latency between racks and regions and partitions on demand.

:class:`Topology` says where each bookie, etcd, the test process and any extra
host sit (``/region/rack`` locations) and the round-trip times between them;
``LocalCluster(topology=...)`` builds it with a :class:`Network` and runs each
bookie and etcd in a namespace of its own.

* **Hosts.** Each host but the test process is a network namespace
  ``abk<pid>-<host>`` with a veth pair to a bridge ``abk<pid>b`` and an address
  in ``198.18.<n>.0/24`` (the range set aside for network tests, RFC 2544;
  ``<n>`` is chosen among those no interface of the machine uses).  The test
  process stays in the machine's namespace and reaches the hosts through the
  bridge, whose address is host ``client``.  Nothing else of the machine is
  changed: no forwarding, no firewall rule outside the namespaces.
* **Latency.** Each namespace's iptables send packets to the NFQUEUE of their
  class (same rack, other rack, other region), and one delay process
  (:mod:`asyncbk.local.netdelay`) releases them after half the class's round
  trip, on the way out and, for the test process's traffic, on the way in.
* **Partitions.** :meth:`Network.partition` drops packets between groups of hosts
  (iptables ``DROP`` in both directions in the namespaces), so connections hang
  as on a real cut cable until the peers' timeouts fire; :meth:`Network.heal`
  restores them.
* **Teardown.** :meth:`Network.stop` deletes every link, namespace and process it
  made, also after a failure.  A network whose owner died (SIGKILL) is removed by
  the next :meth:`Network.start` on the machine.

It needs Linux, root, ``ip`` and ``iptables`` with NFQUEUE;
:func:`network_unavailable` says why not where one is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..topology import normalize_location, region_of
from .process import LocalClusterError, guarded

PREFIX = "abk"
SUBNET_BASE = ipaddress.IPv4Network("198.18.0.0/15")
CLIENT = "client"
"""The host name of the process that runs the cluster (the machine's namespace)."""
ETCD = "etcd"
COMMAND_TIMEOUT_S = 30.0
QUEUE_RACK, QUEUE_CROSS_RACK, QUEUE_CROSS_REGION = 1, 2, 3


class NetworkError(LocalClusterError):
    """The namespaces could not be made, changed or removed."""


@dataclass(frozen=True)
class Latency:
    """Round-trip times added between hosts, in milliseconds, by where they sit:
    ``rack`` between two hosts of one rack, ``cross_rack`` between racks of one
    region, ``cross_region`` between regions.  Each direction is delayed by half.
    The delay process adds about 0.05-0.1 ms of its own per direction."""

    rack_ms: float = 0.2
    cross_rack_ms: float = 2.0
    cross_region_ms: float = 20.0

    def __post_init__(self) -> None:
        for name in ("rack_ms", "cross_rack_ms", "cross_region_ms"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 <= value <= 10_000:
                raise ValueError(f"Latency.{name} must be a number of milliseconds in "
                                 f"[0, 10000], not {value!r}")

    def between(self, a: str, b: str) -> float:
        """Round trip in ms between locations ``a`` and ``b``."""
        if region_of(a) != region_of(b):
            return self.cross_region_ms
        if a != b:
            return self.cross_rack_ms
        return self.rack_ms


@dataclass(frozen=True)
class Topology:
    """Where the hosts of a ``LocalCluster`` sit.

    ``bookies``: the location (``/region/rack`` or ``/rack``) of each bookie; one
    bookie per entry, each on a host of its own (``bookie-0``...).  ``etcd`` and
    ``client`` (the test process) default to the first bookie's location.
    ``hosts``: more hosts by name and location, for processes the test starts
    there (:meth:`Network.command`).  ``latency``: round trips by distance
    (None: none added)."""

    bookies: Sequence[str]
    etcd: str | None = None
    client: str | None = None
    hosts: dict[str, str] = field(default_factory=dict)
    latency: Latency | None = field(default_factory=Latency)

    def __post_init__(self) -> None:
        if not self.bookies:
            raise ValueError("Topology needs at least one bookie location")
        for name in self.hosts:
            if not re.fullmatch(r"[a-z][a-z0-9-]{0,15}", name) or name in (CLIENT, ETCD) \
                    or name.startswith("bookie-"):
                raise ValueError(f"host name {name!r}: use 1-16 of a-z, 0-9, '-' (starting "
                                 f"with a letter), not 'client', 'etcd' or 'bookie-N'")

    def locations(self) -> dict[str, str]:
        """Host name -> normalized location, for every host."""
        bookies = [normalize_location(loc) for loc in self.bookies]
        out = {CLIENT: normalize_location(self.client or bookies[0]),
               ETCD: normalize_location(self.etcd or bookies[0])}
        out.update({f"bookie-{i}": loc for i, loc in enumerate(bookies)})
        out.update({name: normalize_location(loc) for name, loc in self.hosts.items()})
        return out


@dataclass
class Host:
    """One host of a :class:`Network`: a name, a location and an address.  ``netns``
    is None for the ``client`` host (the machine's own namespace)."""

    name: str
    location: str
    ip: str
    netns: str | None
    veth: str | None = None

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on this host."""
        if self.netns is None:
            return list(argv)
        return ["ip", "netns", "exec", self.netns, *argv]


# ---------------------------------------------------------------- commands


async def _run(argv: Sequence[str], stdin: str | None = None) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        detail = (err or out).decode(errors="replace").strip().splitlines()
        raise NetworkError(f"{' '.join(argv[:4])} failed: {detail[-1] if detail else proc.returncode}")
    return out.decode(errors="replace")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_unavailable: str | None | bool = False


def network_unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can).  Checked once per process
    by making and removing a namespace with an NFQUEUE rule."""
    global _unavailable
    if _unavailable is not False:
        return _unavailable  # type: ignore[return-value]
    _unavailable = _probe()
    return _unavailable


def _probe() -> str | None:
    import subprocess

    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run the tests as root)"
    for tool in ("ip", "iptables", "iptables-restore"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not installed (iproute2 / iptables)"
    name = f"{PREFIX}{os.getpid()}-probe"
    try:
        for argv in (["ip", "netns", "add", name],
                     ["ip", "netns", "exec", name, "iptables", "-t", "mangle", "-A", "OUTPUT",
                      "-d", "198.18.0.1", "-j", "NFQUEUE", "--queue-num", "1"]):
            res = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
            if res.returncode != 0:
                return f"{' '.join(argv[:3])} failed: {res.stderr.strip() or res.returncode}"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run ip/iptables: {exc}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True,
                       timeout=COMMAND_TIMEOUT_S)
    return None


async def sweep_leftovers() -> list[str]:
    """Remove the namespaces and links of networks whose owner process is gone;
    the names removed."""
    removed: list[str] = []
    pattern = re.compile(rf"^{PREFIX}(\d+)[-bv]")
    for name in (await _run(["ip", "netns", "list"])).split():
        m = pattern.match(name)
        if m and not _pid_alive(int(m.group(1))):
            with contextlib.suppress(NetworkError):
                await _run(["ip", "netns", "del", name])
                removed.append(name)
    for line in (await _run(["ip", "-o", "link", "show"])).splitlines():
        parts = line.split(":", 2)
        if len(parts) < 2:
            continue
        link = parts[1].strip().split("@", 1)[0]
        m = pattern.match(link)
        if m and not _pid_alive(int(m.group(1))):
            with contextlib.suppress(NetworkError):
                await _run(["ip", "link", "del", link])
                removed.append(link)
    return removed


async def _used_networks() -> list[ipaddress.IPv4Network]:
    out: list[ipaddress.IPv4Network] = []
    for line in (await _run(["ip", "-4", "-o", "addr", "show"])).splitlines():
        m = re.search(r"inet (\S+)", line)
        if m:
            out.append(ipaddress.IPv4Interface(m.group(1)).network)
    for line in (await _run(["ip", "-4", "route", "show", "table", "all"])).splitlines():
        token = line.split()[0] if line.split() else ""
        if token in ("local", "broadcast", "unreachable", "blackhole", "prohibit"):
            token = line.split()[1]
        with contextlib.suppress(ValueError):
            if token != "default":
                out.append(ipaddress.IPv4Network(token, strict=False))
    return out


# ---------------------------------------------------------------- the network


class Network:
    """The hosts of a :class:`Topology` as network namespaces.  Use as ``async with``
    or ``start()``/``stop()``; ``LocalCluster(topology=...)`` does it for you."""

    def __init__(self, topology: Topology, *, preferred_subnet: str | None = None) -> None:
        self.topology = topology
        self.latency = topology.latency
        self.tag = f"{PREFIX}{os.getpid()}"
        self.hosts: dict[str, Host] = {}
        self.subnet: ipaddress.IPv4Network | None = None
        self._preferred = ipaddress.IPv4Network(preferred_subnet) if preferred_subnet else None
        self.bridge = f"{self.tag}b"
        self._delay: asyncio.subprocess.Process | None = None
        self._cuts: list[tuple[frozenset[str], frozenset[str]]] = []
        self._lock = asyncio.Lock()
        self._made: list[str] = []  # links and namespaces to remove, in order
        self.started = False

    # ---------------------------------------------------------------- setup

    async def _choose_subnet(self) -> ipaddress.IPv4Network:
        used = await _used_networks()
        candidates = list(SUBNET_BASE.subnets(new_prefix=24))
        if self._preferred is not None:
            candidates.insert(0, self._preferred)
        start = os.getpid() % len(candidates)
        for net in [*candidates[:1], *candidates[start:], *candidates[:start]]:
            if net.subnet_of(SUBNET_BASE) and not any(net.overlaps(u) for u in used):
                return net
        raise NetworkError("no free /24 in 198.18.0.0/15 for the test network: remove "
                           "addresses in that range from this machine's interfaces")

    async def start(self) -> None:
        why = await asyncio.to_thread(network_unavailable)
        if why is not None:
            raise NetworkError(f"cannot make network namespaces: {why}")
        await sweep_leftovers()
        self.subnet = await self._choose_subnet()
        try:
            addresses = self.subnet.hosts()
            bridge_ip = str(next(addresses))
            for name, location in self.topology.locations().items():
                if name == CLIENT:
                    self.hosts[name] = Host(name, location, bridge_ip, None)
                else:
                    self.hosts[name] = Host(name, location, str(next(addresses)), "")
            prefix = self.subnet.prefixlen
            batch = [f"link add {self.bridge} type bridge",
                     f"addr add {bridge_ip}/{prefix} dev {self.bridge}",
                     f"link set {self.bridge} up"]
            self._made.append(f"link:{self.bridge}")
            await _run(["ip", "-batch", "-"], "\n".join(batch) + "\n")
            for host in list(self.hosts.values()):
                if host.netns is not None:
                    await self._make_host(host)
            self.started = True
            await self._start_delay()
            await self._apply_cuts()
        except BaseException:
            await self.stop()
            raise

    async def _make_host(self, host: Host) -> None:
        assert self.subnet is not None
        index = list(self.hosts).index(host.name)
        host.netns = f"{self.tag}-{host.name}"
        host.veth = f"{self.tag}v{index}"
        ns = host.netns
        self._made.append(f"netns:{ns}")
        self._made.append(f"link:{host.veth}")
        await _run(["ip", "-batch", "-"], "\n".join([
            f"netns add {ns}",
            f"link add {host.veth} type veth peer name eth0 netns {ns}",
            f"link set {host.veth} master {self.bridge} up",
        ]) + "\n")
        await _run(["ip", "-n", ns, "-batch", "-"], "\n".join([
            f"addr add {host.ip}/{self.subnet.prefixlen} dev eth0",
            "link set eth0 up",
            "link set lo up",
        ]) + "\n")
        await _run(["ip", "netns", "exec", ns, "iptables-restore"], self._mangle_rules(host))

    def _mangle_rules(self, host: Host) -> str:
        """The host's delay rules: packets out to each other host by distance, and in
        from the client host (whose own namespace has no rules)."""
        lines = ["*mangle", ":PREROUTING ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
        if self.latency is not None:
            for other in self.hosts.values():
                if other is host:
                    continue
                queue = self._queue(host.location, other.location)
                if queue is None:
                    continue
                lines.append(f"-A OUTPUT -d {other.ip}/32 -j NFQUEUE --queue-num {queue}")
                if other.netns is None:
                    lines.append(f"-A PREROUTING -s {other.ip}/32 -j NFQUEUE "
                                 f"--queue-num {queue}")
        return "\n".join([*lines, "COMMIT", ""])

    def _queue(self, a: str, b: str) -> int | None:
        assert self.latency is not None
        if region_of(a) != region_of(b):
            queue, ms = QUEUE_CROSS_REGION, self.latency.cross_region_ms
        elif a != b:
            queue, ms = QUEUE_CROSS_RACK, self.latency.cross_rack_ms
        else:
            queue, ms = QUEUE_RACK, self.latency.rack_ms
        return queue if ms > 0 else None

    def _delay_config(self, hosts: Iterable[Host]) -> list[dict[str, object]]:
        assert self.latency is not None
        delays = {QUEUE_RACK: self.latency.rack_ms, QUEUE_CROSS_RACK: self.latency.cross_rack_ms,
                  QUEUE_CROSS_REGION: self.latency.cross_region_ms}
        return [{"netns": h.netns, "queue": q, "delay_s": ms / 2000}
                for h in hosts if h.netns for q, ms in delays.items() if ms > 0]

    async def _start_delay(self) -> None:
        if self.latency is None:
            return
        config = self._delay_config(self.hosts.values())
        if not config:
            return
        self._delay = await asyncio.create_subprocess_exec(
            *guarded([sys.executable, "-m", "asyncbk.local.netdelay"]),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=_child_env(), start_new_session=True)
        assert self._delay.stdin is not None and self._delay.stdout is not None
        self._delay.stdin.write((json.dumps({"queues": config}) + "\n").encode())
        await self._delay.stdin.drain()
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            line = await self._delay.stdout.readline()
        if line.strip() != b"ready":
            assert self._delay.stderr is not None
            err = (await self._delay.stderr.read()).decode(errors="replace").strip()
            raise NetworkError(f"the delay process did not start: {err or line!r}")

    async def set_latency(self, latency: Latency | None) -> None:
        """Change the round trips (None: none added), for packets sent from now on."""
        async with self._lock:
            self.latency = latency
            await asyncio.gather(*(
                _run(["ip", "netns", "exec", h.netns, "iptables-restore"],
                     self._mangle_rules(h)) for h in self.hosts.values() if h.netns))
            if latency is None:
                return
            if self._delay is None:
                await self._start_delay()
                return
            assert self._delay.stdin is not None and self._delay.stdout is not None
            line = json.dumps({"queues": self._delay_config(self.hosts.values())})
            self._delay.stdin.write(line.encode() + b"\n")
            await self._delay.stdin.drain()
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                answer = (await self._delay.stdout.readline()).decode().strip()
            if answer != "ok":
                raise NetworkError(f"the delay process refused the new latency: {answer}")

    # ---------------------------------------------------------------- hosts

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise KeyError(f"no host {name!r}; hosts: {', '.join(self.hosts)}") from None

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` made to run on ``host`` (``ip netns exec ...``)."""
        return self.host(host).command(argv)

    def select(self, *names: str | Iterable[str]) -> frozenset[str]:
        """Host names for host names and locations: ``"bookie-1"``, ``"/east"`` (every
        host of region east), ``"/east/r1"`` (of that rack), ``"/r1"`` (a rack of the
        default region)."""
        out: set[str] = set()
        for item in names:
            for name in ([item] if isinstance(item, str) else item):
                if name in self.hosts:
                    out.add(name)
                    continue
                if not name.startswith("/"):
                    raise KeyError(f"no host {name!r}; hosts: {', '.join(self.hosts)}")
                matched = {h.name for h in self.hosts.values()
                           if _at(h.location, name)}
                if not matched:
                    raise KeyError(f"no host at {name!r}; locations: "
                                   f"{', '.join(sorted({h.location for h in self.hosts.values()}))}")
                out |= matched
        return frozenset(out)

    # ---------------------------------------------------------------- partitions

    async def partition(self, side_a: str | Iterable[str],
                        side_b: str | Iterable[str] | None = None) -> tuple[frozenset[str],
                                                                             frozenset[str]]:
        """Cut every host of ``side_a`` from every host of ``side_b`` (by default from
        every other host), both ways; hosts within a side still reach each other.
        Sides are host names or locations (:meth:`select`).  Returns the cut, for
        :meth:`heal`."""
        a = self.select(side_a)
        b = self.select(side_b) if side_b is not None else frozenset(self.hosts) - a
        if a & b:
            raise ValueError(f"a host cannot be on both sides: {', '.join(sorted(a & b))}")
        cut = (a, b)
        async with self._lock:
            self._cuts.append(cut)
            await self._apply_cuts()
        return cut

    async def heal(self, cut: tuple[frozenset[str], frozenset[str]] | None = None) -> None:
        """Remove one cut (from :meth:`partition`), or every cut."""
        async with self._lock:
            if cut is None:
                self._cuts.clear()
            elif cut in self._cuts:
                self._cuts.remove(cut)
            await self._apply_cuts()

    @contextlib.asynccontextmanager
    async def partitioned(self, side_a: str | Iterable[str],
                          side_b: str | Iterable[str] | None = None) -> AsyncIterator[None]:
        """``async with network.partitioned("/r1"): ...``: the cut lasts the block."""
        cut = await self.partition(side_a, side_b)
        try:
            yield
        finally:
            await self.heal(cut)

    def blocked(self, a: str, b: str) -> bool:
        """Whether hosts ``a`` and ``b`` are cut from each other now."""
        return any((a in x and b in y) or (b in x and a in y) for x, y in self._cuts)

    async def _apply_cuts(self) -> None:
        await asyncio.gather(*(self._apply_filter(h) for h in self.hosts.values()
                               if h.netns))

    async def _apply_filter(self, host: Host) -> None:
        lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]",
                 ":OUTPUT ACCEPT [0:0]"]
        for other in self.hosts.values():
            if other is not host and self.blocked(host.name, other.name):
                lines.append(f"-A OUTPUT -d {other.ip}/32 -j DROP")
                lines.append(f"-A INPUT -s {other.ip}/32 -j DROP")
        assert host.netns is not None
        await _run(["ip", "netns", "exec", host.netns, "iptables-restore"],
                   "\n".join([*lines, "COMMIT", ""]))

    # ---------------------------------------------------------------- teardown

    async def stop(self) -> None:
        """Stop the delay process and remove every namespace and link made."""
        if self._delay is not None:
            with contextlib.suppress(ProcessLookupError):
                self._delay.kill()
            await self._delay.wait()
            self._delay = None
        errors: list[str] = []
        for item in reversed(self._made):
            kind, name = item.split(":", 1)
            try:
                if kind == "link":
                    links = await _run(["ip", "-o", "link", "show"])
                    if re.search(rf"^\d+: {re.escape(name)}[@:]", links, re.M):
                        await _run(["ip", "link", "del", name])
                else:
                    await _run(["ip", "netns", "del", name])
            except NetworkError as exc:
                if "No such file" not in str(exc) and "Cannot find" not in str(exc):
                    errors.append(str(exc))
        self._made.clear()
        self.started = False
        if errors:
            raise NetworkError("; ".join(errors))

    async def __aenter__(self) -> Network:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _at(location: str, prefix: str) -> bool:
    """Whether ``location`` (normalized ``/region/rack``) is at ``prefix``: a region
    (``/east``), a rack (``/east/r1``), or a rack of the default region (``/r1``)."""
    if location == prefix or "/" + region_of(location) == prefix.rstrip("/"):
        return True
    try:
        return normalize_location(prefix) == location
    except ValueError:
        return False


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


__all__ = ["CLIENT", "ETCD", "Host", "Latency", "Network", "NetworkError", "Topology",
           "network_unavailable", "sweep_leftovers"]
