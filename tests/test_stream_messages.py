"""Message formats: chunked partials (PartialAssembler), synthetic chunks and checksums, the
consumer's PanelStore (completeness, dedupe, order tolerance, tamper detection), dead-letter headers."""

from __future__ import annotations

import random

import numpy as np
import orjson
import pytest

from pipeline.consumer import IncompleteStep, PanelStore
from pipeline.releases.codecs import columns_checksum, synthetic_columns
from pipeline.serialization import dumps_state
from pipeline.stream.kafka.messages import PartialAssembler, dead_letter_headers, encode_partial, synthetic_chunks


def partial(step, partition, rng, bins=64, horizon=12):
    return {
        "step": step,
        "partition": partition,
        "users": int(rng.integers(1, 1000)),
        "reported": int(rng.integers(0, 1000)),
        "releases": {
            "fw": {"counts": rng.integers(0, 1000, bins).astype(np.int64)},
            "fw-early": {"counts": None},
            "cu": {"z": rng.integers(0, 100, horizon + 1).astype(np.int64)},
            "hh": {"elements": np.arange(5, dtype=np.int64), "counts": rng.integers(0, 9, 5).astype(np.int64)},
        },
    }


def same(a, b) -> bool:
    """Structural equality (dtype, shape and values of arrays; key sets of dicts)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and set(a) == set(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and bool(np.array_equal(a, b)))
    return type(a) is type(b) and a == b


# --- partials ---------------------------------------------------------------------------------

def test_encode_partial_keys_and_chunk_count():
    rng = np.random.default_rng(0)
    p = partial(3, 2, rng)
    size = len(dumps_state(p))
    msgs = encode_partial(p, chunk_bytes=50)
    assert len(msgs) == -(-size // 50)
    assert [k for k, _ in msgs] == [f"3:2:{c}".encode() for c in range(len(msgs))]
    assert encode_partial(p, chunk_bytes=50) == msgs  # deterministic bytes: replays are exact duplicates
    assert len(encode_partial(p)) == 1


def test_assembler_round_trip_tiny_chunks_duplicates_and_disorder():
    rng = np.random.default_rng(1)
    P = 3
    originals = {(t, p): partial(t, p, rng) for t in (1, 2) for p in range(P)}
    msgs = []
    for (t, p), part in originals.items():
        msgs += [v for _, v in encode_partial(part, chunk_bytes=37)]
    msgs += random.Random(2).sample(msgs, 15)  # at-least-once: duplicates
    random.Random(3).shuffle(msgs)  # arbitrary order across steps, partitions and chunks
    asm = PartialAssembler(P)
    seen_complete = {1: False, 2: False}
    for m in msgs:
        step = asm.add(m)
        assert step in (1, 2)
        for t in (1, 2):
            if asm.complete(t):
                seen_complete[t] = True
    assert all(seen_complete.values())
    for t in (2, 1):
        parts = asm.pop(t)
        assert [p["partition"] for p in parts] == [0, 1, 2]
        for p in range(P):
            assert same(parts[p], originals[(t, p)])
    with pytest.raises(KeyError):
        asm.pop(1)


def test_assembler_complete_only_when_every_partition_arrived():
    rng = np.random.default_rng(4)
    P = 4
    asm = PartialAssembler(P)
    chunks = {p: encode_partial(partial(5, p, rng), chunk_bytes=64) for p in range(P)}
    assert not asm.complete(5)
    for p in range(P - 1):
        for _, v in chunks[p]:
            asm.add(v)
    assert not asm.complete(5)
    last = chunks[P - 1]
    assert len(last) >= 3
    for _, v in last[:-1]:
        asm.add(v)
    assert not asm.complete(5)  # the last partition misses a chunk
    with pytest.raises(KeyError):
        asm.pop(5)
    asm.add(last[-1][1])
    assert asm.complete(5) and len(asm.pop(5)) == P
    assert not asm.complete(5)


def test_assembler_missing_middle_chunk_is_incomplete():
    rng = np.random.default_rng(5)
    asm = PartialAssembler(1)
    msgs = encode_partial(partial(1, 0, rng), chunk_bytes=40)
    for i, (_, v) in enumerate(msgs):
        if i != 1:
            asm.add(v)
    assert not asm.complete(1)


def test_assembler_discard_before():
    rng = np.random.default_rng(6)
    asm = PartialAssembler(1)
    for t in (1, 2, 3):
        for _, v in encode_partial(partial(t, 0, rng)):
            asm.add(v)
    asm.discard_before(3)
    assert not asm.complete(1) and not asm.complete(2) and asm.complete(3)


# --- synthetic chunks ------------------------------------------------------------------------

@pytest.mark.parametrize("m,chunk", [(1, 1), (10, 3), (10, 10), (10, 11), (1000, 7)])
def test_synthetic_chunks_cover_every_record_once(m, chunk):
    rng = np.random.default_rng(m)
    cols = rng.integers(0, 3, size=(m, 2)).astype(np.int8)
    msgs = list(synthetic_chunks("rel", 4, [3, 4], cols, chunk_records=chunk))
    assert len(msgs) == -(-m // chunk)
    rebuilt = np.full_like(cols, -1)
    for c, (key, value) in enumerate(msgs):
        body = orjson.loads(value)
        assert key == f"rel:4:{c}".encode()
        assert body["chunk"] == c and body["chunks"] == len(msgs) and body["release"] == "rel" and body["step"] == 4
        assert body["stop"] - body["start"] == len(body["values"]["3"]) == len(body["values"]["4"])
        rebuilt[body["start"]:body["stop"], 0] = body["values"]["3"]
        rebuilt[body["start"]:body["stop"], 1] = body["values"]["4"]
    np.testing.assert_array_equal(rebuilt, cols)
    assert columns_checksum(rebuilt) == columns_checksum(cols)


def _orjson_chunks(release, step, column_steps, columns, chunk_records):
    """The chunk bytes as orjson writes them from Python lists (the encoding every published step had)."""
    m = columns.shape[0]
    chunks = max(1, -(-m // chunk_records))
    for c in range(chunks):
        start, stop = c * chunk_records, min(m, (c + 1) * chunk_records)
        yield f"{release}:{step}:{c}".encode(), orjson.dumps({
            "release": release, "step": step, "chunk": c, "chunks": chunks, "start": start, "stop": stop,
            "values": {str(s): columns[start:stop, j].tolist() for j, s in enumerate(column_steps)}})


@pytest.mark.parametrize("dtype,top", [(np.int8, 0), (np.int8, 1), (np.int8, 9), (np.int8, 10), (np.int16, 300),
                                       (np.int32, 2**31 - 1), (np.float64, 1)])
@pytest.mark.parametrize("m,chunk", [(0, 5), (1, 1), (10, 3), (20_001, 20_000)])
def test_synthetic_chunks_are_the_bytes_orjson_writes(dtype, top, m, chunk):
    """The vectorised encoding of small alphabets writes exactly orjson's bytes (a republished step must
    be byte for byte the first copy, whichever version published it)."""
    rng = np.random.default_rng(m)
    cols = (rng.random((m, 3)) if dtype is np.float64 else rng.integers(0, top + 1, size=(m, 3))).astype(dtype)
    if m:
        cols[0, 0], cols[-1, -1] = top, 0
    assert list(synthetic_chunks('a "q"', 7, [5, 6, 12], cols, chunk_records=chunk)) == \
        list(_orjson_chunks('a "q"', 7, [5, 6, 12], cols, chunk))


def test_public_topic_readers_check_record_crcs_in_c():
    """kafka-python checks each fetched record batch's CRC-32C; without the C package (the crc32c extra)
    it does so in Python at ~9 MB/s, about a second of reading per 10⁶-record step."""
    from kafka.record import util

    assert util.crc32c_c is not None and util.calc_crc32c.__defaults__[0] is util.crc32c_c


def test_columns_checksum_is_sha256_of_int8_record_major():
    import hashlib

    cols = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.int8)
    assert columns_checksum(cols) == hashlib.sha256(bytes([1, 0, 0, 1, 1, 1])).hexdigest()
    assert columns_checksum(cols) != columns_checksum(cols.T.copy().T[::-1])
    flipped = cols.copy()
    flipped[2, 1] = 0
    assert columns_checksum(flipped) != columns_checksum(cols)


# --- consumer ---------------------------------------------------------------------------------

M, H = 25, 4


def step_messages(release, step, column_steps, cols, chunk_records=6, rtype="fixed_window", categories=2):
    chunks = list(synthetic_chunks(release, step, column_steps, cols, chunk_records=chunk_records))
    manifest = {
        "release": release, "type": rtype, "step": step, "horizon": H,
        "parameters": {"window": 2, "categories": categories, "n_pad": 1, "m": cols.shape[0]},
        "noisy_counts": [1, 2, 3, 4],
        "synthetic": {"columns": column_steps, "records": cols.shape[0], "chunks": len(chunks),
                      "sha256": columns_checksum(cols)},
    }
    if cols.dtype != np.int8:  # manifests without dtype (earlier versions) mean int8
        manifest["synthetic"]["dtype"] = cols.dtype.name
    return orjson.dumps(manifest), [v for _, v in chunks]


@pytest.fixture
def panel_data():
    rng = np.random.default_rng(9)
    full = rng.integers(0, 2, size=(M, H)).astype(np.int8)
    steps = {2: step_messages("fw", 2, [1, 2], full[:, :2])}
    for t in (3, 4):
        steps[t] = step_messages("fw", t, [t], full[:, t - 1 : t])
    return full, steps


def store_of(steps, order=(2, 3, 4)) -> PanelStore:
    """A panel store fed each step's manifest and then its chunks, steps in ``order``."""
    store = PanelStore()
    for t in order:
        man, chunks = steps[t]
        store.add_manifest(man)
        for c in chunks:
            store.add_chunk(c)
    return store


def test_panel_store_in_order(panel_data):
    full, steps = panel_data
    store = store_of(steps)
    panel = store.panels["fw"]
    assert panel.complete_steps == {2, 3, 4} and panel.released_through == 4
    np.testing.assert_array_equal(panel.as_array(), full)
    assert store.duplicates == 0


def test_panel_store_tolerates_duplicates_and_any_order(panel_data):
    full, steps = panel_data
    msgs = []
    for t in (2, 3, 4):
        man, chunks = steps[t]
        msgs += [("m", man)] + [("c", c) for c in chunks]
    dups = random.Random(1).sample(msgs, 8)
    order = msgs + dups
    random.Random(7).shuffle(order)
    store = PanelStore()
    for kind, value in order:
        (store.add_manifest if kind == "m" else store.add_chunk)(value)
    panel = store.panels["fw"]
    np.testing.assert_array_equal(panel.as_array(), full)
    assert store.duplicates >= 1
    # a full replay of everything changes nothing
    for kind, value in msgs:
        (store.add_manifest if kind == "m" else store.add_chunk)(value)
    np.testing.assert_array_equal(store.panels["fw"].as_array(), full)


def test_panel_store_waits_for_missing_chunk(panel_data):
    full, steps = panel_data
    store = PanelStore()
    man, chunks = steps[2]
    store.add_manifest(man)
    for c in chunks[:-1]:
        store.add_chunk(c)
    assert 2 not in store.panels["fw"].complete_steps and store.panels["fw"].released_through == 0
    store.add_chunk(chunks[-1])
    assert store.panels["fw"].released_through == 2


def test_panel_store_gap_in_steps_limits_released_through(panel_data):
    full, steps = panel_data
    store = store_of(steps, order=(2, 4))
    assert store.panels["fw"].complete_steps == {2, 4}
    assert store.panels["fw"].released_through == 2


def test_panel_store_rejects_tampered_chunk_then_accepts_genuine_one(panel_data):
    full, steps = panel_data
    man, chunks = steps[2]
    store = PanelStore()
    store.add_manifest(man)
    for c in chunks[:-1]:
        store.add_chunk(c)
    bad = orjson.loads(chunks[-1])
    bad["values"]["1"][0] = 1 - bad["values"]["1"][0]
    with pytest.raises(IncompleteStep, match="checksum"):
        store.add_chunk(orjson.dumps(bad))
    assert 2 not in store.panels["fw"].complete_steps and store.panels["fw"].values is None
    store.add_chunk(chunks[-1])  # the republished genuine chunk replaces it
    np.testing.assert_array_equal(store.panels["fw"].as_array(), full[:, :2])


def test_panel_store_rejects_chunk_of_another_run(panel_data):
    full, steps = panel_data
    other = full.copy()
    other[0, 0] = 1 - other[0, 0]
    _, other_chunks = step_messages("fw", 2, [1, 2], other[:, :2])
    man, chunks = steps[2]
    store = PanelStore()
    store.add_manifest(man)
    with pytest.raises(IncompleteStep):
        for c in other_chunks:
            store.add_chunk(c)


@pytest.mark.parametrize("corruption", ["short", "missing_column", "out_of_range"])
def test_panel_store_malformed_chunk_is_incomplete_step(panel_data, corruption):
    full, steps = panel_data
    man, chunks = steps[2]
    store = PanelStore()
    store.add_manifest(man)
    for c in chunks[:-1]:
        store.add_chunk(c)
    bad = orjson.loads(chunks[-1])
    if corruption == "short":
        bad["values"]["1"] = bad["values"]["1"][:-1]
    elif corruption == "missing_column":
        del bad["values"]["2"]
    else:
        bad["values"]["1"][0] = 300
    with pytest.raises(IncompleteStep):
        store.add_chunk(orjson.dumps(bad))


def test_panel_store_manifest_without_synthetic_is_complete():
    store = PanelStore()
    store.add_manifest(orjson.dumps({"release": "fw", "type": "fixed_window", "step": 1, "horizon": H,
                                     "status": "accumulating"}))
    assert store.panels["fw"].complete_steps == {1}


def test_panel_queries_and_exports(panel_data, tmp_path):
    full, steps = panel_data
    store = store_of(steps)
    panel = store.panels["fw"]
    counts = panel.window_counts(3)
    code = full[:, 1].astype(int) * 2 + full[:, 2]
    np.testing.assert_array_equal(counts, np.bincount(code, minlength=4))
    np.testing.assert_array_equal(panel.window_counts(3, debias=True), counts - 1)
    csv = panel.export_csv(tmp_path / "p.csv")
    rows = np.loadtxt(csv, delimiter=",", skiprows=1, dtype=int)
    np.testing.assert_array_equal(rows[:, 0], np.arange(M))
    np.testing.assert_array_equal(rows[:, 1:], full)
    assert csv.read_text().splitlines()[0] == "record,step_1,step_2,step_3,step_4"
    pq = pytest.importorskip("pyarrow.parquet")
    path = panel.export_parquet(tmp_path / "p.parquet")
    table = pq.read_table(str(path))
    assert table.column_names == ["record", "step_1", "step_2", "step_3", "step_4"]
    np.testing.assert_array_equal(np.column_stack([table[f"step_{t}"].to_numpy() for t in range(1, 5)]), full)


# --- dead letters -----------------------------------------------------------------------------

def test_dead_letter_headers():
    h = dict(dead_letter_headers("out_of_domain", "x" * 5000, "p.d.reports", 3, 41, 7))
    assert h["dpstream-reason"] == b"out_of_domain"
    assert len(h["dpstream-detail"]) == 1000
    assert h["dpstream-source"] == b"p.d.reports/3/41"
    assert h["dpstream-batch-index"] == b"7"
    assert "dpstream-batch-index" not in dict(dead_letter_headers("late", "", "t", 0, 0, None))


def test_assembler_min_offset_tracks_unreleased_chunks():
    rng = np.random.default_rng(12)
    asm = PartialAssembler(2)
    assert asm.min_offset() is None
    msgs = {(t, p): encode_partial(partial(t, p, rng), chunk_bytes=200) for t in (1, 2) for p in (0, 1)}
    offset, first = 100, {}
    for (t, p), chunks in msgs.items():
        for _, v in chunks:
            first.setdefault(t, offset)
            asm.add(v, offset)
            offset += 1
    assert asm.min_offset() == 100
    asm.add(msgs[(1, 0)][0][1], 900)  # a replayed duplicate later in the log keeps the minimum
    assert asm.min_offset() == 100
    assert len(asm.pop(1)) == 2
    assert asm.min_offset() == first[2]  # where a restarted releaser must re-read from
    asm.add(msgs[(2, 1)][0][1])  # no offset given: not tracked
    assert asm.min_offset() == first[2]
    asm.discard_before(3)
    assert asm.min_offset() is None


# --- synthetic value types ------------------------------------------------------------------------

@pytest.mark.parametrize("categories, dtype", [(2, "int8"), (128, "int8"), (129, "int16"), (300, "int16"),
                                               (32768, "int16"), (32769, "int32")])
def test_synthetic_columns_use_the_smallest_type_holding_the_alphabet(categories, dtype):
    cols = np.array([[0, categories - 1], [categories - 1, 1]], dtype=np.int64)
    out = synthetic_columns(cols, categories)
    assert out.dtype.name == dtype
    np.testing.assert_array_equal(out, cols)  # nothing wrapped
    with pytest.raises(ValueError, match="outside"):
        synthetic_columns(np.array([[categories]]), categories)
    with pytest.raises(ValueError, match="outside"):
        synthetic_columns(np.array([[-1]]), categories)


def test_columns_checksum_of_int16_is_sha256_of_little_endian_record_major():
    import hashlib

    cols = np.array([[299, 0], [128, 1]], dtype=np.int16)
    assert columns_checksum(cols) == hashlib.sha256(np.array([299, 0, 128, 1], dtype="<i2").tobytes()).hexdigest()
    with pytest.raises(TypeError, match="int8"):
        columns_checksum(cols.astype(np.int64))


@pytest.mark.parametrize("categories", [128, 300])
def test_panel_store_reads_back_wide_alphabets(categories):
    """A 128- and a 300-value alphabet through the chunk codec, the checksum and the consumer: the
    values read back are the released ones (300 values would wrap in int8)."""
    rng = np.random.default_rng(categories)
    full = synthetic_columns(rng.integers(0, categories, size=(M, H)), categories)
    full[0, :] = categories - 1
    store = PanelStore()
    for t in range(1, H + 1):
        man, chunks = step_messages("wide", t, [t], full[:, t - 1 : t], categories=categories)
        store.add_manifest(man)
        for c in chunks:
            store.add_chunk(c)
    panel = store.panels["wide"]
    assert panel.released_through == H and panel.as_array().dtype == full.dtype
    np.testing.assert_array_equal(panel.as_array(), full)
    assert panel.as_array().max() == categories - 1


def test_panel_store_refuses_values_that_would_wrap():
    cols = np.array([[1], [2]], dtype=np.int8)
    man, chunks = step_messages("fw", 1, [1], cols)
    bad = orjson.loads(chunks[0])
    bad["values"]["1"][0] = 300  # outside int8: a wrapped 44 must not be accepted
    store = PanelStore()
    store.add_manifest(man)
    with pytest.raises(IncompleteStep, match="malformed"):
        store.add_chunk(orjson.dumps(bad))


def test_reader_decodes_digit_chunks_as_the_json_decoder_does():
    """The reader's numpy path for single-digit value lists gives exactly the JSON decoder's values, and
    leaves anything else (wider codes, other spacing, invalid JSON) to the decoder."""
    from pipeline.consumer import _digit_chunk

    rng = np.random.default_rng(4)
    for top in (1, 9, 10):
        cols = rng.integers(0, top + 1, size=(50, 3)).astype(np.int8)
        for _, value in synthetic_chunks("fw", 3, [1, 2, 3], cols, chunk_records=20):
            fast, slow = _digit_chunk(value), orjson.loads(value)
            if fast is None:
                assert top >= 10 and cols.max() >= 10
                continue
            assert {k: v for k, v in fast.items() if k != "values"} == {k: v for k, v in slow.items() if k != "values"}
            assert {s: v.tolist() for s, v in fast["values"].items()} == slow["values"]
    for other in (b'{"a":1,"values":{"1":[0,1],}}', b'{"a":1,"values":{"1":[0, 1]}}', b'{"a":1,"values":{"1":[01]}}',
                  b'{"a":1,"values":{"1":[-1,1]}}', b'{"a":1,"values":{"1":[0,1]}} ', b'{"values":1,"values":{"1":[0]}}'):
        assert _digit_chunk(other) is None
