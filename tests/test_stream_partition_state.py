"""PartitionState (stateful checks, imputation, close, feedback, checkpoints) and the aggregators,
checked against brute-force counts over the full (users × steps) matrix."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import parse_config
from pipeline.serialization import dumps_state, loads_state
from pipeline.releases.aggregators import ActiveSetAggregator, CumulativeAggregator, FixedWindowAggregator
from pipeline.stream.ingest.partition_state import FeedbackPending, PartitionState, stable_argsort
from pipeline.stream.ingest.reports import ReportParser, public_hash
from pipeline.stream.ingest.roster import Roster

STATUS = ["employed", "unemployed", "inactive"]


def deployment(*, n=30, horizon=6, max_ahead=2, rule="carry_forward", default=None, window=3,
               monitors=False, hh_k=2, hh_method="tme"):
    releases = [
        {"name": "fw", "type": "fixed_window", "attribute": "poverty", "window": window, "share": 0.25},
        {"name": "fw-status", "type": "fixed_window", "attribute": "status", "window": 2, "share": 0.25},
        {"name": "cu", "type": "cumulative", "attribute": "poverty", "share": 0.5},
    ]
    budget = {"rho": 1.0}
    if monitors:
        budget.update(epsilon=1.0, delta=1e-6)
        releases += [
            {"name": "hh", "type": "heavy_hitters", "attribute": "query", "method": hh_method, "k": hh_k,
             "share": 0.5},
            {"name": "band", "type": "band_monitor", "attribute": "status", "value": "unemployed",
             "low": 0, "high": 100, "share": 0.5},
        ]
    return parse_config({
        "name": "ps",
        "roster": {"size": n},
        "horizon": horizon,
        "attributes": {
            "poverty": {"type": "binary"},
            "status": {"type": "categorical", "values": STATUS},
            "query": {"type": "hashed", "size": 50},
        },
        "budget": budget,
        "random": {"kind": "seeded", "seed": 1},
        "steps": {"max_ahead": max_ahead},
        "imputation": {"rule": rule, "default": default or {}},
        "releases": releases,
    })


class Harness:
    """One partition's state plus a parser, fed with JSON reports like a worker would be."""

    def __init__(self, dep, partition=0, partitions=1):
        self.dep = dep
        self.roster = Roster.from_range(dep.n)
        rows = self.roster.rows_of(partition, partitions)
        self.state = PartitionState(dep, partition, rows, self.roster.n)
        self.parser = ReportParser(self.roster, dep.attributes, dep.horizon)

    def send(self, *reports):
        raws = [r if isinstance(r, bytes) else orjson.dumps(r) for r in reports]
        parsed = self.parser.parse(raws)
        applied = self.state.apply(parsed)
        return applied, parsed

    @staticmethod
    def r(user, step, **values):
        return {"user": f"u{user}", "step": step, "values": values}


def reasons(parsed):
    return [r.reason for r in parsed.rejections]


# --- stateful checks -------------------------------------------------------------------------

def test_duplicate_within_one_batch_first_wins():
    h = Harness(deployment())
    first = orjson.dumps(h.r(1, 1, poverty=1))
    second = orjson.dumps(h.r(1, 1, poverty=0))
    applied, parsed = h.send(first, h.r(2, 1, poverty=1), second)
    assert len(applied) == 2 and applied.rows.tolist() == [1, 2]
    assert reasons(parsed) == ["duplicate"] and parsed.rejections[0].original == second
    assert h.state.pending["poverty"][0, 1] == 1


def test_duplicate_inside_a_batch_message():
    h = Harness(deployment())
    items = [h.r(4, 1, poverty=0), h.r(4, 1, poverty=1), h.r(4, 2, poverty=1)]
    applied, parsed = h.send(orjson.dumps({"reports": items}))
    assert applied.steps.tolist() == [1, 2]
    assert [(r.reason, r.batch_index) for r in parsed.rejections] == [("duplicate", 1)]
    assert orjson.loads(parsed.rejections[0].original) == items[1]
    assert h.state.pending["poverty"][0, 4] == 0


def test_duplicate_across_batches_first_wins_even_for_another_attribute():
    h = Harness(deployment())
    h.send(h.r(3, 1, poverty=0))
    applied, parsed = h.send(h.r(3, 1, poverty=1), h.r(3, 1, status="inactive"))
    assert len(applied) == 0 and reasons(parsed) == ["duplicate", "duplicate"]
    assert h.state.pending["poverty"][0, 3] == 0 and h.state.pending["status"][0, 3] == -1
    part = h.state.close(1)
    assert part["reported"] == 1


def test_same_user_different_open_steps_are_not_duplicates():
    h = Harness(deployment(max_ahead=2))
    applied, parsed = h.send(h.r(5, 3, poverty=1), h.r(5, 1, poverty=0), h.r(5, 2, poverty=1))
    assert len(applied) == 3 and not parsed.rejections
    assert h.state.pending["poverty"][:, 5].tolist() == [0, 1, 1]


def test_late_report_for_closed_step():
    h = Harness(deployment())
    h.state.close(1)
    raw = orjson.dumps(h.r(1, 1, poverty=1))
    applied, parsed = h.send(raw, h.r(2, 2, poverty=1))
    assert applied.rows.tolist() == [2]
    assert [(r.reason, r.original) for r in parsed.rejections] == [("late", raw)]


def test_future_step_beyond_max_ahead():
    h = Harness(deployment(max_ahead=1))  # open steps: 1 and 2
    ahead = orjson.dumps(h.r(1, 3, poverty=1))
    applied, parsed = h.send(h.r(1, 2, poverty=1), ahead)
    assert applied.steps.tolist() == [2]
    assert [(r.reason, r.original) for r in parsed.rejections] == [("future_step", ahead)]
    h.state.close(1)  # now 2 and 3 are open
    applied, parsed = h.send(ahead)
    assert len(applied) == 1 and not parsed.rejections


def test_max_ahead_zero_accepts_only_the_next_step():
    h = Harness(deployment(max_ahead=0))
    applied, parsed = h.send(h.r(1, 1, poverty=1), h.r(1, 2, poverty=1))
    assert applied.steps.tolist() == [1] and reasons(parsed) == ["future_step"]


def test_reports_of_several_open_steps_land_in_their_steps():
    h = Harness(deployment(n=4, max_ahead=2, window=1))
    h.send(h.r(0, 1, poverty=1), h.r(0, 2, poverty=0), h.r(0, 3, poverty=1),
           h.r(1, 3, poverty=1), h.r(2, 2, poverty=1))
    x = []
    for t in (1, 2, 3):
        h.state.close(t)
        x.append(h.state.last_x["poverty"].tolist())
    # carry forward: user 1 is 0 until step 3; user 2 carries step 2's 1 into step 3
    assert x == [[1, 0, 0, 0], [0, 0, 1, 0], [1, 1, 1, 0]]


def test_foreign_rows_refused():
    dep = deployment(n=40)
    h = Harness(dep, partition=0, partitions=2)
    other = int(Roster.from_range(40).rows_of(1, 2)[0])
    parsed = h.parser.parse([orjson.dumps(h.r(other, 1, poverty=1))])
    with pytest.raises(ValueError, match="does not own"):
        h.state.apply(parsed)


# --- imputation ------------------------------------------------------------------------------

def test_carry_forward_imputation():
    dep = deployment(n=3, rule="carry_forward", default={"poverty": 1, "status": "inactive"})
    h = Harness(dep)
    h.send(h.r(0, 1, poverty=0, status="employed"))
    h.state.close(1)
    # nothing carried yet -> configured default
    assert h.state.last_x["poverty"].tolist() == [0, 1, 1]
    assert h.state.last_x["status"].tolist() == [0, 2, 2]
    h.send(h.r(1, 2, poverty=0))
    h.state.close(2)
    assert h.state.last_x["poverty"].tolist() == [0, 0, 1]  # user 0 carries its 0
    assert h.state.last_x["status"].tolist() == [0, 2, 2]


def test_default_imputation():
    dep = deployment(n=3, rule="default", default={"poverty": 1, "status": "unemployed"})
    h = Harness(dep)
    h.send(h.r(0, 1, poverty=0, status="employed"))
    h.state.close(1)
    h.state.close(2)
    assert h.state.last_x["poverty"].tolist() == [1, 1, 1]  # user 0's 0 is not carried
    assert h.state.last_x["status"].tolist() == [1, 1, 1]


def test_default_imputation_without_configured_default_is_zero():
    h = Harness(deployment(n=3, rule="default"))
    h.send(h.r(2, 1, poverty=1, status="inactive"))
    h.state.close(1)
    assert h.state.last_x["poverty"].tolist() == [0, 0, 1]
    assert h.state.last_x["status"].tolist() == [0, 0, 2]


def test_hashed_default_label_uses_public_hash():
    dep = deployment(n=2, rule="default", default={"query": "nothing"})
    h = Harness(dep)
    h.state.close(1)
    assert h.state.last_x["query"].tolist() == [public_hash("nothing", 50)] * 2


# --- close order and feedback ---------------------------------------------------------------

def test_close_order_errors():
    h = Harness(deployment())
    with pytest.raises(ValueError, match="next step to close is 1"):
        h.state.close(2)
    h.state.close(1)
    with pytest.raises(ValueError, match="next step to close is 2"):
        h.state.close(1)
    with pytest.raises(ValueError):
        h.state.close(3)
    assert h.state.closed == 1


def test_partial_summary_fields():
    dep = deployment(n=30)
    h = Harness(dep, partition=1, partitions=3)
    rows = h.state.rows
    h.send(*[h.r(int(u), 1, poverty=1) for u in rows[:4]])
    p = h.state.close(1)
    assert p["step"] == 1 and p["partition"] == 1
    assert p["users"] == rows.size and p["reported"] == 4
    assert set(p["releases"]) == {"fw", "fw-status", "cu"}


def test_feedback_gates_next_close_and_is_idempotent():
    dep = deployment(n=6, monitors=True, hh_k=2)
    h = Harness(dep)
    h.send(*[h.r(u, 1, query=7 if u < 4 else 9) for u in range(6)])
    p1 = h.state.close(1)
    assert p1["releases"]["hh"]["elements"].tolist() == [7, 9]
    assert p1["releases"]["hh"]["counts"].tolist() == [4, 2]
    with pytest.raises(FeedbackPending):
        h.state.close(2)
    h.state.apply_feedback(1, "hh", {"flagged": [7]})
    with pytest.raises(FeedbackPending, match="band"):
        h.state.close(2)
    h.state.apply_feedback(1, "hh", {"flagged": [7]})  # replayed: must not charge again
    h.state.apply_feedback(1, "band", {"flagged": []})
    assert h.state.aggregators["hh"].charges.tolist() == [1, 1, 1, 1, 0, 0]
    h.state.apply_feedback(1, "hh", {"flagged": [7]})  # still a no-op after the gate opened
    h.state.apply_feedback(0, "hh", {"flagged": [7]})  # stale step: no-op
    assert h.state.aggregators["hh"].charges.tolist() == [1, 1, 1, 1, 0, 0]
    h.state.close(2)  # carries step 1's values forward
    h.state.apply_feedback(1, "hh", {"flagged": [7]})  # feedback of an older step: no-op
    assert h.state.aggregators["hh"].charges.tolist() == [1, 1, 1, 1, 0, 0]


def test_no_feedback_needed_without_monitor_releases():
    h = Harness(deployment())
    h.state.close(1)
    assert not h.state.feedback_needed
    h.state.close(2)


# --- checkpoints -------------------------------------------------------------------------------

def _drive(h, rng, steps, start=1, monitors=False):
    """Random reports (some duplicates, some ahead, some late) then a close, for each step."""
    out = []
    n = h.dep.n
    for t in range(start, start + steps):
        reps = []
        for u in rng.permutation(n)[: int(n * 0.7)]:
            s = int(t + rng.integers(-1, 3))
            reps.append(h.r(int(u), max(s, 1), poverty=int(rng.integers(0, 2)),
                            status=STATUS[int(rng.integers(0, 3))], query=int(rng.integers(0, 5))))
        _, parsed = h.send(*reps)
        p = h.state.close(t)
        if monitors:
            flagged = [int(e) for e, c in zip(p["releases"]["hh"]["elements"], p["releases"]["hh"]["counts"]) if c >= 3]
            h.state.apply_feedback(t, "hh", {"flagged": flagged})
            h.state.apply_feedback(t, "band", {"flagged": [1]})
        out.append((dumps_state(p), sorted(reasons(parsed))))
    return out


def test_state_round_trip_continues_identically():
    dep = deployment(n=40, monitors=True)
    a = Harness(dep)
    _drive(a, np.random.default_rng(5), 3, monitors=True)
    a.send(a.r(1, 4, poverty=1), a.r(2, 5, poverty=0))  # open-step reports are in the checkpoint
    blob = dumps_state(a.state.get_state())
    b = Harness(dep)
    b.state.set_state(loads_state(blob))
    ra = _drive(a, np.random.default_rng(6), 3, start=4, monitors=True)
    rb = _drive(b, np.random.default_rng(6), 3, start=4, monitors=True)
    assert ra == rb
    assert_same_state(a.state.get_state(), b.state.get_state())


def assert_same_state(x, y, path="state"):
    assert type(x) is type(y), path
    if isinstance(x, dict):
        assert set(x) == set(y), path
        for key in x:
            assert_same_state(x[key], y[key], f"{path}.{key}")
    elif isinstance(x, np.ndarray):
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), path
    else:
        assert x == y, path


def _widened(state):
    """A checkpoint as written before the narrow types: every integer array int64, ``last`` copied
    as ``last_x`` once a step closed."""
    if isinstance(state, dict):
        out = {k: _widened(v) for k, v in state.items()}
        if "last" in state and "pending" in state:
            out["last_x"] = _widened(state["last"]) if state["closed"] else {}
        return out
    if isinstance(state, np.ndarray) and state.dtype.kind == "i":
        return state.astype(np.int64)
    return state


def test_checkpoint_from_before_the_narrow_types_restores_exactly():
    dep = deployment(n=40, monitors=True)
    a = Harness(dep)
    _drive(a, np.random.default_rng(5), 3, monitors=True)
    a.send(a.r(1, 4, poverty=1), a.r(2, 5, poverty=0))
    old = loads_state(dumps_state(_widened(a.state.get_state())))
    assert old["pending"]["poverty"].dtype == np.int64 and "last_x" in old
    b = Harness(dep)
    b.state.set_state(old)
    assert_same_state(a.state.get_state(), b.state.get_state())
    ra = _drive(a, np.random.default_rng(6), 3, start=4, monitors=True)
    rb = _drive(b, np.random.default_rng(6), 3, start=4, monitors=True)
    assert ra == rb


def test_per_user_state_is_held_in_narrow_types():
    """Binary and 3-value attributes in int8, the 50-id hashed one in int8, ranks (< (T+1)(P+1)) in
    int8, counters in int8: with int64 the same state was 8x larger."""
    dep = deployment(n=40, monitors=True)
    h = Harness(dep)
    _drive(h, np.random.default_rng(5), 2, monitors=True)
    arrays = []

    def walk(obj):
        if isinstance(obj, np.ndarray):
            arrays.append(obj)
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
    walk(h.state.get_state())
    per_user = [a for a in arrays if a.shape and a.shape[-1] == 40]
    assert per_user and all(a.dtype == np.int8 for a in per_user), {a.dtype for a in per_user}
    state = h.state.get_state()  # last_x: a copy of last, for the previous version's readers
    assert all(np.array_equal(state["last_x"][a], state["last"][a]) for a in state["last"])
    big = parse_config({**dep.model_dump(mode="json"),
                        "attributes": {**dep.model_dump(mode="json")["attributes"],
                                       "query": {"type": "hashed", "size": 10**6}}})
    wide = PartitionState(big, 0, np.arange(40), 40)
    assert wide.pending["query"].dtype == np.int32 and wide.last["query"].dtype == np.int32


def test_restored_partition_checkpoint_has_the_same_bytes():
    dep = deployment(n=10)
    a = Harness(dep)
    a.send(a.r(1, 1, poverty=1, status="inactive"))
    blob = dumps_state(a.state.get_state())
    b = Harness(dep)
    b.state.set_state(loads_state(blob))
    assert dumps_state(b.state.get_state()) == blob


def test_state_of_another_partition_is_refused():
    dep = deployment(n=40)
    a = Harness(dep, 0, 2)
    b = Harness(dep, 1, 2)
    with pytest.raises(ValueError, match="partition"):
        b.state.set_state(a.state.get_state())


def test_get_state_is_a_snapshot():
    dep = deployment(n=10)
    h = Harness(dep)
    snap = h.state.get_state()
    before = dumps_state(snap)
    h.send(h.r(1, 1, poverty=1))
    h.state.close(1)
    assert dumps_state(snap) == before


# --- aggregators vs brute force ----------------------------------------------------------------

def _random_panel(rng, n, T, A, p_missing=0.3):
    x = rng.integers(0, A, size=(n, T))
    missing = rng.random((n, T)) < p_missing
    return x, missing


def _carry_forward(x, missing):
    out = x.copy()
    n, T = x.shape
    for i in range(n):
        last = 0
        for t in range(T):
            if missing[i, t]:
                out[i, t] = last
            last = out[i, t]
    return out


def test_partials_match_brute_force_over_partitions():
    n, T, k = 60, 7, 3
    dep = deployment(n=n, horizon=T, window=k, max_ahead=2)
    rng = np.random.default_rng(11)
    pov, pov_miss = _random_panel(rng, n, T, 2)
    sta, sta_miss = _random_panel(rng, n, T, 3)
    both_missing = pov_miss & sta_miss
    X = _carry_forward(pov, both_missing | pov_miss)
    S = _carry_forward(sta, both_missing | sta_miss)
    partitions = 3
    hs = [Harness(dep, p, partitions) for p in range(partitions)]
    owners = Roster.from_range(n).owners(partitions)
    got = {t: [] for t in range(1, T + 1)}
    for t in range(1, T + 1):
        for h in hs:
            reps = []
            for u in h.state.rows:
                values = {}
                if not pov_miss[u, t - 1]:
                    values["poverty"] = int(pov[u, t - 1])
                if not sta_miss[u, t - 1]:
                    values["status"] = STATUS[int(sta[u, t - 1])]
                if values:
                    reps.append(h.r(int(u), t, **values))
            rng.shuffle(reps)
            _, parsed = h.send(*reps)
            assert not parsed.rejections
            got[t].append(h.state.close(t))
    for t in range(1, T + 1):
        parts = got[t]
        assert sum(p["users"] for p in parts) == n
        assert [p["partition"] for p in parts] == [0, 1, 2]
        assert sum(p["reported"] for p in parts) == int((~both_missing[:, t - 1]).sum())
        # fixed window, binary, k = 3: pattern = Σ x^{t-k+1+i} 2^{k-1-i} (oldest most significant)
        fw = [p["releases"]["fw"]["counts"] for p in parts]
        fws = [p["releases"]["fw-status"]["counts"] for p in parts]
        if t < k:
            assert all(c is None for c in fw)
        else:
            code = sum(X[:, t - k + i] * 2 ** (k - 1 - i) for i in range(k))
            expected = np.array([np.sum(code == s) for s in range(2**k)])
            np.testing.assert_array_equal(np.sum(fw, axis=0), expected)
            # additivity: each partition counts exactly its own users
            for p, c in zip(parts, fw):
                mine = owners == p["partition"]
                np.testing.assert_array_equal(c, np.bincount(code[mine], minlength=2**k))
        if t < 2:
            assert all(c is None for c in fws)
        else:
            code = S[:, t - 2] * 3 + S[:, t - 1]
            np.testing.assert_array_equal(np.sum(fws, axis=0), np.bincount(code, minlength=9))
        # cumulative: z_b = #{weight after t-1 == b-1 and x_t = 1}, b = 1..T; z_0 = 0
        w_before = X[:, : t - 1].sum(axis=1)
        z = np.sum([p["releases"]["cu"]["z"] for p in parts], axis=0)
        assert z.shape == (T + 1,) and z[0] == 0
        for b in range(1, T + 1):
            assert z[b] == np.sum((w_before == b - 1) & (X[:, t - 1] == 1)), (t, b)


def test_fixed_window_aggregator_pattern_code_oldest_most_significant():
    agg = FixedWindowAggregator(rows=1, window=3, categories=3)
    seq = [2, 0, 1, 1]
    outs = [agg.partial(t + 1, np.array([v])) for t, v in enumerate(seq)]
    assert outs[0]["counts"] is None and outs[1]["counts"] is None
    assert int(np.flatnonzero(outs[2]["counts"])[0]) == 2 * 9 + 0 * 3 + 1
    assert int(np.flatnonzero(outs[3]["counts"])[0]) == 0 * 9 + 1 * 3 + 1
    assert outs[3]["counts"].size == 27


def test_fixed_window_aggregator_window_one():
    agg = FixedWindowAggregator(rows=4, window=1, categories=2)
    out = agg.partial(1, np.array([1, 0, 1, 1]))
    assert out["counts"].tolist() == [1, 3]
    assert agg.partial(2, np.array([0, 0, 0, 1]))["counts"].tolist() == [3, 1]


def test_cumulative_aggregator_by_hand():
    agg = CumulativeAggregator(rows=3, horizon=3)
    assert agg.partial(1, np.array([1, 0, 1]))["z"].tolist() == [0, 2, 0, 0]
    assert agg.partial(2, np.array([1, 1, 0]))["z"].tolist() == [0, 1, 1, 0]
    assert agg.partial(3, np.array([1, 1, 1]))["z"].tolist() == [0, 0, 2, 1]


@pytest.mark.parametrize("k,threshold", [(1, 4), (2, 6)])
def test_active_set_counts_and_charging_at_k_vs_brute_force(k, threshold):
    n, T = 40, 8
    dep = deployment(n=n, horizon=T, monitors=True, hh_k=k)
    rng = np.random.default_rng(4)
    Q = rng.choice([0, 1, 2, 3, 4], size=(n, T), p=[0.4, 0.3, 0.15, 0.1, 0.05])
    h = Harness(dep)
    charges = np.zeros(n, dtype=int)
    retired_seen = retired_holding_flagged = False
    for t in range(1, T + 1):
        h.send(*[h.r(u, t, query=int(Q[u, t - 1])) for u in range(n)])
        p = h.state.close(t)["releases"]["hh"]
        active = charges < k
        elements, counts = np.unique(Q[active, t - 1], return_counts=True)
        assert p["elements"].tolist() == elements.tolist()
        assert p["counts"].tolist() == counts.tolist()
        # the releaser's noisy decision: heavy elements, and element 0 always (noise may flag anything)
        flagged = sorted({0} | {int(e) for e, c in zip(elements, counts) if c >= threshold})
        h.state.apply_feedback(t, "hh", {"flagged": flagged})
        h.state.apply_feedback(t, "band", {"flagged": []})
        charges[active & np.isin(Q[:, t - 1], flagged)] += 1
        assert h.state.aggregators["hh"].charges.tolist() == charges.tolist()
        retired_seen |= bool((charges >= k).any())
        # a user retired before this step who holds a flagged element is not charged again
        retired_holding_flagged |= bool((~active & np.isin(Q[:, t - 1], flagged)).any())
    assert retired_seen and charges.max() == k  # nobody is charged beyond k
    assert retired_holding_flagged  # the data exercises the "not charged after k" rule


def test_active_set_uncounted_methods_count_everyone():
    agg = ActiveSetAggregator(rows=3, k=1, counted=False)
    x = np.array([5, 5, 6])
    agg.apply_feedback(1, x, {"flagged": [5]})
    assert agg.charges.tolist() == [0, 0, 0]
    assert agg.partial(2, x)["counts"].tolist() == [2, 1]


def test_band_monitor_counts_the_watched_value_and_retires_contributors():
    dep = deployment(n=5, monitors=True)
    h = Harness(dep)
    h.send(*[h.r(u, 1, status="unemployed" if u < 3 else "employed") for u in range(5)])
    p = h.state.close(1)
    assert p["releases"]["band"] == {"count": 3}
    h.state.apply_feedback(1, "hh", {"flagged": []})
    h.state.apply_feedback(1, "band", {"flagged": [STATUS.index("unemployed")]})
    p = h.state.close(2)  # carried forward, but the 3 contributors are retired (k = 1)
    assert p["releases"]["band"] == {"count": 0}


@pytest.mark.parametrize("domain", [3, 1000, 2**40])
def test_active_set_element_counts_equal_unique(domain):
    """Counting (dense codes) or sorting (sparse ones), the partial is np.unique's arrays."""
    from pipeline.releases.aggregators import _element_counts

    values = np.random.default_rng(domain % 97).integers(0, domain, 5000)
    elements, counts = _element_counts(values)
    ref_e, ref_c = np.unique(values, return_counts=True)
    assert np.array_equal(elements, ref_e) and np.array_equal(counts, ref_c)
    assert _element_counts(values[:0])[0].size == 0


def test_previous_version_reads_a_new_checkpoint():
    """A rollback: the previous version's set_state (int64 arrays, last_x required) restores a
    checkpoint this version wrote to the same state."""
    dep = deployment(n=40, monitors=True)
    h = Harness(dep)
    _drive(h, np.random.default_rng(5), 3, monitors=True)
    state = loads_state(dumps_state(h.state.get_state()))
    old = {"pending": {a: np.array(v, dtype=np.int64) for a, v in state["pending"].items()},
           "rank": np.array(state["rank"], dtype=np.int64),
           "last": {a: np.array(v, dtype=np.int64) for a, v in state["last"].items()},
           "last_x": {a: np.array(v, dtype=np.int64) for a, v in state["last_x"].items()}}
    for a in h.state.attributes:
        assert np.array_equal(old["last_x"][a], old["last"][a])
        assert np.array_equal(old["pending"][a], h.state.pending[a])


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.one_of(st.integers(0, 40), st.integers(0, 2**32 + 5), st.integers(-3, 3)), max_size=300))
def test_stable_argsort_is_numpys_stable_argsort(keys):
    """Duplicates in a run are found by sorting (user, step) keys stably: the two 16-bit radix passes
    give numpy's stable order exactly, ties included (and fall back to it outside [0, 2^32))."""
    arr = np.array(keys, dtype=np.int64)
    assert stable_argsort(arr).tolist() == np.argsort(arr, kind="stable").tolist()
    assert stable_argsort(arr * 65537 % 2**32).tolist() == np.argsort(arr * 65537 % 2**32, kind="stable").tolist()
