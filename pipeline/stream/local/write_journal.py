"""The object store's write-ahead journal: one disk flush per acknowledged write, shared by
concurrent writes.

Making a new file durable in place costs two journal commits of the file system: the file's
``fsync`` and, after its rename into place, its folder's (about 15 ms a write on the shared machine
this was measured on, three quarters of the object store's time per produce request). The journal
makes a write durable with one ``fdatasync`` of an append-only file instead, and writes arriving
together share it (group commit):

1. a record ``(put, key, body)`` — or ``(delete, key)`` — is appended to the current journal file
   and the journal is flushed with ``fdatasync``; one flush covers every record appended before it;
2. the object is then written in place (created, or overwritten and cut to its new length; no
   temporary file, no rename: a rename over an existing file also costs a flush on ext4),
   **without** syncing, under its key's lock, so no reader sees it half written;
3. only then is the write acknowledged (and shown in listings).

Every ``CHECKPOINT_SECONDS`` (or after ``CHECKPOINT_BYTES`` of records) a checkpoint starts a new
journal file, waits until every write whose record is in an older file is done, flushes the file
system that holds the objects (``syncfs``), then removes the older journal files. When the store
starts it replays the journal files that are left, in order, record by record — a ``put`` rewrites
the object with the journaled body, a ``delete`` removes it — then checkpoints. Records are
checksummed; replay stops at the first incomplete or corrupt one, which only an unacknowledged write
can have left (an acknowledged record was flushed whole, and so was everything before it).

Why an acknowledged write survives a machine crash: its record was on disk before the answer was
sent (1 before 3), in a journal file whose name was on disk before its first record was appended
(the folder is fsync'd when a journal file is created); the journal file is removed only after a
``syncfs`` that followed the writing of every object it records. So after a crash, either the
journal still holds the record and replay rewrites the object whole (whatever state the crash left
its file in: a half-done overwrite included), or the checkpoint put the object on disk. A crash
before the record is flushed leaves the object as it was: it is written only after the flush.
Replaying an old record again is harmless: records of one key are appended under that key's lock, in
the order of its writes, and replay applies them in that order, so the last one wins. A write that
fails after its record was flushed (a full disk) answers an error but may appear after a restart,
as a write whose answer was lost may on any S3 store.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "CHECKPOINT_BYTES",
    "CHECKPOINT_SECONDS",
    "WriteJournal",
    "fsync_dir",
    "recover",
    "replay",
    "sync_filesystem",
]

CHECKPOINT_SECONDS = 10.0
CHECKPOINT_BYTES = 256 << 20
_MAGIC = b"DPJ1"
_HEADER = struct.Struct(
    "<4scIQI"
)  # magic, op (b"P" put / b"D" delete), key length, body length, crc32
_SUFFIX = ".journal"


def sync_filesystem(path: Path) -> None:
    """Flush the file system holding ``path`` (Linux ``syncfs``; elsewhere ``sync``)."""
    libc_name = ctypes.util.find_library("c")
    syncfs = getattr(ctypes.CDLL(libc_name, use_errno=True), "syncfs", None) if libc_name else None
    if syncfs is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def fsync_dir(folder: Path) -> None:
    """The folder's entries (names created, renamed or removed in it) on disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _record(op: bytes, key: str, body: bytes) -> bytes:
    raw_key = key.encode()
    crc = zlib.crc32(body, zlib.crc32(raw_key, zlib.crc32(op)))
    return _HEADER.pack(_MAGIC, op, len(raw_key), len(body), crc) + raw_key + body


def _journal_files(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"*{_SUFFIX}"))


def replay(folder: Path, put: Callable[[str, bytes], None], delete: Callable[[str], None]) -> int:
    """Apply the records of every journal file in ``folder``, oldest first; the number applied."""
    applied = 0
    for path in _journal_files(folder):
        data = path.read_bytes()
        at = 0
        while at + _HEADER.size <= len(data):
            magic, op, key_len, body_len, crc = _HEADER.unpack_from(data, at)
            start, end = at + _HEADER.size, at + _HEADER.size + key_len + body_len
            if magic != _MAGIC or op not in (b"P", b"D") or end > len(data):
                break  # torn or never flushed: the tail of an unacknowledged write
            raw_key, body = data[start : start + key_len], data[start + key_len : end]
            if zlib.crc32(body, zlib.crc32(raw_key, zlib.crc32(op))) != crc:
                break
            if op == b"P":
                put(raw_key.decode(), body)
            else:
                delete(raw_key.decode())
            applied += 1
            at = end
    return applied


def recover(
    folder: Path, data_root: Path, put: Callable[[str, bytes], None], delete: Callable[[str], None]
) -> int:
    """At start: replay what the journal files hold, flush the objects, remove the files."""
    leftover = _journal_files(folder) if folder.is_dir() else []
    if not leftover:
        return 0
    applied = replay(folder, put, delete)
    sync_filesystem(data_root)
    for path in leftover:
        path.unlink()
    return applied


class WriteJournal:
    """Appends records, flushes them with group commit, and checkpoints in a background thread.

    ``data_root`` is the folder whose file system holds the objects (flushed at each checkpoint);
    ``folder`` holds the journal files."""

    def __init__(
        self,
        folder: Path,
        data_root: Path,
        checkpoint_seconds: float = CHECKPOINT_SECONDS,
        checkpoint_bytes: int = CHECKPOINT_BYTES,
    ):
        self.folder, self.data_root = folder, data_root
        self.checkpoint_seconds, self.checkpoint_bytes = checkpoint_seconds, checkpoint_bytes
        self._append_lock = threading.Lock()  # order of records; the current file
        self._sync_lock = threading.Lock()  # one flush at a time; the leader's covers the followers
        self._written = 0  # bytes appended over the journal's life (all files)
        self._synced = 0  # of which flushed
        self._since_checkpoint = 0
        self._pending: dict[
            int, int
        ] = {}  # journal file -> its records whose write is not done yet
        self._applied = threading.Condition()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self.folder.mkdir(parents=True, exist_ok=True)
        existing = _journal_files(self.folder)
        self._seq = int(existing[-1].stem) + 1 if existing else 0
        self._fd = self._create(self._seq)
        self.flushes = 0  # fdatasync calls (group commit: fewer than records under concurrency)
        self._thread = threading.Thread(
            target=self._checkpoints, daemon=True, name="journal-checkpoint"
        )
        self._thread.start()

    def _create(self, seq: int) -> int:
        fd = os.open(
            self.folder / f"{seq:020d}{_SUFFIX}",
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND,
            0o600,
        )
        fsync_dir(self.folder)  # its name on disk before any record relies on it
        return fd

    @contextmanager
    def ahead_of_put(self, key: str, body: bytes) -> Iterator[None]:
        """The record of an object written with this body, on disk before the block writes it."""
        with self._ahead(_record(b"P", key, body)):
            yield

    @contextmanager
    def ahead_of_delete(self, key: str) -> Iterator[None]:
        """The record of an object removed, on disk before the block removes it."""
        with self._ahead(_record(b"D", key, b"")):
            yield

    @contextmanager
    def _ahead(self, record: bytes) -> Iterator[None]:
        seq = self._append(record)
        try:
            yield
        finally:
            with self._applied:
                self._pending[seq] -= 1
                self._applied.notify_all()

    def _append(self, record: bytes) -> int:
        """Append and flush ``record``; the journal file it went to (counted as not applied yet)."""
        with self._append_lock:
            view = memoryview(record)
            while view:
                view = view[os.write(self._fd, view) :]
            self._written += len(record)
            self._since_checkpoint += len(record)
            mine, seq = self._written, self._seq
            with self._applied:
                self._pending[seq] = self._pending.get(seq, 0) + 1
        with self._sync_lock:
            if (
                self._synced < mine
            ):  # else a flush that began after our record was appended covered it
                with self._append_lock:
                    target, fd = self._written, self._fd
                os.fdatasync(fd)
                self.flushes += 1
                self._synced = target
        if self._since_checkpoint >= self.checkpoint_bytes:
            self._wake.set()
        return seq

    def checkpoint(self) -> None:
        """A new journal file; once every record of the older ones is applied, the objects flushed
        and the older journal files removed."""
        with self._sync_lock, self._append_lock:
            if self._since_checkpoint == 0:
                return
            os.fdatasync(self._fd)  # records appended but not flushed yet: their writers wait on us
            self._synced = self._written
            os.close(self._fd)
            self._seq += 1
            self._fd = self._create(self._seq)
            self._since_checkpoint = 0
            current = self._seq
        with self._applied:  # writes whose record is in an older file but that are not done yet
            self._applied.wait_for(
                lambda: not any(n for s, n in self._pending.items() if s < current)
            )
            for seq in [s for s in self._pending if s < current]:
                del self._pending[seq]
        sync_filesystem(self.data_root)  # every object the older files record, as written, on disk
        for path in _journal_files(self.folder):
            if int(path.stem) < current:
                path.unlink()

    def _checkpoints(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self.checkpoint_seconds)
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                self.checkpoint()
            except OSError:
                time.sleep(
                    1.0
                )  # the journal keeps every record meanwhile: nothing is lost by waiting

    def close(self) -> None:
        self._stopped.set()
        self._wake.set()
        self._thread.join(timeout=5)
        with self._sync_lock, self._append_lock:
            os.close(self._fd)
