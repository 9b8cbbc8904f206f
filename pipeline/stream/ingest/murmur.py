"""Kafka's murmur2 partitioner over many keys at once (numpy): the owner of every roster user.

Byte for byte the hash of ``kafka.partitioner.default.murmur2`` (the Java client's
``Utils.murmur2``), computed with 32-bit wrapping arithmetic on whole arrays: keys are grouped by
length and each group is one (keys, length) byte matrix, so 10^6 ids cost milliseconds where a
Python loop over them took seconds (roster ownership on every worker start and every upload).
"""

from __future__ import annotations

import numpy as np

from pipeline.small_ints import distinct

__all__ = ["murmur2_many", "murmur2_of_bytes", "partitions_of", "partition_of_hashes"]

_SEED, _M = np.uint32(0x9747B28C), np.uint32(0x5BD1E995)


def murmur2_many(keys: list[str]) -> np.ndarray:
    """murmur2 of every key's UTF-8 bytes, as uint32 (no Python hashing per key)."""
    joined = "".join(keys)
    if joined.isascii():  # one character, one byte
        data, lengths = (
            joined.encode("ascii"),
            np.fromiter(map(len, keys), dtype=np.int64, count=len(keys)),
        )
    else:
        encoded = [k.encode("utf-8", "surrogatepass") for k in keys]
        data, lengths = (
            b"".join(encoded),
            np.fromiter(map(len, encoded), dtype=np.int64, count=len(keys)),
        )
    return murmur2_of_bytes(
        np.frombuffer(data, dtype=np.uint8), np.concatenate([[0], np.cumsum(lengths)])
    )


def murmur2_of_bytes(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """murmur2 of the keys ``data[offsets[i]:offsets[i + 1]]`` (a string array's buffers), as
    uint32.

    The keys of one length are gathered into a (keys, words) matrix of little-endian uint32 (one
    gather of their bytes), and each word is mixed in as a column; the 0-3 tail bytes one by
    one."""
    lengths = np.diff(offsets)
    padded = np.concatenate([data, np.zeros(8, dtype=np.uint8)])
    out = np.empty(lengths.size, dtype=np.uint32)
    with np.errstate(over="ignore"):
        if lengths.size and lengths.min() == lengths.max():  # ids of one length: no grouping
            out[:] = _hash_equal_length(padded, offsets[:-1], int(lengths[0]))
            return out
        for length in distinct(lengths).tolist():
            at = np.flatnonzero(lengths == length)
            out[at] = _hash_equal_length(padded, offsets[at], length)
    return out


def _hash_equal_length(padded: np.ndarray, start: np.ndarray, length: int) -> np.ndarray:
    """murmur2 of the keys of ``length`` bytes starting at ``start`` in ``padded``."""
    h = np.full(start.size, _SEED ^ np.uint32(length), dtype=np.uint32)
    body = length // 4 * 4
    if body:
        words = padded[start[:, None] + np.arange(body)].view("<u4")  # (keys, body // 4)
        for i in range(body // 4):
            k = words[:, i] * _M
            k ^= k >> np.uint32(24)
            k *= _M
            h *= _M
            h ^= k
    extra = length - body
    if extra >= 3:
        h ^= padded[start + body + 2].astype(np.uint32) << 16
    if extra >= 2:
        h ^= padded[start + body + 1].astype(np.uint32) << 8
    if extra >= 1:
        h ^= padded[start + body].astype(np.uint32)
        h *= _M
    h ^= h >> np.uint32(13)
    h *= _M
    h ^= h >> np.uint32(15)
    return h


def partitions_of(keys: list[str], partitions: int) -> np.ndarray:
    """The partition Kafka's default partitioner picks for each key (positive part, modulo)."""
    return partition_of_hashes(murmur2_many(keys), partitions)


def partition_of_hashes(hashes: np.ndarray, partitions: int) -> np.ndarray:
    return ((hashes & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)).astype(np.int32)
