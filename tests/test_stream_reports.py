"""Roster (ids -> rows, Kafka partition ownership) and report parsing/validation."""

from __future__ import annotations

import random

import numpy as np
import orjson
import pytest
from kafka.partitioner.default import murmur2 as kafka_murmur2

from pipeline.config import parse_config
from pipeline.stream.ingest.reports import REASONS, ReportParser, public_hash
from pipeline.stream.ingest.roster import Roster, murmur2_partition

HORIZON = 6


def deployment():
    return parse_config({
        "name": "rep",
        "roster": {"size": 20},
        "horizon": HORIZON,
        "attributes": {
            "poverty": {"type": "binary"},
            "status": {"type": "categorical", "values": ["employed", "unemployed", "inactive"]},
            "query": {"type": "hashed", "size": 1000},
        },
        "budget": {"rho": 1.0},
        "releases": [{"name": "cu", "type": "cumulative", "attribute": "poverty", "share": 1.0}],
    })


@pytest.fixture
def parser():
    dep = deployment()
    return ReportParser(Roster.from_range(20), dep.attributes, dep.horizon)


def rep(user="u1", step=1, **values) -> bytes:
    return orjson.dumps({"user": user, "step": step, "values": values or {"poverty": 1}})


# --- roster --------------------------------------------------------------------------------------

def test_partition_matches_both_clients_default_partitioners_on_random_bytes():
    """The roster's owner of a key is the partition kafka-python's and aiokafka's default
    partitioners pick for it (a report keyed by user id lands on the partition that owns the user)."""
    from aiokafka.partitioner import DefaultPartitioner

    aiokafka_partition = DefaultPartitioner()
    rnd = random.Random(20261121)
    for length in list(range(0, 17)) + [31, 64, 255, 1000]:
        for _ in range(25):
            data = bytes(rnd.getrandbits(8) for _ in range(length))
            for partitions in (1, 3, 4, 7, 64):
                got = murmur2_partition(data, partitions)
                assert got == (kafka_murmur2(data) & 0x7FFFFFFF) % partitions, data
                assert got == aiokafka_partition(data, list(range(partitions)), []), data


def test_murmur2_known_java_values():
    # The hash the roster uses is the Java client's: values from Kafka's UtilsTest.testMurmur2
    # (signed int32 in Java).
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
             b"a-little-bit-longer-string": -1486304829, b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
             b"abc": 479470107}
    for key, java in cases.items():
        assert kafka_murmur2(key) == java & 0xFFFFFFFF, key
        assert murmur2_partition(key, 1 << 31) == java & 0x7FFFFFFF, key


def test_owners_match_kafka_default_partitioner_and_are_stable():
    roster = Roster.from_range(500)
    for partitions in (1, 3, 4):
        owners = roster.owners(partitions)
        expected = [(kafka_murmur2(f"u{i}".encode()) & 0x7FFFFFFF) % partitions for i in range(500)]
        assert owners.tolist() == expected
        again = Roster.from_range(500).owners(partitions)  # a fresh roster (another process) agrees
        assert again.tolist() == expected
        assert roster.owners(partitions) is owners or roster.owners(partitions).tolist() == expected
    # every row is owned by exactly one partition
    parts = [roster.rows_of(p, 4) for p in range(4)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(500))
    assert all(p.size > 0 for p in parts)


def test_roster_rows_and_unknown_users(tmp_path):
    roster = Roster.from_range(5, prefix="hh")
    assert roster.n == 5
    assert roster.row("hh3") == 3 and roster.row("u3") == -1 and roster.row("") == -1
    assert roster.rows(["hh0", "nobody", "hh4", 7, None]).tolist() == [0, -1, 4, -1, -1]
    f = tmp_path / "ids"
    f.write_text("bob\n\nalice\n")
    r2 = Roster.from_file(f)
    assert r2.ids == ["bob", "alice"] and r2.row("alice") == 1 and r2.row("carol") == -1


def test_roster_refuses_duplicates_and_empty():
    with pytest.raises(ValueError):
        Roster(["a", "b", "a"])
    with pytest.raises(ValueError):
        Roster([])


# --- accepted reports -----------------------------------------------------------------------

def test_single_report_accepted(parser):
    raw = rep("u7", 3, poverty=1, status="unemployed")
    out = parser.parse([raw])
    assert len(out) == 1 and not out.rejections
    assert out.rows.tolist() == [7] and out.steps.tolist() == [3]
    assert out.codes["poverty"].tolist() == [1]
    assert out.codes["status"].tolist() == [1]
    assert out.codes["query"].tolist() == [-1]  # not carried: imputed at close
    assert out.original(0) == raw and out.batch_index.tolist() == [-1]


def test_categorical_labels_and_int_codes(parser):
    out = parser.parse([rep("u0", 1, status="employed"), rep("u1", 1, status="inactive"),
                        rep("u2", 1, status=1), rep("u3", 1, status=2)])
    assert out.codes["status"].tolist() == [0, 2, 1, 2] and not out.rejections


def test_binary_takes_bools_and_01(parser):
    out = parser.parse([rep("u0", 1, poverty=True), rep("u1", 1, poverty=False), rep("u2", 1, poverty=0)])
    assert out.codes["poverty"].tolist() == [1, 0, 0] and not out.rejections


def test_hashed_attribute_uses_public_hash(parser):
    out = parser.parse([rep("u0", 1, query="influenza symptoms"), rep("u1", 1, query=999)])
    assert out.codes["query"].tolist() == [public_hash("influenza symptoms", 1000), 999]
    h = public_hash("influenza symptoms", 1000)
    assert 0 <= h < 1000 and h == public_hash("influenza symptoms", 1000)  # deterministic
    # the public hash is BLAKE2b-64 little-endian mod size: anyone can recompute it
    import hashlib

    d = hashlib.blake2b("influenza symptoms".encode(), digest_size=8).digest()
    assert h == int.from_bytes(d, "little") % 1000


# --- rejections of single messages: the original bytes, exactly ---------------------------

@pytest.mark.parametrize("raw,reason", [
    (b'{"user": "u1", "step": 1, "values": {"poverty": 1}', "malformed"),  # truncated
    (b"not json at all", "malformed"),
    (b"", "malformed"),
    (b"\xff\xfe\x00garbage", "malformed"),
    (b"[1, 2, 3]", "malformed"),
    (b'"u1"', "malformed"),
    (b"null", "malformed"),
    (b'{"user": 1, "step": 1, "values": {"poverty": 1}}', "malformed"),
    (b'{"user": "u1", "step": "1", "values": {"poverty": 1}}', "malformed"),
    (b'{"user": "u1", "step": 1.0, "values": {"poverty": 1}}', "malformed"),
    (b'{"user": "u1", "step": true, "values": {"poverty": 1}}', "malformed"),
    (b'{"user": "u1", "step": 1, "values": [1]}', "malformed"),
    (b'{"user": "u1", "step": 1}', "malformed"),
    (b'{"user": "u1", "step": 1, "values": {}}', "malformed"),
    (b'{"user": "u1", "step": 1, "values": {"poverty": 1}, "extra": 2}', "malformed"),
    (b'{"user": "u1", "step": 1, "values": {"income": 1}}', "malformed"),
    (b'{"user": "u1", "step": 0, "values": {"poverty": 1}}', "malformed"),
    (b'{"user": "u1", "step": -4, "values": {"poverty": 1}}', "malformed"),
    (b'{"user": {"nested": ["garbage", {"x": null}]}, "step": 1, "values": {"poverty": 1}}', "malformed"),
    (b'{"user": "u1", "step": 100000000000000000000000000000, "values": {"poverty": 1}}', "malformed"),
    (b'{"user": "u1", "step": 1e400, "values": {"poverty": 1}}', "malformed"),
    (b'{"user": "u1", "step": NaN, "values": {"poverty": 1}}', "malformed"),
    (b'{"user": "u1", "step": 7, "values": {"poverty": 1}}', "future_step"),  # beyond the horizon
    (b'{"user": "u1", "step": 18446744073709551615, "values": {"poverty": 1}}', "future_step"),
    (b'{"user": "nobody", "step": 1, "values": {"poverty": 1}}', "unknown_user"),
    (b'{"user": "u1", "step": 1, "values": {"poverty": 2}}', "out_of_domain"),
    (b'{"user": "u1", "step": 1, "values": {"poverty": -1}}', "out_of_domain"),
    (b'{"user": "u1", "step": 1, "values": {"poverty": 1.5}}', "out_of_domain"),
    (b'{"user": "u1", "step": 1, "values": {"poverty": "yes"}}', "out_of_domain"),
    (b'{"user": "u1", "step": 1, "values": {"poverty": 99999999999999999999999}}', "out_of_domain"),
    (b'{"user": "u1", "step": 1, "values": {"poverty": [[1]]}}', "out_of_domain"),
    (b'{"user": "u1", "step": 1, "values": {"status": "retired"}}', "out_of_domain"),
    (b'{"user": "u1", "step": 1, "values": {"status": 3}}', "out_of_domain"),
    (b'{"user": "u1", "step": 1, "values": {"status": true}}', "out_of_domain"),
    (b'{"user": "u1", "step": 1, "values": {"query": 1000}}', "out_of_domain"),
    (b'{"user": "u1", "step": 1, "values": {"query": {"a": 1}}}', "out_of_domain"),
])
def test_single_message_rejection_keeps_original_bytes(parser, raw, reason):
    out = parser.parse([raw])
    assert len(out) == 0
    assert len(out.rejections) == 1
    rej = out.rejections[0]
    assert rej.reason == reason and rej.reason in REASONS
    assert rej.original == raw and type(rej.original) is bytes
    assert rej.batch_index is None
    assert rej.detail


def test_out_of_domain_anywhere_rejects_the_whole_report(parser):
    raw = rep("u1", 1, poverty=1, status="retired")
    out = parser.parse([raw])
    assert len(out) == 0 and out.rejections[0].reason == "out_of_domain"
    assert "status" in out.rejections[0].detail


def test_non_bytes_input_is_malformed_not_a_crash(parser):
    out = parser.parse([None, b'{"user": "u1", "step": 1, "values": {"poverty": 1}}'])
    assert [r.reason for r in out.rejections] == ["malformed"] and len(out) == 1


# --- batches ---------------------------------------------------------------------------------

def test_batch_mixed_keeps_good_items_in_order_and_reencodes_bad_ones(parser):
    items = [
        {"user": "u3", "step": 1, "values": {"poverty": 1}},
        {"user": "ghost", "step": 1, "values": {"poverty": 1}},
        {"user": "u1", "step": 2, "values": {"status": "inactive"}},
        "not an object",
        {"user": "u2", "step": 1, "values": {"poverty": 7}},
        {"user": "u9", "step": 99, "values": {"poverty": 0}},
        {"user": "u0", "step": 1, "values": {"poverty": 0}, "x": 1},
        {"user": "u5", "step": 3, "values": {"poverty": 0, "query": "cough"}},
    ]
    raw = orjson.dumps({"reports": items})
    single_before, single_after = rep("u10", 1), rep("u11", 1)
    out = parser.parse([single_before, raw, single_after])
    assert out.rows.tolist() == [10, 3, 1, 5, 11]
    assert out.steps.tolist() == [1, 1, 2, 3, 1]
    assert out.batch_index.tolist() == [-1, 0, 2, 7, -1]
    assert out.original(1) == orjson.dumps(items[0]) and out.original(0) == single_before
    got = [(r.reason, r.batch_index, r.original) for r in out.rejections]
    assert got == [
        ("unknown_user", 1, orjson.dumps(items[1])),
        ("malformed", 3, orjson.dumps(items[3])),
        ("out_of_domain", 4, orjson.dumps(items[4])),
        ("future_step", 5, orjson.dumps(items[5])),
        ("malformed", 6, orjson.dumps(items[6])),
    ]
    for r in out.rejections:  # a re-encoded item decodes to the item that was sent
        assert orjson.loads(r.original) == items[r.batch_index]
        assert type(r.original) is bytes


@pytest.mark.parametrize("raw", [
    b'{"reports": {"user": "u1"}}',
    b'{"reports": [], "extra": 1}',
    b'{"reports": "x"}',
    b'{"reports": [{"user": "u1", "step": 1, "values": {"poverty": 1}}], "user": "u2"}',
])
def test_bad_batch_envelope_is_one_malformed_rejection_with_original_bytes(parser, raw):
    out = parser.parse([raw])
    assert len(out) == 0
    assert [(r.reason, r.original, r.batch_index) for r in out.rejections] == [("malformed", raw, None)]


def test_empty_batch_is_nothing(parser):
    out = parser.parse([b'{"reports": []}'])
    assert len(out) == 0 and not out.rejections


def test_large_batch_is_parsed_in_order(parser):
    rng = np.random.default_rng(3)
    users = rng.integers(0, 20, 5000)
    steps = rng.integers(1, HORIZON + 1, 5000)
    vals = rng.integers(0, 2, 5000)
    items = [{"user": f"u{u}", "step": int(s), "values": {"poverty": int(v)}} for u, s, v in zip(users, steps, vals)]
    out = parser.parse([orjson.dumps({"reports": items})])
    assert out.rows.tolist() == users.tolist()
    assert out.steps.tolist() == steps.tolist()
    assert out.codes["poverty"].tolist() == vals.tolist()
    assert out.batch_index.tolist() == list(range(5000))


def test_take_and_reject_keep_originals(parser):
    raws = [rep("u1", 1), rep("u2", 1), rep("u3", 1)]
    out = parser.parse(raws)
    mask = np.array([True, False, True])
    out.reject(~mask, "duplicate", "test")
    kept = out.take(mask)
    assert kept.rows.tolist() == [1, 3]
    assert [kept.original(i) for i in range(len(kept))] == [raws[0], raws[2]]
    assert [(r.reason, r.original) for r in kept.rejections] == [("duplicate", raws[1])]
