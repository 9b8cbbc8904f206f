"""Columnar batch messages: the same reports as single messages, the same rejections, log order kept."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from pipeline.config import parse_config
from pipeline.stream.ingest.partition_state import PartitionState
from pipeline.stream.ingest.reports import ReportParser, public_hash
from pipeline.stream.ingest.roster import Roster

N = 20


@pytest.fixture
def parser():
    dep = parse_config({
        "name": "col", "roster": {"size": N}, "horizon": 6,
        "attributes": {"pov": {"type": "binary"}, "status": {"type": "categorical", "values": ["a", "b", "c"]},
                       "item": {"type": "hashed", "size": 1000}},
        "budget": {"rho": 1.0},
        "releases": [{"name": "fw", "type": "fixed_window", "attribute": "pov", "window": 2, "share": 1}],
    })
    return dep, ReportParser(Roster.from_range(N), dep.attributes, dep.horizon)


def test_columnar_batch_equals_the_same_reports_sent_singly(parser):
    _, p = parser
    rng = np.random.default_rng(0)
    users = [f"u{i}" for i in rng.permutation(N)]
    pov = rng.integers(0, 2, N).tolist()
    status = [["a", "b", "c"][i] if i < 3 else i - 3 for i in rng.integers(0, 6, N).tolist()]  # labels and codes
    item = [f"q{i}" if i % 2 else int(i) for i in rng.integers(0, 999, N).tolist()]
    pov[3] = None  # not reported in this row
    singles = [orjson.dumps({"user": u, "step": 2, "values": {k: v for k, v in
                             (("pov", pov[j]), ("status", status[j]), ("item", item[j])) if v is not None}})
               for j, u in enumerate(users)]
    columnar = orjson.dumps({"columns": {"user": users, "step": 2, "pov": pov, "status": status, "item": item}})
    a, b = p.parse(singles), p.parse([columnar])
    assert not a.rejections and not b.rejections
    np.testing.assert_array_equal(a.rows, b.rows)
    np.testing.assert_array_equal(a.steps, b.steps)
    for attr in ("pov", "status", "item"):
        np.testing.assert_array_equal(a.codes[attr], b.codes[attr])
    assert b.codes["pov"][3] == -1
    assert b.codes["item"].tolist() == [public_hash(v, 1000) if isinstance(v, str) else v for v in item]
    assert b.batch_index.tolist() == list(range(N)) and b.message.tolist() == [0] * N
    assert orjson.loads(b.original(5)) == orjson.loads(singles[5])  # re-encoded as its single report


def test_every_row_rejection_has_its_reason_row_number_and_single_report_bytes(parser):
    _, p = parser
    cols = {
        "user": ["u1", "nobody", "u2", "u3", "u4", 7, "u5"],
        "step": [1, 1, 9, 0, 1, 1, 1],
        "pov": [1, 1, 1, 1, 5, 1, None],
        "status": ["a", "a", "a", "a", "a", "a", None],
    }
    out = p.parse([orjson.dumps({"columns": cols})])
    assert out.rows.tolist() == [1]
    got = {r.batch_index: (r.reason, orjson.loads(r.original)) for r in out.rejections}
    assert got[1][0] == "unknown_user" and got[1][1]["user"] == "nobody"
    assert got[2][0] == "future_step" and got[2][1]["step"] == 9
    assert got[3][0] == "malformed"  # step 0
    assert got[4][0] == "out_of_domain" and got[4][1]["values"] == {"pov": 5, "status": "a"}
    assert got[5][0] == "malformed"  # user not a string
    assert got[6][0] == "malformed" and got[6][1]["values"] == {}  # nothing reported


@pytest.mark.parametrize("body", [
    {"columns": {"user": ["u1"], "step": 1, "pov": [1], "height": [3]}},  # unknown column
    {"columns": {"user": ["u1", "u2"], "step": 1, "pov": [1]}},  # length mismatch
    {"columns": {"user": ["u1"], "step": [1, 2], "pov": [1]}},
    {"columns": {"user": "u1", "step": 1, "pov": [1]}},
    {"columns": [1, 2]},
    {"columns": {"user": ["u1"], "step": 1, "pov": [1]}, "extra": 1},
])
def test_a_malformed_columnar_message_is_rejected_whole_with_its_bytes(parser, body):
    _, p = parser
    raw = orjson.dumps(body)
    out = p.parse([raw])
    assert len(out) == 0 and [(r.reason, r.original) for r in out.rejections] == [("malformed", raw)]


def test_log_order_across_formats_decides_which_duplicate_wins(parser):
    dep, p = parser
    first = orjson.dumps({"user": "u1", "step": 1, "values": {"pov": 0}})
    batch = orjson.dumps({"columns": {"user": ["u1", "u2"], "step": 1, "pov": [1, 1]}})
    later = orjson.dumps({"user": "u2", "step": 1, "values": {"pov": 0}})
    parsed = p.parse([first, batch, later])
    assert parsed.message.tolist() == [0, 1, 1, 2]
    state = PartitionState(dep, 0, np.arange(N), N)
    state.apply(parsed)
    dups = [(r.message, r.batch_index) for r in parsed.rejections if r.reason == "duplicate"]
    assert dups == [(1, 0), (2, None)]  # the columnar u1 row and the later single u2 report
    assert state.pending["pov"][0, 1] == 0 and state.pending["pov"][0, 2] == 1
