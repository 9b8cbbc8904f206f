"""Release kinds (pipeline.releases): the privacy events each kind declares are the cost of the noise its
built mechanism draws, they add up to the release's allotment, and the plan and the ledger charge
exactly them.

The cost is recomputed here from the noise parameters read off the built mechanism, apart from the
kind's code: zCDP of a Gaussian-noised count of L2 sensitivity Δ is Δ²/(2σ²) (Bun and Steinke,
"Concentrated differential privacy", TCC 2016, Proposition 1.6; for the discrete Gaussian Canonne,
Kamath and Steinke, NeurIPS 2020, Theorem 14), with Δ² = 1 per count under add/remove and 2 under
replace (one user's value leaves one bin and enters another); the monitors' (ε, δ) are recomputed
from their noise scales with the theorem each method names (pipeline.monitors.calibration).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.attributes import MISSING, OUT_OF_DOMAIN, public_hash
from pipeline.config import Release, parse_config
from pipeline.monitors import calibration as cal
from pipeline.privacy.noise import used_scale
from pipeline.plan import mechanism_setting, planned_events, planned_schedule
from pipeline.privacy.events import ApproxDP, ZCDP
from pipeline.releases import kinds
from pipeline.stream.releaser.engine import ReleaseEngine

N, T = 30, 9
ITEMS = ["a", "b", "c", "d"]


def deployment(release: dict, horizon: int = T) -> object:
    attributes = {"pov": {"type": "binary"}, "item": {"type": "categorical", "values": ITEMS},
                  "text": {"type": "hashed", "size": 1000, "dictionary": {public_hash("x", 1000): "x"}}}
    return parse_config({
        "name": "kinds", "roster": {"size": N}, "horizon": horizon, "attributes": attributes,
        "budget": {"rho": 0.7, "epsilon": 1.5, "delta": 1e-6}, "random": {"kind": "seeded", "seed": 11},
        "releases": [{"name": "r", "share": 0.8, **release}],
    })


RELEASES = {
    "fixed_window": [{"type": "fixed_window", "attribute": "item", "window": 3}],
    "cumulative": [{"type": "cumulative", "attribute": "pov", "counter": "tree"},
                   {"type": "cumulative", "attribute": "pov", "counter": "factorization"}],
    "heavy_hitters": [{"type": "heavy_hitters", "attribute": "text", "method": m, "k": 2}
                      for m in ("tme", "tct", "svt_restart", "naive")],
    "band_monitor": [{"type": "band_monitor", "attribute": "item", "value": "b", "low": 3, "high": 20}],
    "relative_error": [{"type": "relative_error", "attribute": "item", "queries": "singletons"},
                       {"type": "relative_error", "attribute": "item", "queries": "groups",
                        "groups": {"ab": ["a", "b"], "cd": ["c", "d"]}}],
}


def replace_delta2() -> int:
    return 2  # replace: −1 in one bin, +1 in another (the only relation a deployment accepts)


def fixed_window_cost(rel, mech):
    rho = replace_delta2() / (2 * mech.sigma2)
    return [ZCDP(rho) if t >= rel.window else None for t in range(1, T + 1)]


def cumulative_cost(rel, mech):
    out = []
    for b, counter in enumerate(mech.counters, start=1):
        if rel.counter == "tree":  # a leaf lies in L = ⌊log2(T − b + 1)⌋ + 1 released nodes
            delta2 = replace_delta2() * (T - b + 1).bit_length()
        else:  # Δ² of the integer factorization (its coefficients under replace)
            delta2 = counter.sensitivity2
        out.append(ZCDP(delta2 / (2 * counter.sigma2)))
    return out


def heavy_hitters_guarantee(rel, mech, delta):
    """(ε, δ) of the noise scales the monitor samples with, by the theorem of its method."""
    p = mech.plan
    if rel.method == "tct":
        eps0 = 1.0 / used_scale(p["scale"])
        return cal.individual_charging_privacy(eps0, rel.k, delta, "replace").as_approx_dp()
    if rel.method == "naive":
        return cal.naive_privacy(p["sigma2"], T, delta, "replace")
    if rel.method == "svt_restart":
        return cal.svt_restart_privacy(4.0 / p["scale_nu"], p["max_tops"], delta)
    return cal.threshold_monitor_privacy(p["epsilon_tilde"], p["delta_tilde"], rel.k, "replace")


def band_guarantee(rel, mech, delta):
    return cal.outside_interval_privacy(1.0 / mech._scale, delta, "replace").as_approx_dp()


def relative_error_step_cost(rel, mech):
    """(ε, δ) of one step's PREM, recomputed by the library's calibration round trip from the noise
    parameters of the plan the mechanism runs with (pipeline.synth.prem_privacy.plan_privacy)."""
    from pipeline.synth.prem_privacy import plan_privacy

    return plan_privacy(mech.plan)


ZCDP_COST = {"fixed_window": fixed_window_cost, "cumulative": cumulative_cost}
APPROX_GUARANTEE = {"heavy_hitters": heavy_hitters_guarantee, "band_monitor": band_guarantee}
PER_STEP_APPROX = {"relative_error": relative_error_step_cost}  # the same (ε, δ) at every step, composed over T


def cases():
    return [pytest.param(name, rel, id=f"{name}-{i}") for name, rels in RELEASES.items() for i, rel in enumerate(rels)]


def test_every_registered_kind_is_checked_here():
    """A new kind must come with its independent cost check above (and a configuration case)."""
    assert set(kinds()) == set(RELEASES) == set(ZCDP_COST) | set(APPROX_GUARANTEE) | set(PER_STEP_APPROX)


def test_the_configuration_union_is_the_registry():
    tags = {model.model_fields["type"].annotation.__args__[0] for model in Release.__origin__.__args__}
    assert tags == set(kinds())


@pytest.mark.parametrize("name,rel_cfg", cases())
def test_declared_events_are_the_cost_of_the_noise_drawn(name, rel_cfg):
    dep = deployment(rel_cfg)
    rel = dep.release("r")
    allot = dep.budget_plan().allotments()["r"]
    engine = ReleaseEngine(dep, N)
    mech = engine.mechanisms["r"]
    events = engine.events["r"]
    assert len(events) == T
    if name in ZCDP_COST:
        expected = ZCDP_COST[name](rel, mech)
        for got, want in zip(events, expected):
            if want is None:
                assert got is None
            else:
                assert isinstance(got, ZCDP) and got.rho == pytest.approx(want.rho, rel=1e-12)
        total = sum(e.rho for e in events if e is not None)
        assert total == pytest.approx(allot.rho, rel=1e-12)  # the horizon's events are the allotment
        assert total <= allot.rho * (1 + 1e-12)
    elif name in PER_STEP_APPROX:
        want = PER_STEP_APPROX[name](rel, mech)
        assert all(isinstance(e, ApproxDP) and e == want for e in events)
        # basic composition over the horizon stays within the allotment (each step's target is 1/T of it)
        assert T * want.epsilon <= allot.epsilon * (1 + 1e-9) and T * want.delta <= allot.delta * (1 + 1e-9)
    else:
        first, rest = events[0], events[1:]
        assert first == allot and all(e is None for e in rest)  # whole horizon, charged at step 1
        guarantee = APPROX_GUARANTEE[name](rel, mech, allot.delta)
        assert guarantee.epsilon == pytest.approx(first.epsilon, rel=1e-6)  # calibrated to the charge
        assert guarantee.epsilon <= first.epsilon * (1 + 1e-12)
        assert guarantee.delta <= first.delta * (1 + 1e-12)


@pytest.mark.parametrize("name,rel_cfg", cases())
def test_plan_and_ledger_charge_the_declared_events(name, rel_cfg):
    dep = deployment(rel_cfg)
    allot = dep.budget_plan().allotments()["r"]
    engine = ReleaseEngine(dep, N)
    assert planned_events(dep, dep.release("r"), allot) == engine.events["r"]
    value = [0.0 if e is None else (e.rho if isinstance(e, ZCDP) else e.epsilon) for e in engine.events["r"]]
    np.testing.assert_array_equal(planned_schedule(dep)["r"], value)
    # restored from state, the engine declares the same events for the restored mechanism
    restored = ReleaseEngine.from_state(dep, engine.get_state())
    assert restored.events["r"] == engine.events["r"]


def _partials(dep, step):
    """Every user holds code 0 and never reports 1 (the values do not matter to the charges)."""
    rel = dep.release("r")
    size = dep.attributes[rel.attribute].size
    if rel.type == "fixed_window":
        counts = None
        if step >= rel.window:
            counts = np.zeros(size ** rel.window, dtype=np.int64)
            counts[0] = N
        part = {"counts": counts}
    elif rel.type == "cumulative":
        part = {"z": np.zeros(T + 1, dtype=np.int64)}
    elif rel.type == "heavy_hitters":
        part = {"elements": np.zeros(1, np.int64), "counts": np.full(1, N, np.int64)}
    elif rel.type == "relative_error":  # the histogram of current values: everyone on code 0
        counts = np.zeros(size, dtype=np.int64)
        counts[0] = N
        part = {"counts": counts}
    else:
        part = {"count": 0}
    return [{"users": N, "releases": {"r": part}}]


@pytest.mark.parametrize("name,rel_cfg", cases())
def test_the_ledger_records_the_events_step_by_step(name, rel_cfg):
    dep = deployment(rel_cfg)
    engine = ReleaseEngine(dep, N)
    for t in range(1, T + 1):
        engine.release(t, _partials(dep, t))
    charged = {e.step: e.cost for e in engine.ledger.entries}
    assert charged == {t: e for t, e in enumerate(engine.events["r"], start=1) if e is not None}


def test_fixed_window_draws_noise_of_the_declared_variance():
    """The σ² the event is computed from is the variance of the noise in the published counts:
    Ĉ − C − pad over 4³ bins × 38 update steps of a zero histogram. The discrete Gaussian's variance is
    σ²(1 − O(e^{−2π²σ²})) (Canonne, Kamath, Steinke 2020, Proposition 19), so the sample variance of
    m = 2432 draws has relative sd √(2/m) ≈ 0.029 (excess kurtosis 0); 5 sd = 0.14 — a noise off by
    √2 in σ (twice the variance, half the charged ρ) is far outside."""
    horizon = 40
    dep = deployment({"type": "fixed_window", "attribute": "item", "window": 3}, horizon=horizon)
    mech = ReleaseEngine(dep, N).mechanisms["r"]
    counts = np.zeros(len(ITEMS) ** 3, dtype=np.int64)
    counts[0] = N
    noise = []
    for t in range(3, horizon + 1):
        mech.release_counts(counts)
        noise.append(mech.noisy_counts[t] - counts - mech.n_pad)
    noise = np.concatenate(noise)
    m = noise.size
    assert m == len(ITEMS) ** 3 * (horizon - 2)
    variance = float(np.mean(noise.astype(float) ** 2))
    assert abs(variance / mech.sigma2 - 1) < 5 * math.sqrt(2 / m)
    rho_of_noise = replace_delta2() / (2 * variance)
    declared = ReleaseEngine(dep, N).events["r"][2].rho
    assert abs(rho_of_noise / declared - 1) < 6 * math.sqrt(2 / m)


def test_mechanism_setting_is_what_the_engine_builds_from():
    dep = deployment(RELEASES["heavy_hitters"][1])
    allot = dep.budget_plan().allotments()["r"]
    setting = mechanism_setting(dep, dep.release("r"), allot, N)
    assert ReleaseEngine(dep, N).settings["r"] == setting
    assert setting.domain_size == 1000 and setting.horizon == T and setting.allotment == allot


# --- attribute types own their domain (pipeline.attributes) ----------------------------------------

def attributes():
    return deployment(RELEASES["band_monitor"][0]).attributes


@pytest.mark.parametrize("name", ["pov", "item", "text"])
def test_wire_values_decode_to_the_same_codes(name):
    attr = attributes()[name]
    codes = np.array([0, 1, 1, 0, attr.size - 1])
    wire = attr.wire_values(codes)
    decode = attr.decoder()
    assert [decode(v) for v in wire] == codes.tolist()
    assert list(attr.column_decoder()(wire + [None])) == codes.tolist() + [MISSING]


def test_out_of_domain_and_missing_markers():
    attrs = attributes()
    assert list(attrs["pov"].column_decoder()([2, "yes", None, True])) == [OUT_OF_DOMAIN, OUT_OF_DOMAIN, MISSING, 1]
    assert list(attrs["item"].column_decoder()(["e", 4, 2.0, None])) == [OUT_OF_DOMAIN, OUT_OF_DOMAIN, 2, MISSING]
    assert list(attrs["text"].column_decoder()(["x", 1000, None])) == [public_hash("x", 1000), OUT_OF_DOMAIN,
                                                                         MISSING]
    assert attrs["item"].decoder()(True) is None  # a bool is never a categorical code


def test_configured_values_and_public_labels():
    attrs = attributes()
    assert attrs["item"].code("c") == 2 and attrs["item"].code(1) == 1
    assert attrs["pov"].code("1") == 1 and attrs["pov"].code(0) == 0
    assert attrs["text"].code("x") == public_hash("x", 1000) and attrs["text"].code(7) == 7
    assert attrs["item"].in_domain("d") and not attrs["item"].in_domain("e") and not attrs["item"].in_domain(True)
    assert not attrs["pov"].in_domain("1") and attrs["pov"].in_domain(1)
    assert attrs["text"].in_domain("anything") and not attrs["text"].in_domain(1000)
    # labels only from the public domain: a hashed id without a dictionary entry gets none
    hx = public_hash("x", 1000)
    other = (hx + 1) % 1000
    assert attrs["text"].public_labels([hx, other]) == {str(hx): "x"}
    assert attrs["item"].public_labels([3]) == {"3": "d"}
    assert attrs["pov"].public_labels([1]) == {}
    assert attrs["item"].csv_value("7") == "7" and attrs["pov"].csv_value("1") == 1
