"""The object store's write-ahead journal: every write it acknowledged survives a machine crash.

A machine crash loses what the operating system had not written to the disk. The store does not sync
an object's file before answering; it flushes a journal record of the write instead and replays the
journal at start. The tests run the real object-store process, kill it with SIGKILL, and then take
away what a crash may take away (every object file written since the last checkpoint, a torn last
record) before starting it again."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.object_store import store_request as _request

from pipeline.stream.local.embedded import (
    ACCESS_KEY_ENV,
    OBJECT_STORE_BUCKET,
    free_port,
    wait_for_port,
)
from pipeline.stream.local.object_store import JOURNAL_DIR
from pipeline.stream.local.write_journal import WriteJournal, replay

FOLDER = "clusters/c/topics/reports/partitions/0000000000/"


class _Store:
    """The object-store process on a fixed port and data folder, started and SIGKILLed at will."""

    def __init__(self, data_dir: Path, *args: str):
        self.data_dir, self.args = data_dir, args
        self.port, self.access_key = free_port(), "journal-test-key"
        self.proc: subprocess.Popen | None = None

    def start(self) -> _Store:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline.stream.local.object_store",
                str(self.data_dir),
                "--port",
                str(self.port),
                *self.args,
            ],
            env=dict(os.environ, **{ACCESS_KEY_ENV: self.access_key}),
        )
        wait_for_port(self.port, timeout=30)
        return self

    def kill(self) -> None:
        """SIGKILL, if it runs (idempotent: also the tests' clean-up)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


def _batch(i: int) -> str:
    return f"{FOLDER}records/{i:020d}.batch"


def _journal_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / JOURNAL_DIR).glob("*.journal"))


def test_acknowledged_writes_are_replayed_when_a_crash_lost_their_files(tmp_path):
    """Batches created, a watermark compare-and-swapped 30 times, one batch deleted; the store
    killed; every object file removed (what a machine crash may lose: none was synced) and a torn
    record left at the journal's end (a write in flight, never acknowledged). After a restart every
    acknowledged write is back, with its body and ETag, the deleted batch stays deleted, and the
    listing agrees. (Before the journal the files were fsync'd instead; removing them lost them.)"""
    data_dir = tmp_path / "log"
    store = _Store(data_dir, "--checkpoint-seconds", "3600")  # no checkpoint during the test
    try:
        _acknowledged_writes_then_a_crash(store, data_dir)
    finally:
        store.kill()


def _acknowledged_writes_then_a_crash(store: _Store, data_dir: Path) -> None:
    store.start()
    bodies = {_batch(i): f"batch {i} ".encode() * (1 + i % 50) for i in range(40)}
    etags = {}
    for key, body in bodies.items():
        status, etag, _ = _request(store, "PUT", key, body, **{"If-None-Match": "*"})
        assert status == 200
        etags[key] = etag
    watermark = f"{FOLDER}watermark.json"
    status, etag, _ = _request(store, "PUT", watermark, b'{"high":0}', **{"If-None-Match": "*"})
    for high in range(1, 31):
        value = b'{"high":%d}' % high
        status, etag, _ = _request(store, "PUT", watermark, value, **{"If-Match": etag})
        assert status == 200
    assert _request(store, "DELETE", _batch(7))[0] == 204
    del bodies[_batch(7)]
    store.kill()

    bucket = data_dir / OBJECT_STORE_BUCKET
    lost = [p for p in bucket.rglob("*") if p.is_file()]
    assert len(lost) == 40  # 39 batches and the watermark
    for path in lost:
        path.unlink()
    (last,) = sorted((data_dir / JOURNAL_DIR).glob("*.journal"))
    with last.open("ab") as journal:  # the start of a record whose write was never answered
        journal.write(b"DPJ1P" + b"\x00" * 7)

    store.start()
    for key, body in bodies.items():
        status, etag, data = _request(store, "GET", key)
        assert (status, data, etag) == (200, body, etags[key]), key
    assert _request(store, "GET", _batch(7))[0] == 404
    assert _request(store, "GET", watermark)[2] == b'{"high":30}'
    query = f"?list-type=2&prefix={FOLDER}records/"
    listing = _request(store, "GET", "", path=query)[2].decode()
    assert re.findall(r"<Key>([^<]+)</Key>", listing) == sorted(bodies)
    # replayed, flushed and emptied: the journal starts again from nothing
    assert _journal_bytes(data_dir) == 0


def test_the_journal_is_emptied_by_checkpoints(tmp_path):
    """The journal holds only what the last checkpoint has not flushed: after writes stop, a
    checkpoint (every 0.5 s here) leaves it empty, the objects readable across a SIGKILL and
    restart."""
    data_dir = tmp_path / "log"
    store = _Store(data_dir, "--checkpoint-seconds", "0.5").start()
    try:
        for i in range(20):
            status = _request(store, "PUT", _batch(i), b"x" * 1000, **{"If-None-Match": "*"})[0]
            assert status == 200
        deadline = time.monotonic() + 20
        while _journal_bytes(data_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _journal_bytes(data_dir) == 0
        assert len(list((data_dir / JOURNAL_DIR).glob("*.journal"))) == 1  # the current, empty one
        store.kill()
        store.start()
        assert all(_request(store, "GET", _batch(i))[2] == b"x" * 1000 for i in range(20))
    finally:
        store.kill()


def test_replay_stops_at_the_first_corrupt_record_and_keeps_the_order_of_writes(tmp_path):
    """Records of one key replay in the order written (the last write wins); a record whose checksum
    fails ends the replay (only the unflushed tail of an unacknowledged write can be corrupt)."""
    journal = WriteJournal(tmp_path / "journal", tmp_path, checkpoint_seconds=3600)
    for key, body in (("b/k", b"one"), ("b/k", b"two"), ("b/gone", b"x")):
        with journal.ahead_of_put(key, body):
            pass
    with journal.ahead_of_delete("b/gone"):
        pass
    with journal.ahead_of_put("b/late", b"never answered"):
        pass
    journal.close()
    (path,) = (tmp_path / "journal").glob("*.journal")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # the last record's body
    path.write_bytes(bytes(data))
    state: dict[str, bytes] = {}
    applied = replay(tmp_path / "journal", state.__setitem__, state.pop)
    assert applied == 4 and state == {"b/k": b"two"}
