"""Child processes that never outlive their parent, and a data directory that one
local cluster owns at a time.

* :func:`guarded` wraps a command so that, on Linux, the child gets SIGKILL
  when the process that started it dies (``prctl(PR_SET_PDEATHSIG)``), even
  when that process is killed with SIGKILL and has no chance to clean up.  The
  wrapper is a few lines of Python that set the flag and then ``exec`` the real
  command, so the pid stays the same.  The signal fires when the *thread* that
  forked the child exits: start children from the thread that runs for the
  process's lifetime (the event loop's thread in the main thread).
* :class:`DataDirLock` takes an exclusive ``flock`` on ``<data_dir>/cluster.lock``
  for the life of a cluster and keeps ``<data_dir>/cluster.pid`` (JSON: owner
  pid, metadata URI, every child with its pid, start time and command line).
  A second cluster on the same directory is refused with a message naming the
  running one.  A state file left by an owner that died (its lock is gone with
  it) lists the children it may have left behind; :func:`kill_leftovers` kills
  those that are still running, after checking through ``/proc`` that each is
  really the process recorded (same start time and command line), so a reused
  pid is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import BKError

LOCK_FILE = "cluster.lock"
STATE_FILE = "cluster.pid"
LEFTOVER_EXIT_TIMEOUT_S = 5.0

# Run as ``python -I -S -c GUARD <parent pid> <command...>``: ask for SIGKILL when the
# parent dies, give up if it already died (the flag would never fire), then become the
# command.
_GUARD = """\
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:
    sys.exit("cannot set PR_SET_PDEATHSIG: " + os.strerror(ctypes.get_errno()))
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def guarded(command: list[str]) -> list[str]:
    """``command``, wrapped so that on Linux it is killed when this process dies;
    unchanged elsewhere."""
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-I", "-S", "-c", _GUARD, str(os.getpid()), *command]


# ------------------------------------------------------------------ /proc


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` (clock ticks after boot, from ``/proc``); None if it is
    gone, a zombie, or ``/proc`` is unavailable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    # fields[0] is the state (field 3 of stat), fields[19] the start time (field 22)
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


def process_cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    if Path("/proc").is_dir():
        return process_start_time(pid) is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe_pid(pid: int, width: int = 100) -> str:
    """``pid 123: etcd --name ...`` (the command line cut to ``width``)."""
    cmd = process_cmdline(pid)
    if not cmd:
        return f"pid {pid}"
    text = " ".join(cmd)
    return f"pid {pid}: {text[:width]}{'...' if len(text) > width else ''}"


# ------------------------------------------------------------------ the data directory


@dataclass
class ChildRecord:
    """A child process as recorded in the state file."""

    name: str
    pid: int
    start_time: int | None
    argv: list[str]


@dataclass
class ClusterState:
    owner: str
    pid: int
    start_time: int | None
    metadata_uri: str | None = None
    children: list[ChildRecord] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        d = json.loads(text)
        children = [ChildRecord(str(c["name"]), int(c["pid"]),
                                None if c.get("start_time") is None else int(c["start_time"]),
                                [str(a) for a in c["argv"]]) for c in d.get("children", [])]
        return cls(str(d.get("owner", "a local cluster")), int(d["pid"]),
                   None if d.get("start_time") is None else int(d["start_time"]),
                   d.get("metadata_uri"), children)


class LocalClusterError(BKError):
    """A local cluster could not start (its data directory or a port is in use...)."""


class ClusterRunningError(LocalClusterError):
    """Another local cluster runs on this data directory."""

    def __init__(self, data_dir: Path, state: ClusterState | None) -> None:
        self.data_dir = data_dir
        self.state = state
        if state is None:
            text = (f"a local cluster is already running on {data_dir} (it holds "
                    f"{data_dir / LOCK_FILE}); stop it first, or choose another data directory")
        else:
            uri = (f"metadata URI {state.metadata_uri}" if state.metadata_uri
                   else "metadata URI not known yet (it is starting)")
            text = (f"{state.owner} is already running on {data_dir} (pid {state.pid}), "
                    f"{uri}; use it, stop it first, or choose another data directory")
        super().__init__(text)


def read_state(data_dir: Path) -> ClusterState | None:
    try:
        return ClusterState.from_json((data_dir / STATE_FILE).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


class DataDirLock:
    """Exclusive ownership of a local cluster's data directory; see the module
    docstring.  Blocking file I/O: call from a thread in async code."""

    def __init__(self, data_dir: Path, owner: str) -> None:
        self.data_dir = data_dir
        self.owner = owner
        self._fd: int | None = None
        self.state = ClusterState(owner, os.getpid(), None)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> ClusterState | None:
        """Take the lock (ClusterRunningError if another cluster holds it) and write
        the state file.  Returns the state file a dead previous owner left, if any."""
        import fcntl

        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ClusterRunningError(self.data_dir, read_state(self.data_dir)) from None
        self._fd = fd
        previous = read_state(self.data_dir)
        self.state = ClusterState(self.owner, os.getpid(), process_start_time(os.getpid()))
        self.write()
        return previous

    def write(self) -> None:
        """Replace the state file (atomically: readers never see half of it)."""
        tmp = self.data_dir / (STATE_FILE + ".tmp")
        tmp.write_text(self.state.to_json())
        os.replace(tmp, self.data_dir / STATE_FILE)

    def release(self) -> None:
        """Remove the state file (every child is gone) and drop the lock."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / STATE_FILE).unlink()
        os.close(fd)  # closing the descriptor drops the lock


def is_recorded_process(child: ChildRecord) -> bool:
    """True if ``child.pid`` is still the very process recorded: same start time and
    command line (never a pid the system has since given to someone else)."""
    if child.start_time is None:
        return False
    # (A child caught between fork and exec still shows the guard's command line; the
    # guard exits by itself then, since its parent is gone.)
    return (process_start_time(child.pid) == child.start_time
            and process_cmdline(child.pid) == child.argv)


def kill_leftovers(previous: ClusterState, timeout_s: float = LEFTOVER_EXIT_TIMEOUT_S) -> list[str]:
    """SIGKILL the children a dead owner left running (only those that are provably
    the processes it recorded); wait until they are gone.  Returns what was killed."""
    if previous.pid != os.getpid() and previous.start_time is not None \
            and process_start_time(previous.pid) == previous.start_time:
        # The owner still runs (it cannot hold the lock, or we would not be here,
        # but it is alive): its children are its business.
        return []
    killed: list[str] = []
    for child in previous.children:
        if is_recorded_process(child):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child.pid, signal.SIGKILL)
                killed.append(f"{child.name} (pid {child.pid})")
    deadline = time.monotonic() + timeout_s
    pending = [c for c in previous.children if is_recorded_process(c)]
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = [c for c in pending if is_recorded_process(c)]
    if pending:
        raise LocalClusterError(
            "processes of a previous run on this data directory do not exit: "
            + ", ".join(f"{c.name} (pid {c.pid})" for c in pending))
    return killed
