"""What a bookie runs on, passed in: :class:`BookieContext`.

:class:`~.server.BookieServer` is the bookie's one composition root: it builds the
storage, the request processor, the listener, the registration, the disk watch
and garbage collection, and takes every I/O seam they stand on from its context:

* ``open_metadata``: the metadata store (etcd with the bookie's TLS and user, from
  its configuration; the simulator's shared in-memory store);
* ``io`` and ``offload``: file operations and "run this blocking call off the
  loop" (:mod:`.fileio`), used by the storage, the cookies and the disk watch;
  ``kv_open`` opens the on-disk index (``index_backend = "lmdb"``);
* ``disk_usage``: the probe of a directory's file system, ``(free, total)`` bytes
  (``statvfs``), a blocking call run through ``offload``;
* ``lock_directories`` and ``resolve``: the directory lock and how a directory is
  made absolute, for the cookie;
* ``network``: the port and liveness checks before start, and listening
  (:class:`~.startup.BookieNetwork`);
* ``clock`` and ``rng``: time and randomness (the registration's back-off jitter),
  so that a simulated run replays from its seed;
* ``log`` and ``on_state_change``: where the bookie logs, and who hears each change
  of its state (:class:`~.state.Change`);
* ``tracing``: the spans of traced requests.

The defaults are the real ones: a bookie process never builds a context.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..config import BookieConfig
from ..meta.api import MetadataStore
from ..meta.uri import open_metadata_store
from ..net.etcd_security import bookie_etcd_security
from ..tracing import Tracing
from .cookie import DirectoryLocker, os_directory_lock
from .fileio import OS_FILE_IO, THREAD_OFFLOAD, FileIO, Offload
from .startup import OS_NETWORK, BookieNetwork
from .state import Change
from .storage.recovery import KVOpener

MetadataFactory = Callable[[BookieConfig], Awaitable[MetadataStore]]
"""Opens the bookie's metadata store from its configuration."""

DiskProbe = Callable[[Path], tuple[int, int]]
"""``(free bytes, total bytes)`` of the file system holding a directory (blocking)."""


async def open_bookie_metadata(config: BookieConfig) -> MetadataStore:
    """The store of ``config.metadata_uri``, with the bookie's etcd TLS and user."""
    etcd = await asyncio.to_thread(bookie_etcd_security, config)
    return await open_metadata_store(config.metadata_uri, timeout_s=config.metadata_timeout_s,
                                     **etcd.store_options())


def statvfs_usage(path: Path) -> tuple[int, int]:
    """``(free, total)`` bytes of the file system holding ``path`` (``os.statvfs``:
    blocks available to unprivileged users)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def device_of(path: Path) -> int:
    """The device holding ``path`` (``st_dev``), so a disk shared by several ledger
    directories is counted once."""
    return os.stat(path).st_dev


@dataclass(frozen=True, slots=True)
class BookieContext:
    """The seams of one bookie (module docstring)."""

    clock: Clock = SYSTEM_CLOCK
    rng: random.Random = field(default_factory=random.Random)
    open_metadata: MetadataFactory = open_bookie_metadata
    io: FileIO = OS_FILE_IO
    offload: Offload = THREAD_OFFLOAD
    kv_open: KVOpener | None = None
    """Opens the on-disk index (None: LMDB)."""
    disk_usage: DiskProbe | None = None
    """None: ``statvfs`` (:func:`statvfs_usage`)."""
    device_of: Callable[[Path], int] = device_of
    lock_directories: DirectoryLocker = os_directory_lock
    resolve: Callable[[Path], Path] = Path.resolve
    network: BookieNetwork = OS_NETWORK
    log: Any = None
    """The bookie's logger (None: structlog's, with ``bookie_id`` bound)."""
    on_state_change: Callable[[str, Change], None] | None = None
    """``on_state_change(bookie_id, change)`` after each change of state or reasons."""
    tracing: Tracing | None = None
    """Spans of the requests that carry a trace context (None: as ``otel_exporter``
    says, through a tracer provider of the process's own, or no spans)."""


__all__ = ["BookieContext", "DiskProbe", "MetadataFactory", "device_of",
           "open_bookie_metadata", "statvfs_usage"]
