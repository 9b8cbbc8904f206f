"""Kafka's murmur2 partitioner over many keys at once (numpy): the owner of every roster user.

Byte for byte the hash of ``kafka.partitioner.default.murmur2`` (the Java client's
``Utils.murmur2``), computed with 32-bit wrapping arithmetic on whole arrays: the keys' words are
read a word position at a time for every key at once, so 10^6 ids cost milliseconds where a
Python loop over them took seconds (roster ownership on every worker start and every upload).
"""

from __future__ import annotations

import numpy as np

from pipeline.key_words import KeyWords

__all__ = [
    "murmur2_many",
    "murmur2_of_bytes",
    "murmur2_of_words",
    "partitions_of",
    "partition_of_hashes",
]

_SEED, _M = np.uint32(0x9747B28C), np.uint32(0x5BD1E995)
# a key's 1-3 tail bytes are the top bytes of its last word: shifted down by 8 * (4 - tail)
# (a key without a tail: its value is not used)
_TAIL_SHIFT = np.array([0, 24, 16, 8], dtype=np.uint32)


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

    All keys at once, whatever their lengths: word ``i`` of every key is one read
    (:class:`pipeline.key_words.KeyWords`: a strided view when the keys are of one length, else
    one aligned gather), mixed in where the key has that word; the 1-3 tail bytes are the top
    bytes of each key's last four."""
    return murmur2_of_words(KeyWords(data, offsets))


def murmur2_of_words(words: KeyWords) -> np.ndarray:
    """murmur2 of the keys of ``words`` (:func:`murmur2_of_bytes`)."""
    lengths = words.lengths
    h = lengths.astype(np.uint32)
    h ^= _SEED
    with np.errstate(over="ignore"):
        for i in range(words.longest // 4):
            k = words.from_start(4 * i) * _M
            k ^= k >> np.uint32(24)
            k *= _M
            mixed = h * _M
            mixed ^= k
            if i < words.shortest // 4:  # every key has this word
                h = mixed
            else:
                h = _chosen(lengths >= 4 * (i + 1), mixed, h)
        extra = lengths & 3
        if words.uniform:
            if words.longest & 3:
                h ^= words.from_end(4) >> np.uint32(32 - 8 * (words.longest & 3))
                h *= _M
        elif extra.any():
            if words.short:  # zeros past a key: its tail is the word after its whole words
                tail = np.multiply(words.from_start(0), lengths < 4, dtype=np.uint32)
                tail += words.from_start(4)  # zero for a key of up to 4 bytes
            else:
                tail = words.from_end(4) >> np.take(_TAIL_SHIFT, extra)
            tail ^= h
            tail *= _M
            h = _chosen(extra > 0, tail, h)
        h ^= h >> np.uint32(13)
        h *= _M
        h ^= h >> np.uint32(15)
    return h


def _chosen(where: np.ndarray, yes: np.ndarray, no: np.ndarray) -> np.ndarray:
    """``np.where(where, yes, no)`` by arithmetic (``yes`` overwritten): ``np.where`` branches on
    every element, several times slower when the keys' lengths are mixed at random."""
    yes ^= no
    yes *= where
    yes ^= no
    return yes


def partitions_of(keys: list[str], partitions: int) -> np.ndarray:
    """The partition Kafka's default partitioner picks for each key (positive part, modulo)."""
    return partition_of_hashes(murmur2_many(keys), partitions)


def partition_of_hashes(hashes: np.ndarray, partitions: int) -> np.ndarray:
    if partitions & (partitions - 1) == 0 and partitions <= 1 << 31:  # a power of two: low bits
        return (hashes & np.uint32(partitions - 1)).astype(np.int32)
    return ((hashes & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)).astype(np.int32)
