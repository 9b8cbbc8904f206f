"""Arrow arrays made from numpy buffers and their bytes read back, without ``pyarrow.array``.

``pyarrow.array`` and ``pyarrow.scalar`` import pandas on their first call when it is installed
(~1 s of CPU: 400 modules), and so does every compute function handed a numpy array or a Python
value. The upload makes its arrays here, from buffers, so ``dpstream produce`` never pays that.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = [
    "bools",
    "integers",
    "int32s",
    "int64s",
    "offsets_of",
    "string_buffers",
    "string_scalar",
    "strings",
    "valid_of",
    "values_of",
]


def integers(values: np.ndarray, dtype) -> pa.Array:
    """An Arrow integer array of the numpy type ``dtype`` holding ``values`` (their buffer itself
    when they are of that type and contiguous)."""
    data = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(
        pa.from_numpy_dtype(data.dtype), data.size, [None, pa.py_buffer(data)]
    )


def int64s(values: np.ndarray) -> pa.Array:
    """An int64 array holding ``values``."""
    return integers(values, np.int64)


def int32s(values: np.ndarray) -> pa.Array:
    """An int32 array holding ``values``."""
    return integers(values, np.int32)


def bools(mask: np.ndarray) -> pa.Array:
    """A boolean array holding ``mask``."""
    packed = np.packbits(np.asarray(mask, dtype=bool), bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), int(mask.size), [None, pa.py_buffer(packed)])


def strings(values: list, large: bool = False) -> pa.Array:
    """A string array of ``values`` (``str``, or ``bytes`` of UTF-8)."""
    encoded = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values]
    kind = np.int64 if large else np.int32
    offsets = np.zeros(len(encoded) + 1, dtype=kind)
    np.cumsum([len(v) for v in encoded], out=offsets[1:])
    data = np.frombuffer(b"".join(encoded) or b"\0", dtype=np.uint8)
    typ = pa.large_string() if large else pa.string()
    return pa.Array.from_buffers(
        typ, len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def string_scalar(value: str, large: bool = False) -> pa.Scalar:
    return strings([value], large)[0]


def offsets_of(arr: pa.Array) -> np.ndarray:
    """The offsets of a string or binary array (32-bit, or 64-bit for the large types) as a view
    of its buffer, from its first value: value i ends at ``offsets[i + 1]`` in the data buffer."""
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64 if wide else np.int32)
    return offsets[arr.offset : arr.offset + len(arr) + 1]


def string_buffers(users: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(UTF-8 bytes, offsets) of a string array: id i is ``data[offsets[i]:offsets[i + 1]]``."""
    users = users.cast(pa.large_string())
    offsets = offsets_of(users)
    data = users.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    return raw, offsets


def values_of(arr: pa.Array) -> np.ndarray:
    """The values of a boolean or fixed-width numeric array as a numpy view or copy (a null's slot
    holds whatever its buffer holds: callers mask nulls). Not ``Array.to_numpy``, which imports
    pandas."""
    size, t = len(arr), arr.type
    data = arr.buffers()[1] if size else None
    if pa.types.is_boolean(t):
        if data is None:
            return np.zeros(0, dtype=bool)
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
        return bits[arr.offset : arr.offset + size].astype(bool)
    if pa.types.is_integer(t):
        dtype = np.dtype(f"{'i' if pa.types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")
    elif pa.types.is_floating(t):
        dtype = np.dtype(f"f{t.bit_width // 8}")
    else:
        raise TypeError(f"not a boolean or numeric array: {t}")
    if data is None:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(data, dtype=dtype)[arr.offset : arr.offset + size]


def valid_of(arr: pa.Array) -> np.ndarray:
    """Where ``arr`` holds a value (not null)."""
    if not arr.null_count:
        return np.ones(len(arr), dtype=bool)
    return values_of(arr.is_valid())
