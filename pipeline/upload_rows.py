"""Roster rows of a column of user ids (a pyarrow string array), with no Python object per id.

What the upload checks "is this user enrolled" with, a chunk of the file at a time:

* a roster that is a range (``roster: {size: n, id_prefix: p}``, ids ``p0 .. p<n-1>``): an id is
  enrolled when it is the prefix and then a number in canonical form (no sign, no leading zero)
  below n, and that number is its row. Every id is read from the array's bytes as a few words
  (:class:`pipeline.key_words.KeyWords`): the prefix's from its start, the digits eight at a time
  from its end, checked and summed eight digits per word operation (SWAR); no roster is built
  (a list of 10^6 ids costs ~1 s to make and ~60 MB).
* a roster file: the roster's vectorised id index (:class:`pipeline.stream.ingest.id_index.IdIndex`,
  built once) looks up the ids straight from the array's bytes, as the workers' parser does with a
  message's bytes. Ids holding a NUL byte go through the roster's dict (the index cannot tell them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.arrow_arrays import string_buffers
from pipeline.key_words import SHORT, KeyWords

__all__ = ["UserRows"]


_MAX_DIGITS = 18  # a row number of up to 18 digits fits an int64

_ZEROS = np.uint64(0x3030303030303030)  # "00000000"
_HIGH_NIBBLES = np.uint64(0xF0F0F0F0F0F0F0F0)
_SIXES = np.uint64(0x0606060606060606)
_LOW_SEVENS, _SEVENTY_SIXES = np.uint64(0x7F7F7F7F7F7F7F7F), np.uint64(0x7676767676767676)
_TOP_BITS = np.uint64(0x8080808080808080)
# a word's last (top) k bytes kept, the others set to "0" (leading zeros), k = 0..8
_KEEP = np.array([~((1 << 8 * (8 - k)) - 1) & (2**64 - 1) for k in range(9)], dtype=np.uint64)
_FILL = _ZEROS & ~_KEEP
_STAGES = [  # (mask, scale, shift): pairs of digits, then quadruples, then the eight
    (np.uint64(0x0F0F0F0F0F0F0F0F), np.uint64(10 * 2**8 + 1), np.uint64(8)),
    (np.uint64(0x00FF00FF00FF00FF), np.uint64(100 * 2**16 + 1), np.uint64(16)),
    (np.uint64(0x0000FFFF0000FFFF), np.uint64(10000 * 2**32 + 1), np.uint64(32)),
]
# the smallest number of d digits in canonical form (no leading zero): 10^(d-1); 0 for d <= 1
_LOWEST = np.array([0, 0] + [10 ** (d - 1) for d in range(2, 20)], dtype=np.uint64)


def _eight_digits(word: np.ndarray, count) -> tuple[np.ndarray, np.ndarray]:
    """(whether the last ``count`` bytes of each 8-byte little-endian word are ASCII digits, the
    number they write), eight digits at once (SWAR: each stage multiplies a lane by its scale
    plus one, adding each higher digit group times the scale to the one before it, wrapping; in
    place, one temporary)."""
    if np.ndim(count):  # a count per word (ids of several lengths; clipped to 0..8)
        x = np.bitwise_xor(word, _ZEROS, dtype=np.uint64)  # the bytes not kept become "0"
        x &= np.take(_KEEP, count, mode="clip")
        x ^= _ZEROS
    else:
        x = np.bitwise_and(word, _KEEP[count], dtype=np.uint64)
        x |= _FILL[count]
    return _digits_of(x)


def _digits_of(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(whether each word's 8 bytes are ASCII digits, the number they write), in place."""
    spare = x & _HIGH_NIBBLES
    valid = spare == _ZEROS  # bytes 0x30..0x3F
    np.add(x, _SIXES, out=spare)
    spare &= _HIGH_NIBBLES
    valid &= spare == _ZEROS  # and not 0x3A..0x3F
    x &= _STAGES[0][0]  # each byte its digit
    return valid, _number_of(x)


def _below_ten(x: np.ndarray) -> np.ndarray:
    """Whether every byte of each 64-bit word is below 10 (a digit XORed with "0"): a byte's low
    seven bits plus 0x76 set its top bit from 10 on, without a carry into the next byte, and a
    byte of 0x80 or more has it set already."""
    spare = np.bitwise_and(x, _LOW_SEVENS)
    spare += _SEVENTY_SIXES
    spare |= x
    spare &= _TOP_BITS
    return spare == 0


def _number_of(x: np.ndarray) -> np.ndarray:
    """The number each word's 8 bytes of digit values (0-9) write, the first byte the most
    significant, in place."""
    with np.errstate(over="ignore"):
        for stage, (mask, scale, shift) in enumerate(_STAGES):
            if stage:
                x &= mask
            x *= scale
            x >>= shift
    return x


class UserRows:
    """Row of every user id of a string array (-1: not enrolled), for one deployment's roster."""

    def __init__(self, roster_config, roster: Callable[[], object]):
        """``roster``: makes the deployment's :class:`Roster` (called only for a roster file)."""
        self._range = roster_config.source == "range"
        if self._range:
            prefix = roster_config.id_prefix.encode("utf-8")
            self._size = int(roster_config.size)
            self._prefix = np.frombuffer(prefix, dtype=np.uint8)
            self._digits = min(len(str(self._size - 1)), _MAX_DIGITS)  # of the largest row
            # the prefix as little-endian words, the last one masked to the prefix's bytes
            padded = prefix + bytes(-len(prefix) % 4)
            self._prefix_words = [
                np.uint32(int.from_bytes(padded[i : i + 4], "little"))
                for i in range(0, len(prefix), 4)
            ]
            self._prefix_masks = [
                np.uint32((1 << 8 * min(4, len(prefix) - i)) - 1) for i in range(0, len(prefix), 4)
            ]
        self._make_roster = roster
        self._short_tables: dict[str, np.ndarray] | None = None
        self._roster: Any = None  # the Roster, made on first use

    def rows(self, users: pa.Array, words: KeyWords | None = None) -> np.ndarray:
        """``words``: the ids' words, when made already."""
        if not self._range:
            return self._of_roster(users)
        return self._of_range(words if words is not None else KeyWords(*string_buffers(users)))

    def _of_range(self, words: KeyWords) -> np.ndarray:
        skip = self._prefix.size
        if words.longest <= skip:  # no id has a digit (the reads below stay within the padding)
            return np.full(words.size, -1, dtype=np.int64)
        if words.short:
            return self._of_short(words)
        # digits after the prefix (a number when the ids are all of one length); more than the
        # largest row has: not canonical, or at least the roster's size
        digits: Any
        ok: Any = True
        if words.uniform:
            digits = words.longest - skip
            if not 1 <= digits <= self._digits:
                return np.full(words.size, -1, dtype=np.int64)
        else:
            digits = words.lengths - skip
            ok = (digits >= 1) & (digits <= self._digits)
        # the prefix, word by word from the id's start
        for j in range(-(-skip // 4)):
            word = words.from_start(4 * j)
            ok = ok & ((word & self._prefix_masks[j]) == self._prefix_words[j])
        # the number, 8 digits a word from the end (the id's last 8 bytes: its last 8 digits; at
        # most 24 bytes before an id's end, within the words' padding)
        number: Any = 0
        for k in range(-(-self._digits // 8)):
            if words.uniform:
                count = min(max(digits - 8 * k, 0), 8)
            else:
                count = digits - 8 * k  # _eight_digits clips it to 0..8
            valid, value = _eight_digits(words.from_end(8 * k + 8, "<u8"), count)
            ok = ok & valid
            number = value if k == 0 else number + value * np.uint64(10 ** (8 * k))
        ok &= number < np.uint64(self._size)
        # no leading zero (unless the number is 0): at least the smallest number of its digits
        ok &= number >= np.take(_LOWEST, digits, mode="clip")
        if ok.all():
            return number.view(np.int64)  # below 10^18: the same as int64
        return np.where(ok, number.view(np.int64), -1)

    def _of_short(self, words: KeyWords) -> np.ndarray:
        """Ids of several lengths, none longer than 8 bytes (:attr:`KeyWords.short`): each id is
        one word (its bytes from the lowest), each byte XORed with "0" (a digit becomes its
        value, any other byte 10 or more), its prefix shifted out and its digits shifted up to
        the word's top (zeros under them: leading zeros). The shift and the smallest canonical
        number of that many digits are looked up by the id's length; a wrong count of digits
        has no digits left and a smallest number above any (one gather and one comparison fewer
        than a table of its own, and no "0"s to fill in: ~1.5 ms per 10^6 ids less)."""
        by_length, lengths = self._by_length(), words.lengths
        x = np.bitwise_xor(words.left_aligned(), _ZEROS)  # a new array
        x >>= np.uint64(8 * self._prefix.size)
        x <<= np.take(by_length["shift"], lengths)
        ok = _below_ten(x)
        for j in range(-(-self._prefix.size // 4)):
            word = words.from_start(4 * j)
            ok &= (word & self._prefix_masks[j]) == self._prefix_words[j]
        number = _number_of(x)
        ok &= number < np.uint64(self._size)
        ok &= number >= np.take(by_length["lowest"], lengths)
        if ok.all():
            return number.view(np.int64)
        return np.where(ok, number.view(np.int64), -1)

    def _by_length(self) -> dict[str, np.ndarray]:
        """Per id length 0..SHORT: the shift that puts its digits at a word's top (64: none, for
        a count of digits that is not 1 up to the largest row's), and the smallest canonical
        number of that many digits (the largest 64-bit number when the count is not right)."""
        if self._short_tables is None:
            digits = np.arange(SHORT + 1) - self._prefix.size
            fits = (digits >= 1) & (digits <= self._digits)
            count = np.clip(digits, 0, 8)
            lowest = _LOWEST[np.clip(digits, 0, _LOWEST.size - 1)]
            self._short_tables = {
                "shift": np.where(fits, 8 * (8 - count), 64).astype(np.uint64),
                "lowest": np.where(fits, lowest, np.uint64(2**64 - 1)).astype(np.uint64),
            }
        return self._short_tables

    def _of_roster(self, users: pa.Array) -> np.ndarray:
        if self._roster is None:
            self._roster = self._make_roster()
        roster = self._roster
        raw, offsets = string_buffers(users)
        index = roster.index() if len(users) and not (raw == 0).any() else None
        if index is not None:
            starts = offsets[:-1] - offsets[0]
            rows = index.rows_of_spans(
                raw[offsets[0] : offsets[-1]].tobytes(), starts, np.diff(offsets)
            )
            if rows is not None:
                return rows
        return roster.rows_of_ids(users.to_pylist())
