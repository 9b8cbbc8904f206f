"""Kafka's murmur2 partitioner over many keys at once (numpy): the owner of every roster user.

Byte for byte the hash of ``kafka.partitioner.default.murmur2`` (the Java client's
``Utils.murmur2``), computed with 32-bit wrapping arithmetic on whole arrays: keys are grouped by
length and each group is one (keys, length) byte matrix, so 10^6 ids cost milliseconds where a
Python loop over them took seconds (roster ownership on every worker start and every upload).
"""

from __future__ import annotations

import numpy as np

__all__ = ["murmur2_many", "partitions_of"]

_SEED, _M = np.uint32(0x9747B28C), np.uint32(0x5BD1E995)


def murmur2_many(keys) -> np.ndarray:
    """murmur2 of every key's UTF-8 bytes, as uint32 (``keys``: a list of str, or a pyarrow string array)."""
    import pyarrow as pa

    arr = keys.cast(pa.large_binary()) if isinstance(keys, pa.Array) else pa.array(keys, type=pa.large_binary())
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset: arr.offset + len(arr) + 1]
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8) if len(arr) and arr.buffers()[2] else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    out = np.empty(len(arr), dtype=np.uint32)
    with np.errstate(over="ignore"):
        for length in np.unique(lengths):
            at = np.flatnonzero(lengths == length)
            out[at] = _hash_equal_length(data[offsets[at][:, None] + np.arange(length)], int(length))
    return out


def _hash_equal_length(block: np.ndarray, length: int) -> np.ndarray:
    """murmur2 of each row of a (keys, length) uint8 matrix."""
    h = np.full(block.shape[0], _SEED ^ np.uint32(length), dtype=np.uint32)
    body = length // 4 * 4
    words = block[:, :body].astype(np.uint32)
    for i in range(0, body, 4):
        k = words[:, i] | (words[:, i + 1] << 8) | (words[:, i + 2] << 16) | (words[:, i + 3] << 24)
        k *= _M
        k ^= k >> np.uint32(24)
        k *= _M
        h *= _M
        h ^= k
    extra = length - body
    tail = block[:, body:].astype(np.uint32)
    if extra >= 3:
        h ^= tail[:, 2] << 16
    if extra >= 2:
        h ^= tail[:, 1] << 8
    if extra >= 1:
        h ^= tail[:, 0]
        h *= _M
    h ^= h >> np.uint32(13)
    h *= _M
    h ^= h >> np.uint32(15)
    return h


def partitions_of(keys: list[str], partitions: int) -> np.ndarray:
    """The partition Kafka's default partitioner picks for each key (positive part, modulo)."""
    return ((murmur2_many(keys) & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)).astype(np.int32)
