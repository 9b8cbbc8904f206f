"""Deterministic bytes for mechanism state (checkpoints to Redis, restore bit-for-bit).

A state is a nested structure of dicts (str keys), lists, numpy arrays, Python ints/floats/bools,
str and None. :func:`dumps_state` writes a JSON header describing the structure followed by the
raw little-endian buffers of the arrays; :func:`loads_state` reverses it exactly (dtype, shape and
every bit of every array and float). Same state -> same bytes, so checksums are meaningful.

Every blob starts with ``DPST`` and the format version, one ASCII digit (:data:`FORMAT_VERSION`).
Blobs persist in Redis across upgrades, so a blob of a version this one cannot read is refused with
:class:`StateFormatError` naming what it is (the Redis key), never half-read. Version 2 holds
manifests, alerts and feedback of a release record as nested maps (version 1 held them as JSON
strings inside the blob); a Redis state of version 1 is refused — start a new deployment state
(docs/streaming.md, "State format"). Version 3 adds constant arrays (below); version 2 blobs are read.

Large integer arrays are stored in the narrowest signed type that holds their values (codes with a
-1 sentinel are mostly int8/int32 held in int64) and widened back on load: lossless, and it cuts a
worker checkpoint about threefold, which is on the path of every step close. A large integer array
holding one value throughout is stored as that value (a worker's open steps at a close: nothing
reported for them yet, 12 of its 25 bytes per user), so a close writes half the bytes to Redis.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

__all__ = ["dumps_state", "loads_state", "FORMAT_VERSION", "StateFormatError"]

_MAGIC = b"DPST"
FORMAT_VERSION = 3  # one ASCII digit after the magic
_READABLE = (b"2", b"3")  # version 3 only adds "__fill__" entries


class StateFormatError(ValueError):
    """A state blob this version cannot read: not a dpstream blob, or another format version."""


def _encode(obj: Any, buffers: list[bytes]) -> Any:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        if arr.dtype.hasobject:
            raise TypeError("object arrays cannot be serialised")
        dtype = (
            arr.dtype.newbyteorder("<") if arr.dtype.byteorder not in ("|", "<", "=") else arr.dtype
        )
        if arr.dtype.kind in "iu" and arr.size >= _NARROW_MIN_SIZE and arr.min() == arr.max():
            return {
                "__fill__": {"__int__": str(int(arr.flat[0]))},
                "dtype": np.dtype(dtype).str,
                "shape": list(arr.shape),
            }
        stored = _narrow(arr) or dtype
        buffers.append(arr.astype(stored, copy=False).tobytes())
        entry = {
            "__nd__": len(buffers) - 1,
            "dtype": np.dtype(stored).str,
            "shape": list(arr.shape),
        }
        if stored != dtype:
            entry["as"] = np.dtype(dtype).str
        return entry
    if isinstance(obj, dict):
        for key in obj:
            if not isinstance(key, str):
                raise TypeError(f"state keys must be str, got {key!r}")
        # sorted, so buffer numbering follows the header's order: equal states -> equal bytes
        return {"__map__": {k: _encode(obj[k], buffers) for k in sorted(obj)}}
    if isinstance(obj, (list, tuple)):
        return [_encode(v, buffers) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return {"__int__": str(int(obj))}  # arbitrary precision, no float rounding
    if isinstance(obj, (float, np.floating)):
        return {"__float__": float(obj).hex()}  # exact, including inf/nan
    if obj is None or isinstance(obj, str):
        return obj
    raise TypeError(f"cannot serialise value of type {type(obj).__name__}")


_NARROW_MIN_SIZE = 4096  # smaller arrays are stored as they are
_NARROW: list[np.dtype] = [np.dtype("<i1"), np.dtype("<i2"), np.dtype("<i4")]


def _narrow(arr: np.ndarray) -> np.dtype | None:
    """The narrowest signed type holding every value of a large integer array, if narrower."""
    if arr.dtype.kind not in "iu" or arr.size < _NARROW_MIN_SIZE:
        return None
    lo, hi = int(arr.min()), int(arr.max())
    for dtype in _NARROW:
        if dtype.itemsize >= arr.dtype.itemsize:
            return None
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return dtype
    return None


def _decode(obj: Any, buffers: list[memoryview]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, buffers) for v in obj]
    if isinstance(obj, dict):
        if "__fill__" in obj:
            return np.full(
                obj["shape"], _decode(obj["__fill__"], buffers), dtype=np.dtype(obj["dtype"])
            )
        if "__nd__" in obj:
            arr = np.frombuffer(buffers[obj["__nd__"]], dtype=np.dtype(obj["dtype"]))
            if "as" in obj:
                return arr.astype(np.dtype(obj["as"])).reshape(obj["shape"])  # widened: a copy
            return arr.reshape(obj["shape"]).copy()
        if "__map__" in obj:
            return {k: _decode(v, buffers) for k, v in obj["__map__"].items()}
        if "__int__" in obj:
            return int(obj["__int__"])
        if "__float__" in obj:
            return float.fromhex(obj["__float__"])
        raise ValueError(f"corrupt state header entry {obj!r}")
    return obj


def dumps_state(state: dict[str, Any]) -> bytes:
    buffers: list[bytes] = []
    header = json.dumps(_encode(state, buffers), sort_keys=True, separators=(",", ":")).encode()
    parts = [
        _MAGIC,
        b"%d" % FORMAT_VERSION,
        struct.pack("<I", len(header)),
        header,
        struct.pack("<I", len(buffers)),
    ]
    for buf in buffers:
        parts.append(struct.pack("<Q", len(buf)))
        parts.append(buf)
    return b"".join(parts)


def loads_state(data: bytes, what: str = "state blob") -> dict[str, Any]:
    """The state in ``data``; ``what`` names the blob (e.g. its Redis key) in every error."""
    view = memoryview(data)
    if bytes(view[:4]) != _MAGIC or len(view) < 5:
        raise StateFormatError(f"{what}: not a dpstream state blob (bad magic)")
    version = bytes(view[4:5])
    if version not in _READABLE:
        raise StateFormatError(
            f"{what}: state format version {version.decode('latin-1')!r}, this dpstream reads versions "
            f"{' and '.join(v.decode() for v in _READABLE)} only; an older state cannot be continued: start a new "
            'deployment state (docs/streaming.md, "State format")'
        )
    pos = 5
    (hlen,) = struct.unpack_from("<I", view, pos)
    pos += 4
    header = json.loads(bytes(view[pos : pos + hlen]))
    pos += hlen
    (count,) = struct.unpack_from("<I", view, pos)
    pos += 4
    buffers = []
    for _ in range(count):
        (blen,) = struct.unpack_from("<Q", view, pos)
        pos += 8
        buffers.append(view[pos : pos + blen])
        pos += blen
    if pos != len(view):
        raise StateFormatError(f"{what}: trailing bytes after the state")
    return _decode(header, buffers)
