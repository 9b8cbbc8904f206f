"""Roster rows of a column of user ids (a pyarrow string array), with no Python object per id.

What the upload checks "is this user enrolled" with, a chunk of the file at a time:

* a roster that is a range (``roster: {size: n, id_prefix: p}``, ids ``p0 .. p<n-1>``): an id is
  enrolled when it is the prefix and then a number in canonical form (no sign, no leading zero)
  below n, and that number is its row. One regular expression and one cast, in Arrow; no roster is
  built (a list of 10^6 ids costs ~1 s to make and ~60 MB).
* a roster file: the roster's vectorised id index (:class:`pipeline.stream.ingest.id_index.IdIndex`,
  built once) looks up the ids straight from the array's bytes, as the workers' parser does with a
  message's bytes. Ids holding a NUL byte go through the roster's dict (the index cannot tell them).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.arrow_arrays import bools, string_buffers, values_of

__all__ = ["UserRows"]


class UserRows:
    """Row of every user id of a string array (-1: not enrolled), for one deployment's roster."""

    def __init__(self, roster_config, roster: Callable[[], object]):
        """``roster``: makes the deployment's :class:`Roster` (called only for a roster file)."""
        self._range = roster_config.source == "range"
        if self._range:
            prefix = roster_config.id_prefix
            self._size = int(roster_config.size)
            self._skip = len(prefix)
            self._pattern = "^" + re.escape(prefix) + "(0|[1-9][0-9]{0,17})$"
        self._make_roster = roster
        self._roster: Any = None  # the Roster, made on first use

    def rows(self, users: pa.Array) -> np.ndarray:
        return self._of_range(users) if self._range else self._of_roster(users)

    def _of_range(self, users: pa.Array) -> np.ndarray:
        out = np.full(len(users), -1, dtype=np.int64)
        numbered = values_of(pc.match_substring_regex(users, self._pattern))
        at = np.flatnonzero(numbered)
        if at.size:
            digits = pc.utf8_slice_codeunits(users.filter(bools(numbered)), self._skip)
            number = values_of(digits.cast(pa.int64()))
            out[at] = np.where(number < self._size, number, -1)
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
