"""The object store's operations on its files, shared by its two front ends.

Both the full request handler (:class:`pipeline.stream.local.object_store.ConditionalHandler`) and
the lean front (:mod:`pipeline.stream.local.store_server`) write, delete and list objects through
these functions, under the same striped key locks, so the two see each other's writes with one ETag
per body. A module of its own so that neither front end imports the other.
"""

from __future__ import annotations

import base64
import os
import threading
import time
import zlib
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from urllib.parse import quote
from xml.sax.saxutils import escape

import localbucket

from pipeline.stream.local.object_index import BucketIndex, ObjectMeta
from pipeline.stream.local.store_trace import RequestTrace
from pipeline.stream.local.write_journal import WriteJournal

_KEY_LOCKS = [
    threading.Lock() for _ in range(256)
]  # striped: bounded memory however many objects there are


def lock_for(path: Path) -> threading.Lock:
    """The lock of key ``path`` (shared with the keys of the same stripe)."""
    return _KEY_LOCKS[zlib.crc32(str(path).encode()) % len(_KEY_LOCKS)]


def etags_in(header: str) -> set[str]:
    return {tag.strip().removeprefix("W/").strip('"') for tag in header.split(",") if tag.strip()}


class PreconditionFailed(Exception):
    """A conditional write's condition does not hold (each front end answers ``412`` its own way)."""


def check_write_conditions(
    if_match: str | None, create_only: bool, current_etag: Callable[[], str] | None
) -> None:
    """Raise :class:`PreconditionFailed` unless a write may go ahead: ``If-Match`` needs the object
    and, unless ``*``, one of the listed ETags; ``If-None-Match: *`` (``create_only``) needs no
    object. ``current_etag`` gives the object's ETag, None when there is no object; the caller holds
    the key's lock, so the answer holds until the write."""
    if if_match is not None:
        wanted = etags_in(if_match)
        if current_etag is None or ("*" not in wanted and current_etag() not in wanted):
            raise PreconditionFailed
    if create_only and current_etag is not None:
        raise PreconditionFailed


def etag_from_disk(index: BucketIndex, target: Path, key: str) -> str | None:
    """The ETag of an object indexed from disk at start, computed on first need and kept in the
    index; None when the object is gone."""
    try:
        etag = localbucket.object_etag(target)
    except FileNotFoundError:
        return None
    index.set_etag(key, etag)
    return etag


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its ancestors that do not exist yet (a write creates them)."""
    missing = []
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    return missing


def synced(write, trace: RequestTrace | None):
    """localbucket's body writer, then the body on disk before the file is linked into place."""

    def write_and_sync(file):
        etag = write(file)
        file.flush()
        started = time.monotonic()
        os.fsync(file.fileno())
        if trace is not None:
            trace.phase("fsync", time.monotonic() - started)
        return etag

    return write_and_sync


def _write_in_place(target: Path, body: bytes, create_only: bool) -> None:
    """The object's file, created or overwritten (then cut to the body's length). Not atomic by itself:
    the caller holds the key's lock (no reader sees it half done) and journaled the body first (a crash
    half way is repaired by replay)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if create_only else 0)
    fd = os.open(target, flags, 0o600)
    try:
        view = memoryview(body)
        at = 0
        while at < len(body):
            at += os.pwrite(fd, view[at:], at)
        os.ftruncate(fd, len(body))
    finally:
        os.close(fd)


def journaled_put(
    journal: WriteJournal, name: str, target: Path, body: bytes, create_only: bool
) -> dict[str, float]:
    """The write's record flushed to the journal, then the object written in place (the caller holds
    the key's lock); the seconds each took."""
    started = time.monotonic()
    with journal.ahead_of_put(name, body):
        journaled = time.monotonic()
        _write_in_place(target, body, create_only)
    return {"journal": journaled - started, "write": time.monotonic() - journaled}


def delete_object(
    index: BucketIndex, journal: WriteJournal | None, bucket_dir: Path, key: str, target: Path
) -> None:
    """Remove the object ``key`` (if any) and the folders it leaves empty, under the key's lock."""
    with lock_for(target):
        # out of the index first: a listing never names an object a GET would no longer find
        index.remove(key)
        if target.is_file():
            if journal is not None:  # a replay after a crash must not bring it back
                with journal.ahead_of_delete(f"{bucket_dir.name}/{key}"):
                    target.unlink(missing_ok=True)
            else:
                target.unlink(missing_ok=True)
            remove_empty_folders(target.parent, bucket_dir)


def _max_keys(query: dict[str, str]) -> int:
    """The max-keys parameter, capped at S3's 1,000 (as localbucket reads it)."""
    try:
        max_keys = min(
            int(query.get("max-keys", localbucket.MAX_KEYS_LIMIT)), localbucket.MAX_KEYS_LIMIT
        )
    except ValueError:
        max_keys = -1
    if max_keys < 0:
        raise localbucket.S3Error(
            HTTPStatus.BAD_REQUEST,
            "InvalidArgument",
            "Provided max-keys not an integer or within integer range.",
        )
    return max_keys


def list_objects_v2(
    bucket: str, index: BucketIndex, query: dict[str, str], etag_from_disk
) -> bytes:
    """A ListObjectsV2 answer: localbucket's parameters and XML, the page from the index and the XML
    written as text (ElementTree took ~0.1 ms a key: 1,000 keys outlasted a fetch).
    ``etag_from_disk(key)``: the ETag of an object indexed without one, or None if it is gone."""
    prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
    start_after, token = query.get("start-after", ""), query.get("continuation-token")
    max_keys = _max_keys(query)
    marker, marker_is_prefix = start_after, False
    if token is not None:
        try:
            decoded = base64.urlsafe_b64decode(token.encode()).decode()
        except ValueError:
            decoded = ""
        if decoded[:2] not in ("K:", "P:"):
            raise localbucket.S3Error(
                HTTPStatus.BAD_REQUEST,
                "InvalidArgument",
                "The continuation token provided is incorrect.",
            )
        marker, marker_is_prefix = decoded[2:], decoded.startswith("P:")
    page = index.page(prefix, delimiter, marker, marker_is_prefix, max_keys)
    url = query.get("encoding-type") == "url"

    def text(value: str) -> str:
        return escape(quote(value, safe="/") if url else value)

    out = [
        "<?xml version='1.0' encoding='UTF-8'?>\n",
        f'<ListBucketResult xmlns="{localbucket.S3_NAMESPACE}"><Name>{escape(bucket)}</Name>',
        f"<Prefix>{text(prefix)}</Prefix>",
    ]
    if delimiter:
        out.append(f"<Delimiter>{text(delimiter)}</Delimiter>")
    out.append(
        f"<MaxKeys>{max_keys}</MaxKeys>"
        f"<KeyCount>{len(page.contents) + len(page.common_prefixes)}</KeyCount>"
        f"<IsTruncated>{'true' if page.truncated else 'false'}</IsTruncated>"
    )
    if token is not None:
        out.append(f"<ContinuationToken>{escape(token)}</ContinuationToken>")
    if page.truncated:
        next_token = base64.urlsafe_b64encode(page.last_entry.encode()).decode()
        out.append(f"<NextContinuationToken>{next_token}</NextContinuationToken>")
    if start_after:
        out.append(f"<StartAfter>{text(start_after)}</StartAfter>")
    if url:
        out.append("<EncodingType>url</EncodingType>")

    def entry(key: str, meta: ObjectMeta) -> str:
        return (
            f"<Contents><Key>{text(key)}</Key><LastModified>{meta.modified}</LastModified>"
            f"<ETag>&quot;{meta.etag}&quot;</ETag><Size>{meta.size}</Size>"
            "<StorageClass>STANDARD</StorageClass></Contents>"
        )

    for key, meta in page.contents:
        if meta.etag is None:
            etag = etag_from_disk(key)
            if etag is None:
                continue  # deleted since the page was taken
            out.append(entry(key, ObjectMeta(meta.size, meta.mtime, etag)))
        else:  # the broker lists the same batches on every fetch: each rendered once
            out.append(entry(key, meta) if url else index.rendered(key, meta, entry))
    out += [
        f"<CommonPrefixes><Prefix>{text(c)}</Prefix></CommonPrefixes>" for c in page.common_prefixes
    ]
    out.append("</ListBucketResult>")
    return "".join(out).encode()


def remove_empty_folders(folder: Path, bucket_dir: Path) -> None:
    """``folder`` and its ancestors below the bucket, as long as they are empty (as localbucket does)."""
    while folder != bucket_dir:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent
