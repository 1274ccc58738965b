"""Latency between network namespaces without ``sch_netem``: packets are queued to
user space with netfilter's NFQUEUE and released after their delay.

Run as a process of its own (``python -m asyncbk.local.netdelay``) by
:class:`asyncbk.local.network.Network`; it reads its configuration as one JSON
object on stdin::

    {"queues": [{"netns": "abk123-h1", "queue": 2, "delay_s": 0.001}, ...]}

For each entry it binds NFQUEUE ``queue`` in network namespace ``netns`` (the
namespace's iptables rules send packets there) and gives every packet that
arrives an accept verdict ``delay_s`` after it was queued.  The delay of a queue
is constant, so packets leave in the order they came, and one batch verdict
(``NFQNL_MSG_VERDICT_BATCH``: every id up to N) releases all that are due; the
kernel copies no payload to us (``NFQNL_COPY_META``).  It prints ``ready`` once
every queue is bound, and runs until stdin closes or it is killed.  Each further
line on stdin has the same form: new queues are bound, known ones take the new
delay (for packets queued from then on); it answers ``ok`` or ``error: ...``.  If it dies,
the queued packets are dropped and new ones are too: the namespaces' rules do
not bypass a missing reader, so a lost delay shows up as a partition, never as
a silently faster network.

Why not ``tc qdisc ... netem``: many kernels (this project's CI among them) are
built without ``sch_netem``; NFQUEUE is in every netfilter build.  The netlink
protocol is small and written here (no library offers NFQUEUE without a C
dependency).
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import socket
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass, field

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_CONFIG = 2
NFQNL_MSG_VERDICT_BATCH = 3
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 4
NF_ACCEPT = 1
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
CLONE_NEWNET = 0x40000000
QUEUE_MAXLEN = 65536
RCVBUF = 8 << 20

_NLMSG = struct.Struct("=IHHII")
_NFGEN = struct.Struct("=BBH")  # family, version, res_id (big-endian, packed by hand)
_NLATTR = struct.Struct("=HH")


class NetDelayError(Exception):
    """The delay process could not set up a queue."""


def _attr(kind: int, payload: bytes) -> bytes:
    length = _NLATTR.size + len(payload)
    return _NLATTR.pack(length, kind) + payload + b"\0" * (-length % 4)


def _message(msg: int, queue: int, attrs: bytes, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
    body = _NFGEN.pack(socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    kind = (NFNL_SUBSYS_QUEUE << 8) | msg
    return _NLMSG.pack(_NLMSG.size + len(body), kind, flags, seq, 0) + body


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetDelayError(f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass
class _Queue:
    number: int
    delay_s: float
    pending: deque[tuple[float, int]] = field(default_factory=deque)


class _Socket:
    """One netlink socket in one namespace, bound to that namespace's queues."""

    def __init__(self, netns: str) -> None:
        self.netns = netns
        self.queues: dict[int, _Queue] = {}
        self.seq = 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        self.sock.bind((0, 0))

    def _request(self, msg: int, queue: int, attrs: bytes) -> None:
        self.seq += 1
        self.sock.send(_message(msg, queue, attrs, self.seq, NLM_F_REQUEST | NLM_F_ACK))
        data = self.sock.recv(65536)
        _, kind, _, _, _ = _NLMSG.unpack_from(data)
        if kind == NLMSG_ERROR:
            (errno,) = struct.unpack_from("=i", data, _NLMSG.size)
            if errno != 0:
                raise NetDelayError(f"queue {queue} in {self.netns}: {os.strerror(-errno)}")

    def bind(self, number: int, delay_s: float) -> None:
        self._request(NFQNL_MSG_CONFIG, number,
                      _attr(NFQA_CFG_CMD, struct.pack("=BBH", NFQNL_CFG_CMD_BIND, 0, 0)))
        self._request(NFQNL_MSG_CONFIG, number,
                      _attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))
                      + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", QUEUE_MAXLEN))
                      + _attr(NFQA_CFG_MASK, struct.pack(">I", NFQA_CFG_F_GSO))
                      + _attr(NFQA_CFG_FLAGS, struct.pack(">I", NFQA_CFG_F_GSO)))
        self.queues[number] = _Queue(number, delay_s)

    def receive(self, now: float) -> None:
        """Queue every packet the kernel has handed over (non-blocking)."""
        while True:
            try:
                data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as exc:  # ENOBUFS: the kernel dropped some; TCP resends them
                if exc.errno == 105:
                    continue
                raise
            offset = 0
            while offset + _NLMSG.size <= len(data):
                length, kind, _, _, _ = _NLMSG.unpack_from(data, offset)
                if length < _NLMSG.size:
                    break
                if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    self._packet(data, offset, length, now)
                offset += (length + 3) & ~3

    def _packet(self, data: bytes, offset: int, length: int, now: float) -> None:
        res_id = struct.unpack_from(">H", data, offset + _NLMSG.size + 2)[0]
        queue = self.queues.get(res_id)
        pos = offset + _NLMSG.size + _NFGEN.size
        end = offset + length
        while pos + _NLATTR.size <= end:
            alen, akind = _NLATTR.unpack_from(data, pos)
            if alen < _NLATTR.size:
                return
            if (akind & 0x7FFF) == NFQA_PACKET_HDR and queue is not None:
                (packet_id,) = struct.unpack_from(">I", data, pos + _NLATTR.size)
                queue.pending.append((now + queue.delay_s, packet_id))
                return
            pos += (alen + 3) & ~3

    def release(self, now: float) -> float | None:
        """Accept every packet that is due; the next deadline, if any."""
        nearest: float | None = None
        for queue in self.queues.values():
            last = -1
            pending = queue.pending
            while pending and pending[0][0] <= now:
                last = pending.popleft()[1]
            if last >= 0:
                self.seq += 1
                self.sock.send(_message(NFQNL_MSG_VERDICT_BATCH, queue.number,
                                        _attr(NFQA_VERDICT_HDR,
                                              struct.pack(">II", NF_ACCEPT, last)),
                                        self.seq))
            if pending and (nearest is None or pending[0][0] < nearest):
                nearest = pending[0][0]
        return nearest


SPIN_S = 0.0015
"""Below this, wait with ``nanosleep`` instead of ``epoll``, whose timeout is in
whole milliseconds (so sub-millisecond delays stay sub-millisecond)."""


def _configure(config: object, sockets: dict[str, _Socket], poller: select.epoll,
               home_fd: int) -> None:
    """Bind the queues of ``config`` (or change their delays)."""
    entries = config.get("queues") if isinstance(config, dict) else None
    if not isinstance(entries, list):
        raise NetDelayError("config needs a list 'queues'")
    libc = ctypes.CDLL(None, use_errno=True)
    for entry in entries:
        try:
            netns, number = str(entry["netns"]), int(entry["queue"])
            delay = float(entry["delay_s"])
        except (KeyError, TypeError, ValueError) as exc:
            raise NetDelayError(f"bad queue entry {entry!r}: {exc}") from None
        if not 0 <= delay <= 10 or not 0 <= number < 65536 or "/" in netns:
            raise NetDelayError(f"bad queue entry {entry!r}")
        if netns not in sockets:
            _setns(f"/run/netns/{netns}")
            try:
                sockets[netns] = _Socket(netns)
            finally:
                if libc.setns(home_fd, CLONE_NEWNET) != 0:
                    raise NetDelayError("cannot return to the original network namespace")
            poller.register(sockets[netns].sock.fileno(), select.EPOLLIN)
        queue = sockets[netns].queues.get(number)
        if queue is None:
            sockets[netns].bind(number, delay)
        else:
            queue.delay_s = delay


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run(config: dict[str, object]) -> None:
    home_fd = os.open(f"/proc/{os.getpid()}/ns/net", os.O_RDONLY)
    sockets: dict[str, _Socket] = {}
    poller = select.epoll()
    _configure(config, sockets, poller, home_fd)
    stdin_fd = sys.stdin.fileno()
    poller.register(stdin_fd, select.EPOLLIN)
    _say("ready")
    pending_input = b""
    nearest: float | None = None
    while True:
        now = time.monotonic()
        if nearest is not None and nearest - now < SPIN_S:
            time.sleep(max(0.0, nearest - now))
            events = poller.poll(0)
        else:
            events = poller.poll(-1 if nearest is None else nearest - now - SPIN_S / 2)
        now = time.monotonic()
        by_fd = {s.sock.fileno(): s for s in sockets.values()}
        for fd, _ in events:
            if fd == stdin_fd:
                chunk = os.read(stdin_fd, 65536)
                if not chunk:
                    return
                pending_input += chunk
                while b"\n" in pending_input:
                    line, pending_input = pending_input.split(b"\n", 1)
                    try:
                        _configure(json.loads(line), sockets, poller, home_fd)
                    except (NetDelayError, OSError, ValueError) as exc:
                        _say(f"error: {exc}")
                    else:
                        _say("ok")
                continue
            by_fd[fd].receive(now)
        nearest = None
        for s in sockets.values():
            due = s.release(now)
            if due is not None and (nearest is None or due < nearest):
                nearest = due


def main() -> None:
    try:
        first = b""
        while not first.endswith(b"\n"):  # unbuffered: later lines are read from the fd
            byte = os.read(sys.stdin.fileno(), 1)
            if not byte:
                return
            first += byte
        run(json.loads(first))
    except (NetDelayError, ValueError) as exc:
        sys.exit(f"asyncbk netdelay: error: {exc}")
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
