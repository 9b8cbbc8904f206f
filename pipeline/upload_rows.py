"""Roster rows of a column of user ids (a pyarrow string array), with no Python object per id.

What the upload checks "is this user enrolled" with, a chunk of the file at a time:

* a roster that is a range (``roster: {size: n, id_prefix: p}``, ids ``p0 .. p<n-1>``): an id is
  enrolled when it is the prefix and then a number in canonical form (no sign, no leading zero)
  below n, and that number is its row. The ids of one length are read from the array's bytes as a
  (ids, length) matrix, prefix and digits checked and the number summed in numpy; no roster is
  built (a list of 10^6 ids costs ~1 s to make and ~60 MB).
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
from pipeline.small_ints import distinct

__all__ = ["UserRows"]


_MAX_DIGITS = 18  # a row number of up to 18 digits fits an int64


def _lengths(lengths: np.ndarray, low: int, high: int) -> list[int]:
    """The distinct values of ``lengths`` in ``low..high``."""
    return [n for n in distinct(lengths).tolist() if low <= n <= high]


class UserRows:
    """Row of every user id of a string array (-1: not enrolled), for one deployment's roster."""

    def __init__(self, roster_config, roster: Callable[[], object]):
        """``roster``: makes the deployment's :class:`Roster` (called only for a roster file)."""
        self._range = roster_config.source == "range"
        if self._range:
            prefix = roster_config.id_prefix.encode("utf-8")
            self._size = int(roster_config.size)
            self._prefix = np.frombuffer(prefix, dtype=np.uint8)
        self._make_roster = roster
        self._roster: Any = None  # the Roster, made on first use

    def rows(self, users: pa.Array) -> np.ndarray:
        return self._of_range(users) if self._range else self._of_roster(users)

    def _of_range(self, users: pa.Array) -> np.ndarray:
        out = np.full(len(users), -1, dtype=np.int64)
        raw, offsets = string_buffers(users)
        lengths = np.diff(offsets)
        skip = self._prefix.size
        for length in _lengths(lengths, skip + 1, skip + _MAX_DIGITS):
            at = np.flatnonzero(lengths == length)
            starts = offsets[at]
            ok = np.ones(at.size, dtype=bool)
            for j, byte in enumerate(self._prefix.tolist()):
                ok &= raw[starts + j] == byte
            number = np.zeros(at.size, dtype=np.int64)
            for j in range(skip, length):
                digit = raw[starts + j] - np.uint8(ord("0"))  # no digit: wraps above 9
                ok &= digit <= 9
                number *= 10
                number += digit
            if length > skip + 1:
                ok &= raw[starts + skip] != ord("0")  # canonical: no leading zero
            number = number[ok]
            out[at[ok]] = np.where(number < self._size, number, -1)
        return out

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
