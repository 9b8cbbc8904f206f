"""The ``relative_error`` release kind (pipeline.releases.relative_error): configuration checks, the query
families, the per-step privacy event against PREM's calibration, the releaser engine against the
library PREM (Ghazi et al., "PREM: Privately Answering Statistical Queries with Relative Error",
arXiv 2502.14809), the consumer's histogram assembly and the (ζ, α) interval."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config import ConfigError, parse_config
from pipeline.consumer import IncompleteStep, PanelStore
from pipeline.plan import planned_schedule, release_seed, step_cost
from pipeline.privacy.budget import BUDGET_RTOL
from pipeline.privacy.events import ApproxDP
from pipeline.releases import relative_error as re_kind
from pipeline.releases import kind_of
from pipeline.releases.codecs import columns_checksum
from pipeline.stream.releaser.engine import ReleaseEngine, ReleaseOutput
from pipeline.stream.kafka.messages import synthetic_chunks
from support.neighbour_runs import CoupledWorlds
from pipeline.attributes import public_hash
from pipeline.synth.prem import PREM
from pipeline.synth.prem_privacy import charged_plan, paper_plan, plan_privacy

N, T = 300, 3
EPS, DELTA = 3.0, 3e-6  # per step (ε, δ) = (1, 1e-6) with share 1


def config(**release) -> dict:
    rel = {"name": "occ-groups", "type": "relative_error", "attribute": "occ", "share": 1.0, "queries": "groups",
           "groups": {"ab": ["a", "b"], "cde": ["c", "d", 4], "h": ["h"]}}
    rel.update(release)
    return {
        "name": "re-unit", "roster": {"size": N}, "horizon": T,
        "attributes": {"occ": {"type": "categorical", "values": list("abcdefgh")},
                       "item": {"type": "hashed", "size": 32}, "flag": {"type": "binary"}},
        "budget": {"epsilon": EPS, "delta": DELTA}, "random": {"kind": "seeded", "seed": 7},
        "releases": [rel],
    }


def refused(cfg: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(cfg, source="re.yaml")
    return str(info.value)


# --- configuration -------------------------------------------------------------------------------

def test_config_resolves_groups_by_label_code_and_public_hash():
    dep = parse_config(config())
    rel = dep.releases[0]
    assert re_kind.resolve_groups(rel, dep.attributes["occ"]) == {"ab": [0, 1], "cde": [2, 3, 4], "h": [7]}
    dep = parse_config(config(attribute="item", groups={"g": ["flu", 5]}))
    assert re_kind.resolve_groups(dep.releases[0], dep.attributes["item"]) == {"g": sorted([public_hash("flu", 32), 5])}


@pytest.mark.parametrize("change, key, words", [
    ({"groups": {}}, "releases.0 (occ-groups).groups", "at least one declared group"),
    ({"groups": {"ab": ["a", "zz"]}}, "releases.0 (occ-groups).groups.ab", "'zz' is not a value"),
    ({"groups": {"ab": ["a", 0]}}, "releases.0 (occ-groups).groups.ab", "appears twice"),
    ({"groups": {"ab": [9]}}, "releases.0 (occ-groups).groups.ab", "outside [0, 8)"),
    ({"groups": {"ab": []}}, "releases.0 (occ-groups).groups.ab", "at least one value"),
    ({"queries": "dyadic"}, "releases.0 (occ-groups).groups", "only for queries: groups"),
    ({"attribute": "flag", "queries": "singletons", "groups": {}}, "releases.0 (occ-groups).attribute",
     "categorical or hashed"),
    ({"share": 1.0, "queries": "singletons", "groups": {}, "zeta": 0.5}, "releases.0.zeta", "less than 0.5"),
    ({"queries": "everything"}, "releases.0.queries", "'groups', 'dyadic' or 'singletons'"),
])
def test_config_refusals_name_the_key(change, key, words):
    msg = refused(config(**change))
    assert key in msg and words in msg, msg


def test_config_refuses_a_per_step_epsilon_the_calibration_does_not_cover_and_big_domains():
    cfg = config()
    cfg["budget"]["epsilon"] = 4.0
    msg = refused(cfg)
    assert "releases.0 (occ-groups).share" in msg and "1.333" in msg, msg
    cfg = config(attribute="item", queries="dyadic", groups={})
    cfg["attributes"]["item"]["size"] = re_kind.MAX_DOMAIN + 1
    assert "more than the" in refused(cfg)
    cfg["attributes"]["item"]["size"] = 1 << 19  # 20 levels of 2^19 pairs: nnz over the cap
    assert "releases.0 (occ-groups).queries" in refused(cfg)
    cfg = config()
    del cfg["budget"]["epsilon"], cfg["budget"]["delta"]
    cfg["budget"]["rho"] = 1.0
    assert "needs budget.epsilon" in refused(cfg)


# --- query families ------------------------------------------------------------------------------

@pytest.mark.parametrize("size", list(range(2, 41)) + [64, 100])
def test_dyadic_family_is_every_distinct_aligned_block_once(size):
    lo, hi = re_kind.dyadic_blocks(size)
    blocks = list(zip(lo.tolist(), hi.tolist()))
    reference, width = set(), 1
    while True:
        reference |= {(s, min(s + width, size)) for s in range(0, size, width)}
        if width >= size:
            break
        width *= 2
    assert len(blocks) == len(set(blocks)) and set(blocks) == reference
    dense = re_kind.query_family("dyadic", size).toarray()
    for row, (a, b) in zip(dense, blocks):
        assert np.array_equal(np.flatnonzero(row), np.arange(a, b))
    levels = math.ceil(math.log2(size))
    for a in range(size):
        for b in range(a + 1, size + 1):
            pieces = re_kind.dyadic_pieces(a, b, size)
            assert pieces[0][0] == a and pieces[-1][1] == b
            assert all(p[1] == q[0] for p, q in zip(pieces, pieces[1:]))
            assert set(pieces) <= reference and len(pieces) <= 2 * levels


def test_singletons_and_groups_families():
    assert np.array_equal(re_kind.query_family("singletons", 5).toarray(), np.eye(5))
    groups = [("y", [1, 3]), ("x", [0])]
    assert np.array_equal(re_kind.query_family("groups", 4, groups).toarray(), [[0, 1, 0, 1], [1, 0, 0, 0]])


def test_a_restored_mechanism_keeps_the_declared_group_order():
    """F's order is the monitor's query order, so a releaser restored from its state must rebuild F in the
    declared order (the state format sorts mapping keys): same matrix, same manifest groups."""
    from pipeline.serialization import dumps_state, loads_state

    dep = parse_config(config(groups={"zz": ["h"], "ab": ["a", "b"], "mm": ["c"]}))
    engine = ReleaseEngine(dep, N)
    mech = engine.mechanisms["occ-groups"]
    restored = re_kind.RelativeErrorMechanism.from_state(loads_state(dumps_state(mech.get_state())))
    assert (restored.queries != mech.queries).nnz == 0
    assert mech.queries.toarray()[0].tolist() == [0, 0, 0, 0, 0, 0, 0, 1]
    assert list(restored.parameters()["groups"]) == ["zz", "ab", "mm"]


# --- the neighbouring relation on the workers' aggregation ---------------------------------------

@st.composite
def neighbouring_streams(draw):
    """Two streams differing in one user's whole sequence (the all-missing one drawn often), others
    with gaps, either imputation rule, with or without a default (docs/privacy.md)."""
    n, horizon = draw(st.integers(2, 5)), draw(st.integers(1, 4))
    cfg = config()
    cfg.update(roster={"size": n}, horizon=horizon, budget={"epsilon": 1.0, "delta": 1e-6}, steps={"max_ahead": 0},
               imputation={"rule": draw(st.sampled_from(["carry_forward", "default"])),
                           "default": draw(st.sampled_from([{}, {"occ": "f"}]))})
    cfg["attributes"] = {"occ": cfg["attributes"]["occ"]}
    row = st.lists(st.integers(-1, 7), min_size=horizon, max_size=horizon)
    others = np.array(draw(st.lists(row, min_size=n, max_size=n)), dtype=np.int64)
    user = draw(st.integers(0, n - 1))
    worlds = []
    for _ in range(2):
        reports = others.copy()
        reports[user] = draw(st.one_of(st.just([-1] * horizon), row))
        worlds.append(reports)
    return parse_config(cfg), user, worlds


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(neighbouring_streams())
def test_each_steps_histogram_is_a_replace_one_neighbour(case):
    """What PREM's privacy needs (docs/prem.md §6): through the worker's own state, imputation and
    aggregator, each step's histogram in the two worlds has the same n and differs at most by one
    unit moved between the bins of the user's two (reported or imputed) values: h' = h − e_x + e_y."""
    dep, user, worlds = case
    run = CoupledWorlds(dep)
    for t in range(1, dep.horizon + 1):
        p0, p1 = run.close(t, {"occ": worlds[0][:, t - 1]}, {"occ": worlds[1][:, t - 1]})
        assert p0["users"] == p1["users"] == dep.n
        h0, h1 = p0["releases"]["occ-groups"]["counts"], p1["releases"]["occ-groups"]["counts"]
        assert h0.sum() == h1.sum() == dep.n
        d = h1 - h0
        x, y = run.values(0, "occ")[user], run.values(1, "occ")[user]
        expected = np.zeros(8, dtype=np.int64)
        expected[x] -= 1
        expected[y] += 1
        assert d.tolist() == expected.tolist(), (t, x, y, d)


# --- the per-step privacy event ------------------------------------------------------------------

def test_step_cost_is_the_calibration_of_the_mechanisms_noise():
    """Each step charges plan_privacy of the plan made for (ε_r/T, δ_r/T) — PREM's own round trip — and
    T of them fit the allotment; noise half as large (σ_n²/2 or a doubled) would cost more than the charge."""
    dep = parse_config(config())
    rel = dep.releases[0]
    allot = dep.budget_plan().allotments()[rel.name]
    assert allot == ApproxDP(EPS, DELTA)
    plan = charged_plan(8, 3, 0.1, EPS / T, DELTA / T, 0.05)
    expected = plan_privacy(plan)
    costs = [step_cost(dep, rel, t, allot) for t in range(1, T + 1)]
    assert costs == [expected] * T
    assert expected.epsilon <= EPS / T * (1 + BUDGET_RTOL) and expected.delta <= DELTA / T * (1 + BUDGET_RTOL)
    assert expected.epsilon == pytest.approx(EPS / T, rel=1e-6)  # calibrated to the target, not loosely under it
    assert planned_schedule(dep)[rel.name].sum() == pytest.approx(EPS, rel=1e-9)
    engine = ReleaseEngine(dep, N)
    assert engine.mechanisms[rel.name].step_cost() == expected
    for noisier in (dataclasses.replace(plan, mass_param=plan.mass_param / 2), dataclasses.replace(plan, a=2 * plan.a)):
        assert plan_privacy(noisier).epsilon > expected.epsilon * 1.01


def test_paper_accounting_charges_the_paper_plan():
    dep = parse_config(config(accounting="paper"))
    rel = dep.releases[0]
    allot = dep.budget_plan().allotments()[rel.name]
    expected = plan_privacy(paper_plan(N, 8, 3, 0.1, EPS / T, DELTA / T, 0.05))
    assert step_cost(dep, rel, 2, allot) == expected
    assert expected.epsilon == pytest.approx(EPS / T, rel=1e-6) and expected.delta <= DELTA / T


# --- the engine against the library --------------------------------------------------------------

def _run_engine(dep, panel: np.ndarray, engine: ReleaseEngine | None = None, steps=None):
    """Release ``steps`` from two partitions' partials (rows split in half): partials add, so the split
    must not matter."""
    rel = dep.releases[0]
    engine = engine or ReleaseEngine(dep, N)
    halves = (slice(0, N // 2), slice(N // 2, N))
    aggs = [kind_of(rel).aggregator(rel, dep.attributes[rel.attribute], len(range(N)[h]), T) for h in halves]
    outputs = {}
    for t in steps or range(1, T + 1):
        parts = [{"users": len(range(N)[h]), "releases": {rel.name: agg.partial(t, panel[h, t - 1])}}
                 for agg, h in zip(aggs, halves)]
        outputs[t] = engine.release(t, parts)[0]
    return engine, outputs


def test_engine_equals_library_prem_per_step_and_restores_from_state():
    """Dyadic ranges over a hashed attribute: each step's released histogram is PREM (the library) fitted
    on that step's batch histogram with seed step_seed(release_seed, t), bit for bit; the ledger holds the
    per-step event; a releaser rebuilt from its state after step 1 continues identically."""
    dep = parse_config(config(attribute="item", queries="dyadic", groups={}, zeta=0.2))
    rel = dep.releases[0]
    rng = np.random.default_rng(5)
    panel = rng.choice(32, size=(N, T), p=np.arange(1, 33) / np.arange(1, 33).sum())
    engine, outputs = _run_engine(dep, panel)
    family = re_kind.query_family("dyadic", 32)
    plan = charged_plan(32, family.shape[0], 0.2, EPS / T, DELTA / T, 0.05)
    for t in range(1, T + 1):
        prem = PREM(32, family, 0.2, EPS / T, DELTA / T, beta=0.05, accounting="charged", plan=plan,
                    seed=re_kind.step_seed(release_seed(dep, rel.name), t))
        expected = prem.fit(np.bincount(panel[:, t - 1], minlength=32))
        out = outputs[t]
        np.testing.assert_array_equal(out.columns[:, 0], expected)
        assert ReleaseOutput.from_bytes(out.to_bytes()).columns.tobytes() == out.columns.tobytes()  # as stored
        params = out.manifest["parameters"]
        assert (params["zeta"], params["alpha"], params["beta"], params["n_queries"]) == (0.2, prem.alpha, 0.05, 63)
        assert out.manifest["synthetic"]["sha256"] == columns_checksum(expected)
        assert out.manifest["privacy"]["step_cost"] == dataclasses.asdict(plan_privacy(plan))
        assert engine.ledger.has(rel.name, t)
    assert engine.ledger.spent_approx_dp(rel.name).epsilon == pytest.approx(EPS, rel=1e-9)
    # restart after step 1 from the stored state: steps 2..T are the same bytes
    first, _ = _run_engine(dep, panel, steps=[1])
    restored = ReleaseEngine.from_state(dep, first.get_state())
    _, again = _run_engine(dep, panel, engine=restored, steps=[2, 3])
    for t in (2, 3):
        np.testing.assert_array_equal(again[t].columns, outputs[t].columns)


def test_different_steps_draw_different_noise():
    assert len({re_kind.step_seed(11, t) for t in range(1, 50)}) == 49
    assert re_kind.step_seed(None, 3) is None


# --- the consumer ---------------------------------------------------------------------------------

def _published(hist: np.ndarray, step: int, chunk_records: int, alpha: float = 10.0) -> tuple[bytes, list[bytes]]:
    manifest = {"release": "r", "type": "relative_error", "step": step, "horizon": 4,
                "parameters": {"queries": "groups", "groups": {"lo": [0, 1], "all": list(range(hist.size))},
                               "domain_size": hist.size, "zeta": 0.1, "alpha": alpha, "beta": 0.05, "n": 1000},
                "synthetic": {"columns": [step], "records": hist.size, "dtype": "float64", "histogram": True,
                              "chunks": -(-hist.size // chunk_records), "sha256": columns_checksum(hist)}}
    chunks = [v for _, v in synthetic_chunks("r", step, [step], hist.reshape(-1, 1), chunk_records=chunk_records)]
    return orjson.dumps(manifest), chunks


def test_consumer_assembles_the_histogram_bit_for_bit_and_checks_it(tmp_path):
    hist = np.random.default_rng(1).exponential(7.0, 10) * (1 + 1e-13)  # full float64 mantissas
    store = PanelStore()
    manifest, chunks = _published(hist, 1, chunk_records=4)
    for c in reversed(chunks):  # order-tolerant, duplicates harmless
        store.add_chunk(c)
    store.add_chunk(chunks[0])
    assert 1 not in store.panels["r"].complete_steps
    store.add_manifest(manifest)
    panel = store.panels["r"]
    assert panel.complete_steps == {1} and panel.released_through == 1
    assert panel.histograms[1].tobytes() == hist.astype("<f8").tobytes()
    answer = panel.group_count(1, "lo")
    assert answer["estimate"] == float(hist[:2].sum())
    assert answer["interval"] == list(re_kind.group_interval(float(hist[:2].sum()), 0.1, 10.0, 1000))
    back = np.loadtxt(panel.export_csv(tmp_path / "h.csv"), delimiter=",", skiprows=1)  # code, step_1
    assert back[:, 0].tolist() == list(range(10)) and back[:, 1].tobytes() == hist.tobytes()
    # a value changed in transit: refused
    manifest2, chunks2 = _published(hist, 2, chunk_records=4)
    bad = orjson.loads(chunks2[1])
    bad["values"]["2"][0] += 1e-9
    store.add_manifest(manifest2)
    store.add_chunk(chunks2[0])
    store.add_chunk(chunks2[2])
    with pytest.raises(IncompleteStep, match="checksum mismatch"):
        store.add_chunk(orjson.dumps(bad))
    assert store.panels["r"].released_through == 1


# --- the interval ---------------------------------------------------------------------------------

def test_interval_is_the_guarantee_solved_for_the_true_count():
    """(1−ζ)f(h) − α ≤ f(ĥ) ≤ (1+ζ)f(h) + α ⇔ f(h) ∈ [(f(ĥ) − α)/(1+ζ), (f(ĥ) + α)/(1−ζ)]: at either
    extreme of the guarantee the true count is exactly the interval's end; beyond it, it falls outside."""
    zeta, alpha, n = 0.1, 50.0, 10_000
    for true in (0.0, 30.0, 400.0, 9_000.0):
        high = (1 + zeta) * true + alpha
        low = (1 - zeta) * true - alpha
        assert re_kind.group_interval(high, zeta, alpha, n)[0] == pytest.approx(max(0.0, true))
        assert re_kind.group_interval(max(low, 0.0), zeta, alpha, n)[1] >= true - 1e-9
        if low > 0:
            assert re_kind.group_interval(low, zeta, alpha, n)[1] == pytest.approx(min(true, n))
        lo, hi = re_kind.group_interval(high + 1.0, zeta, alpha, n)  # outside the guarantee: true excluded
        assert lo > true
    assert re_kind.group_interval(0.0, zeta, alpha, n) == (0.0, alpha / (1 - zeta))
    assert re_kind.group_interval(1e9, zeta, alpha, n)[1] == n


def test_range_answers_sum_dyadic_pieces_with_their_alphas():
    hist = np.arange(16, dtype=np.float64)
    manifest = {"parameters": {"queries": "dyadic", "domain_size": 16, "zeta": 0.1, "alpha": 5.0, "n": 500,
                               "beta": 0.05}}
    out = re_kind.answer_query(manifest, hist, "3:11")
    assert re_kind.dyadic_pieces(3, 11, 16) == [(3, 4), (4, 8), (8, 10), (10, 11)] and out["pieces"] == 4
    assert out["estimate"] == float(hist[3:11].sum())
    assert out["interval"] == list(re_kind.group_interval(out["estimate"], 0.1, 5.0, 500, pieces=out["pieces"]))
    assert re_kind.answer_query(manifest, hist, "7")["estimate"] == 7.0
    with pytest.raises(ValueError, match="outside"):
        re_kind.answer_query(manifest, hist, "16")
    with pytest.raises(ValueError, match="lo < hi"):
        re_kind.answer_query(manifest, hist, "5:5")


def test_released_intervals_cover_the_truth_when_counts_exceed_alpha():
    """Theorem (docs/prem.md §3.3): w.p. ≥ 1 − β every family query is within (ζ, α_run); with n = 2·10⁶
    users over 16 codes the groups' counts are far above α. Fixed seeds; a miss would be an event of
    probability ≤ β = 0.05 per run under a correct mechanism, while an α or ζ too small for the noise
    (e.g. margins from the wrong scale) makes misses systematic."""
    groups = {"low": list(range(4)), "mid": list(range(4, 12)), "high": [12, 13, 14, 15], "one": [3]}
    params = {"domain_size": 16, "queries": "groups", "groups": list(groups.items()), "zeta": 0.1, "epsilon": 1.0,
              "delta": 1e-6, "beta": 0.05, "accounting": "charged", "n": 2_000_000, "max_calls": 20,
              "max_rounds": 3}
    rng = np.random.default_rng(3)
    for seed in range(5):
        mech = re_kind.RelativeErrorMechanism(dict(params, seed=seed))
        h = rng.multinomial(2_000_000, rng.dirichlet(np.ones(16)))
        hist, prem = mech.fit(1, h)
        manifest = {"parameters": mech.parameters(prem)}
        for name, codes in groups.items():
            ans = re_kind.answer_query(manifest, hist, name)
            lo, hi = ans["interval"]
            assert lo <= h[codes].sum() <= hi, (seed, name, ans, h[codes].sum())
