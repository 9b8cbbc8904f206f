"""Little-endian 32-bit words of byte strings laid end to end (a string array's data and offsets),
read at the same distance from every key's start or end, with no loop over keys.

What murmur2 (:mod:`pipeline.stream.ingest.murmur`) and a range roster's id parser
(:mod:`pipeline.upload_rows`) read ids with. Reading a word at an odd byte offset is what makes
them slow in numpy: a gather through an unaligned view costs several times an aligned one (and
``np.take`` copies the whole view first), and a gather per byte multiplies the gathers. So:

* keys all of one length (fixed-width ids, a chunk of consecutive numbers): the keys are a regular
  (keys, length) grid and a word of each is a strided view of the bytes, read by the ufunc that
  uses it: no gather at all;
* keys of several lengths, none longer than 8 bytes (``SHORT``: a one-letter prefix and up to seven
  digits, the usual range roster): Arrow's cast to ``binary_view`` (one C pass) writes every key
  inline in 16 bytes, its length (32 bits) and then its bytes, zeros after them: a regular grid
  again, each word from the key's start a strided view of it. A read from the key's end is the
  key's 64 bits shifted up by the bytes it lacks (one shift); a read wholly outside its key is
  zero. Whatever the mix of lengths, no gather (the layout below gathers every word it reads,
  ~1 ms per word for 2^17 keys with the arithmetic on their positions);
* otherwise the bytes are copied four times, shifted by 0-3 bytes, into one aligned ``(4, m)``
  array of words: the word at byte ``p`` is ``[p % 4, p // 4]``, so every read is one aligned
  gather (four copies of the bytes cost less than one unaligned gather of 10^5 words).

Reads past a key (into the next key or the zero padding around the bytes) are allowed: callers
mask what is not theirs. The padding reads as zero: ``reach_before`` bytes (32) before the first
key, and after the last key the longest key's length and ``reach_after`` (8) more (a read at the
same distance from every key's start reaches past a short key).
"""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa

__all__ = ["SHORT", "KeyWords"]

_U32, _U64 = np.dtype("<u4"), np.dtype("<u8")
SHORT = 8  # bytes: keys up to this long are read as one word each


class KeyWords:
    """Words of the keys ``data[offsets[i]:offsets[i + 1]]``."""

    def __init__(
        self, data: np.ndarray, offsets: np.ndarray, reach_before: int = 32, reach_after: int = 8
    ):
        offsets = np.asarray(offsets, dtype=np.int64)
        self.lengths = np.diff(offsets)
        self.size = int(self.lengths.size)
        self.shortest = int(self.lengths.min()) if self.size else 0
        self.longest = int(self.lengths.max()) if self.size else 0
        self.uniform = self.shortest == self.longest
        first, last = (int(offsets[0]), int(offsets[-1])) if offsets.size else (0, 0)
        self.short = not self.uniform and self.longest <= SHORT and _has_views()
        if self.short:
            self.bytes = data[first:last]  # every key's, end to end
            self.inline = _inline(data, offsets)
            self._starts: np.ndarray | None = None  # made on first use
            self._ends: np.ndarray | None = None
            return
        front = -(-reach_before // 4) * 4  # a multiple of 4: the keys keep their alignment
        after = self.longest + reach_after  # a read of a short key at the end
        words = -(-(front + last - first + after + 4) // 4) + 1
        padded = np.zeros(4 * words, dtype=np.uint8)
        padded[front : front + last - first] = data[first:last]
        self._padded = padded
        self.bytes = padded[front : front + last - first]  # every key's, end to end
        self._shift = front - first  # key i starts at offsets[i] + shift in ``padded``
        if self.uniform:
            self._first = first + self._shift
        else:
            shifted = np.empty((4, words - 1), dtype=_U32)
            for r in range(4):
                shifted[r] = np.frombuffer(padded, dtype=_U32, count=words - 1, offset=r)
            self._words = shifted.reshape(-1)
            self._m = words - 1
            starts = offsets[:-1] + self._shift
            self._bases = {"start": self._base(starts), "end": self._base(starts + self.lengths)}

    def _base(self, positions: np.ndarray) -> np.ndarray:
        return (positions & 3) * self._m + (positions >> 2)

    def from_start(self, distance: int) -> np.ndarray:
        """The 32-bit word of every key at ``distance`` bytes from its start (``distance``: a
        multiple of 4; the result may be a view of the bytes: do not write to it)."""
        return self._read("start", distance, _U32)

    def from_end(self, distance: int, dtype: str = "<u4") -> np.ndarray:
        """The word (``<u4``, or ``<u8``: 64 bits) of every key that ends ``distance`` bytes
        before the key's end (``distance``: a multiple of 4; ``from_end(4)``: the key's last four
        bytes)."""
        return self._read("end", -distance, np.dtype(dtype))

    def _read(self, side: str, distance: int, dtype: np.dtype) -> np.ndarray:
        if distance % 4:
            raise ValueError(f"distance must be a multiple of 4 bytes, got {distance}")
        if self.uniform:
            first = self._first + distance + (self.longest if side == "end" else 0)
            return np.ndarray(
                (self.size,),
                dtype=dtype,
                buffer=self._padded,
                offset=first,
                strides=(self.longest,),
            )
        if self.short:
            return self._within(side, distance, dtype)
        at = self._bases[side] + distance // 4
        low = self._words[at]
        if dtype == _U32:
            return low
        high = self._words[at + 1].astype(np.uint64)
        high <<= np.uint64(32)
        high |= low
        return high

    def left_aligned(self) -> np.ndarray:
        """Every key (``short`` keys only) as a little-endian 64-bit word: its bytes from the
        lowest, zeros past its end."""
        if not self.short:
            raise ValueError("only keys of several lengths, none longer than SHORT, are held whole")
        if self._starts is None:  # the inline bytes start after the length: 4 bytes in
            self._starts = np.ndarray(
                (self.size,), dtype=_U64, buffer=self.inline, offset=4, strides=(16,)
            )  # unaligned: numpy's ufuncs read it as they go (do not write to it)
        return self._starts

    def _right_aligned(self) -> np.ndarray:
        """Every ``short`` key in the top bytes of a 64-bit word (what precedes it: zeros)."""
        if self._ends is None:
            missing = np.take(_MISSING_BITS, self.lengths)
            self._ends = self.left_aligned() << missing  # 64: zero (an empty key)
        return self._ends

    def _within(self, side: str, distance: int, dtype: np.dtype) -> np.ndarray:
        """A read of keys of at most 8 bytes: from the start (``distance`` 0, 4, 8: a column of
        the views), or a half or the whole of the key's 64 bits, left-aligned from its start
        or right-aligned to its end (``side`` "end", ``distance`` -8 or -4); zero wholly
        outside the key."""
        if side == "start" and dtype == _U32:
            if distance in (0, 4, 8):
                return self.inline.view(_U32)[:, 1 + distance // 4]
            return np.zeros(self.size, dtype=_U32)
        if side == "start":
            word, at = self.left_aligned(), distance
        else:
            word, at = self._right_aligned(), distance + 8
        if dtype == _U64:  # four bytes past the word: its other half, zeros beside it
            if at == 0:
                return word
            if at in (-4, 4):
                return word << np.uint64(32) if at < 0 else word >> np.uint64(32)
            return np.zeros(self.size, dtype=_U64)
        if at in (0, 4):
            return word.view(_U32)[at // 4 :: 2]
        return np.zeros(self.size, dtype=_U32)


@functools.cache
def _has_views() -> bool:
    """Whether this pyarrow casts binary to and from binary views (pyarrow 16 and later)."""
    try:
        probe = _inline(np.frombuffer(b"ab", dtype=np.uint8), np.array([0, 1, 2]))
        viewed = pa.Array.from_buffers(pa.binary_view(), 2, [None, pa.py_buffer(probe)])
        return viewed.cast(pa.binary()).to_pylist() == [b"a", b"b"]
    except (AttributeError, NotImplementedError, pa.ArrowException):
        return False


# the bits a key of 0-8 bytes lacks in a 64-bit word
_MISSING_BITS = np.array([8 * (8 - n) for n in range(SHORT + 1)], dtype=np.uint64)


def _inline(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The keys as Arrow binary views, ``(keys, 2)`` little-endian 64-bit words: a key of up to
    12 bytes is held inline, its length (32 bits), then its bytes, zeros after them (the Arrow
    columnar format's "variable-size binary view" layout pads an inline value with zeros)."""
    keys = pa.Array.from_buffers(
        pa.large_binary(),
        offsets.size - 1,
        [None, pa.py_buffer(np.ascontiguousarray(offsets)), pa.py_buffer(data)],
    )
    viewed = keys.cast(pa.binary_view())
    views = np.frombuffer(viewed.buffers()[1], dtype=_U64).reshape(-1, 2)
    return views[viewed.offset : viewed.offset + len(viewed)]
