"""The embedded broker's durable storage: an S3-compatible object server on loopback, objects as files.

The embedded broker (Tansu) keeps a durable log only in an object store (``--storage-engine s3://``).
Its object-store layer needs three things of the server (read off Tansu 0.6's ``dynostore``):

* ``PUT`` with ``If-None-Match: *`` (create only): each record batch is one object
  ``clusters/<c>/topics/<t>/partitions/<p>/records/<offset>.batch``;
* ``PUT`` with ``If-Match: <etag>`` (compare and swap): a partition's high watermark is one small JSON
  object updated optimistically — the broker reads it, advances it and writes it back on condition
  that nobody wrote it meanwhile, retrying on ``412``. Two concurrent produce requests to one
  partition rely on that ``412``: a server that ignores ``If-Match`` lets both take the same offsets;
* listings that see every write already acknowledged (a fetch lists the partition's batches).

``localbucket`` (PyPI) stores objects as plain files, lists a directory (so a listing sees every
completed write), and honours ``If-None-Match: *`` atomically (``link``), but ignores ``If-Match``.
This module runs its request handler with the missing piece: conditional writes of one key are
serialised under a lock and checked against the current ETag (``If-Match``) or existence
(``If-None-Match: *``); a read takes the same lock, so the ETag it returns is that of the body it
returns (localbucket computes them apart); and a ``GET`` with a matching ``If-None-Match`` answers
``304`` (the broker polls its metadata that way). Requests must carry the access key the broker was given
(``DPSTREAM_OBJECT_STORE_KEY``; the signature itself is not verified: the server listens on
127.0.0.1 only, and its data directory is its owner's only).

Connections are read by a lean HTTP/1.1 front (:mod:`pipeline.stream.local.store_server`): it
answers the broker's hot path itself — object ``PUT``/``GET``/``HEAD``/``DELETE`` and ListObjectsV2,
with the same locks, index, journal and access-key check — and hands every other request to this
handler (``http.server`` and localbucket took 1.35 ms of CPU a request of the broker's, the front
0.60 ms: ``jobs/bench/profile_store_requests.py``).

Listings: the broker lists a partition's whole ``records/`` prefix on every fetch with new data and gives
up when the fetch's max wait expires (the bundled Tansu's ``DynoStore::fetch``). localbucket walks, sorts and
stats the folder for every page; here pages come from an in-memory sorted index
(:mod:`pipeline.stream.local.object_index`, rebuilt from disk at start, updated with every write and delete
before it is answered) and ListObjectsV2 answers are written as text: a page costs what its keys cost.

Durability (``--sync``; ``DPSTREAM_LOG_FSYNC`` for ``dpstream up``): an acknowledged write survives a
machine crash in the default mode, ``journal`` (``on``): a record of the write is appended to a
write-ahead journal and flushed (one ``fdatasync``, shared by concurrent writes), then the object is
written in place, then the write is acknowledged; checkpoints flush the objects and empty the
journal, and a start replays what is left (:mod:`pipeline.stream.local.write_journal` gives the
argument). ``files``: each file fsync'd before it is linked or renamed into place and its folder
fsync'd after (two commits of the file system's journal per write instead of one flush). ``off``:
acknowledged before the disk has it — a kill -9 of the server or the broker still loses nothing (the
operating system holds the file), a machine crash may lose the last writes.

Run as a process: ``python -m pipeline.stream.local.object_store DATA_ROOT --port P``.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
import threading
import time
import xml.etree.ElementTree as ET
from http import HTTPStatus
from pathlib import Path

import localbucket

from pipeline.stream.local.embedded import ACCESS_KEY_ENV
from pipeline.stream.local.embedded import OBJECT_STORE_BUCKET as BUCKET
from pipeline.stream.local.object_index import BucketIndex, ObjectMeta
from pipeline.stream.local.object_ops import (
    PreconditionFailed,
    check_write_conditions,
    delete_object,
    etag_from_disk,
    etags_in,
    journaled_put,
    list_objects_v2,
    lock_for,
    missing_folders,
    remove_empty_folders,
    synced,
)
from pipeline.stream.local.store_trace import RequestTrace, trace_from_env
from pipeline.stream.local.write_journal import (
    CHECKPOINT_SECONDS,
    WriteJournal,
    fsync_dir,
    recover,
)

__all__ = ["ConditionalHandler", "serve"]

_INDEX_START = threading.Lock()  # one thread builds a bucket's index from disk


class ConditionalHandler(localbucket.S3Handler):
    """localbucket's handler with atomic ``If-Match``/``If-None-Match`` writes and ``304`` reads."""

    access_key: str | None = None
    sync: str = "journal"  # journal | files | off: see the module's docstring
    journal: WriteJournal | None = None  # with sync == "journal"
    indexes: dict[str, BucketIndex] = {}  # bucket -> its keys (serve() builds them from disk)
    # headers and body go out as separate writes: with Nagle's algorithm each small response waits for
    # the client's delayed ACK (tens of ms per request; the broker makes several per produce and fetch)
    disable_nagle_algorithm = True
    trace: RequestTrace | None = None  # DPSTREAM_OBJECT_STORE_TRACE: one line per request

    def parse_request(self) -> bool:
        if self.trace is not None:
            self.trace.begin()  # the request line is in: from here on the time is the store's
        return super().parse_request()

    def send_response(self, code, message=None):
        self._status = int(code)
        super().send_response(code, message)

    def handle_one_request(self):
        super().handle_one_request()
        if self.trace is not None and self.raw_requestline:
            self.trace.end(self.command or "", self.path or "", getattr(self, "_status", 0))

    def _dispatch(self, action):
        if self.access_key and f"Credential={self.access_key}/" not in self.headers.get(
            "Authorization", ""
        ):
            self._send_error(
                localbucket.S3Error(
                    HTTPStatus.FORBIDDEN,
                    "InvalidAccessKeyId",
                    "The access key is not the one this server was started with.",
                )
            )
            return
        super()._dispatch(action)

    def _get(self, bucket: str, key: str, include_body: bool):
        if not (bucket and key):
            return super()._get(bucket, key, include_body)
        target = self._object_path(bucket, key)
        # Under the key's lock: localbucket computes the ETag apart from reading the body, so a write in
        # between would pair the old body with the new ETag, and a compare-and-swap on that ETag would
        # then overwrite the new value with an update of the old one (a lost watermark update).
        with lock_for(target):
            if_none_match = self.headers.get("If-None-Match")
            if (
                if_none_match
                and target.is_file()
                and localbucket.object_etag(target) in etags_in(if_none_match)
            ):
                self._send(
                    HTTPStatus.NOT_MODIFIED,
                    headers={"ETag": f'"{localbucket.object_etag(target)}"'},
                )
                return
            super()._get(bucket, key, include_body)

    def _write_object(self, bucket: str, key: str, write) -> str:
        target = self._object_path(bucket, key)
        create_only = self.headers.get("If-None-Match", "").strip() == "*"
        with lock_for(target):
            try:  # create-only without the journal: localbucket's atomic link decides
                check_write_conditions(
                    self.headers.get("If-Match"),
                    create_only and self.journal is not None,
                    (lambda: localbucket.object_etag(target)) if target.is_file() else None,
                )
            except PreconditionFailed:
                raise self._precondition_failed_error() from None
            started = time.monotonic()
            if self.journal is not None:
                buffer = io.BytesIO()
                etag = write(buffer)
                phases = journaled_put(
                    self.journal, f"{bucket}/{key}", target, buffer.getvalue(), create_only
                )
                localbucket.remember_etag(target, etag)
            else:
                created = missing_folders(target.parent)
                etag = super()._write_object(
                    bucket, key, synced(write, self.trace) if self.sync == "files" else write
                )
                placed = time.monotonic()
                if (
                    self.sync == "files"
                ):  # the new name (and any new folder) on disk before the answer
                    for folder in [target.parent, *(c.parent for c in created)]:
                        fsync_dir(folder)
                phases = {"write": placed - started, "dirsync": time.monotonic() - placed}
            if self.trace is not None:
                for name, seconds in phases.items():
                    self.trace.phase(name, seconds)
            stat = target.stat()
            self._index(bucket).put(key, ObjectMeta(stat.st_size, stat.st_mtime, etag))
            return etag

    def _delete_object(self, bucket: str, key: str):
        bucket_dir = self._bucket_dir(bucket).resolve()
        target = self._object_path(bucket, key)
        delete_object(self._index(bucket), self.journal, bucket_dir, key, target)
        self._send(HTTPStatus.NO_CONTENT)

    def _delete_bucket(self, bucket: str):
        super()._delete_bucket(bucket)
        self.indexes.pop(bucket, None)

    def _index(self, bucket: str) -> BucketIndex:
        index = self.indexes.get(bucket)
        if index is None:
            with _INDEX_START:
                index = self.indexes.get(bucket)
                if index is None:
                    index = self.indexes[bucket] = BucketIndex.from_disk(self._bucket_dir(bucket))
        return index

    def _list_entries(
        self,
        bucket_dir: Path,
        prefix: str,
        delimiter: str,
        marker: str,
        marker_is_prefix: bool,
        max_keys: int,
    ):
        """One page from the bucket's index (localbucket walks, sorts and stats the whole bucket)."""
        page = self._index(bucket_dir.name).page(
            prefix, delimiter, marker, marker_is_prefix, max_keys
        )
        self._page_meta = dict(page.contents)
        return (
            [(key, bucket_dir / key) for key, _ in page.contents],
            page.common_prefixes,
            page.truncated,
            page.last_entry,
        )

    def _list_objects_v2(self, bucket: str):
        """ListObjectsV2 (what the broker sends): the page from the index, written as text."""
        body = list_objects_v2(
            bucket,
            self._index(self._bucket_dir(bucket).name),
            self.query,
            lambda key: self._etag_from_disk(bucket, key),
        )
        self._send(HTTPStatus.OK, body, {"Content-Type": "application/xml"})

    def _add_list_entries(self, root, contents, common_prefixes, encode):
        """ListObjects (v1): the entries from the index's metadata, no stat or read per key."""
        for key, path in contents:
            meta = self._page_meta[key]
            etag = meta.etag or self._etag_from_disk(path.relative_to(self.data_root).parts[0], key)
            if etag is None:
                continue
            item = ET.SubElement(root, "Contents")
            for tag, value in (
                ("Key", encode(key)),
                ("LastModified", meta.modified),
                ("ETag", f'"{etag}"'),
                ("Size", str(meta.size)),
                ("StorageClass", "STANDARD"),
            ):
                localbucket.sub_element(item, tag, value)
        for common in common_prefixes:
            localbucket.sub_element(ET.SubElement(root, "CommonPrefixes"), "Prefix", encode(common))

    def _etag_from_disk(self, bucket: str, key: str) -> str | None:
        return etag_from_disk(self._index(bucket), self._object_path(bucket, key), key)

    def log_message(self, format: str, *args):
        pass  # one line per request would dwarf the broker's own log


def _warm_etags(data_root: Path) -> None:
    for bucket, index in list(ConditionalHandler.indexes.items()):
        for key in index.without_etag():
            try:
                index.set_etag(key, localbucket.object_etag(data_root / bucket / key))
            except OSError:
                continue  # deleted meanwhile


JOURNAL_DIR = (
    ".journal"  # under the data root; not a bucket name (S3 names start with a letter or digit)
)


def _replayed_put(data_root: Path):
    def put(key: str, body: bytes) -> None:
        target = data_root.joinpath(*key.split("/"))
        if not target.resolve().is_relative_to(data_root):
            return  # the journal only ever holds keys the server accepted; never write outside
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{localbucket.TEMP_PREFIX}replay-{target.name}")
        tmp.write_bytes(body)
        os.replace(tmp, target)

    return put


def _replayed_delete(data_root: Path):
    def delete(key: str) -> None:
        target = data_root.joinpath(*key.split("/"))
        if target.resolve().is_relative_to(data_root) and target.is_file():
            target.unlink()
            remove_empty_folders(target.parent, data_root / key.split("/", 1)[0])

    return delete


def serve(
    data_root: Path,
    port: int,
    host: str = "127.0.0.1",
    sync: str = "journal",
    checkpoint_seconds: float = CHECKPOINT_SECONDS,
) -> None:
    data_root = data_root.resolve()
    (data_root / BUCKET).mkdir(parents=True, exist_ok=True)
    log = logging.getLogger("dpstream.object_store")
    journal_dir = data_root / JOURNAL_DIR
    # whatever the mode now, writes acknowledged under a journal before are restored first
    replayed = recover(
        journal_dir, data_root, _replayed_put(data_root), _replayed_delete(data_root)
    )
    if replayed:
        log.info("replayed %d journaled writes", replayed)
    ConditionalHandler.data_root = data_root
    ConditionalHandler.access_key = os.environ.get(ACCESS_KEY_ENV) or None
    ConditionalHandler.sync = sync
    if sync == "journal":
        fsync_dir(data_root / BUCKET)
        fsync_dir(data_root)
        ConditionalHandler.journal = WriteJournal(journal_dir, data_root, checkpoint_seconds)
    ConditionalHandler.trace = trace_from_env()
    ConditionalHandler.indexes = {
        bucket.name: BucketIndex.from_disk(bucket, localbucket.TEMP_PREFIX)
        for bucket in localbucket.bucket_dirs(data_root)
    }
    # ETags of the objects found on disk, computed in the background: a listing otherwise reads each
    # object it names for the first time, and the broker's first fetches after a restart list them all
    threading.Thread(target=_warm_etags, args=(data_root,), daemon=True, name="etags").start()
    log.info("serving %s on http://%s:%d (sync: %s)", data_root, host, port, sync)
    from pipeline.stream.local.store_server import serve_lean  # it builds on this module

    serve_lean(host, port, ConditionalHandler)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("data_root", type=Path)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--sync",
        choices=("journal", "files", "off"),
        default="journal",
        help="journal: one flushed journal record per write (default); files: each object "
        "and its folder fsync'd; off: acknowledged before on disk (a machine crash "
        "may lose the last writes)",
    )
    parser.add_argument("--no-fsync", action="store_true", help="the same as --sync off")
    parser.add_argument(
        "--checkpoint-seconds",
        type=float,
        default=CHECKPOINT_SECONDS,
        help="how often the journal is checkpointed (objects flushed, journal emptied)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    os.umask(0o077)
    try:
        serve(
            args.data_root,
            args.port,
            sync="off" if args.no_fsync else args.sync,
            checkpoint_seconds=args.checkpoint_seconds,
        )
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
