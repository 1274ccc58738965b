"""The network harness's pure parts: topologies, host selection, the rules it writes,
and the delay process's netlink messages (the real thing runs in
tests/integration/test_partitions.py)."""

from __future__ import annotations

import struct

import pytest

from asyncbk.local import netdelay, network
from asyncbk.local.network import Host, Latency, Network, Topology


def test_latency_classes_and_validation() -> None:
    lat = Latency(rack_ms=0.5, cross_rack_ms=3, cross_region_ms=30)
    assert lat.between("/eu/r1", "/eu/r1") == 0.5
    assert lat.between("/eu/r1", "/eu/r2") == 3
    assert lat.between("/eu/r1", "/us/r1") == 30
    for bad in (-1, 20_000, "2"):
        with pytest.raises(ValueError, match="milliseconds"):
            Latency(cross_rack_ms=bad)  # type: ignore[arg-type]


def test_topology_locations() -> None:
    topo = Topology(bookies=["/r1", "/eu/r2"], hosts={"writer": "/eu/r9"})
    assert topo.locations() == {
        "client": "/default-region/r1", "etcd": "/default-region/r1",
        "bookie-0": "/default-region/r1", "bookie-1": "/eu/r2", "writer": "/eu/r9"}
    topo = Topology(bookies=["/r1"], etcd="/r2", client="/eu/r3")
    assert topo.locations()["etcd"] == "/default-region/r2"
    assert topo.locations()["client"] == "/eu/r3"
    with pytest.raises(ValueError, match="at least one bookie"):
        Topology(bookies=[])
    for name in ("client", "etcd", "bookie-3", "Big", "a" * 17, "x y"):
        with pytest.raises(ValueError, match="host name"):
            Topology(bookies=["/r1"], hosts={name: "/r1"})
    with pytest.raises(ValueError):
        Topology(bookies=["not a location"]).locations()


def _network() -> Network:
    """A network with hosts but nothing made (no root needed)."""
    topo = Topology(bookies=["/east/r1", "/east/r2", "/west/r3"], client="/east/r1",
                    latency=Latency(rack_ms=0.2, cross_rack_ms=2, cross_region_ms=0))
    net = Network(topo)
    for i, (name, loc) in enumerate(topo.locations().items()):
        ip = f"198.18.5.{i + 1}"
        net.hosts[name] = Host(name, loc, ip, None if name == "client" else f"ns-{name}")
    return net


def test_select_by_name_region_and_rack() -> None:
    net = _network()
    assert net.select("bookie-1") == {"bookie-1"}
    assert net.select("/west") == {"bookie-2"}
    assert net.select("/east") == {"client", "etcd", "bookie-0", "bookie-1"}
    assert net.select("/east/r1") == {"client", "etcd", "bookie-0"}
    assert net.select(["bookie-2", "/east/r2"]) == {"bookie-1", "bookie-2"}
    with pytest.raises(KeyError, match="no host 'nobody'"):
        net.select("nobody")
    with pytest.raises(KeyError, match="no host at '/r7'"):
        net.select("/r7")


def test_rules_follow_the_latency_classes() -> None:
    net = _network()
    rules = net._mangle_rules(net.hosts["bookie-0"])
    # same rack (client, etcd): queue 1; other rack: queue 2; other region: none (0 ms)
    assert "-A OUTPUT -d 198.18.5.2/32 -j NFQUEUE --queue-num 1" in rules
    assert "-A OUTPUT -d 198.18.5.4/32 -j NFQUEUE --queue-num 2" in rules
    assert "198.18.5.5" not in rules
    # the client host has no namespace: its traffic in is delayed on the way in too
    assert "-A PREROUTING -s 198.18.5.1/32 -j NFQUEUE --queue-num 1" in rules
    assert rules.startswith("*mangle") and rules.rstrip().endswith("COMMIT")
    config = net._delay_config(net.hosts.values())
    assert {"netns": "ns-bookie-0", "queue": 2, "delay_s": 0.001} in config
    assert all(c["queue"] != 3 for c in config)  # no cross-region delay configured
    assert not any(c["netns"] is None for c in config)


def test_blocked_pairs() -> None:
    net = _network()
    net._cuts.append((frozenset({"bookie-2"}), frozenset({"client", "etcd"})))
    assert net.blocked("bookie-2", "client") and net.blocked("etcd", "bookie-2")
    assert not net.blocked("bookie-2", "bookie-0")
    assert not net.blocked("client", "etcd")


def test_unavailable_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(network, "_unavailable", False)
    monkeypatch.setattr(network.os, "geteuid", lambda: 1000)
    assert "root" in (network.network_unavailable() or "")


# ---------------------------------------------------------------- netlink messages


class _FakeSock:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        return len(data)


def _packet_message(queue: int, packet_id: int) -> bytes:
    hdr = struct.pack(">IHB", packet_id, 0x0800, 3) + b"\0"
    return netdelay._message(netdelay.NFQNL_MSG_PACKET, queue,
                             netdelay._attr(netdelay.NFQA_PACKET_HDR, hdr), 0)


def _socket() -> netdelay._Socket:
    s = netdelay._Socket.__new__(netdelay._Socket)
    s.netns = "ns"
    s.queues = {}
    s.seq = 0
    s.sock = _FakeSock()  # type: ignore[assignment]
    return s


def test_message_layout() -> None:
    msg = netdelay._message(netdelay.NFQNL_MSG_CONFIG, 258, netdelay._attr(1, b"abc"), 7)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", msg)
    assert length == len(msg) == 16 + 4 + 8
    assert kind == (3 << 8) | 2 and flags == netdelay.NLM_F_REQUEST and seq == 7
    assert msg[18:20] == struct.pack(">H", 258)  # the queue number, big-endian
    assert msg[20:28] == struct.pack("=HH", 7, 1) + b"abc\0"  # attribute padded to 4


def test_packets_are_released_in_order_after_their_delay() -> None:
    s = _socket()
    s.queues[2] = netdelay._Queue(2, 0.010)
    s.queues[5] = netdelay._Queue(5, 0.001)
    data = b"".join(_packet_message(2, i) for i in (11, 12)) + _packet_message(5, 40) \
        + _packet_message(9, 1)  # a queue not ours: ignored
    offset = 0
    while offset < len(data):
        length = struct.unpack_from("=I", data, offset)[0]
        s._packet(data, offset, length, now=100.0)
        offset += length
    assert [p for _, p in s.queues[2].pending] == [11, 12]
    assert s.release(100.0005) == pytest.approx(100.001)  # nothing due yet
    assert s.sock.sent == []  # type: ignore[attr-defined]
    assert s.release(100.002) == pytest.approx(100.010)
    (verdict,) = s.sock.sent  # type: ignore[attr-defined]
    assert verdict[18:20] == struct.pack(">H", 5)
    assert struct.unpack_from(">II", verdict, 24) == (netdelay.NF_ACCEPT, 40)
    assert s.release(100.010) is None
    # one batch verdict releases 11 and 12: every id up to 12
    assert struct.unpack_from(">II", s.sock.sent[-1], 24) == (1, 12)  # type: ignore[attr-defined]
    assert len(s.sock.sent) == 2  # type: ignore[attr-defined]


def test_bad_config_is_refused() -> None:
    with pytest.raises(netdelay.NetDelayError, match="list 'queues'"):
        netdelay._configure({"queues": 3}, {}, None, -1)  # type: ignore[arg-type]
    with pytest.raises(netdelay.NetDelayError, match="bad queue entry"):
        netdelay._configure({"queues": [{"netns": "x"}]}, {}, None, -1)  # type: ignore[arg-type]
    with pytest.raises(netdelay.NetDelayError, match="bad queue entry"):
        netdelay._configure({"queues": [{"netns": "../x", "queue": 1, "delay_s": 0}]}, {},
                            None, -1)  # type: ignore[arg-type]
