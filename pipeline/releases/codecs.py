"""What a kind's step output looks like on the public ``synthetic`` topic, and how a reader checks it.

A kind's new synthetic columns (codes, m records × the step's new columns) or its float64 histogram
over the codes (records = codes 0..|X|−1, one column) are published in chunks of
:data:`SYNTHETIC_CHUNK_RECORDS` records (the chunk messages themselves: ``synthetic_chunks`` in
:mod:`pipeline.stream.kafka.messages`); the step's manifest carries a ``synthetic`` entry
(:func:`synthetic_entry`) with the chunk count and the SHA-256 of the values (:func:`columns_checksum`),
which a reader recomputes before it accepts the step (else :class:`IncompleteStep`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

__all__ = [
    "SYNTHETIC_CHUNK_RECORDS",
    "SYNTHETIC_DTYPES",
    "IncompleteStep",
    "synthetic_columns",
    "columns_checksum",
    "synthetic_entry",
]

SYNTHETIC_CHUNK_RECORDS = 20_000  # ~60 KB of JSON per chunk per column

# Types a manifest's ``synthetic.dtype`` may name for synthetic records: the smallest holding the
# release's alphabet (``pipeline.synth.postprocess.synthetic_dtype``). A histogram is float64.
SYNTHETIC_DTYPES = ("int8", "int16", "int32")
_CHECKED_DTYPES = SYNTHETIC_DTYPES + ("float64",)


class IncompleteStep(RuntimeError):
    """A step's chunks are missing or do not match the manifest's checksum."""


def synthetic_columns(columns, categories: int) -> np.ndarray:
    """The new synthetic columns in the smallest type holding codes 0..categories−1 (int8 up to 128
    values, int16 up to 32,768); a value outside the alphabet is refused, never wrapped."""
    # the synthesizers are imported by the releaser only: a reader of the topics needs none of them
    from pipeline.synth.postprocess import synthetic_dtype

    arr = np.asarray(columns)
    if arr.size and (arr.min() < 0 or arr.max() >= categories):
        raise ValueError(
            f"synthetic values outside 0..{categories - 1}: [{arr.min()}, {arr.max()}]"
        )
    return arr.astype(synthetic_dtype(categories), copy=False)


def columns_checksum(columns: np.ndarray) -> str:
    """SHA-256 of the published values, record-major, in their own type, little-endian: synthetic
    columns (one of ``SYNTHETIC_DTYPES``) or a histogram (float64). The manifest's completeness
    check. For int8 columns these are the bytes earlier versions hashed."""
    if columns.dtype.name not in _CHECKED_DTYPES:
        raise TypeError(
            f"synthetic columns must be one of {SYNTHETIC_DTYPES} (a histogram float64), "
            f"got {columns.dtype}"
        )
    return hashlib.sha256(
        np.ascontiguousarray(columns, dtype=columns.dtype.newbyteorder("<")).tobytes()
    ).hexdigest()


def synthetic_entry(values: np.ndarray, column_steps: list[int]) -> dict[str, Any]:
    """The manifest's ``synthetic`` entry for the step's new ``values``: synthetic columns (m × the
    steps ``column_steps``, in a ``SYNTHETIC_DTYPES`` type) or a float64 histogram over the codes."""
    m = values.shape[0]
    entry: dict[str, Any] = {"columns": column_steps, "records": m, "dtype": values.dtype.name}
    if values.dtype.name == "float64":
        entry["histogram"] = True
    entry["chunks"] = max(1, -(-m // SYNTHETIC_CHUNK_RECORDS))
    entry["sha256"] = columns_checksum(values)
    return entry
