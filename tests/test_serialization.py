import math

import numpy as np
import pytest

from pipeline.serialization import dumps_state, loads_state


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
