"""Candidates for an on-disk entry index (issue 13), measured on this machine.

The bookie's index maps (ledger id, entry id) to the entry's place in an entry
log.  This file defines the small interface such an index would sit behind
(:class:`IndexBackend`), implements it over sqlite3 (stdlib), lmdb and rocksdict
(RocksDB), and measures each one the way a bookie would use it:

* bulk write: N entries over L ledgers, interleaved as a bookie receives them,
  in batches (one journal group each), with ``sync()`` every ``--sync-every``
  puts (a checkpoint's durable point);
* the same bulk write into a fresh index while a journal-like thread appends
  1 KiB records to a file with a group fdatasync at full speed, reporting the
  index rate and the journal rate against the journal alone;
* point lookups (hits; misses) and range lookups of ``--range-len`` entries;
* restart: close and reopen a populated index, up to the first answered get;
* delete 90% of the ledgers, then space on disk, lookups after the deletes,
  compaction where the backend has one (RocksDB ``compact_range``, SQLite
  ``VACUUM``; LMDB has none in place, its free pages are reused, so it is
  measured by a compacting copy and by writing new entries into the freed
  space), lookups after compaction;
* memory: VmRSS / RssAnon / RssFile / VmHWM of the process, each backend (and
  each repetition) in its own subprocess so the figures are comparable;
* ``--crash-test``: a writer process killed with SIGKILL mid-run, the index
  reopened: does it open, and which entries survived (against what the writer
  had seen returned from ``put_batch`` and from ``sync``)?

Every repetition runs each backend once (backends interleaved, so a noisy spell
hits all of them); the report is the median of the repetitions, with ratios to
sqlite3 measured in the same run.

    python benchmarks/index_candidates.py --entries 1000000 --json out.json
    python benchmarks/index_candidates.py --entries 2000 --reps 1 --crash-test
    python benchmarks/index_candidates.py --help
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import resource
import shutil
import signal
import sqlite3
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

# ---------------------------------------------------------------------------
# The interface and its encodings
# ---------------------------------------------------------------------------

KEY = struct.Struct(">QQ")     # ledger, entry: big-endian, so byte order = numeric order
VALUE = struct.Struct(">QQI")  # entry log id, offset, length
LEDGER_KEY = struct.Struct(">Q")

Item = tuple[int, int, int, int, int]  # ledger, entry, log id, offset, length


class IndexBackend(Protocol):
    """What the bookie needs from its entry index (one writer; reads anywhere
    between writes).  Nothing written is durable before :meth:`sync`."""

    def put_batch(self, items: Sequence[Item]) -> None: ...
    def get(self, ledger: int, entry: int) -> tuple[int, int, int] | None: ...
    def range(self, ledger: int, first: int, last: int) -> list[tuple[int, int, int, int]]: ...
    def delete_ledger(self, ledger: int) -> None: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...


# ---------------------------------------------------------------------------
# sqlite3
# ---------------------------------------------------------------------------

class SqliteIndex:
    """A ``WITHOUT ROWID`` table keyed on (ledger, entry), in WAL mode.

    ``synchronous=NORMAL`` in WAL mode: commits are not fsynced; a checkpoint
    fsyncs the WAL, copies it into the database and fsyncs that.  Automatic
    checkpoints are off, so :meth:`sync` (an explicit ``wal_checkpoint``) is the
    only fsync.  (``synchronous=OFF`` would make even the checkpoint skip its
    fsyncs, so there would be no durable point at all.)  A process kill keeps
    every committed batch (the WAL is in the page cache); a power loss keeps a
    consistent database as of some commit after the last sync."""

    name = "sqlite"

    def __init__(self, path: Path, cache_mb: int = 64) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path / "index.sqlite", isolation_level=None,
                                   check_same_thread=False)
        c = self._db
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA synchronous=NORMAL")
        c.execute("PRAGMA wal_autocheckpoint=0")
        c.execute(f"PRAGMA cache_size=-{cache_mb * 1024}")
        c.execute("CREATE TABLE IF NOT EXISTS idx (ledger INTEGER NOT NULL, entry INTEGER NOT NULL,"
                  " log INTEGER NOT NULL, off INTEGER NOT NULL, len INTEGER NOT NULL,"
                  " PRIMARY KEY (ledger, entry)) WITHOUT ROWID")

    def put_batch(self, items: Sequence[Item]) -> None:
        c = self._db
        c.execute("BEGIN")
        c.executemany("INSERT OR REPLACE INTO idx VALUES (?,?,?,?,?)", sorted(items))
        c.execute("COMMIT")

    def get(self, ledger: int, entry: int) -> tuple[int, int, int] | None:
        row = self._db.execute("SELECT log, off, len FROM idx WHERE ledger=? AND entry=?",
                               (ledger, entry)).fetchone()
        return row  # type: ignore[no-any-return]

    def range(self, ledger: int, first: int, last: int) -> list[tuple[int, int, int, int]]:
        return self._db.execute(  # type: ignore[no-any-return]
            "SELECT entry, log, off, len FROM idx WHERE ledger=? AND entry BETWEEN ? AND ?"
            " ORDER BY entry", (ledger, first, last)).fetchall()

    def delete_ledger(self, ledger: int) -> None:
        self._db.execute("DELETE FROM idx WHERE ledger=?", (ledger,))

    def sync(self) -> None:
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def compact(self) -> None:
        self.sync()
        self._db.execute("VACUUM")
        self.sync()

    def close(self) -> None:
        self.sync()
        self._db.close()


# ---------------------------------------------------------------------------
# lmdb
# ---------------------------------------------------------------------------

class LmdbIndex:
    """One LMDB environment, one unnamed database; writes with ``sync=False``
    (MDB_NOSYNC) and :meth:`sync` = ``env.sync(True)``.  One read transaction
    is kept between writes (renewed after each write), as a bookie would.
    LMDB has no range delete: a ledger is deleted key by key with a cursor.
    The file never shrinks; freed pages are reused by later writes."""

    name = "lmdb"

    def __init__(self, path: Path, *, writemap: bool = False,
                 map_size: int = 1 << 40) -> None:
        import lmdb

        path.mkdir(parents=True, exist_ok=True)
        self._env = lmdb.open(str(path), map_size=map_size, subdir=True, sync=False,
                              metasync=False, readahead=False, writemap=writemap,
                              max_dbs=0, lock=True)
        self._rtxn: Any = None

    def _reader(self) -> Any:
        if self._rtxn is None:
            self._rtxn = self._env.begin(buffers=False)
        return self._rtxn

    def _drop_reader(self) -> None:
        if self._rtxn is not None:
            self._rtxn.abort()
            self._rtxn = None

    def put_batch(self, items: Sequence[Item]) -> None:
        kp, vp = KEY.pack, VALUE.pack
        pairs = sorted((kp(lg, e), vp(log, off, ln)) for lg, e, log, off, ln in items)
        self._drop_reader()
        with self._env.begin(write=True) as txn:
            txn.cursor().putmulti(pairs)

    def get(self, ledger: int, entry: int) -> tuple[int, int, int] | None:
        v = self._reader().get(KEY.pack(ledger, entry))
        return None if v is None else VALUE.unpack(v)

    def range(self, ledger: int, first: int, last: int) -> list[tuple[int, int, int, int]]:
        out: list[tuple[int, int, int, int]] = []
        cur = self._reader().cursor()
        if not cur.set_range(KEY.pack(ledger, first)):
            return out
        end = KEY.pack(ledger, last)
        unpack = VALUE.unpack
        for k, v in cur:
            if k > end:
                break
            out.append((KEY.unpack(k)[1], *unpack(v)))
        return out

    def delete_ledger(self, ledger: int) -> None:
        lo = LEDGER_KEY.pack(ledger)
        self._drop_reader()
        with self._env.begin(write=True) as txn:
            cur = txn.cursor()
            if cur.set_range(lo):
                while cur.key()[:8] == lo:
                    if not cur.delete():
                        break

    def sync(self) -> None:
        self._env.sync(True)

    def compact_copy(self, dest: Path) -> None:
        """LMDB's only compaction: a compacting copy to another file (the live
        environment keeps its size; a bookie would copy, then swap files)."""
        dest.mkdir(parents=True, exist_ok=True)
        self._env.copy(str(dest), compact=True)

    def close(self) -> None:
        self._drop_reader()
        self._env.sync(True)
        self._env.close()


class LmdbWritemapIndex(LmdbIndex):
    """LMDB with MDB_WRITEMAP (pages written through the shared map: fewer
    copies, but with NOSYNC a system crash may corrupt the file, per the LMDB
    documentation; a process kill does not)."""

    name = "lmdb-writemap"

    def __init__(self, path: Path) -> None:
        super().__init__(path, writemap=True)


# ---------------------------------------------------------------------------
# rocksdict (RocksDB)
# ---------------------------------------------------------------------------

class RocksIndex:
    """RocksDB through rocksdict in raw (bytes) mode, with the knobs
    DbLedgerStorage sets (64 MiB write buffer and target file size, bloom
    filter 10 bits/key, a bounded block cache holding index and filter blocks
    too).  Writes are one WriteBatch per put_batch; a ledger is deleted with
    one ``delete_range`` (as DbLedgerStorage does).

    ``wal=True``: default WAL, not fsynced per write; :meth:`sync` =
    ``flush_wal(sync=True)``.  ``wal=False`` (``disable_wal``: the bookie's
    journal is the WAL): unflushed memtables are lost by a crash, so
    :meth:`sync` must flush the memtable to an SST file."""

    def __init__(self, path: Path, *, wal: bool, cache_mb: int = 64,
                 write_buffer_mb: int = 64) -> None:
        import rocksdict as rd

        self._rd = rd
        self.name = "rocksdict-wal" if wal else "rocksdict-nowal"
        self._wal = wal
        opt = rd.Options(raw_mode=True)
        opt.create_if_missing(True)
        opt.set_max_background_jobs(2)
        opt.set_write_buffer_size(write_buffer_mb << 20)
        opt.set_max_write_buffer_number(3)
        opt.set_target_file_size_base(64 << 20)
        opt.set_level_compaction_dynamic_level_bytes(True)
        opt.set_compression_type(rd.DBCompressionType.lz4())
        opt.set_keep_log_file_num(2)
        opt.set_max_log_file_size(1 << 20)
        tbl = rd.BlockBasedOptions()
        tbl.set_block_cache(rd.Cache(cache_mb << 20))
        tbl.set_bloom_filter(10, False)
        tbl.set_block_size(16 << 10)
        # cache_index_and_filter_blocks=True would bound index/filter memory by the
        # cache, but through rocksdict it made single gets ~25x slower here (9k/s vs
        # 220k/s at 1M keys); so index and filter blocks stay in the table readers
        # (about 1.3 B/key of bloom filter plus the index blocks, outside the cache).
        tbl.set_cache_index_and_filter_blocks(False)
        opt.set_block_based_table_factory(tbl)
        self._db = rd.Rdict(str(path), opt)
        self._wo = rd.WriteOptions()
        self._wo.disable_wal = not wal
        self._db.set_write_options(self._wo)

    def put_batch(self, items: Sequence[Item]) -> None:
        wb = self._rd.WriteBatch(raw_mode=True)
        kp, vp = KEY.pack, VALUE.pack
        for lg, e, log, off, ln in items:
            wb.put(kp(lg, e), vp(log, off, ln))
        self._db.write(wb, self._wo)

    def get(self, ledger: int, entry: int) -> tuple[int, int, int] | None:
        v = self._db.get(KEY.pack(ledger, entry))
        return None if v is None else VALUE.unpack(v)

    def range(self, ledger: int, first: int, last: int) -> list[tuple[int, int, int, int]]:
        out: list[tuple[int, int, int, int]] = []
        it = self._db.iter()
        it.seek(KEY.pack(ledger, first))
        end = KEY.pack(ledger, last)
        unpack = VALUE.unpack
        while it.valid():
            k = it.key()
            if k > end:
                break
            out.append((KEY.unpack(k)[1], *unpack(it.value())))
            it.next()
        return out

    def delete_ledger(self, ledger: int) -> None:
        self._db.delete_range(LEDGER_KEY.pack(ledger) + bytes(8),
                              LEDGER_KEY.pack(ledger + 1) + bytes(8), self._wo)

    def sync(self) -> None:
        if self._wal:
            self._db.flush_wal(True)
        else:
            self._db.flush(True)

    def compact(self) -> None:
        self._db.compact_range(None, None)

    def close(self) -> None:
        self.sync()
        self._db.close()


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------

def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


BACKENDS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    # name: (module it needs, factory)
    "sqlite": ("sqlite3", SqliteIndex),
    "lmdb": ("lmdb", LmdbIndex),
    "lmdb-writemap": ("lmdb", LmdbWritemapIndex),
    "rocksdict-wal": ("rocksdict", lambda p: RocksIndex(p, wal=True)),
    "rocksdict-nowal": ("rocksdict", lambda p: RocksIndex(p, wal=False)),
}


def open_backend(name: str, path: Path) -> Any:
    return BACKENDS[name][1](path)


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    with contextlib.suppress(ImportError):
        import lmdb
        out["lmdb (py-lmdb)"] = lmdb.__version__
        out["lmdb (liblmdb)"] = ".".join(map(str, lmdb.version()))
    with contextlib.suppress(Exception):
        from importlib.metadata import version
        out["rocksdict"] = version("rocksdict")
    return out


# ---------------------------------------------------------------------------
# Workload pieces
# ---------------------------------------------------------------------------

LEDGER_BASE = 1 << 40  # ledger ids well past 32 bits


def ledger_of(k: int) -> int:
    return LEDGER_BASE + 7 * k


def item_at(i: int, ledgers: int) -> Item:
    """The i-th entry a bookie receives: ledgers interleaved round robin."""
    return (ledger_of(i % ledgers), i // ledgers, i // 1_000_000, (i % 1_000_000) * 1100,
            1050 + i % 50)


def batches(start: int, n: int, ledgers: int, batch: int) -> Iterator[list[Item]]:
    for b0 in range(start, start + n, batch):
        yield [item_at(i, ledgers) for i in range(b0, min(b0 + batch, start + n))]


def bulk_write(ix: Any, start: int, n: int, ledgers: int, batch: int,
               sync_every: int) -> float:
    """Seconds spent inside put_batch and sync (item generation not counted)."""
    spent = 0.0
    since_sync = 0
    pc = time.perf_counter
    for items in batches(start, n, ledgers, batch):
        t0 = pc()
        ix.put_batch(items)
        since_sync += len(items)
        if since_sync >= sync_every:
            ix.sync()
            since_sync = 0
        spent += pc() - t0
    t0 = pc()
    ix.sync()
    return spent + pc() - t0


class JournalWriter(threading.Thread):
    """A journal-like appender: groups of ``group`` 1 KiB records, each built
    in Python (header + body, as a bookie frames them), one write and one
    fdatasync per group; the file is cut back to 0 every 256 MiB."""

    def __init__(self, path: Path, group: int = 64, record: int = 1024) -> None:
        super().__init__(daemon=True)
        self.path, self.group, self.record = path, group, record
        self.records = 0
        self.stop_flag = threading.Event()
        self.elapsed = 0.0

    def run(self) -> None:
        hdr = struct.Struct(">IQQQ")
        body = os.urandom(self.record - hdr.size)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        pos, seq = 0, 0
        t0 = time.perf_counter()
        try:
            while not self.stop_flag.is_set():
                parts = []
                for _ in range(self.group):
                    seq += 1
                    parts.append(hdr.pack(self.record, 1, seq, seq))
                    parts.append(body)
                buf = b"".join(parts)
                os.write(fd, buf)
                os.fdatasync(fd)
                self.records += self.group
                pos += len(buf)
                if pos >= 256 << 20:
                    os.ftruncate(fd, 0)
                    os.lseek(fd, 0, os.SEEK_SET)
                    pos = 0
        finally:
            self.elapsed = time.perf_counter() - t0
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def stop(self) -> float:
        """Stop and return records per second."""
        self.stop_flag.set()
        self.join()
        return self.records / self.elapsed if self.elapsed else 0.0


def journal_alone(path: Path, seconds: float) -> float:
    j = JournalWriter(path)
    j.start()
    time.sleep(seconds)
    return j.stop()


class GilProbe(threading.Thread):
    """Wakes every millisecond; the longest gap between wake-ups is how long
    this thread waited for the GIL (an asyncio loop would have stalled as
    long).  A CPU-bound Python thread alone gives it the GIL at the switch
    interval (5 ms); much longer gaps mean a C call held the GIL."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.max_gap = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        last = time.perf_counter()
        while not self.done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            self.max_gap = max(self.max_gap, now - last - 0.001)
            last = now

    def take_ms(self) -> float:
        gap, self.max_gap = self.max_gap, 0.0
        return gap * 1e3


def disk_usage(path: Path) -> tuple[int, int]:
    """(allocated bytes, apparent bytes) of every file under path."""
    alloc = apparent = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(os.path.join(root, f))
                alloc += st.st_blocks * 512
                apparent += st.st_size
    return alloc, apparent


def proc_status() -> dict[str, float]:
    """VmRSS, RssAnon, RssFile, VmHWM of this process, MiB."""
    out: dict[str, float] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(rest.split()[0]) / 1024
    return out


def cpu_and_io() -> tuple[float, int]:
    """(CPU seconds of every thread of this process, bytes it caused to be written
    to storage per /proc/self/io; mmap'd writes (lmdb writemap) are not counted)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    wb = 0
    with contextlib.suppress(OSError), open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                wb = int(line.split()[1])
    return r.ru_utime + r.ru_stime, wb


def timed_ops(fn: Callable[[Any], Any], args: Sequence[Any]) -> float:
    """Operations per second of fn over args."""
    t0 = time.perf_counter()
    for a in args:
        fn(a)
    dt = time.perf_counter() - t0
    return len(args) / dt if dt > 0 else float("inf")


# ---------------------------------------------------------------------------
# One backend, one repetition (runs in a child process)
# ---------------------------------------------------------------------------

def run_backend(name: str, workdir: Path, *, entries: int, ledgers: int, batch: int,
                sync_every: int, lookups: int, ranges: int, range_len: int,
                journal_entries: int, journal_seconds: float, delete_fraction: float,
                seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    res: dict[str, Any] = {"backend": name}
    mem0 = proc_status()
    res["rss_start_mb"] = mem0["VmRSS"]
    db_dir = workdir / "a"
    per_ledger = -(-entries // ledgers)
    probe = GilProbe()
    probe.start()

    # bulk write
    ix = open_backend(name, db_dir)
    cpu0, wb0 = cpu_and_io()
    dt = bulk_write(ix, 0, entries, ledgers, batch, sync_every)
    cpu1, wb1 = cpu_and_io()
    res["write_ops_s"] = entries / dt
    res["write_cpu_us_per_entry"] = (cpu1 - cpu0) / entries * 1e6
    res["write_disk_bytes_per_entry"] = (wb1 - wb0) / entries
    res["gil_stall_write_ms"] = probe.take_ms()
    res["write_us_per_entry"] = dt / entries * 1e6
    res["space_after_write_mb"] = disk_usage(db_dir)[0] / 2**20
    mem = proc_status()
    res["rss_after_write_mb"] = mem["VmRSS"]
    res["rss_anon_after_write_mb"] = mem["RssAnon"]
    res["rss_file_after_write_mb"] = mem["RssFile"]

    # restart
    t0 = time.perf_counter()
    ix.close()
    res["close_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ix = open_backend(name, db_dir)
    assert ix.get(ledger_of(0), 0) is not None
    res["reopen_s"] = time.perf_counter() - t0

    # lookups
    hits = [item_at(rng.randrange(entries), ledgers)[:2] for _ in range(lookups)]
    half = lookups // 2
    misses = ([(ledger_of(rng.randrange(ledgers)), per_ledger + rng.randrange(10**6))
               for _ in range(half)]
              + [(ledger_of(rng.randrange(ledgers)) + 1, rng.randrange(per_ledger))
                 for _ in range(lookups - half)])
    starts = []
    for _ in range(ranges):
        k = rng.randrange(ledgers)
        first = rng.randrange(max(1, per_ledger - range_len))
        starts.append((ledger_of(k), first, first + range_len - 1))
    get, rng_fn = ix.get, ix.range
    res["get_hit_ops_s"] = timed_ops(lambda a: get(*a), hits)
    res["get_miss_ops_s"] = timed_ops(lambda a: get(*a), misses)
    res["range_ops_s"] = timed_ops(lambda a: rng_fn(*a), starts)
    res["range_entries_s"] = res["range_ops_s"] * range_len
    res["gil_stall_lookups_ms"] = probe.take_ms()
    mem = proc_status()
    res["rss_after_lookups_mb"] = mem["VmRSS"]
    res["rss_anon_after_lookups_mb"] = mem["RssAnon"]

    # bulk write into a fresh index while a journal runs at full speed
    probe.take_ms()
    if journal_entries > 0:
        jpath = workdir / "journal.bin"
        before = journal_alone(jpath, journal_seconds)
        b_dir = workdir / "b"
        ixb = open_backend(name, b_dir)
        j = JournalWriter(jpath)
        j.start()
        t0 = time.perf_counter()
        spent = bulk_write(ixb, 0, journal_entries, ledgers, batch, sync_every)
        wall = time.perf_counter() - t0
        res["journal_during_rec_s"] = j.stop()
        ixb.close()
        shutil.rmtree(b_dir)
        # the disk is shared: the baseline is the mean of one run before, one after
        res["journal_alone_rec_s"] = (before + journal_alone(jpath, journal_seconds)) / 2
        res["write_with_journal_ops_s"] = journal_entries / spent
        res["write_with_journal_wall_ops_s"] = journal_entries / wall
        res["journal_drop_pct"] = 100 * (1 - res["journal_during_rec_s"]
                                         / res["journal_alone_rec_s"])

    # mass delete
    probe.take_ms()
    n_del = int(ledgers * delete_fraction)
    doomed = [ledger_of(k) for k in range(n_del)]
    kept = list(range(n_del, ledgers))
    t0 = time.perf_counter()
    for lg in doomed:
        ix.delete_ledger(lg)
    ix.sync()
    dt = time.perf_counter() - t0
    res["delete_ledgers_s"] = dt
    res["delete_keys_s"] = (n_del * per_ledger) / dt if dt > 0 else float("inf")
    res["space_after_delete_mb"] = disk_usage(db_dir)[0] / 2**20
    res["gil_stall_delete_ms"] = probe.take_ms()

    def after(tag: str) -> None:
        if not kept:
            return
        live = [(ledger_of(rng.choice(kept)), rng.randrange(per_ledger))
                for _ in range(lookups)]
        gone = [(rng.choice(doomed), rng.randrange(per_ledger)) for _ in range(lookups)]
        gone_ranges = []
        for _ in range(ranges):
            first = rng.randrange(max(1, per_ledger - range_len))
            gone_ranges.append((rng.choice(doomed), first, first + range_len - 1))
        live_ranges = []
        for _ in range(ranges):
            first = rng.randrange(max(1, per_ledger - range_len))
            live_ranges.append((ledger_of(rng.choice(kept)), first, first + range_len - 1))
        get, rng_fn = ix.get, ix.range
        res[f"get_hit_{tag}_ops_s"] = timed_ops(lambda a: get(*a), live)
        res[f"get_deleted_{tag}_ops_s"] = timed_ops(lambda a: get(*a), gone)
        res[f"range_{tag}_ops_s"] = timed_ops(lambda a: rng_fn(*a), live_ranges)
        res[f"range_deleted_{tag}_ops_s"] = timed_ops(lambda a: rng_fn(*a), gone_ranges)

    after("after_delete")

    # compaction
    probe.take_ms()
    t0 = time.perf_counter()
    if hasattr(ix, "compact"):
        ix.compact()
        res["compact_s"] = time.perf_counter() - t0
        res["gil_stall_compact_ms"] = probe.take_ms()
        res["space_after_compact_mb"] = disk_usage(db_dir)[0] / 2**20
        after("after_compact")
    elif hasattr(ix, "compact_copy"):
        ix.compact_copy(workdir / "copy")
        res["compact_s"] = time.perf_counter() - t0
        res["gil_stall_compact_ms"] = probe.take_ms()
        res["space_after_compact_mb"] = disk_usage(workdir / "copy")[0] / 2**20
        shutil.rmtree(workdir / "copy")

    # write as many new entries as were deleted, into new ledgers
    n_new = n_del * per_ledger
    dt = bulk_write(ix, entries * 10, n_new, ledgers, batch, sync_every)
    res["rewrite_ops_s"] = n_new / dt
    res["space_after_rewrite_mb"] = disk_usage(db_dir)[0] / 2**20
    mem = proc_status()
    res["rss_end_mb"] = mem["VmRSS"]
    res["rss_anon_end_mb"] = mem["RssAnon"]
    res["rss_peak_mb"] = mem["VmHWM"]
    ix.close()
    probe.done.set()
    probe.join()
    shutil.rmtree(db_dir)
    return res


# ---------------------------------------------------------------------------
# Crash test: SIGKILL a writer, reopen
# ---------------------------------------------------------------------------

def crash_writer(name: str, path: Path, ledgers: int, batch: int, sync_every: int) -> None:
    """Write forever; after each put_batch print 'P <n>', after each sync 'S <n>'."""
    ix = open_backend(name, path)
    n = since = 0
    out = sys.stdout
    while True:
        items = [item_at(i, ledgers) for i in range(n, n + batch)]
        ix.put_batch(items)
        n += batch
        since += batch
        out.write(f"P {n}\n")
        if since >= sync_every:
            ix.sync()
            since = 0
            out.write(f"S {n}\n")
        out.flush()


def count_present(ix: Any, ledgers: int, upto: int) -> tuple[int, bool]:
    """(entries found, whether they form the prefix 0..k-1 of the write order)."""
    per_ledger = -(-upto // ledgers) + 2
    found = 0
    present: set[int] = set()
    for k in range(ledgers):
        for e, *_ in ix.range(ledger_of(k), 0, per_ledger):
            present.add(e * ledgers + k)
            found += 1
    prefix = present == set(range(found))
    return found, prefix


def crash_test(name: str, workdir: Path, *, kill_after_s: float, ledgers: int, batch: int,
               sync_every: int) -> dict[str, Any]:
    path = workdir / f"crash-{name}"
    proc = subprocess.Popen([sys.executable, __file__, "--crash-child", name, str(path),
                             "--ledgers", str(ledgers), "--batch", str(batch),
                             "--sync-every", str(sync_every)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    put = synced = 0
    deadline = time.monotonic() + kill_after_s
    for line in proc.stdout:
        kind, num = line.split()
        if kind == "P":
            put = int(num)
        else:
            synced = int(num)
        if time.monotonic() >= deadline:
            proc.send_signal(signal.SIGKILL)
            break
    # lines still in the pipe were printed after their put_batch returned
    for line in proc.stdout:
        kind, num = line.split()
        if kind == "P":
            put = max(put, int(num))
        else:
            synced = max(synced, int(num))
    proc.wait()
    out: dict[str, Any] = {"backend": name, "put_returned": put, "synced": synced}
    try:
        t0 = time.perf_counter()
        ix = open_backend(name, path)
        out["reopen_s"] = time.perf_counter() - t0
        found, prefix = count_present(ix, ledgers, put + batch)
        ix.close()
        out.update(opens=True, present=found, prefix_of_write_order=prefix,
                   lost_after_put=max(0, put - found), lost_after_sync=max(0, synced - found))
    except Exception as e:  # the point is to report it
        out.update(opens=False, error=repr(e))
    shutil.rmtree(path, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------

HIGHER_IS_BETTER = ("_ops_s", "_entries_s", "_rec_s")


def summarize(runs: dict[str, list[dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, Any]]:
    med: dict[str, dict[str, float]] = {}
    for name, reps in runs.items():
        keys = [k for k in reps[0] if isinstance(reps[0][k], int | float)]
        med[name] = {k: statistics.median(r[k] for r in reps if k in r) for k in keys}
    ratios: dict[str, dict[str, float]] = {}
    base = med.get("sqlite")
    if base:
        for name, m in med.items():
            ratios[name] = {k: round(v / base[k], 3) for k, v in m.items()
                            if base.get(k) not in (None, 0) and isinstance(v, float | int)}
    return med, ratios


TABLE_ROWS = [
    ("write_ops_s", "bulk write, entries/s"),
    ("write_us_per_entry", "bulk write, µs/entry"),
    ("write_cpu_us_per_entry", "bulk write, CPU µs/entry (all threads)"),
    ("write_disk_bytes_per_entry", "bulk write, bytes written to disk/entry"),
    ("write_with_journal_ops_s", "write while journaling, entries/s"),
    ("journal_alone_rec_s", "journal alone, records/s"),
    ("journal_during_rec_s", "journal during index write, records/s"),
    ("journal_drop_pct", "journal rate drop, %"),
    ("gil_stall_write_ms", "longest GIL wait of another thread during write, ms"),
    ("get_hit_ops_s", "get (hit), ops/s"),
    ("get_miss_ops_s", "get (miss), ops/s"),
    ("range_ops_s", "range of 100, ops/s"),
    ("space_after_write_mb", "space after write, MiB"),
    ("close_s", "close, s"),
    ("reopen_s", "reopen + first get, s"),
    ("delete_ledgers_s", "delete 90% of ledgers (+sync), s"),
    ("gil_stall_delete_ms", "longest GIL wait during deletes, ms"),
    ("space_after_delete_mb", "space after delete, MiB"),
    ("get_hit_after_delete_ops_s", "get (live) after delete, ops/s"),
    ("get_deleted_after_delete_ops_s", "get (deleted) after delete, ops/s"),
    ("range_after_delete_ops_s", "range (live) after delete, ops/s"),
    ("range_deleted_after_delete_ops_s", "range (deleted) after delete, ops/s"),
    ("compact_s", "compaction, s"),
    ("gil_stall_compact_ms", "longest GIL wait during compaction, ms"),
    ("space_after_compact_mb", "space after compaction, MiB"),
    ("rewrite_ops_s", "re-write of the deleted count, entries/s"),
    ("space_after_rewrite_mb", "space after re-write, MiB"),
    ("rss_anon_after_write_mb", "RssAnon after write, MiB"),
    ("rss_after_lookups_mb", "VmRSS after lookups, MiB"),
    ("rss_peak_mb", "VmHWM (peak RSS), MiB"),
]


def format_table(med: dict[str, Any], ratios: dict[str, Any]) -> str:
    names = list(med)
    lines = ["| metric | " + " | ".join(names) + " |",
             "|---|" + "---|" * len(names)]
    for key, label in TABLE_ROWS:
        if not any(key in med[n] for n in names):
            continue
        cells = []
        for n in names:
            v = med[n].get(key)
            if v is None:
                cells.append("–")
                continue
            cell = f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
            r = ratios.get(n, {}).get(key)
            if r is not None and n != "sqlite":
                cell += f" ({r:.2g}×)"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Benchmark candidate on-disk entry-index backends (issue 13).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--entries", type=int, default=1_000_000, help="entries in the index")
    p.add_argument("--ledgers", type=int, default=100, help="ledgers, interleaved")
    p.add_argument("--batch", type=int, default=1000, help="entries per put_batch")
    p.add_argument("--sync-every", type=int, default=10_000, help="puts between sync()s")
    p.add_argument("--lookups", type=int, default=100_000, help="point gets per measure")
    p.add_argument("--ranges", type=int, default=10_000, help="range lookups per measure")
    p.add_argument("--range-len", type=int, default=100, help="entries per range lookup")
    p.add_argument("--journal-entries", type=int, default=None,
                   help="entries written while journaling (default: --entries; 0 skips)")
    p.add_argument("--journal-seconds", type=float, default=3.0,
                   help="seconds of journal-alone baseline")
    p.add_argument("--delete-fraction", type=float, default=0.9)
    p.add_argument("--reps", type=int, default=3, help="repetitions (median reported)")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="comma-separated, from: " + ", ".join(BACKENDS))
    p.add_argument("--workdir", type=Path, default=None, help="scratch dir (default: /tmp)")
    p.add_argument("--timeout", type=float, default=600, help="per child run, seconds")
    p.add_argument("--crash-test", action="store_true",
                   help="also SIGKILL a writer per backend and reopen")
    p.add_argument("--crash-after", type=float, default=3.0, help="seconds before the kill")
    p.add_argument("--json", type=Path, default=None, help="write results here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--crash-child", nargs=2, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    jentries = a.entries if a.journal_entries is None else a.journal_entries

    if a.crash_child:
        crash_writer(a.crash_child[0], Path(a.crash_child[1]), a.ledgers, a.batch, a.sync_every)
        return 0
    if a.child:
        assert a.workdir is not None
        res = run_backend(a.child, a.workdir, entries=a.entries, ledgers=a.ledgers,
                          batch=a.batch, sync_every=a.sync_every, lookups=a.lookups,
                          ranges=a.ranges, range_len=a.range_len, journal_entries=jentries,
                          journal_seconds=a.journal_seconds,
                          delete_fraction=a.delete_fraction)
        json.dump(res, sys.stdout)
        return 0

    names = [n.strip() for n in a.backends.split(",") if n.strip()]
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        p.error(f"unknown backends: {unknown}")
    missing = [n for n in names if not _has(BACKENDS[n][0])]
    for n in missing:
        print(f"skipping {n}: module {BACKENDS[n][0]!r} is not installed", file=sys.stderr)
    names = [n for n in names if n not in missing]

    base = Path(tempfile.mkdtemp(prefix="index-cand-", dir=a.workdir))
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    failures: list[str] = []
    started = time.time()
    try:
        for rep in range(a.reps):
            for n in names:
                wd = base / f"{n}-{rep}"
                wd.mkdir()
                cmd = [sys.executable, __file__, "--child", n, "--workdir", str(wd),
                       "--entries", str(a.entries), "--ledgers", str(a.ledgers),
                       "--batch", str(a.batch), "--sync-every", str(a.sync_every),
                       "--lookups", str(a.lookups), "--ranges", str(a.ranges),
                       "--range-len", str(a.range_len), "--journal-entries", str(jentries),
                       "--journal-seconds", str(a.journal_seconds),
                       "--delete-fraction", str(a.delete_fraction)]
                t0 = time.perf_counter()
                try:
                    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
                except subprocess.TimeoutExpired:
                    failures.append(f"{n} rep {rep}: timed out after {a.timeout}s")
                    print(failures[-1], file=sys.stderr)
                    continue
                finally:
                    shutil.rmtree(wd, ignore_errors=True)
                if r.returncode != 0:
                    failures.append(f"{n} rep {rep}: exit {r.returncode}: {r.stderr[-2000:]}")
                    print(failures[-1], file=sys.stderr)
                    continue
                res = json.loads(r.stdout)
                res["child_wall_s"] = time.perf_counter() - t0
                runs[n].append(res)
                print(f"rep {rep} {n}: write {res['write_ops_s']:,.0f}/s, "
                      f"get {res['get_hit_ops_s']:,.0f}/s, "
                      f"wall {res['child_wall_s']:.1f}s", file=sys.stderr)
        crash: list[dict[str, Any]] = []
        if a.crash_test:
            for n in names:
                c = crash_test(n, base, kill_after_s=a.crash_after, ledgers=a.ledgers,
                               batch=a.batch, sync_every=a.sync_every)
                crash.append(c)
                print(f"crash {n}: {c}", file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    runs = {n: rs for n, rs in runs.items() if rs}
    med, ratios = summarize(runs) if runs else ({}, {})
    if med:
        print(format_table(med, ratios))
    out = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()
                   if k not in ("child", "crash_child")},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "versions": library_versions(),
        "total_wall_s": time.time() - started,
        "median": med, "ratios_vs_sqlite": ratios, "runs": runs,
        "crash_test": crash, "failures": failures,
    }
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
