"""The object store's HTTP front: a lean keep-alive server for the requests the broker makes.

``http.server`` and localbucket's handler cost ~1.35 ms of CPU a request of the broker's
(``jobs/bench/profile_store_requests.py``: header parsing through the ``email`` package, a path
``resolve`` and several ``stat`` calls per request, and a closed connection after every ``404`` or
``412``), and the broker makes its store requests one after the other per partition (the
watermark's compare-and-swap, then the batch object). This front reads each connection with plain
socket calls, parses only what a request needs, and answers on its own the broker's hot path:

* ``PUT`` of an object (``If-None-Match: *`` and ``If-Match``) when the store journals its writes;
* ``GET``/``HEAD`` of an object (with ``If-None-Match``; no ``Range``);
* ``DELETE`` of an object; ``ListObjectsV2`` from the index.

Everything else — buckets, ListObjects v1, copies, multipart uploads, ranges, aws-chunked bodies,
unsupported query parameters — is handed whole to the full handler
(:class:`pipeline.stream.local.object_store.ConditionalHandler`) over an in-memory stream, so both
answer with the same code where they overlap and share its guarantees: one lock per key stripe for
conditional writes and reads (the ETag returned is that of the body returned), the index updated
before a write is acknowledged, the journal flushed before the object is written (group commit
across connections: :class:`pipeline.stream.local.write_journal.WriteJournal`), the access key
checked on every request. Errors on the fast path keep the connection open (as S3 does).
"""

from __future__ import annotations

import hashlib
import io
import mimetypes
import os
import socket
import threading
import time
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote
from xml.sax.saxutils import escape

import localbucket

from pipeline.stream.local import object_ops as ops
from pipeline.stream.local.object_index import BucketIndex, ObjectMeta

__all__ = ["serve_lean"]

# object_store.ConditionalHandler, the class itself, handed in by object_store.serve (importing it
# here would close an import circle)
StoreHandler = Any

_MAX_HEAD = 64 << 10
_PHRASES = {status.value: status.phrase for status in HTTPStatus}
_OBJECT_QUERY = frozenset(localbucket.ALWAYS_ALLOWED_QUERY)
_LIST_QUERY = _OBJECT_QUERY | frozenset(localbucket.LIST_OBJECTS_V2_QUERY)


class _Closed(Exception):
    """The client closed the connection (or sent something that ends it)."""


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    head: bytes  # the request line and headers as received
    body: bytes = b""


class _Reader:
    """Buffered reads of one connection."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, bytearray()

    def _more(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise _Closed
        self.buf += chunk

    def head(self) -> bytes | None:
        """Up to and with the blank line after the headers; None when the client closed between
        requests."""
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                head = bytes(self.buf[: end + 4])
                del self.buf[: end + 4]
                return head
            if len(self.buf) > _MAX_HEAD:
                raise _Closed
            try:
                self._more()
            except _Closed:
                if self.buf.strip():
                    raise
                return None

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            if len(self.buf) > _MAX_HEAD:
                raise _Closed
            self._more()
        data = bytes(self.buf[:end])
        del self.buf[: end + 2]
        return data

    def chunked(self) -> bytes:
        """An HTTP/1.1 chunked body (extensions and trailers dropped)."""
        body = bytearray()
        while True:
            size = int(self.line().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while self.line():
                    pass
                return bytes(body)
            body += self.exactly(size)
            self.line()


def _parse_head(head: bytes) -> _Request:
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3:
        raise _Closed
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return _Request(parts[0], parts[1], parts[2], headers, head)


_date_cache: list = [0, ""]


def _date() -> str:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[:] = [now, formatdate(now, usegmt=True)]
    return _date_cache[1]


def _response(status: int, body: bytes = b"", headers=(), length: int | None = None) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_PHRASES.get(status, '')}",
        "Server: LocalBucket",
        f"Date: {_date()}",
        f"x-amz-request-id: {os.urandom(8).hex().upper()}",
        f"Content-Length: {len(body) if length is None else length}",
        *(f"{name}: {value}" for name, value in headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _error(error: localbucket.S3Error, path: str, method: str) -> tuple[int, bytes]:
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{error.code}</Code><Message>{escape(error.message)}</Message>"
        f"<Resource>{escape(path)}</Resource></Error>"
    ).encode()
    status = int(error.status)
    if method == "HEAD":
        return status, _response(
            status, headers=[("Content-Type", "application/xml")], length=len(xml)
        )
    return status, _response(status, xml, [("Content-Type", "application/xml")])


def _no_such_key() -> localbucket.S3Error:
    return localbucket.S3Error(
        HTTPStatus.NOT_FOUND, "NoSuchKey", "The specified key does not exist."
    )


def _precondition_failed() -> localbucket.S3Error:
    return localbucket.S3Error(
        HTTPStatus.PRECONDITION_FAILED,
        "PreconditionFailed",
        "At least one of the pre-conditions you specified did not hold",
    )


_content_types: dict[str, str] = {}


def _content_type(name: str) -> str:
    suffix = os.path.splitext(name)[1]
    kind = _content_types.get(suffix)
    if kind is None:
        kind = _content_types[suffix] = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return kind


class _FastPath:
    """The broker's requests, answered from the index, the journal and the files directly."""

    def __init__(self, handler: StoreHandler):
        self.h = handler

    def target(self, bucket: str, key: str) -> Path | None:
        """The object's file, or None when the full handler should judge the key (it rejects it)."""
        parts = key.split("/")
        if not key or key.endswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in key:
            return None
        return self.h.data_root.joinpath(bucket, *parts)

    def etag(self, index: BucketIndex, key: str, meta: ObjectMeta, target: Path) -> str:
        if meta.etag is not None:
            return meta.etag
        etag = localbucket.object_etag(target)
        index.set_etag(key, etag)
        return etag

    def put(self, req: _Request, bucket: str, key: str, target: Path) -> tuple[int, bytes]:
        index, journal = self.h.indexes[bucket], self.h.journal
        assert journal is not None
        body = req.body
        etag = hashlib.md5(body).hexdigest()
        create_only = req.headers.get("if-none-match", "").strip() == "*"
        with ops.lock_for(target):
            meta = index.meta(key)
            try:
                ops.check_write_conditions(
                    req.headers.get("if-match"),
                    create_only,
                    None if meta is None else (lambda: self.etag(index, key, meta, target)),
                )
            except ops.PreconditionFailed:
                raise _precondition_failed() from None
            phases = ops.journaled_put(journal, f"{bucket}/{key}", target, body, create_only)
            localbucket.remember_etag(target, etag)  # for the full handler's reads
            index.put(key, ObjectMeta(len(body), time.time(), etag))
        if self.h.trace is not None:
            for name, seconds in phases.items():
                self.h.trace.phase(name, seconds)
        return 200, _response(200, headers=[("ETag", f'"{etag}"')])

    def get(self, req: _Request, bucket: str, key: str, target: Path) -> tuple[int, bytes]:
        index = self.h.indexes[bucket]
        with ops.lock_for(target):
            meta = index.meta(key)
            if meta is None:
                raise _no_such_key()
            etag = self.etag(index, key, meta, target)
            if_none_match = req.headers.get("if-none-match")
            if if_none_match and etag in ops.etags_in(if_none_match):
                return 304, _response(304, headers=[("ETag", f'"{etag}"')])
            try:
                body = target.read_bytes() if req.method == "GET" else b""
            except FileNotFoundError:
                raise _no_such_key() from None
        headers = [
            ("Content-Type", _content_type(key)),
            ("ETag", f'"{etag}"'),
            ("Last-Modified", formatdate(meta.mtime, usegmt=True)),
            ("Accept-Ranges", "bytes"),
        ]
        if req.method == "HEAD":
            return 200, _response(200, headers=headers, length=meta.size)
        return 200, _response(200, body, headers)

    def delete(self, bucket: str, key: str, target: Path) -> tuple[int, bytes]:
        bucket_dir = self.h.data_root / bucket
        ops.delete_object(self.h.indexes[bucket], self.h.journal, bucket_dir, key, target)
        return 204, _response(204)

    def list_v2(self, bucket: str, query: dict[str, str]) -> tuple[int, bytes]:
        index = self.h.indexes[bucket]

        def etag_from_disk(key: str) -> str | None:
            return ops.etag_from_disk(
                index, self.h.data_root.joinpath(bucket, *key.split("/")), key
            )

        body = ops.list_objects_v2(bucket, index, query, etag_from_disk)
        return 200, _response(200, body, [("Content-Type", "application/xml")])

    def answer(self, req: _Request) -> tuple[int, bytes] | None:
        """(status, response) of a request on the fast path; None: the full handler's."""
        path, _, raw_query = req.target.partition("?")
        bucket, _, key = unquote(path).lstrip("/").partition("/")
        if bucket not in self.h.indexes or "origin" in req.headers:
            return None
        query = {
            name: values[0] for name, values in parse_qs(raw_query, keep_blank_values=True).items()
        }
        if not key:
            if (
                req.method == "GET"
                and query.get("list-type") == "2"
                and query.keys() <= _LIST_QUERY
            ):
                return self.list_v2(bucket, query)
            return None
        target = self.target(bucket, key)
        if target is None or not query.keys() <= _OBJECT_QUERY:
            return None
        if req.method in ("GET", "HEAD") and "range" not in req.headers:
            return self.get(req, bucket, key, target)
        if req.method == "DELETE":
            return self.delete(bucket, key, target)
        if (
            req.method == "PUT"
            and self.h.journal is not None
            and "x-amz-copy-source" not in req.headers
            and not req.headers.get("x-amz-content-sha256", "").startswith("STREAMING-")
            and "aws-chunked" not in req.headers.get("content-encoding", "")
        ):
            return self.put(req, bucket, key, target)
        return None


def _full_handler(handler: StoreHandler, req: _Request, client: tuple) -> tuple[bytes, bool]:
    """The request answered by the full handler over in-memory streams: (response, close after)."""
    lines = req.head[:-4].split(b"\r\n")
    kept = [
        line
        for line in lines[1:]
        if line.split(b":", 1)[0].strip().lower()
        not in (b"content-length", b"transfer-encoding", b"expect")
    ]
    raw = b"\r\n".join([lines[0], *kept, b"Content-Length: %d" % len(req.body)]) + b"\r\n\r\n"
    one = handler.__new__(handler)
    one.rfile, one.wfile = io.BytesIO(raw + req.body), io.BytesIO()
    one.client_address, one.server, one.request = client, None, None
    one.close_connection = True
    one.handle_one_request()
    return one.wfile.getvalue(), bool(one.close_connection)


def _serve_connection(sock: socket.socket, client: tuple, handler: StoreHandler) -> None:
    fast = _FastPath(handler)
    reader = _Reader(sock)
    trace = handler.trace
    try:
        while True:
            head = reader.head()
            if head is None:
                return
            if trace is not None:
                trace.begin()
            req = _parse_head(head)
            if req.headers.get("expect", "").lower() == "100-continue":
                sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            if "chunked" in req.headers.get("transfer-encoding", "").lower():
                req.body = reader.chunked()
            else:
                req.body = reader.exactly(int(req.headers.get("content-length") or 0))
            close = req.version != "HTTP/1.1" or req.headers.get("connection", "") == "close"
            path = req.target.partition("?")[0]
            key = handler.access_key
            try:
                if key and f"Credential={key}/" not in req.headers.get("authorization", ""):
                    raise localbucket.S3Error(
                        HTTPStatus.FORBIDDEN,
                        "InvalidAccessKeyId",
                        "The access key is not the one this server was started with.",
                    )
                answered = fast.answer(req)
            except localbucket.S3Error as error:
                answered = _error(error, path, req.method)
            except OSError as error:  # a full disk, say: the write was not acknowledged
                answered = _error(
                    localbucket.S3Error(
                        HTTPStatus.INTERNAL_SERVER_ERROR, "InternalError", str(error)
                    ),
                    path,
                    req.method,
                )
                close = True
            if answered is None:
                response, close_after = _full_handler(handler, req, client)  # traces itself
                close = close or close_after
            else:
                status, response = answered
                if trace is not None:
                    trace.end(req.method, req.target, status)
            sock.sendall(response)
            if close:
                return
    except (_Closed, ConnectionError, ValueError, OSError):
        return
    finally:
        sock.close()


def serve_lean(host: str, port: int, handler: StoreHandler) -> None:
    """Accept connections on ``host:port`` for ever, one thread per connection (the broker keeps a
    few open)."""
    listener = socket.create_server((host, port), backlog=128)
    try:
        while True:
            sock, client = listener.accept()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(
                target=_serve_connection, args=(sock, client, handler), daemon=True
            ).start()
    finally:
        listener.close()
