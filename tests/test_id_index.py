"""The vectorised id index returns exactly what a dict lookup returns (the hot path's user -> row)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.stream.ingest import id_index
from pipeline.stream.ingest.id_index import IdIndex
from pipeline.stream.ingest.roster import Roster

ids_strategy = st.lists(st.text(max_size=12).filter(lambda s: not s.endswith("\x00")), min_size=1, max_size=200,
                        unique=True)


def _dict_rows(ids, queries):
    row = {u: i for i, u in enumerate(ids)}
    return [row.get(q, -1) for q in queries]


@settings(max_examples=150, deadline=None)
@given(ids=ids_strategy, others=st.lists(st.text(max_size=40), max_size=50), data=st.data())
def test_rows_equal_a_dict_lookup(ids, others, data):
    index = IdIndex(ids)
    members = data.draw(st.lists(st.sampled_from(ids), max_size=100))
    queries = data.draw(st.permutations(members + others))
    got = index.rows(queries)
    if any(q.endswith("\x00") for q in queries):
        assert got is None  # numpy would drop the NUL: refused, the caller uses the dict
    else:
        assert got.tolist() == _dict_rows(ids, queries)


def test_prefixes_padding_and_longer_ids_are_not_confused():
    ids = ["ab", "a", "abc", "", "b\x00c", "é", "日本"]
    queries = ["ab", "a", "abc", "", "abcd", "b", "b\x00c", "é", "日本", "日", "x" * 50, "ab "]
    assert IdIndex(ids).rows(queries).tolist() == _dict_rows(ids, queries)


def test_exact_under_hash_collisions(monkeypatch):
    # every id hashes to slot 0: all inserts and lookups probe linearly, and must still be exact
    monkeypatch.setattr(id_index, "_hash", lambda arr: np.zeros(arr.size, dtype=np.uint64))
    ids = [f"user-{i}" for i in range(500)]
    queries = ids[::-1] + ["user-500", "user-", "nobody"]
    assert IdIndex(ids).rows(queries).tolist() == _dict_rows(ids, queries)


def test_large_roster_against_dict():
    ids = [f"u{i}" for i in range(200_000)]
    rng = np.random.default_rng(3)
    queries = [ids[i] for i in rng.integers(0, len(ids), 50_000)] + [f"u{i}" for i in range(200_000, 200_500)]
    assert IdIndex(ids).rows(queries).tolist() == _dict_rows(ids, queries)


def test_roster_ids_ending_in_nul_are_refused_and_the_roster_uses_its_dict():
    with pytest.raises(ValueError, match="NUL"):
        IdIndex(["a", "b\x00"])
    roster = Roster(["a", "b\x00"] + [f"u{i}" for i in range(300)])
    queries = ["b\x00", "b", "a"] + [f"u{i}" for i in range(300)]
    assert roster.index() is None
    assert roster.rows_of_ids(queries).tolist() == [1, -1, 0] + list(range(2, 302))


def test_roster_batches_use_the_index():
    roster = Roster.from_range(1000)
    queries = [f"u{i}" for i in range(999, -1, -1)] + ["u1000"]
    assert roster.rows_of_ids(queries).tolist() == list(range(999, -1, -1)) + [-1]
    assert roster.index() is not None


def test_a_longer_id_whose_cut_to_the_width_ends_in_nuls_is_not_a_shorter_one():
    # ids are NUL-padded to whole 8-byte words; a query longer than the width is cut to it, and its
    # cut must not equal a shorter roster id when the cut ends in NULs of the query itself
    ids = ["ab", "abcdefg", "é"]
    queries = ["ab" + "\x00" * 6 + "x", "ab\x00\x00\x00\x00\x00\x00\x00\x00y", "abcdefg\x00z", "é\x00x", "ab"]
    assert IdIndex(ids).rows(queries).tolist() == _dict_rows(ids, queries)
