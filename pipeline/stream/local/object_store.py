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

Durability: an acknowledged write is a file renamed into place, so it survives a kill -9 of the
server or the broker (the operating system holds it); the server does not ``fsync``, so a machine
crash may lose the last writes — as a single Kafka broker with its default flush settings.

Run as a process: ``python -m pipeline.stream.local.object_store DATA_ROOT --port P``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import zlib
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from pathlib import Path

import localbucket

from pipeline.stream.local.embedded import ACCESS_KEY_ENV, OBJECT_STORE_BUCKET as BUCKET

__all__ = ["ConditionalHandler", "serve"]

_KEY_LOCKS = [threading.Lock() for _ in range(256)]  # striped: bounded memory however many objects there are


def _lock_for(path: Path) -> threading.Lock:
    """The lock of key ``path`` (shared with the keys of the same stripe)."""
    return _KEY_LOCKS[zlib.crc32(str(path).encode()) % len(_KEY_LOCKS)]


def _etags(header: str) -> set[str]:
    return {tag.strip().removeprefix("W/").strip('"') for tag in header.split(",") if tag.strip()}


class ConditionalHandler(localbucket.S3Handler):
    """localbucket's handler with atomic ``If-Match``/``If-None-Match`` writes and ``304`` reads."""

    access_key: str | None = None
    # headers and body go out as separate writes: with Nagle's algorithm each small response waits for
    # the client's delayed ACK (tens of ms per request; the broker makes several per produce and fetch)
    disable_nagle_algorithm = True

    def _dispatch(self, action):
        if self.access_key and f"Credential={self.access_key}/" not in self.headers.get("Authorization", ""):
            self._send_error(localbucket.S3Error(HTTPStatus.FORBIDDEN, "InvalidAccessKeyId",
                                                 "The access key is not the one this server was started with."))
            return
        super()._dispatch(action)

    def _write_object(self, bucket: str, key: str, write) -> str:
        target = self._object_path(bucket, key)
        if_match = self.headers.get("If-Match")
        with _lock_for(target):
            if if_match is not None:
                exists = target.is_file()
                if not exists or ("*" not in _etags(if_match)
                                  and localbucket.object_etag(target) not in _etags(if_match)):
                    raise self._precondition_failed_error()
            return super()._write_object(bucket, key, write)

    def _get(self, bucket: str, key: str, include_body: bool):
        if not (bucket and key):
            return super()._get(bucket, key, include_body)
        target = self._object_path(bucket, key)
        # Under the key's lock: localbucket computes the ETag apart from reading the body, so a write in
        # between would pair the old body with the new ETag, and a compare-and-swap on that ETag would
        # then overwrite the new value with an update of the old one (a lost watermark update).
        with _lock_for(target):
            if_none_match = self.headers.get("If-None-Match")
            if if_none_match and target.is_file() and localbucket.object_etag(target) in _etags(if_none_match):
                self._send(HTTPStatus.NOT_MODIFIED, headers={"ETag": f'"{localbucket.object_etag(target)}"'})
                return
            super()._get(bucket, key, include_body)

    def _list_entries(self, bucket_dir: Path, prefix: str, *rest):
        """localbucket walks the whole bucket for every listing, and the broker lists a partition's batches
        on every fetch: walk only the directory the prefix names (the same keys, in the same order)."""
        root = bucket_dir / prefix.rpartition("/")[0] if "/" in prefix else bucket_dir
        if not root.is_dir() or not root.resolve().is_relative_to(bucket_dir.resolve()):
            return [], [], False, ""
        contents, prefixes, truncated, last = super()._list_entries(root, prefix.rpartition("/")[2], *rest[:1],
                                                                    *self._relative_marker(root, bucket_dir, rest))
        base = root.relative_to(bucket_dir).as_posix()
        base = f"{base}/" if base != "." else ""
        return ([(base + key, path) for key, path in contents], [base + p for p in prefixes], truncated,
                last[:2] + base + last[2:] if last else last)

    @staticmethod
    def _relative_marker(root: Path, bucket_dir: Path, rest: tuple) -> tuple:
        _, marker, marker_is_prefix, max_keys = rest
        base = root.relative_to(bucket_dir).as_posix()
        base = f"{base}/" if base != "." else ""
        if marker.startswith(base):
            marker = marker[len(base):]
        elif marker:  # a marker outside this directory: before it (nothing skipped) or after it (all skipped)
            marker = "" if marker < base else "\U0010ffff"
        return marker, marker_is_prefix, max_keys

    def log_message(self, format: str, *args):
        pass  # one line per request would dwarf the broker's own log


def serve(data_root: Path, port: int, host: str = "127.0.0.1") -> None:
    data_root = data_root.resolve()
    (data_root / BUCKET).mkdir(parents=True, exist_ok=True)
    ConditionalHandler.data_root = data_root
    ConditionalHandler.access_key = os.environ.get(ACCESS_KEY_ENV) or None
    server = ThreadingHTTPServer((host, port), ConditionalHandler)
    server.daemon_threads = True
    logging.getLogger("dpstream.object_store").info("serving %s on http://%s:%d", data_root, host, port)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("data_root", type=Path)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.umask(0o077)
    try:
        serve(args.data_root, args.port)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
