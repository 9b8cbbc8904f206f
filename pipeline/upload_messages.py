"""A chunk of checked reports as columnar batch messages, each for the partition owning its users.

The chunk's reports are grouped by (step, owning reports partition: murmur2 of the user id, as the
workers expect, so nothing is forwarded), in file order within a group, and each group is cut
evenly into messages ``{"columns": {"user": [...], "step": t, "<attribute>": [codes]}}`` of up to
``MAX_REPORT_BYTES`` (tens of thousands of reports each: few messages, so few objects in the
broker's durable log). No Python object is made per report: ids are quoted and joined in Arrow,
codes written as digits a chunk at a time, or by orjson from numpy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.arrow_arrays import int32s, int64s, offsets_of, string_buffers, strings
from pipeline.key_words import SHORT, KeyWords
from pipeline.stream.ingest.murmur import murmur2_of_words, partition_of_hashes
from pipeline.stream.process.limits import MAX_REPORT_BYTES
from pipeline.upload_columns import Columns

__all__ = ["Batch", "chunk_messages", "message_order"]

_FILL = 0.9  # of MAX_REPORT_BYTES a message is planned to fill (the estimate is an upper bound)


@dataclass(frozen=True)
class Batch:
    """One message: the reports at ``index`` (positions in the file, in file order) of one step,
    all owned by reports partition ``partition``."""

    step: int
    partition: int
    index: np.ndarray
    value: bytes


def chunk_messages(chunk: Columns, keep: np.ndarray, deployment) -> Iterator[Batch]:
    """The messages of the chunk's reports at ``keep`` (offsets in the chunk, ascending)."""
    if not keep.size:
        return
    partitions = deployment.topics.partitions
    whole = keep.size == len(chunk)
    users = chunk.users if whole else chunk.users.take(int64s(keep))
    if whole:
        words, (key, order) = chunk.user_words, message_order(chunk, partitions)
    else:
        words = KeyWords(*string_buffers(users))
        steps = chunk.steps[keep]
        key, order = _grouped(steps, (int(steps.min()), int(steps.max())), words, partitions)
    bounds = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True]).tolist()
    # everything in message order once per chunk: a message is then slices of these
    widest = words.longest
    codes = {
        name: _CodeText(c, order, chunk.code_range(name)) if whole else _CodeText(c[keep], order)
        for name, c in chunk.codes.items()
    }
    start = chunk.start
    wide = start + len(chunk) >= 1 << 31  # positions held as int32 when they fit (kept: 4 bytes)
    positions: np.ndarray = (keep[order] if not whole else order) + start
    positions = positions.astype(np.int64 if wide else np.int32)
    listed = _Listed(users, order, words)
    per_message = _per_message(widest, codes, deployment)
    for lo, hi in pairwise(bounds):
        cuts = -(-(hi - lo) // per_message)  # messages of this group, of even sizes
        edges = [lo + (hi - lo) * k // cuts for k in range(cuts + 1)]
        step, partition = divmod(int(key[lo]), partitions)
        for first, stop in pairwise(edges):
            yield from _messages(step, partition, positions, listed, codes, first, stop)


def message_order(chunk: Columns, partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """(key, order) of the chunk's reports: ``order`` puts them in message order (by step, then
    owning partition, then file order), ``key`` is step * partitions + owner in that order. Kept
    with the chunk: the upload's check thread makes it beside the check, the build reads it."""
    made = chunk.derived.get(("order", partitions))
    if made is None:
        made = chunk.derived[("order", partitions)] = _grouped(
            chunk.steps, chunk.step_range, chunk.user_words, partitions
        )
    return made


def _grouped(
    steps: np.ndarray, step_range: tuple[int, int], words: KeyWords, partitions: int
) -> tuple[np.ndarray, np.ndarray]:
    """(key, order) of :func:`message_order`; ``step_range``: the steps' (lowest, highest)."""
    owners = partition_of_hashes(murmur2_of_words(words), partitions)
    low, high = step_range
    if low >= 0 and (high + 1) * partitions <= 1 << 16:
        # numpy sorts 16-bit keys stably by radix: ~10x faster. Made as 16 bits from the start
        # (the steps' bounds known: no 64-bit key, its reductions and cast; ~0.4 ms per 10^6)
        key = steps.astype(np.uint16)
        key *= np.uint16(partitions)
        np.add(key, owners, out=key, casting="unsafe")
    else:
        key = steps * partitions + owners
    order = np.argsort(key, kind="stable")
    return key[order], order


def _per_message(widest: int, codes: dict, deployment) -> int:
    """Reports a message holds, planned from the widest user id and code."""
    widest += 3 + sum(
        len(orjson.dumps(name))
        + 1
        + max(len(str(int(deployment.attributes[name].size) - 1)), 4)
        + 1
        for name in codes
    )
    return max(1, int(_FILL * MAX_REPORT_BYTES // widest))


class _Listed:
    """The user ids in message order, ready to be listed in JSON, joined once per chunk with no
    Python object per id: ids that need no escaping (no quote, backslash or control character:
    the usual case) by ``","`` between an opening and a closing quote; otherwise each id is
    encoded by orjson and joined by ``,``. A message's list is then a slice of the joined bytes."""

    def __init__(self, users: pa.Array, order: np.ndarray, words: KeyWords):
        ids = words.bytes
        data = ids.tobytes()  # searched by memchr: faster than numpy's three comparisons
        self.spaced = 1  # ends[k]: where id k starts in the join, less k separators
        plain = b'"' not in data and b"\\" not in data and (not ids.size or int(ids.min()) >= 0x20)
        if plain:
            self.open, separator, self.close = b'["', b'","', b'"]'
            self.gap = len(separator)
            joined = _joined_in_place(words, order, separator)
            if joined is not None:  # ids of one length: id k ends at (k + 1) * length
                self.ends = np.arange(order.size + 1, dtype=np.int64) * words.longest
                self.joined = joined.data  # a memoryview of the bytes
                return
            inline = _joined_inline(words, order)
            if inline is not None:  # id k and its separator end at ends[k + 1]
                self.ends, self.joined = inline
                self.spaced = 0
                return
        users = users.take(int64s(order))
        if not plain:
            users = strings([orjson.dumps(u) for u in users.to_pylist()])
            self.open, separator, self.close = b"[", b",", b"]"
        self.gap = len(separator)
        large = pa.types.is_large_string(users.type)
        ends = offsets_of(users)
        self.ends = ends - ends[0]  # id k's bytes end at ends[k + 1] + gap * k in the join
        if not large and int(self.ends[-1]) + self.gap * len(users) >= 1 << 31:
            users, large = users.cast(pa.large_string()), True  # the join outgrows 32-bit offsets
        listed = pa.ListArray.from_arrays(int32s(np.array([0, len(users)])), users)
        sep = strings([separator], large=large)[0]
        self.joined = memoryview(pc.binary_join(listed, sep)[0].as_buffer())

    def listed(self, start: int, stop: int) -> list:
        """The pieces of ``[...]`` of the ids ``start:stop`` (to join)."""
        ends, gap, spaced = self.ends, self.gap, self.spaced * self.gap
        begin, end = int(ends[start]) + spaced * start, int(ends[stop]) + spaced * stop - gap
        return [self.open, self.joined[begin:end], self.close]


def _joined_in_place(words: KeyWords, order: np.ndarray, separator: bytes) -> np.ndarray | None:
    """The ids in ``order``, each followed by ``separator``, as one byte array, when they are all
    of one length (fixed-width ids; a chunk of consecutive numbers): a row per id, its bytes
    taken as one item each and the separator written in its columns (~1.5 ms for 2^17 ids of 7
    bytes, against ~2.5-3 ms for Arrow's take and join of the strings). None for ids of several
    lengths (Arrow joins them)."""
    width = words.longest
    if not words.uniform or width == 0:
        return None
    items = words.bytes.view(np.dtype((np.void, width)))  # id k: item k
    rows = np.empty((order.size, width + len(separator)), dtype=np.uint8)
    rows[:, :width].view(items.dtype)[:, 0] = np.take(items, order)
    for column, byte in enumerate(separator, start=width):
        rows[:, column] = byte
    return rows.reshape(-1)


_SEPARATOR = int.from_bytes(b'","', "little")
# added to the binary view of an id of n bytes (two 64-bit words: its length, then its bytes
# inline, zeros after them) to append the separator: 3 to the length, its bytes after the id's
_WITH_SEPARATOR = np.array(
    [
        [3 + ((_SEPARATOR << 8 * n + 32) & (2**64 - 1)), (_SEPARATOR << 8 * n) >> 32]
        for n in range(SHORT + 1)
    ],
    dtype=np.uint64,
)


def _joined_inline(words: KeyWords, order: np.ndarray) -> tuple[np.ndarray, memoryview] | None:
    """(offsets, bytes) of the ids in ``order``, each followed by ``","``, when they are of
    several lengths and none longer than 8 bytes (:attr:`KeyWords.short`): the separator added
    to the ids' binary views (each id held inline, zeros after it; with its separator 11 bytes at
    most, still inline), the views taken in ``order`` as 16-byte rows, and Arrow's cast to
    ``binary`` lays them end to end. None otherwise (Arrow joins them)."""
    if not words.short or not order.size:
        return None
    views = np.take(_WITH_SEPARATOR, words.lengths, axis=0)
    views += words.inline
    views = np.take(views, order, axis=0)
    viewed = pa.Array.from_buffers(pa.binary_view(), order.size, [None, pa.py_buffer(views)])
    large = 11 * order.size >= 1 << 31  # 32-bit offsets would overflow
    joined = viewed.cast(pa.large_binary() if large else pa.binary())
    return offsets_of(joined), memoryview(joined.buffers()[2])


class _CodeText:
    """One attribute's codes in message order, ready to be listed in JSON. Codes of one digit
    (0-9, none missing: the usual binary or categorical column) are written once per chunk as
    text, a digit and a comma per report, and a message's list is a slice of it (~4x faster
    than orjson writing each message's int64 codes, and a byte gathered per report, not 8);
    other codes are written by orjson per message, a missing one as ``null``."""

    def __init__(self, codes: np.ndarray, order: np.ndarray, bounds: tuple[int, int] | None = None):
        """``bounds``: the codes' (lowest, highest), when the check has them already."""
        if bounds is None:
            bounds = (int(codes.min()), int(codes.max())) if codes.size else (0, 0)
        low, high = bounds
        self.text: memoryview | None = None
        if low >= 0 and high <= 9:  # a little-endian 16-bit word a report: digit, comma
            digits = np.take(codes.astype("<u2"), order)
            digits += np.uint16(ord(",") << 8 | ord("0"))
            self.text = digits.view(np.uint8).data
        self.codes = codes[order] if self.text is None else codes[:0]  # listed by orjson
        self.complete = low >= 0  # no code missing

    def listed(self, start: int, stop: int) -> list | None:
        """The pieces of the JSON list of the codes ``start:stop`` (None: all missing)."""
        if self.text is not None:
            return [b"[", self.text[2 * start : 2 * stop - 1], b"]"]
        chunk = self.codes[start:stop]
        missing = None if self.complete else chunk < 0
        if missing is not None and missing.all():
            return None
        if missing is not None and missing.any():
            # null: not reported (the typed decoder then leaves it to the reference path)
            cells = chunk.astype(object)
            cells[missing] = None
            return [orjson.dumps(cells.tolist())]
        return [orjson.dumps(chunk, option=orjson.OPT_SERIALIZE_NUMPY)]


def _messages(
    step: int,
    partition: int,
    positions: np.ndarray,
    listed: _Listed,
    codes: dict[str, _CodeText],
    start: int,
    stop: int,
) -> list[Batch]:
    """The message of the reports ``start:stop`` in message order (``positions``: their places
    in the file), halved while it is over ``MAX_REPORT_BYTES``."""
    parts = [b'{"columns":{"user":', *listed.listed(start, stop), b',"step":%d' % step]
    for name, text in codes.items():
        pieces = text.listed(start, stop)
        if pieces is not None:
            parts += [b",", orjson.dumps(name), b":", *pieces]
    parts.append(b"}}")
    value = b"".join(parts)
    if len(value) > MAX_REPORT_BYTES and stop - start > 1:  # the estimate was short: halve
        half = (start + stop) // 2
        return _messages(step, partition, positions, listed, codes, start, half) + (
            _messages(step, partition, positions, listed, codes, half, stop)
        )
    return [Batch(step, partition, positions[start:stop], value)]
