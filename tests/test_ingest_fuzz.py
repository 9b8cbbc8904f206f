"""Fuzzing the ingest path: arbitrary bytes, wrong JSON types, huge values, unknown users, duplicate,
late and early steps, mixed batches, reports on the wrong partition.

The promise checked: the ingest path never raises, and every report sent is
accounted for exactly once — either accepted (and then reflected in the partition state exactly once
for its (user, step)) or rejected to the dead letters with a reason from ``REASONS`` and its
original bytes (for a batch item: the item re-encoded, plus its batch index; for a batch message
whose every report one stateful check rejected: one dead letter of the message, its bytes and its
report count).

Part 1 drives :class:`IngestCore` (pure logic, no I/O) with hypothesis: fast, many examples,
derandomized so CI is deterministic. Part 2 sends a bounded fuzz corpus through the real broker into a
running worker process and reads the ``dead-letter`` topic back.

What breaks these tests: a parser or state path that raises on odd input (the worker would crash and
crash again on replay), a report silently dropped (conservation fails), a report counted twice or a
duplicate accepted (uniqueness of accepted (user, step) fails), a wrong reason or lost original
bytes in a dead letter, two rejections sharing a dead-letter key (a deduplicating consumer would
lose one), or a worker that dies on bad input (part 2).
"""

from __future__ import annotations

import os
import time

import numpy as np
import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config import load_config
from pipeline.stream.ingest.core import ApplyResult, CloseOutput, IngestCore, Record
from pipeline.stream.kafka.messages import CONTROL_HEADER
from pipeline.stream.ingest.reports import REASONS, ReportParser, public_hash
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.kafka.topics import topic_names

from support.loopback import Loopback

N_USERS, P, HORIZON, MAX_AHEAD = 24, 2, 6, 1
ITEM_SIZE = 64
STATUS = ["a", "b", "c"]


def _config(tmp_dir, name: str, **extra) -> str:
    cfg = {
        "name": name,
        "roster": {"size": N_USERS},
        "horizon": HORIZON,
        "topics": {"partitions": P},
        "steps": {"max_ahead": MAX_AHEAD},
        "attributes": {
            "pov": {"type": "binary"},
            "status": {"type": "categorical", "values": STATUS},
            "item": {"type": "hashed", "size": ITEM_SIZE},
        },
        "budget": {"rho": 0.5},
        "random": {"kind": "seeded", "seed": 5},
        "releases": [
            {"name": "fw", "type": "fixed_window", "attribute": "pov", "window": 2, "share": 0.5},
            {"name": "cu", "type": "cumulative", "attribute": "pov", "share": 0.5},
        ],
        **extra,
    }
    path = os.path.join(str(tmp_dir), f"{name}.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(cfg, fh)
    return path


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    return load_config(_config(tmp_path_factory.mktemp("fuzz"), "fuzz"))


# -- strategies ----------------------------------------------------------------------------------
ROSTER_IDS = [f"u{i}" for i in range(N_USERS)]
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=6)

users = st.one_of(
    st.sampled_from(ROSTER_IDS),  # mostly enrolled users, so duplicates and late/early steps happen
    st.sampled_from(ROSTER_IDS),
    st.sampled_from(["nobody", "", "u-1", f"u{N_USERS}", "U0", "u0 "]),
    json_scalars,
)
steps = st.one_of(
    st.integers(min_value=1, max_value=HORIZON), st.integers(min_value=1, max_value=HORIZON),
    st.integers(min_value=-(2**63), max_value=2**64 - 1), st.sampled_from([0, -1, HORIZON + 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]),
    st.booleans(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3), st.none(),
)
# What a pandas user sends (integral floats, "1", "True") and its near misses, beside the plain values
PANDAS_POV = [0.0, 1.0, -0.0, "0", "1", "0.0", "1.0", "true", "False", "TRUE", 0.5, 2.0, -1.0, "2", "yes", " 1", "1 ",
              "", "01", "1e0", 1e-300]
PANDAS_CODES = [0.0, 1.0, 2.0, 3.0, 2.5, -1.0, -0.0, float(ITEM_SIZE - 1), float(ITEM_SIZE), 1e300, "1", "2.0", True]
attr_values = {
    "pov": st.one_of(st.sampled_from([0, 1, True, False]), st.sampled_from(PANDAS_POV), json_scalars),
    "status": st.one_of(st.sampled_from(STATUS + [0, 1, 2]), st.sampled_from(["d", 3, -1, "A"]),
                        st.sampled_from(PANDAS_CODES), json_scalars),
    "item": st.one_of(st.text(max_size=5), st.integers(min_value=0, max_value=ITEM_SIZE - 1),
                      st.sampled_from(PANDAS_CODES), json_scalars),
}
values = st.one_of(
    st.fixed_dictionaries({}, optional={a: s for a, s in attr_values.items()}),
    st.fixed_dictionaries({}, optional={a: s for a, s in attr_values.items()}),
    st.dictionaries(st.sampled_from(["pov", "status", "item", "other", ""]), json_scalars, max_size=3),
    json_values,
)


@st.composite
def report(draw):
    rep = {"user": draw(users), "step": draw(steps), "values": draw(values)}
    roll = draw(st.integers(0, 9))
    if roll == 0:
        rep.pop(draw(st.sampled_from(["user", "step", "values"])))
    elif roll == 1:
        rep[draw(st.sampled_from(["extra", "reports", "User"]))] = draw(json_scalars)
    return rep


@st.composite
def columnar(draw):
    """The columnar batch {"columns": {"user": [...], "step": t or [...], "<attribute>": [...]}}."""
    size = draw(st.integers(min_value=0, max_value=6))
    cols = {"user": draw(st.lists(users, min_size=size, max_size=size))}
    if draw(st.booleans()):
        cols["step"] = draw(steps)
    else:
        cols["step"] = draw(st.lists(steps, min_size=size, max_size=size))
    for a, strat in attr_values.items():
        if draw(st.booleans()):
            cols[a] = draw(st.lists(st.one_of(st.none(), strat), min_size=size, max_size=size))
    roll = draw(st.integers(0, 14))
    if roll == 0:
        cols.pop(draw(st.sampled_from(sorted(cols))))
    elif roll == 1:
        cols[draw(st.sampled_from(["pov", "other", "user"]))] = draw(st.one_of(json_values, st.lists(json_scalars)))
    return cols


OWNED = Roster.from_range(N_USERS).owners(P)


@st.composite
def clean_batch(draw):
    """A batch (rows or columnar) of well-formed reports of one partition's users for one step: all
    of it late, all duplicates or all ahead is one dead letter of the message (or all accepted)."""
    owner = draw(st.integers(0, P - 1))
    mine = [u for u in ROSTER_IDS if OWNED[int(u[1:])] == owner]
    batch = draw(st.lists(st.sampled_from(mine), min_size=1, max_size=5))
    step = draw(st.integers(min_value=1, max_value=HORIZON))
    pov = draw(st.lists(st.sampled_from([0, 1]), min_size=len(batch), max_size=len(batch)))
    if draw(st.booleans()):
        return orjson.dumps({"columns": {"user": batch, "step": step, "pov": pov}}), batch[0]
    reports = [{"user": u, "step": step, "values": {"pov": v}} for u, v in zip(batch, pov)]
    return orjson.dumps({"reports": reports}), batch[0]


@st.composite
def message(draw):
    """(bytes, partition choice): single reports, batches, raw garbage, odd JSON."""
    kind = draw(st.sampled_from(["report", "report", "report", "batch", "batch", "columnar", "columnar", "bytes",
                                 "json", "badbatch", "clean", "clean"]))
    if kind == "clean":
        return draw(clean_batch())
    if kind == "columnar":
        cols = draw(columnar())
        body = {"columns": cols}
        if draw(st.integers(0, 14)) == 0:
            body["extra"] = draw(json_scalars)
        first = next((u for u in (cols.get("user") if isinstance(cols.get("user"), list) else [])
                      if isinstance(u, str)), None)
        return orjson.dumps(body), first
    if kind == "report":
        rep = draw(report())
        return orjson.dumps(rep), rep.get("user")
    if kind == "batch":
        items = draw(st.lists(st.one_of(report(), report(), report(), json_values), max_size=8))
        return orjson.dumps({"reports": items}), next((r.get("user") for r in items if isinstance(r, dict)), None)
    if kind == "bytes":
        return draw(st.one_of(st.binary(max_size=40), st.sampled_from(
            [b"", b"{", b"null", b"[]", b'{"reports": ', b"\xff\xfe", b'{"user": "u1", "step": 1'] ))), None
    if kind == "json":
        return orjson.dumps(draw(json_values)), None
    body = draw(st.one_of(
        st.fixed_dictionaries({"reports": json_values.filter(lambda v: not isinstance(v, list))}),
        st.fixed_dictionaries({"reports": st.lists(report(), max_size=2), "extra": json_scalars}),
    ))
    return orjson.dumps(body), None


@st.composite
def scenario(draw):
    """A log per partition: runs of messages separated by close markers (steps close in order)."""
    closes = draw(st.integers(min_value=0, max_value=HORIZON))
    segments = []
    for _ in range(closes + 1):
        msgs = draw(st.lists(message(), max_size=10))
        chunking = draw(st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=4))
        placement = draw(st.lists(st.sampled_from(["owner", "owner", "owner", "other"]), min_size=len(msgs),
                                  max_size=len(msgs)))
        segments.append((msgs, chunking, placement))
    return closes, segments


# -- oracle helpers --------------------------------------------------------------------------------
def units_of(raw: bytes) -> list[tuple[object, int | None]]:
    """The reports a message carries (the framing only): [(item, batch index)]; a columnar row is the
    single report it stands for."""
    try:
        msg = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return [(None, None)]
    if type(msg) is dict and "columns" in msg:
        cols = msg["columns"]
        if len(msg) != 1 or type(cols) is not dict or type(cols.get("user")) is not list:
            return [(msg, None)]
        size = len(cols["user"])
        step = cols.get("step")
        if set(cols) - {"user", "step", "pov", "status", "item"} or \
                any(k != "step" and (type(v) is not list or len(v) != size) for k, v in cols.items()) or \
                not (type(step) is int or (type(step) is list and len(step) == size)):
            return [(msg, None)]
        return [({"user": cols["user"][j], "step": step if type(step) is int else step[j],
                  "values": {k: v[j] for k, v in cols.items() if k not in ("user", "step") and v[j] is not None}}, j)
                for j in range(size)]
    if type(msg) is dict and "reports" in msg and type(msg["reports"]) is list and len(msg) == 1:
        return [(item, i) for i, item in enumerate(msg["reports"])]
    return [(msg, None)]


def expected_code(attr: str, v) -> int:
    """The code an accepted value must get (written from the documented table, not the parser)."""
    if attr == "pov":
        return {"0": 0, "1": 1, "0.0": 0, "1.0": 1, "false": 0, "true": 1}[v.lower()] if isinstance(v, str) else int(v)
    if attr == "status":
        return STATUS.index(v) if isinstance(v, str) else int(v)
    return public_hash(v, ITEM_SIZE) if isinstance(v, str) else int(v)


def run_scenario(deployment, scen, owners):
    """Feed the scenario to an IngestCore owning every partition, with what it forwards fed back
    through in-memory ``repartition`` logs (:class:`test_repartition.Loopback`); check the promise."""
    roster = Roster.from_range(N_USERS)
    names = topic_names(deployment)
    core = IngestCore(deployment, roster, names)
    loop = Loopback(core)
    for p in range(P):
        assert core.assign(p) in (None, 0)  # no checkpoint: from the start of the log
    closes, segments = scen
    offsets = [0] * P
    sent_units = 0
    sent: dict[tuple[int, int], bytes] = {}  # (partition, offset) -> the message
    accepted_total = 0
    dead: dict[bytes, tuple[dict, bytes]] = {}
    displaced: dict[tuple[str, int], int] = {}  # (user, step) -> accepted reports later displaced
    # (partition, offset, batch index) -> (item, closed step when handled), per report unit sent
    unit_info: dict[tuple[int, int, int | None], tuple[object, int]] = {}
    accepted_pairs: dict[tuple[str, int], tuple[int, int, int | None]] = {}
    x_by_step: dict[tuple[int, int], dict[str, np.ndarray]] = {}

    def handle(outputs):
        nonlocal accepted_total
        for out in outputs:
            if isinstance(out, CloseOutput):
                continue
            assert isinstance(out, ApplyResult)
            accepted_total += out.accepted
            # counts are of reports: a whole message's dead letter counts all it holds
            assert sum(out.reasons.values()) == sum(_reports(h) for _, _, h in out.dead_letters)
            for key, value, headers in out.dead_letters:
                assert key not in dead, f"two rejections share the dead-letter key {key!r}"
                dead[key] = (dict(headers), value)
                if b":displaced:" in key:
                    rep = orjson.loads(value)
                    displaced[(rep["user"], rep["step"])] = displaced.get((rep["user"], rep["step"]), 0) + 1

    for seg_no, (msgs, chunking, placement) in enumerate(segments):
        per_part: dict[int, list[Record]] = {p: [] for p in range(P)}
        for (raw, user), where in zip(msgs, placement):
            owner = int(owners[roster.row(user)]) if isinstance(user, str) and roster.row(user) >= 0 else 0
            p = owner if where == "owner" else (owner + 1) % P
            rec = Record(offsets[p], raw)
            offsets[p] += 1
            per_part[p].append(rec)
            sent[(p, rec.offset)] = raw
            for item, idx in units_of(raw):
                unit_info[(p, rec.offset, idx)] = (item, core.states[p].closed)
                sent_units += 1
        for p, recs in per_part.items():
            # enqueue in a few runs of varying size (a consumer's fetches split arbitrarily)
            pos, c = 0, 0
            while pos < len(recs):
                size = chunking[c % len(chunking)]
                core.enqueue(p, recs[pos:pos + size])
                handle(loop.drain([p]))
                pos += size
                c += 1
        if seg_no < closes:
            step = seg_no + 1
            for p in range(P):
                marker = Record(offsets[p], orjson.dumps({"step": step}), ((CONTROL_HEADER, b"close"),))
                offsets[p] += 1
                core.enqueue(p, [marker])
            outs = loop.drain(range(P))  # a partition closes once every source's forwards are in
            for p in range(P):
                assert any(isinstance(o, CloseOutput) and o.partition == p and o.step == step and o.messages
                           for o in outs)
                x_by_step[(p, step)] = {a: v.copy() for a, v in core.states[p].last_x.items()}
            handle(outs)

    def precedence(unit, closed, user):
        """The order in which reports of one (user, step) are preferred: the interval in which they
        were handled, then direct before forwarded (lower source partition first), then log order."""
        owner = int(owners[int(user[1:])])
        return (closed, 0 if unit[0] == owner else 1 + unit[0], unit[1], -1 if unit[2] is None else unit[2])

    # 1. conservation: every report sent is accepted or dead-lettered, never both, never twice
    assert accepted_total + sum(_reports(h.items()) for h, _ in dead.values()) == sent_units
    rejected: dict[tuple[int, int, int | None], str] = {}
    for key, (headers, value) in dead.items():
        reason = headers["dpstream-reason"].decode()
        assert reason in REASONS
        assert headers["dpstream-detail"]
        if b":displaced:" in key:
            assert reason == "duplicate"
            continue
        topic, p, off = headers["dpstream-source"].decode().rsplit("/", 2)
        assert topic == names["reports"]
        idx = int(headers["dpstream-batch-index"]) if "dpstream-batch-index" in headers else None
        assert key == f"{p}:{off}:{'-' if idx is None else idx}".encode()
        unit = (int(p), int(off), idx)
        batch = [u for u in unit_info if u[:2] == unit[:2] and u[2] is not None]
        if idx is None and batch:  # a batch message every report of which one check rejected
            assert reason in ("late", "duplicate", "future_step"), reason
            assert _reports(headers.items()) == len(batch) and value == sent[unit[:2]]
            assert not any(u in rejected for u in batch)
            rejected.update(dict.fromkeys(batch, reason))
            continue
        assert unit in unit_info, f"dead letter for a report never sent: {unit}"
        rejected[unit] = reason
        item, _ = unit_info[unit]
        # the original bytes: the message itself, or the batch item re-encoded; a report rejected by
        # its owner after being forwarded: the report as forwarded (same user, step and codes)
        if _well_formed(item) and item["user"] in ROSTER_IDS and unit[0] != int(owners[int(item["user"][1:])]) \
                and reason in ("late", "duplicate", "future_step") and item["step"] <= HORIZON:
            rep = orjson.loads(value)
            assert (rep["user"], rep["step"]) == (item["user"], item["step"])
            assert {a: expected_code(a, v) for a, v in rep["values"].items()} == \
                {a: expected_code(a, v) for a, v in item["values"].items()}
        elif idx is not None:
            assert value == orjson.dumps(item)
        elif item is not None:
            assert orjson.loads(value) == item
    # 2. per (user, step), the reports not rejected outright: the one of smallest precedence is
    # accepted and in the state exactly once, the others were displaced by it
    candidates: dict[tuple[str, int], list] = {}
    for unit, (item, closed) in unit_info.items():
        if unit in rejected:
            continue
        assert type(item) is dict and item.get("user") in ROSTER_IDS, unit
        u, s = item["user"], item["step"]
        assert closed < s <= closed + 1 + MAX_AHEAD and s <= HORIZON
        candidates.setdefault((u, s), []).append((precedence(unit, closed, u), unit, item))
    assert {k: len(v) - 1 for k, v in candidates.items() if len(v) > 1} == displaced
    for (u, s), cands in candidates.items():
        _, unit, item = min(cands)
        accepted_pairs[(u, s)] = (min(cands)[0], unit)
        owner = int(owners[int(u[1:])])
        state = core.states[owner]
        local = int(state.local[int(u[1:])])
        for a, v in item["values"].items():
            code = expected_code(a, v)
            if (owner, s) in x_by_step:  # closed: the value the step was closed with is the reported one
                assert x_by_step[(owner, s)][a][local] == code
            else:  # still open: pending
                assert state.pending[a][s - state.closed - 1, local] == code
    # 3. the reason is the right one where it depends on user/step/state alone
    for unit, reason in rejected.items():
        item, closed = unit_info[unit]
        if not _well_formed(item):
            assert reason in ("malformed", "unknown_user", "out_of_domain", "future_step"), (reason, item)
            continue
        u, s = item["user"], item["step"]
        if reason == "unknown_user":
            assert u not in ROSTER_IDS
        elif reason == "late":
            assert s <= closed
        elif reason == "future_step":
            assert s > closed + 1 + MAX_AHEAD or s > HORIZON
        elif reason == "duplicate":
            first = accepted_pairs.get((u, s))
            assert first is not None and first[0] < precedence(unit, closed, u), (unit, first)  # precedence wins
    assert len(accepted_pairs) == accepted_total
    return accepted_total, sum(_reports(h.items()) for h, _ in dead.values())


def _reports(headers) -> int:
    """The reports a dead letter stands for (a whole batch message's: ``dpstream-reports``)."""
    return int(dict(headers).get("dpstream-reports", b"1"))


def _well_formed(item) -> bool:
    return (type(item) is dict and set(item) == {"user", "step", "values"} and type(item["user"]) is str
            and type(item["step"]) is int)


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(scen=scenario())
def test_ingest_core_accounts_for_every_report_exactly_once(deployment, scen):
    owners = Roster.from_range(N_USERS).owners(P)
    run_scenario(deployment, scen, owners)


def test_fuzz_oracle_can_fail(deployment):
    """The oracle is not vacuous: a hand-made scenario exercising every reason, with known counts."""
    roster = Roster.from_range(N_USERS)
    owners = roster.owners(P)
    u_own = next(u for u in ROSTER_IDS if owners[roster.row(u)] == 0)
    msgs = [
        (orjson.dumps({"user": u_own, "step": 1, "values": {"pov": 1}}), u_own),  # accepted
        (orjson.dumps({"user": u_own, "step": 1, "values": {"pov": 0}}), u_own),  # duplicate
        (orjson.dumps({"reports": [{"user": u_own, "step": 2, "values": {"status": "b"}},  # accepted
                                   {"user": u_own, "step": 2, "values": {"pov": 1}},  # duplicate
                                   {"user": "nobody", "step": 1, "values": {"pov": 1}},  # unknown_user
                                   {"user": u_own, "step": 9, "values": {"pov": 1}},  # future_step
                                   {"user": u_own, "step": 1, "values": {"pov": 3}},  # out_of_domain
                                   7]}), u_own),  # malformed
        (b"\xff", None),  # malformed
    ]
    scen = (1, [(msgs, [2], ["owner"] * len(msgs)),
                ([(orjson.dumps({"user": u_own, "step": 1, "values": {"pov": 1}}), u_own)], [1], ["owner"])])  # late
    assert run_scenario(deployment, scen, owners) == (2, 8)


valid_report = st.fixed_dictionaries({
    "user": st.sampled_from(ROSTER_IDS), "step": st.integers(min_value=1, max_value=HORIZON),
    "values": st.fixed_dictionaries({}, optional={"pov": st.sampled_from([0, 1, True, False] + PANDAS_POV),
                                                  "status": st.sampled_from(STATUS + [0, 1, 2] + PANDAS_CODES),
                                                  "item": st.one_of(st.text(max_size=5),
                                                                    st.integers(0, ITEM_SIZE - 1))}).filter(bool),
}).map(orjson.dumps)
parser_input = st.lists(st.one_of(valid_report, valid_report, valid_report, message().map(lambda m: m[0])),
                        max_size=12)


def _parsed(parsed) -> tuple:
    return (parsed.rows.tolist(), parsed.steps.tolist(), {a: c.tolist() for a, c in parsed.codes.items()},
            [bytes(parsed.original(i)) for i in range(len(parsed))], parsed.batch_index.tolist(), parsed.message.tolist(),
            [(r.reason, r.detail, bytes(r.original), r.batch_index, r.message) for r in parsed.rejections])


@settings(max_examples=400, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(messages=parser_input, chunk=st.integers(min_value=1, max_value=4))
def test_fast_single_report_path_equals_the_reference_parser(deployment, messages, chunk):
    """The typed fast path for runs of single reports decides nothing the reference path would not:
    same accepted arrays in the same order, same rejections (it never rejects by itself)."""
    roster = Roster.from_range(N_USERS)
    fast = ReportParser(roster, deployment.attributes, deployment.horizon, fast_chunk=chunk)
    reference = ReportParser(roster, deployment.attributes, deployment.horizon, fast_chunk=0)
    assert _parsed(fast.parse(messages)) == _parsed(reference.parse(messages))


@settings(max_examples=300, derandomize=True, deadline=None)
@given(name=st.sampled_from(["pov", "status", "item"]),
       col=st.lists(st.one_of(st.integers(-3, ITEM_SIZE + 3), st.integers(-(2**70), 2**70), st.booleans(),
                              st.none(), st.text(max_size=2)), max_size=8))
def test_vectorised_integer_columns_equal_the_column_decoder(deployment, name, col):
    """Columnar batches: the numpy path for all-integer columns gives the reference decoder's codes,
    and declines any column that is not all integers (bools, nulls, strings, beyond int64)."""
    parser = ReportParser(Roster.from_range(N_USERS), deployment.attributes, deployment.horizon)
    fast = parser._int_codes(name, col)
    reference = list(parser._column_decoders[name](col))
    if fast is None:
        assert not col or not all(type(v) is int and abs(v) < 2**63 for v in col)
    else:
        assert fast.tolist() == reference


def test_fast_path_takes_clean_chunks_and_refuses_any_doubt(deployment):
    """The equivalence above is not vacuous: clean chunks do go through the fast path, and each
    kind of doubt (a rejected report, null, a float, an extra field, a batch) sends a chunk back."""
    parser = ReportParser(Roster.from_range(N_USERS), deployment.attributes, deployment.horizon)
    good = [orjson.dumps({"user": f"u{i}", "step": 1 + i % HORIZON, "values": {"pov": i % 2, "item": "q"}})
            for i in range(N_USERS)]
    seg = parser._fast_singles(good, 0)
    assert seg is not None and seg[0].tolist() == list(range(N_USERS))
    assert seg[2]["item"].tolist() == [public_hash("q", ITEM_SIZE)] * N_USERS
    assert seg[2]["status"].tolist() == [-1] * N_USERS
    for bad in ({"user": "nobody", "step": 1, "values": {"pov": 1}}, {"user": "u1", "step": 0, "values": {"pov": 1}},
                {"user": "u1", "step": HORIZON + 1, "values": {"pov": 1}}, {"user": "u1", "step": 1, "values": {}},
                {"user": "u1", "step": 1, "values": {"pov": None}}, {"user": "u1", "step": 1, "values": {"pov": 0.5}},
                {"user": "u1", "step": 1, "values": {"status": 1.5}}, {"user": "u1", "step": 1, "values": {"pov": "yes"}},
                {"user": "u1", "step": 1, "values": {"status": True}}, {"user": "u1", "step": 1.0, "values": {"pov": 1}},
                {"user": "u1", "step": 1, "values": {"pov": 2}}, {"user": "u1", "step": 1, "values": {"status": "z"}},
                {"user": "u1", "step": 1, "values": {"pov": 1}, "x": 1}, {"user": "u1", "step": True, "values": {"pov": 1}},
                {"reports": []}, b'{"user": "u1", "step": 1180591620717411303424, "values": {"pov": 1}}'):
        raw = bad if isinstance(bad, bytes) else orjson.dumps(bad)
        assert parser._fast_singles(good + [raw], 0) is None, bad
    assert parser._fast_singles(good + [b"\xff"], 0) is None and parser._fast_singles(good + [None], 0) is None


def test_fast_columnar_path_takes_clean_batches_and_refuses_any_doubt(deployment):
    """The typed path for columnar batches is not vacuous either: a clean batch goes through it, and
    each kind of doubt (a rejected row, null, a bool, a float, a string code, a short or unknown
    column, a big integer, a step out of range) sends the batch to the reference path, whose
    decision it is. A row accepted on the typed path and rejected later (a duplicate) carries the
    bytes the reference path would give it."""
    parser = ReportParser(Roster.from_range(N_USERS), deployment.attributes, deployment.horizon)
    reference = ReportParser(Roster.from_range(N_USERS), deployment.attributes, deployment.horizon, fast_chunk=0)
    cols = {"user": [f"u{i}" for i in range(N_USERS)], "step": 2, "item": [i % ITEM_SIZE for i in range(N_USERS)],
            "pov": [i % 2 for i in range(N_USERS)]}
    sources = [None]
    seg = parser._fast_columnar(orjson.dumps({"columns": cols}), 0, sources)
    assert seg is not None and seg[0].tolist() == list(range(N_USERS)) and seg[2]["status"].tolist() == [-1] * N_USERS
    assert sources[0].item(3) == {"user": "u3", "step": 2, "values": {"item": 3, "pov": 1}}  # the message's order
    for change in ({"user": cols["user"][:-1] + ["nobody"]}, {"step": 0}, {"step": HORIZON + 1},
                   {"step": [1] * (N_USERS - 1)}, {"step": [1.0] * N_USERS}, {"pov": [None] * N_USERS},
                   {"pov": [True] * N_USERS}, {"pov": [1.0] * N_USERS}, {"pov": [2] * N_USERS},
                   {"status": ["a"] * N_USERS}, {"pov": [1] * (N_USERS - 1)}, {"other": [1] * N_USERS},
                   {"user": [1] * N_USERS}):
        assert parser._fast_columnar(orjson.dumps({"columns": {**cols, **change}}), 0, [None]) is None, change
    without = {k: v for k, v in cols.items() if k not in ("pov", "item")}
    assert parser._fast_columnar(orjson.dumps({"columns": without}), 0, [None]) is None  # no value at all
    assert parser._fast_columnar(orjson.dumps({"columns": cols, "x": 1}), 0, [None]) is None
    big = b'{"columns":{"user":["u0"],"step":1,"pov":[18446744073709551616]}}'
    assert parser._fast_columnar(big, 0, [None]) is None
    twice = [orjson.dumps({"columns": cols})] * 2
    fast, slow = parser.parse(twice), reference.parse(twice)
    for parsed in (fast, slow):
        parsed.reject(np.arange(len(parsed)) >= N_USERS, "duplicate", "again")
    assert _parsed(fast) == _parsed(slow)


def test_user_column_cut_on_its_bytes_only_when_compact_printable_ascii(deployment, monkeypatch):
    """The typed columnar path cuts the user column into ids on the message's bytes only in its
    compact printable-ASCII form (what orjson, json.dumps with separators, pandas write); spaces,
    escapes, non-ASCII ids and odd elements are decoded as strings — with the same result as the
    reference parser either way."""
    from pipeline.stream.ingest.id_index import IdIndex

    spans = []
    real = IdIndex.rows_of_spans
    monkeypatch.setattr(IdIndex, "rows_of_spans", lambda self, *a: spans.append(1) or real(self, *a))
    roster = Roster([f"u{i}" for i in range(N_USERS)] + ["é1", 'q"1', "x" * 20])
    parser = ReportParser(roster, deployment.attributes, deployment.horizon)
    reference = ReportParser(roster, deployment.attributes, deployment.horizon, fast_chunk=0)
    tail = b'],"step":1,"pov":[1,0]}}'
    compact = b'{"columns":{"user":["u1","u22"' + tail
    others = [b'{"columns":{"user":[ "u1","u22"' + tail, b'{"columns":{"user":["u1", "u22"' + tail,
              b'{"columns":{"user":["\\u0075\\u0031","u22"' + tail, '{"columns":{"user":["é1","u22"'.encode() + tail,
              b'{"columns":{"user":["q\\"1","u22"' + tail, b'{"columns":{"user":["u1",22' + tail,
              b'{"columns":{"user":["u1","nobody"' + tail, b'{"columns":{"user":["u1","' + b"x" * 20 + b'"' + tail,
              b'{"columns":{"user":["u1","' + b"x" * 21 + b'"' + tail, b'{"columns":{"user":["u1","u\x7f"' + tail]
    for raw in [compact, *others]:
        before = len(spans)
        assert _parsed(parser.parse([raw])) == _parsed(reference.parse([raw])), raw
        assert (len(spans) > before) == (raw == compact or b"x" * 20 in raw or b"nobody" in raw), raw


@pytest.mark.parametrize("fast_chunk", [0, 4])
def test_pandas_values_are_accepted_where_unambiguous(deployment, fast_chunk):
    """1.0, True, "1", "True" for a binary attribute and integral floats for codes are accepted with
    the code they mean, by single reports (fast and reference paths) and columnar batches alike;
    the ambiguous rest stays out_of_domain (breaks if 1.0 is rejected or 0.5 / "yes" accepted)."""
    parser = ReportParser(Roster.from_range(N_USERS), deployment.attributes, deployment.horizon,
                          fast_chunk=fast_chunk)
    good = [("pov", 1.0, 1), ("pov", 0.0, 0), ("pov", True, 1), ("pov", "1", 1), ("pov", "0", 0), ("pov", "True", 1),
            ("pov", "false", 0), ("pov", "1.0", 1), ("status", 2.0, 2), ("status", 0.0, 0), ("item", 63.0, 63)]
    bad = [("pov", 0.5), ("pov", 2.0), ("pov", "yes"), ("pov", "2"), ("status", 2.5), ("status", 3.0),
           ("status", True), ("status", "1"), ("item", 64.0), ("item", -1.0)]
    singles = [orjson.dumps({"user": f"u{i}", "step": 1, "values": {a: v}}) for i, (a, v, _) in enumerate(good)]
    parsed = parser.parse(singles)
    assert parsed.rejections == [] and parsed.rows.tolist() == list(range(len(good)))
    for i, (a, _, code) in enumerate(good):
        assert parsed.codes[a][i] == code, good[i]
    parsed = parser.parse([orjson.dumps({"user": "u1", "step": 1, "values": {a: v}}) for a, v in bad])
    assert len(parsed) == 0 and [r.reason for r in parsed.rejections] == ["out_of_domain"] * len(bad)
    # a pandas DataFrame sent as columns: float codes (vectorised path) and strings
    cols = {"user": [f"u{i}" for i in range(4)], "step": 1, "pov": [1.0, 0.0, 1.0, 0.5],
            "status": [2.0, 1.0, 0.0, 1.0], "item": ["q", "r", "s", "t"]}
    parsed = parser.parse([orjson.dumps({"columns": cols})])
    assert parsed.rows.tolist() == [0, 1, 2] and parsed.codes["pov"].tolist() == [1, 0, 1]
    assert parsed.codes["status"].tolist() == [2, 1, 0]
    assert [(r.reason, r.batch_index) for r in parsed.rejections] == [("out_of_domain", 3)]
    parsed = parser.parse([orjson.dumps({"columns": {"user": ["u0", "u1"], "step": 1, "pov": ["True", "0"]}})])
    assert parsed.codes["pov"].tolist() == [1, 0] and parsed.rejections == []


@settings(max_examples=300, derandomize=True, deadline=None)
@given(name=st.sampled_from(["pov", "status", "item"]),
       col=st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(PANDAS_CODES),
                              st.integers(-3, ITEM_SIZE + 3)), max_size=8))
def test_vectorised_float_columns_equal_the_column_decoder(deployment, name, col):
    """Columnar batches: the numpy path for all-float columns gives the reference decoder's codes,
    and declines any column that is not all floats."""
    parser = ReportParser(Roster.from_range(N_USERS), deployment.attributes, deployment.horizon)
    fast = parser._float_codes(name, col)
    reference = list(parser._column_decoders[name](col))
    if fast is None:
        assert not col or not all(type(v) is float for v in col)
    else:
        assert fast.tolist() == reference


def test_enqueue_past_unhandled_records_asks_to_seek_back(deployment):
    """A consumer positioned past records the state does not reflect (a client may seek a newly assigned
    partition to the group's committed offset, which can be past the last checkpoint) must not skip
    them: enqueue queues nothing and asks to seek back; records fetched before the seek took effect
    are dropped too (they come again); a gap still there after the grace period is a real one
    (transaction markers, retention) and is accepted."""
    roster = Roster.from_range(N_USERS)
    u = next(x for x in ROSTER_IDS if roster.owners(P)[roster.row(x)] == 0)
    rec = lambda off, step=1: Record(off, orjson.dumps({"user": u, "step": step, "values": {"pov": 1}}))  # noqa: E731
    core = IngestCore(deployment, roster, topic_names(deployment), isolated=True)
    grace = core.REWIND_GRACE_SECONDS
    core.assign(0)
    core.enqueue(0, [rec(0)], now=0.0)
    assert core.drain(0)[0].accepted == 1
    assert core.enqueue(0, [rec(3, 2), rec(4, 2)], now=1.0) == 1  # offsets 1, 2 unhandled: seek back to 1
    assert core.backlog[0] == []
    assert core.enqueue(0, [rec(3, 2)], now=1.1) == 1 and core.backlog[0] == []  # stale: fetched before the seek
    assert core.enqueue(0, [rec(1, 2), rec(2, 2), rec(3, 2)], now=1.2) is None  # re-delivered from 1
    assert [r.offset for r in core.backlog[0]] == [1, 2, 3]
    core.drain(0)
    assert core.enqueue(0, [rec(3, 2)], now=1.3) is None and core.backlog[0] == []  # stale, already handled
    # a real gap (nothing at offsets 4..6): sought back until the grace period is over, then accepted
    assert core.enqueue(0, [rec(7, 3)], now=5.0) == 4
    assert core.enqueue(0, [rec(7, 3)], now=5.0 + grace / 2) == 4
    assert core.enqueue(0, [rec(7, 3)], now=5.0 + grace) is None
    assert [r.offset for r in core.backlog[0]] == [7]


@pytest.mark.parametrize("value", [b"garbage", b'{"step": "x"}', b"{}", b'{"step": 5}'])
def test_garbled_close_marker_does_not_crash_the_partition(deployment, value):
    roster = Roster.from_range(N_USERS)
    core = IngestCore(deployment, roster, topic_names(deployment), isolated=True)
    core.assign(0)
    core.enqueue(0, [Record(0, value, ((CONTROL_HEADER, b"close"),))])
    outputs = core.drain(0)  # must not raise: the marker is dead-lettered with its bytes
    letters = [d for out in outputs for d in getattr(out, "dead_letters", [])]
    assert [(dict(h)["dpstream-reason"], v) for _, v, h in letters] == [(b"malformed", value)]
    assert core.states[0].closed == 0 and core.states[0].offset == 0


# -- end to end: the fuzz corpus through the real broker into a running worker -------------------------
def _read_all(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0, raw: bool = False):
    """Every message of ``topic`` from the beginning to its current end: {partition: [Record]}."""
    from kafka import KafkaConsumer, TopicPartition

    from pipeline.stream.kafka.log_end import log_ends

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    end = log_ends(bootstrap, tps)  # not consumer.end_offsets: the embedded broker's is short
    out = {p: [] for p in range(partitions)}
    deadline = time.monotonic() + timeout
    while any(len(out[tp.partition]) < end[tp] for tp in tps) and time.monotonic() < deadline:
        for tp, msgs in consumer.poll(timeout_ms=200).items():
            out[tp.partition] += msgs if raw else [Record(m.offset, m.value, tuple(m.headers or ())) for m in msgs]
    consumer.close()
    return out


def test_fuzz_corpus_through_broker_into_running_worker(tmp_path, monkeypatch):
    """A bounded, deterministic corpus (30 hypothesis examples) sent to ``reports`` of a running
    deployment, then a full step and its close. The worker stays alive, the step is released, and the
    ``dead-letter`` topic holds exactly the rejections the ingest logic makes on the same log: same
    keys, reasons from ``REASONS``, original bytes (breaks if the worker crashes on bad input, drops a
    dead letter, or publishes it without its reason)."""
    from hypothesis import Phase

    from pipeline.stream.local.cluster import LocalCluster
    from pipeline.stream.local.driver import StepDriver
    from pipeline.stream.local.embedded import EmbeddedServices

    corpus = []

    @settings(max_examples=30, derandomize=True, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(msg=message(), where=st.sampled_from(["owner", "owner", "other"]))
    def collect(msg, where):
        corpus.append((msg, where))

    collect()
    assert len(corpus) >= 20
    monkeypatch.chdir(tmp_path)  # the jobs' working directory
    roster = Roster.from_range(N_USERS)
    owners = roster.owners(P)
    with EmbeddedServices() as svc:
        path = _config(tmp_path, "fuzz-e2e", broker=svc.broker.bootstrap, redis=svc.redis.url)
        dep = load_config(path)
        with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
            drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
            for (raw, user), where in corpus:
                owner = int(owners[roster.row(user)]) if isinstance(user, str) and roster.row(user) >= 0 else 0
                drv.producer.send_raw(raw, partition=owner if where == "owner" else (owner + 1) % P)
            drv.producer._producer.flush()
            drv.producer.send_step(1, {"pov": np.arange(N_USERS) % 2})
            drv.close(1, timeout=90)
            cluster.check_alive()  # the worker survived the corpus
            drv.shutdown()

            # what the ingest logic rejects on exactly this log
            log = _read_all(cluster.broker, cluster.names["reports"], P)
            # (reports on the wrong partition forwarded and fed back in memory: the outcome does not
            # depend on how the worker's logs interleaved)
            core = IngestCore(dep, roster, cluster.names)
            expected, units, accepted, rejected = {}, 0, 0, 0
            for p in range(P):
                core.assign(p)
                core.enqueue(p, log[p])
                units += sum(len(units_of(r.value)) for r in log[p] if CONTROL_HEADER not in dict(r.headers))
            for out in Loopback(core).drain(range(P)):
                if isinstance(out, ApplyResult):
                    accepted += out.accepted
                    expected.update({key: (dict(h)["dpstream-reason"], value) for key, value, h in out.dead_letters})
                    rejected += sum(_reports(h) for _, _, h in out.dead_letters)
            assert accepted + rejected == units  # conservation on the real log (of reports, not letters)
            assert expected, "the corpus produced no rejection: not a fuzz test"
            letters = _read_all(cluster.broker, cluster.names["dead-letter"], 1, raw=True)[0]
            got = {}
            for msg in letters:
                headers = dict(msg.headers)
                reason = headers["dpstream-reason"]
                assert reason.decode() in REASONS
                _, p, off = headers["dpstream-source"].decode().rsplit("/", 2)
                assert msg.key == f"{p}:{off}:{headers.get('dpstream-batch-index', b'-').decode()}".encode() \
                    or b":displaced:" in msg.key
                got[msg.key] = (reason, msg.value)
            assert got == expected
            assert len(letters) == len(expected)  # each rejection published once

