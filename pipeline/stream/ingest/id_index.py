"""Exact, vectorised lookup of string user ids -> roster rows (the ingest hot path's id lookup).

A Python dict lookup costs ~0.5 µs once a roster of 10^6 ids no longer fits the cache (two
dependent cache misses per id). Here ids are UTF-8 bytes in fixed-width, NUL-padded numpy byte
strings whose width is a multiple of 8 bytes, read as 64-bit words: an id of up to 7 bytes is one
word. A public hash of the words picks a slot of an open-addressing table (linear probing, load
≤ 1/4), and every candidate is confirmed by comparing all its words, so the lookup is exact: a
hash collision only costs another probe. A batch of ids is looked up with a few numpy gathers per
probe round.

The width is at least one byte more than the longest roster id, so a query longer than every
roster id (which numpy cuts to the width) still differs from each of them in a byte that is NUL
only in the roster's. Padding makes an id ending in NUL equal to the id without it: :meth:`IdIndex.rows`
refuses such batches (returns None) and the caller falls back to the dict, and an index is not
built over a roster with such ids.
"""

from __future__ import annotations

import sys

import numpy as np

__all__ = ["IdIndex"]

_U64 = np.uint64
_SEED = _U64(0xCBF29CE484222325)
_MIX1, _MIX2 = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)
_KEEP = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=_U64)  # a word's first k bytes
_LITTLE_ENDIAN = sys.byteorder == "little"


def _hash(ids: np.ndarray) -> np.ndarray:
    """Each 64-bit word of the padded ids folded in with the splitmix64 finaliser."""
    words = ids.view(_U64).reshape(ids.size, ids.dtype.itemsize // 8)
    h = np.full(ids.size, _SEED, dtype=_U64)
    with np.errstate(over="ignore"):
        for j in range(words.shape[1]):
            h ^= words[:, j]
            h ^= h >> _U64(30)
            h *= _MIX1
            h ^= h >> _U64(27)
            h *= _MIX2
            h ^= h >> _U64(31)
    return h


def _utf8(ids: list[str]) -> tuple[list, bool] | None:
    """``ids`` as they go into a byte-string array (ASCII ``str`` as is, else UTF-8 ``bytes``) and
    whether any holds a NUL; None if an id ends in NUL (padding would drop it)."""
    joined = "".join(ids)
    nul = "\0" in joined
    if nul and any(u.endswith("\0") for u in ids):
        return None
    return (ids if joined.isascii() else [u.encode("utf-8", "surrogatepass") for u in ids]), nul


class IdIndex:
    """Rows of string ids in a fixed list (position = row), looked up a batch at a time."""

    def __init__(self, ids: list[str]):
        utf8 = _utf8(list(ids))
        if utf8 is None:
            raise ValueError("id index: ids ending in a NUL character are not supported")
        data = utf8[0]
        width = (max(map(len, data), default=0) // 8 + 1) * 8  # > the longest id, whole words
        padded = self.ids = (
            np.array(data, dtype=f"S{width}") if data else np.zeros(0, dtype=f"S{width}")
        )
        self._words = padded.view(_U64).reshape(padded.size, width // 8)
        bits = max(4, int(padded.size * 4 - 1).bit_length())  # load factor at most 1/4
        self._mask = (1 << bits) - 1
        table = np.full(1 << bits, -1, dtype=np.int64)
        home = (_hash(padded) & _U64(self._mask)).astype(np.int64)
        slot = home.copy()
        pending = np.arange(padded.size)
        while pending.size:  # insert in rounds: the first id per free slot wins, the rest probe on
            free = table[slot[pending]] < 0
            cand = pending[free]
            won_slots, first = np.unique(slot[cand], return_index=True)
            table[won_slots] = cand[first]
            placed = np.zeros(padded.size, dtype=bool)
            placed[cand[first]] = True
            pending = pending[~placed[pending]]
            slot[pending] = (slot[pending] + 1) & self._mask
        self._table = table.astype(np.int32) if padded.size < 2**31 else table
        # every slot from an id's home to its own is taken (no deletions): an id is at most this far on
        self._reach = int(((slot - home) & self._mask).max(initial=0))

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes + self._table.nbytes)

    def rows(self, ids: list[str]) -> np.ndarray | None:
        """Row of every id (-1 when absent); None if an id ends in NUL (the caller uses its dict).

        ``ids`` must hold only ``str`` (numpy would turn other values into their text).
        """
        size = len(ids)
        out = np.full(size, -1, dtype=np.int64)
        if size == 0:
            return out
        utf8 = _utf8(ids)
        if utf8 is None:
            return None
        data, nul = utf8
        query = np.array(
            data, dtype=self.ids.dtype
        )  # cut to the width: longer ids then differ in a word
        todo = np.arange(size)
        if nul:  # ... unless the cut ends in NULs of the id itself: compare lengths first
            todo = todo[
                np.fromiter(map(len, data), dtype=np.int64, count=size) < self.ids.dtype.itemsize
            ]
            query = query[todo]
        out[todo] = self._lookup(query)
        return out

    def rows_of_spans(
        self, text: bytes, starts: np.ndarray, lengths: np.ndarray
    ) -> np.ndarray | None:
        """Row of every id given as UTF-8 bytes ``text[start:start + length]`` holding no NUL (-1 when
        absent): a batch's ids straight from its message bytes, no string objects made. Each 8-byte
        word of an id is one unaligned read from ``text``, its bytes past the id masked off. None on
        a big-endian machine (the caller decodes the strings)."""
        if not _LITTLE_ENDIAN:
            return None
        width = self.ids.dtype.itemsize
        data = np.frombuffer(text + bytes(width), dtype=np.uint8)
        at = np.ndarray(
            (data.size - 7,), dtype=_U64, buffer=data, strides=(1,)
        )  # 8 bytes from each offset
        out = np.full(starts.size, -1, dtype=np.int64)
        fits = np.flatnonzero(lengths < width)  # longer than every roster id: absent
        starts, lengths = starts[fits], lengths[fits]
        words = np.empty((fits.size, width // 8), dtype=_U64)
        for j in range(width // 8):
            words[:, j] = at[starts + 8 * j] & _KEEP[np.clip(lengths - 8 * j, 0, 8)]
        out[fits] = self._lookup(words.view(self.ids.dtype).ravel())
        return out

    def _lookup(self, query: np.ndarray) -> np.ndarray:
        """Rows of padded ids of the table's width (-1 when absent): the home slot of every id, then
        for those whose home another id holds, every slot up to the build's longest displacement at
        once — two rounds of gathers, whatever the probe lengths."""
        words = query.view(_U64).reshape(query.size, self._words.shape[1])
        slot = (_hash(query) & _U64(self._mask)).astype(np.int64)
        cand = self._table[slot].astype(np.int64)
        out = np.where(self._equal(cand, words), cand, -1)
        on = np.flatnonzero((out < 0) & (cand >= 0))
        if on.size and self._reach:
            cand = self._table[
                (slot[on, None] + np.arange(1, self._reach + 1)) & self._mask
            ].astype(np.int64)
            hit = self._equal(cand, words[on, None, :])
            out[on] = np.where(hit.any(axis=1), cand[np.arange(on.size), hit.argmax(axis=1)], -1)
        return out

    def _equal(self, cand: np.ndarray, words: np.ndarray) -> np.ndarray:
        """Where the roster id in slot content ``cand`` (-1: empty) is the query id of ``words``."""
        same = cand >= 0
        for j in range(words.shape[-1]):
            same &= self._words[cand, j] == words[..., j]
        return same
