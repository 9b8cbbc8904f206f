"""An in-memory sorted index of one bucket's objects: listings without a directory walk.

The broker lists a partition's whole ``records/`` prefix on every fetch with new data
(:mod:`pipeline.stream.local.object_store`), and gives up on the listing when the fetch's max wait
expires. localbucket answers each page of a listing by walking, sorting and stat-ing the folder, so a
page cost grows with the folder and past ~1,500 objects no fetch finished its listing in time. The index
keeps every key of a bucket, grouped by folder, each folder's names sorted: a page is a bisection to the
marker and ``max_keys`` steps, whatever the folder's size. It is built from disk when the server starts
and kept in step with every write and delete, under one lock, before the request is answered — so a
listing sees every acknowledged write and no deleted object.

Keys sort as UTF-8 bytes (S3's order); Python's ``str`` order is the same for any valid key (UTF-8
preserves code-point order).
"""

from __future__ import annotations

import bisect
import heapq
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ObjectMeta", "ListingPage", "BucketIndex"]


@dataclass(frozen=True)
class ObjectMeta:
    """What a listing shows of an object (the ETag is computed on first listing after a rebuild)."""

    size: int
    mtime: float
    etag: str | None = None

    @property
    def modified(self) -> str:
        """LastModified as S3 writes it in listings."""
        return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(self.mtime))


@dataclass(frozen=True)
class ListingPage:
    """One page: keys with their metadata, common prefixes, whether more follow, and the last entry
    as localbucket encodes it for the continuation token (``K:<key>`` or ``P:<prefix>``)."""

    contents: list[tuple[str, ObjectMeta]]
    common_prefixes: list[str]
    truncated: bool
    last_entry: str


def _folder_of(key: str) -> tuple[str, str]:
    """(folder with its trailing slash, or "" at the top; name in it)."""
    folder, _, name = key.rpartition("/")
    return (folder + "/" if folder else ""), name


class BucketIndex:
    """The keys of one bucket directory, by folder; thread-safe."""

    def __init__(self, temp_prefix: str = ".localbucket-"):
        self._temp_prefix = temp_prefix
        self._lock = threading.Lock()
        self._names: dict[str, list[str]] = {}  # folder -> its objects' names, sorted
        self._folders: list[str] = []  # the folders holding objects, sorted
        self._meta: dict[str, ObjectMeta] = {}
        self._rendered: dict[str, tuple[ObjectMeta, str]] = {}  # key -> (meta, its listing entry)

    @classmethod
    def from_disk(cls, bucket_dir: Path, temp_prefix: str = ".localbucket-") -> BucketIndex:
        """Every object file under ``bucket_dir`` (temporary files of unfinished writes left out)."""
        index = cls(temp_prefix)
        for directory, _, files in os.walk(bucket_dir):
            base = Path(directory).relative_to(bucket_dir).as_posix()
            folder = "" if base == "." else base + "/"
            for name in files:
                if name.startswith(temp_prefix):
                    continue
                try:
                    stat = os.stat(os.path.join(directory, name))
                except FileNotFoundError:
                    continue
                index._meta[folder + name] = ObjectMeta(stat.st_size, stat.st_mtime)
        for key in index._meta:
            folder, name = _folder_of(key)
            index._names.setdefault(folder, []).append(name)
        for names in index._names.values():
            names.sort()
        index._folders = sorted(index._names)
        return index

    def __len__(self) -> int:
        return len(self._meta)

    def put(self, key: str, meta: ObjectMeta) -> None:
        with self._lock:
            if key not in self._meta:
                folder, name = _folder_of(key)
                names = self._names.get(folder)
                if names is None:
                    names = self._names[folder] = []
                    bisect.insort(self._folders, folder)
                if not names or name > names[-1]:
                    names.append(name)  # the broker's batches arrive in offset order: no shifting
                else:
                    bisect.insort(names, name)
            self._meta[key] = meta

    def remove(self, key: str) -> None:
        with self._lock:
            self._rendered.pop(key, None)
            if self._meta.pop(key, None) is None:
                return
            folder, name = _folder_of(key)
            names = self._names[folder]
            del names[bisect.bisect_left(names, name)]
            if not names:
                del self._names[folder]
                del self._folders[bisect.bisect_left(self._folders, folder)]

    def meta(self, key: str) -> ObjectMeta | None:
        """The object's metadata, or None if the bucket has no such object."""
        return self._meta.get(key)  # one dict lookup: atomic under the GIL

    def without_etag(self) -> list[str]:
        """The keys indexed from disk whose ETag is not known yet."""
        with self._lock:
            return [key for key, meta in self._meta.items() if meta.etag is None]

    def set_etag(self, key: str, etag: str) -> None:
        with self._lock:
            meta = self._meta.get(key)
            if meta is not None:
                self._meta[key] = ObjectMeta(meta.size, meta.mtime, etag)

    def page(
        self, prefix: str, delimiter: str, marker: str, marker_is_prefix: bool, max_keys: int
    ) -> ListingPage:
        """The keys starting with ``prefix`` after ``marker``, as localbucket pages them."""
        contents: list[tuple[str, ObjectMeta]] = []
        common_prefixes: list[str] = []
        last_entry, truncated = "", False
        with self._lock:
            span = None if delimiter or marker_is_prefix else self._one_folder(prefix, marker)
            if span is not None:  # the broker's listing of one partition's batches: a slice
                folder, names, lo, hi = span
                meta = self._meta
                for name in names[lo : min(hi, lo + max_keys)]:
                    contents.append((folder + name, meta[folder + name]))
                last_entry = "K:" + contents[-1][0] if contents else ""
                return ListingPage(contents, [], max_keys > 0 and hi - lo > max_keys, last_entry)
            for key in heapq.merge(*self._runs(prefix, marker)):
                if marker_is_prefix and key.startswith(marker):
                    continue
                common = ""
                if delimiter:
                    at = key.find(delimiter, len(prefix))
                    if at >= 0:
                        common = key[: at + len(delimiter)]
                if common and common_prefixes and common_prefixes[-1] == common:
                    continue
                if len(contents) + len(common_prefixes) >= max_keys:
                    truncated = max_keys > 0
                    break
                if common:
                    common_prefixes.append(common)
                    last_entry = "P:" + common
                else:
                    contents.append((key, self._meta[key]))
                    last_entry = "K:" + key
        return ListingPage(contents, common_prefixes, truncated, last_entry)

    def _one_folder(self, prefix: str, marker: str) -> tuple[str, list[str], int, int] | None:
        """When every key starting with ``prefix`` is in one folder: that folder, its sorted names
        and the range of them that start with the prefix's rest and sort after ``marker``; else
        None."""
        base, rest = _folder_of(prefix)
        start = bisect.bisect_left(self._folders, prefix)
        for folder in self._folders[start : start + 2]:
            if folder != base and folder.startswith(prefix):
                return None  # a subfolder: keys from several folders, merged
        if rest and rest[-1] == "\U0010ffff":
            return None
        names = self._names.get(base, [])
        lo = bisect.bisect_left(names, rest)
        hi = bisect.bisect_left(names, rest[:-1] + chr(ord(rest[-1]) + 1)) if rest else len(names)
        if marker.startswith(base):
            lo = max(lo, bisect.bisect_right(names, marker[len(base) :]))
        elif marker > base:
            lo = len(names)  # every key of the folder sorts before the marker
        return base, names, min(lo, hi), hi

    def rendered(self, key: str, meta: ObjectMeta, render: Callable[[str, ObjectMeta], str]) -> str:
        """``render(key, meta)``, kept until the key's metadata changes: a listing renders each
        key once, however often the broker lists it."""
        cached = self._rendered.get(key)
        if cached is not None and cached[0] is meta:
            return cached[1]
        text = render(key, meta)
        self._rendered[key] = (meta, text)
        return text

    def _runs(self, prefix: str, marker: str) -> list[Iterator[str]]:
        """Per folder that can hold keys starting with ``prefix``, its keys after ``marker``, in order."""
        base, rest = _folder_of(prefix)
        folders = [base] if base in self._names else []
        start = bisect.bisect_left(self._folders, prefix)
        for folder in self._folders[start:]:
            if not folder.startswith(prefix):
                break
            if folder != base:
                folders.append(folder)
        return [self._after(folder, rest if folder == base else "", marker) for folder in folders]

    def _after(self, folder: str, name_prefix: str, marker: str) -> Iterator[str]:
        names = self._names[folder]
        lo = bisect.bisect_left(names, name_prefix)
        if marker.startswith(folder):
            lo = max(lo, bisect.bisect_right(names, marker[len(folder) :]))
        elif marker > folder:
            lo = len(names)  # every key of the folder sorts before the marker
        for i in range(lo, len(names)):
            if not names[i].startswith(name_prefix):
                return
            yield folder + names[i]
