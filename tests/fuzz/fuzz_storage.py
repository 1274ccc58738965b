"""Fuzz the bookie's start-up readers (``asyncbk.bookie.storage``) on damaged files.

Input: ``[mode][flags][entry log file name: 12 bytes][sections]`` (sections as in
``_harness.split``).  Each input writes a journal dir and a ledger dir in a scratch
directory (on /dev/shm when there is one) and runs the recovery of
``LedgerStorage.open`` (``storage.recovery.recover``) on them, then reads entries back:

* mode 0, journal replay: 1 to 3 journal files (``fuzz_journal.build`` grammar, so
  records pass their checksum; flags & 4 skips a sequence number).  No error is
  allowed; the recovered ledgers, tombstones, index and entry bodies must equal a
  model of the replay rule, the torn file must be cut at its good end and later files
  removed.
* mode 1, index and entry log: an entry log (grammar) and an index.log (raw 32-byte
  records if flags & 1, else small fields packed into records) covered by a valid
  checkpoint.  Allowed: BookieIOError, from recovery or from reading any indexed entry
  (one at a time and as runs); a body read must be the ADD record at that place.  No
  ``os.pread`` of more than a record's largest size (``PREAD_BYTES_MAX``).
* mode 2, checkpoint file: the section as the checkpoint payload (with a correct
  checksum if flags & 1).  Allowed: BookieIOError from ``read_checkpoint`` and recovery.

Every input also checks that an entry log file name parses only if it is the name of
its log id.  Run: ``python -m tests.fuzz.fuzz_storage [libFuzzer flags] [corpus dirs]``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import xxhash

from . import _harness

with _harness.instrumented(__name__ == "__main__"):
    from asyncbk.bookie import journal_format as jf
    from asyncbk.bookie import storage as st
    from asyncbk.bookie.storage import checkpoint, entrylog, recovery
    from asyncbk.config import BookieConfig
    from asyncbk.errors import BookieIOError

    from .fuzz_journal import build, grammar
    from .samples import journal_records

CONFIG = BookieConfig(entry_log_bytes_max=2048)
NOW_MS = 1_700_000_000_000
PREAD_BYTES_MAX = jf.HEADER_BYTES - 1 + jf.RECORD_BYTES_MAX
_root: Path | None = None


class HugeRead(_harness.Finding):
    """An ``os.pread`` of more bytes than any record can have."""


class _Log:
    def error(self, *args: Any, **kw: Any) -> None:
        pass

    warning = info = error


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _scratch_root() -> Path:
    """``asyncbk-fuzz-<pid>`` on /dev/shm (or the temp dir); those of processes gone are
    removed first (libFuzzer ends the process without running ``atexit``)."""
    base = Path("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    for old in base.glob("asyncbk-fuzz-*"):
        pid = old.name.rsplit("-", 1)[1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    root = base / f"asyncbk-fuzz-{os.getpid()}"
    root.mkdir(exist_ok=True)
    atexit.register(shutil.rmtree, root, True)
    return root


def _dirs() -> tuple[Path, Path]:
    global _root
    if _root is None:
        _root = _scratch_root()
    jdir, ldir = _root / "journal", _root / "ledgers"
    for d in (jdir, ldir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
    (ldir / st.ENTRYLOG_DIR).mkdir()
    return jdir, ldir


@contextlib.contextmanager
def _pread_guard() -> Iterator[None]:
    real = os.pread

    def pread(fd: int, length: int, offset: int) -> bytes:
        if length > PREAD_BYTES_MAX:
            raise HugeRead(f"os.pread of {length} bytes")
        return real(fd, length, offset)

    os.pread = pread
    try:
        yield
    finally:
        os.pread = real


def _model(files: list[tuple[int, bytes]]) -> tuple[dict[int, Any], dict[int, int],
                                                    dict[tuple[int, int], bytes], list[int]]:
    """The replay rule: ledgers {id: [key, fenced, explicit lac]}, tombstones, entries
    {(ledger, entry): body} and each file's length after recovery (-1: removed)."""
    ledgers: dict[int, Any] = {}
    tombstones: dict[int, int] = {}
    entries: dict[tuple[int, int], bytes] = {}
    sizes = []
    cut, prev = False, None
    for seq, content in files:
        if cut or (prev is not None and seq != prev + 1):
            cut = True
            sizes.append(-1)
            continue
        pairs, good = jf.scan_records(content)
        for _, r in pairs:
            if isinstance(r, jf.AddRecord):
                entries[r.ledger_id, r.entry_id] = r.body
            elif isinstance(r, jf.LedgerKeyRecord):
                ledgers.setdefault(r.ledger_id, [r.master_key, False, -1])
                tombstones.pop(r.ledger_id, None)
            elif isinstance(r, jf.DeleteLedgerRecord):
                ledgers.pop(r.ledger_id, None)
                tombstones[r.ledger_id] = NOW_MS
            else:
                d = ledgers.setdefault(r.ledger_id, [b"", False, -1])
                if isinstance(r, jf.FenceRecord):
                    d[1] = True
                else:
                    d[2] = max(d[2], r.lac)
        sizes.append(good)
        cut, prev = good < len(content), seq
    return ledgers, tombstones, entries, sizes


def _replay(flags: int, body: bytes, jdir: Path, ldir: Path) -> None:
    n = 1 + flags % 3
    seqs = [1 + i + (1 if flags & 4 and i == n - 1 and n > 1 else 0) for i in range(n)]
    files = list(zip(seqs, (build(s) for s in _harness.split(body, n)), strict=True))
    for seq, content in files:
        (jdir / jf.journal_file_name(seq)).write_bytes(content)
    ledgers, tombstones, entries, sizes = _model(files)
    rec = recovery.recover(jdir, ldir, CONFIG, _Log(), NOW_MS)
    reader = entrylog.EntryLogReader(ldir / st.ENTRYLOG_DIR)
    try:
        live = {k: v for k, v in entries.items() if k[0] in ledgers}
        want = {lid: st.LedgerInfo(key, fenced, lac, max([e for (x, e) in live if x == lid],
                                                         default=-1), lac)
                for lid, (key, fenced, lac) in ledgers.items()}
        if rec.ledgers != want or rec.durable.tombstones != tombstones:
            raise _harness.Finding(f"replayed ledgers {rec.ledgers} != model {want}")
        if len(rec.index) != len(live):
            raise _harness.Finding("the index holds other entries than the model")
        for (lid, eid), data in live.items():
            loc = rec.index.get(lid, eid)
            if loc is None or reader.read(loc, lid, eid) != data:
                raise _harness.Finding(f"entry {lid}/{eid} is not the replayed body")
        for (seq, _), size in zip(files, sizes, strict=True):
            path = jdir / jf.journal_file_name(seq)
            got = path.stat().st_size if path.exists() else -1
            if got != size:
                raise _harness.Finding(f"journal file {seq} has {got} bytes, model {size}")
        if rec.next_seq != seqs[-1] + 1:
            raise _harness.Finding(f"next journal seq {rec.next_seq}")
    finally:
        reader.close()
        rec.writer.close()


def _index_bytes(flags: int, spec: bytes) -> bytes:
    if flags & 1:
        return spec[:len(spec) - len(spec) % st.INDEX_RECORD.size]
    out = []
    for i in range(0, len(spec) - 7, 8):
        ledger, entry, log_id, offset, length = struct.unpack_from("<BhBHH", spec, i)
        entry = entry if flags & 8 else entry & 0x7FFF
        out.append(st.INDEX_RECORD.pack(ledger % 4, entry, log_id % 2, offset, length))
    return b"".join(out)


def _read_back(flags: int, body: bytes, jdir: Path, ldir: Path) -> None:
    log_spec, index_spec = _harness.split(body, 2)
    log = build(log_spec)
    index = _index_bytes(flags, index_spec)
    records = list(st.INDEX_RECORD.iter_unpack(index))
    (ldir / st.ENTRYLOG_DIR / st.entry_log_name(0)).write_bytes(log)
    (ldir / st.INDEX_FILE).write_bytes(index)
    checkpoint.write_checkpoint(ldir, {
        "version": st.CHECKPOINT_VERSION, "journal_seq": 0, "journal_offset": 0,
        "entry_log_id": 0, "entry_log_length": len(log), "index_length": len(index),
        "ledgers": [[lid, b"k", False, -1, -1] for lid in {r[0] for r in records}],
        "tombstones": []})
    _read_entries(log, records, jdir, ldir)  # F3 (fixed): corrupt records are refused


def _readable(log: bytes, records: list[tuple[int, ...]]) -> dict[tuple[int, int], bytes]:
    """The entries whose last index record (after their ledger's last deletion
    marker, ``(ledger, -1, 0, 0, 0)``) points at their own ADD record in log 0."""
    last: dict[tuple[int, int], tuple[int, ...]] = {}
    for r in records:
        if r[1:] == (-1, 0, 0, 0):
            last = {k: v for k, v in last.items() if k[0] != r[0]}
        elif r[1] >= 0:
            last[r[0], r[1]] = r[2:]
    out = {}
    for (lid, eid), (log_id, offset, length) in last.items():
        got = jf.decode_one(log[offset:offset + length]) if log_id == 0 else None
        record = got[0] if got is not None and got[1] == length else None
        if isinstance(record, jf.AddRecord) and (record.ledger_id, record.entry_id) == (lid, eid):
            out[lid, eid] = record.body
    return out


def _read_entries(log: bytes, records: list[tuple[int, ...]], jdir: Path, ldir: Path) -> None:
    try:
        rec = recovery.recover(jdir, ldir, CONFIG, _Log(), NOW_MS)
    except BookieIOError:
        return
    reader = entrylog.EntryLogReader(ldir / st.ENTRYLOG_DIR)
    try:
        for lid, first in sorted({(r[0], r[1]) for r in records}):
            locs: list[st.Location] = []
            while (loc := rec.index.get(lid, first + len(locs))) is not None and len(locs) < 8:
                locs.append(loc)
            bodies = []
            for i, loc in enumerate(locs):
                with contextlib.suppress(BookieIOError):
                    bodies.append(reader.read(loc, lid, first + i))
                    got = jf.decode_one(log[loc[1]:loc[1] + loc[2]])
                    if loc[0] != 0 or got is None or got[0] != jf.AddRecord(
                            lid, first + i, bodies[-1]):
                        raise _harness.Finding(f"read {lid}/{first + i} at {loc}: not its record")
            run = None
            with contextlib.suppress(BookieIOError):
                run = reader.read_run(locs, lid, first)
            if run is not None and run != bodies:
                raise _harness.Finding(f"read_run of {lid}/{first} differs from the reads")
        for (lid, eid), body in _readable(log, records).items():
            loc = rec.index.get(lid, eid)
            if loc is None or reader.read(loc, lid, eid) != body:
                raise _harness.Finding(f"entry {lid}/{eid} is readable but read {loc}")
    finally:
        reader.close()
        rec.writer.close()


def _checkpoint(flags: int, payload: bytes, jdir: Path, ldir: Path) -> None:
    checksum = xxhash.xxh3_64_intdigest(payload) if flags & 1 else flags * 0x9E3779B97F4A7C15
    (ldir / st.CHECKPOINT_FILE).write_bytes(struct.pack("<Q", checksum % 2**64) + payload)
    try:
        st.read_checkpoint(ldir)
        recovery.recover(jdir, ldir, CONFIG, _Log(), NOW_MS).writer.close()
    except BookieIOError:  # F2 (fixed): also a checksummed but malformed payload
        pass


def check(data: bytes) -> None:
    if len(data) < 14:
        return
    name = data[2:14].decode("latin-1")
    log_id = entrylog.parse_entry_log_name(name)
    if log_id is not None and st.entry_log_name(log_id) != name:  # F4 (fixed)
        raise _harness.Finding(f"{name!r} parses as entry log {log_id}")
    mode, flags, body = data[0] % 3, data[1], data[14:]
    jdir, ldir = _dirs()
    with _pread_guard():
        (_replay, _read_back, _checkpoint)[mode](flags, body, jdir, ldir)


def seeds() -> list[bytes]:
    records = journal_records()
    name = st.entry_log_name(0).encode()
    parts = [grammar(records[:3]), grammar(records[3:6]), grammar(records[6:])]
    out = [bytes([0, 0]) + name + b"".join(parts), bytes([0, 0]) + name + b"".join(parts)[:-3],
           bytes([0, 0]) + name + grammar(records[:7]),  # no deletion: entries to read back
           bytes([0, 1]) + name + _harness.join([parts[0], parts[1] + parts[2]])]
    out += [bytes([0, f]) + name + _harness.join(parts) for f in (2, 5)]  # 5: a missing seq
    adds = grammar([r for r in records if isinstance(r, jf.AddRecord)][:2])
    first = 29 + 6  # the first ADD record's size (body "body-0")
    index = struct.pack("<BhBHH", 1, 0, 0, 0, first) + struct.pack("<BhBHH", 1, 1, 0, first, 129)
    out.append(bytes([1, 0]) + name + _harness.join([adds, index]))
    raw = b"".join(st.INDEX_RECORD.pack(1, e, 0, 0, 35) for e in (0, 1, 5))
    out.append(bytes([1, 1]) + name + _harness.join([adds, raw]))
    payload = msgpack.packb({"version": 1, "journal_seq": 0, "journal_offset": 0,
                             "entry_log_id": 0, "entry_log_length": 0, "index_length": 0,
                             "ledgers": [[1, b"k", True, 3, 2]], "tombstones": [[2, NOW_MS]]},
                            use_bin_type=True)
    out += [bytes([2, 1]) + name + payload, bytes([2, 0]) + name + payload]
    return out


if __name__ == "__main__":
    _harness.run(check)
    sys.exit(0)
