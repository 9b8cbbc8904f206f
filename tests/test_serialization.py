import math

import numpy as np
import pytest

from pipeline.serialization import FORMAT_VERSION, StateFormatError, dumps_state, loads_state


def test_round_trip_preserves_dtypes_shapes_and_bits():
    state = {
        "ints": np.arange(-5, 5, dtype=np.int64).reshape(2, 5),
        "small": np.array([1, 0, 1], dtype=np.uint8),
        "floats": np.array([0.1, -0.0, np.inf, np.nan]),
        "scalar_float": 0.1 + 0.2,
        "big_int": 2**80 + 1,
        "nested": {"list": [1, "a", None, True, {"x": np.zeros(0, dtype=np.int16)}]},
    }
    back = loads_state(dumps_state(state))
    assert back["ints"].dtype == np.int64 and back["ints"].shape == (2, 5)
    np.testing.assert_array_equal(back["ints"], state["ints"])
    assert back["small"].dtype == np.uint8
    assert back["floats"].tobytes() == state["floats"].tobytes()  # bit-for-bit, incl. -0.0 and nan
    assert back["scalar_float"] == state["scalar_float"]
    assert back["big_int"] == 2**80 + 1
    assert back["nested"]["list"][:4] == [1, "a", None, True]
    assert back["nested"]["list"][4]["x"].dtype == np.int16


def test_same_state_gives_same_bytes():
    a = {"b": np.arange(3), "a": 1.5}
    b = {"a": 1.5, "b": np.arange(3)}
    assert dumps_state(a) == dumps_state(b)


def test_restored_arrays_are_writable_copies():
    back = loads_state(dumps_state({"x": np.arange(4)}))
    back["x"][0] = 99  # must not raise (frombuffer views are read-only)
    assert back["x"][0] == 99


@pytest.mark.parametrize("bad", [{"x": object()}, {1: 2}, {"x": np.array([object()])}])
def test_unserialisable_values_are_refused(bad):
    with pytest.raises(TypeError):
        dumps_state(bad)


def test_corrupt_blobs_are_refused():
    blob = dumps_state({"x": np.arange(3)})
    with pytest.raises(ValueError, match="magic"):
        loads_state(b"XXXXX" + blob[5:])
    with pytest.raises(ValueError, match="trailing"):
        loads_state(blob + b"\0")
    assert math.isnan(loads_state(dumps_state({"f": float("nan")}))["f"])


def test_blobs_carry_the_format_version_and_other_versions_are_refused_by_name():
    blob = dumps_state({"x": np.arange(3)})
    assert blob[:5] == b"DPST%d" % FORMAT_VERSION
    key = "dpstream:demo:checkpoint:3"
    for version in (b"1", b"%d" % (FORMAT_VERSION + 1)):
        with pytest.raises(StateFormatError, match=f"{key}: state format version '{version.decode()}'"):
            loads_state(b"DPST" + version + blob[5:], what=key)
    with pytest.raises(StateFormatError, match=f"{key}: not a dpstream state blob"):
        loads_state(b"DPST", what=key)


@pytest.mark.parametrize("dtype, values, narrow_bytes", [
    ("<i8", [-1, 0, 1], 1),                       # codes with a -1 sentinel: int8 on the wire
    ("<i8", [-129, 127], 2),
    ("<i8", [-(2**31), 2**31 - 1], 4),
    ("<i8", [-(2**31) - 1, 0], 8),                # does not fit int32: stored as it is
    ("<u8", [0, 2**63 + 5], 8),
    ("<i4", [-1, 70_000], 4),
    ("<u4", [0, 2**31 - 1], 4),
    ("<u4", [0, 2**32 - 1], 4),
    (">i8", [-1, 1], 1),
])
def test_large_integer_arrays_are_stored_narrow_and_restored_exactly(dtype, values, narrow_bytes):
    rng = np.random.default_rng(3)
    arr = rng.choice(np.array(values, dtype=object), size=(3, 5000)).astype(dtype)
    arr[0, 0], arr[-1, -1] = values[0], values[-1]  # both extremes present
    blob = dumps_state({"a": arr})
    back = loads_state(blob)["a"]
    assert back.dtype == arr.dtype.newbyteorder("<") and back.shape == arr.shape
    assert np.array_equal(back, arr) and back.flags.writeable
    assert arr.size * narrow_bytes <= len(blob) < arr.size * narrow_bytes + 400


def test_small_integer_arrays_are_stored_as_they_are():
    blob = dumps_state({"a": np.array([-1, 0, 1], dtype=np.int64)})
    assert b'"as"' not in blob and loads_state(blob)["a"].dtype == np.int64


@pytest.mark.parametrize("dtype, value", [("<i8", -1), ("<i1", -1), ("<i4", 7), ("<u8", 2**64 - 1), (">i8", 3)])
def test_constant_integer_arrays_are_stored_as_their_value(dtype, value):
    """A worker's open steps hold -1 for every user until reports arrive: stored as the value, not as
    its n bytes (half a close's Redis write), and restored exactly, writable."""
    arr = np.full((4, 5000), value, dtype=dtype)
    blob = dumps_state({"a": arr, "b": np.arange(3)})
    back = loads_state(blob)["a"]
    assert len(blob) < 400
    assert back.dtype == arr.dtype.newbyteorder("<") and back.shape == arr.shape
    assert np.array_equal(back, arr) and back.flags.writeable


def test_version_2_blobs_are_still_read():
    """Version 3 only adds constant arrays: a blob of version 2 (no such entry) reads as it did."""
    blob = dumps_state({"x": np.arange(5000) % 7, "f": 0.5})
    assert loads_state(b"DPST2" + blob[5:])["f"] == 0.5
