"""A chunk of checked reports as columnar batch messages, each for the partition owning its users.

The chunk's reports are grouped by (step, owning reports partition: murmur2 of the user id, as the
workers expect, so nothing is forwarded), in file order within a group, and each group is cut
evenly into messages ``{"columns": {"user": [...], "step": t, "<attribute>": [codes]}}`` of up to
``MAX_REPORT_BYTES`` (tens of thousands of reports each: few messages, so few objects in the
broker's durable log). No Python object is made per report: ids are quoted and joined in Arrow,
codes written by orjson from numpy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.arrow_arrays import int64s, string_buffers, strings
from pipeline.stream.ingest.murmur import murmur2_of_bytes, partition_of_hashes
from pipeline.stream.process.limits import MAX_REPORT_BYTES
from pipeline.upload_columns import Columns

__all__ = ["Batch", "chunk_messages"]

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
    steps = chunk.steps if whole else chunk.steps[keep]
    codes = {name: c if whole else c[keep] for name, c in chunk.codes.items()}
    owners = _owners(users, partitions)
    key = steps * partitions + owners
    if key.size and key.min() >= 0 and key.max() < 1 << 16:
        key = key.astype(np.uint16)  # numpy sorts 16-bit keys stably by radix: ~10x faster
    order = np.argsort(key, kind="stable")
    key = key[order]
    per_message = _per_message(users, codes, deployment)
    bounds = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True]).tolist()
    quoted = _Quoted(users.take(int64s(order)))
    for lo, hi in pairwise(bounds):
        cuts = -(-(hi - lo) // per_message)  # messages of this group, of even sizes
        edges = [lo + (hi - lo) * k // cuts for k in range(cuts + 1)]
        for start, stop in pairwise(edges):
            index = order[start:stop]
            yield from _messages(
                int(steps[index[0]]),
                int(owners[index[0]]),
                chunk.start + keep,
                index,
                quoted,
                start,
                codes,
            )


def _per_message(users: pa.Array, codes: dict, deployment) -> int:
    """Reports a message holds, planned from the widest user id and code."""
    widest = (
        (pc.max(pc.binary_length(users)).as_py() or 0)
        + 3
        + sum(
            len(orjson.dumps(name))
            + 1
            + max(len(str(int(deployment.attributes[name].size) - 1)), 4)
            + 1
            for name in codes
        )
    )
    return max(1, int(_FILL * MAX_REPORT_BYTES // widest))


def _owners(users: pa.Array, partitions: int) -> np.ndarray:
    """Owning reports partition of every user id (murmur2 on the array's buffers)."""
    raw, offsets = string_buffers(users)
    return partition_of_hashes(murmur2_of_bytes(raw, offsets), partitions)


class _Quoted:
    """User ids ready to be listed in JSON, with no Python object per id: ids that need no escaping
    (no quote, backslash or control character: the usual case) are joined by ``","`` between an
    opening and a closing quote; otherwise each id is encoded by orjson and joined by ``,``."""

    def __init__(self, users: pa.Array):
        users = users.cast(pa.large_string())
        raw, _ = string_buffers(users)
        self.plain = not ((raw < 0x20) | (raw == 0x22) | (raw == 0x5C)).any()
        if self.plain:
            ids, self.open, separator, self.close = users, b'["', '","', b'"]'
        else:
            ids = strings([orjson.dumps(u) for u in users.to_pylist()], large=True)
            self.open, separator, self.close = b"[", ",", b"]"
        self.ids = ids.cast(pa.large_binary())  # joined as bytes
        self.separator = strings([separator], large=True).cast(pa.large_binary())[0]

    def listed(self, start: int, stop: int) -> bytes:
        """``[...]`` of the ids ``start:stop``: one join in Arrow."""
        part = self.ids.slice(start, stop - start)
        listed = pa.LargeListArray.from_arrays(int64s(np.array([0, len(part)])), part)
        return self.open + pc.binary_join(listed, self.separator)[0].as_py() + self.close


def _messages(
    step: int,
    partition: int,
    positions: np.ndarray,
    index: np.ndarray,
    quoted: _Quoted,
    start: int,
    codes: dict,
) -> list[Batch]:
    """The message of the reports ``index`` (offsets among those kept; ``positions``: their
    places in the file), halved while it is over ``MAX_REPORT_BYTES``."""
    columns = [b'"user":' + quoted.listed(start, start + index.size), b'"step":%d' % step]
    for name, c in codes.items():
        chunk = c[index]
        if (chunk < 0).all():
            continue
        if (chunk < 0).any():
            # null: not reported (the typed decoder then leaves it to the reference path)
            text = orjson.dumps(np.asarray(np.where(chunk < 0, None, chunk)).tolist())
        else:
            text = orjson.dumps(chunk, option=orjson.OPT_SERIALIZE_NUMPY)
        columns.append(orjson.dumps(name) + b":" + text)
    value = b'{"columns":{' + b",".join(columns) + b"}}"
    if len(value) > MAX_REPORT_BYTES and index.size > 1:  # the estimate was short: halve
        half = index.size // 2
        return _messages(
            step, partition, positions, index[:half], quoted, start, codes
        ) + _messages(step, partition, positions, index[half:], quoted, start + half, codes)
    return [Batch(step, partition, positions[index], value)]
