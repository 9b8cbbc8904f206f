"""The cumulative release's charged schedule follows its counter, and equals what the counters draw.

The plan charges counter b's whole ρ_b at step b (pipeline.plan.step_cost). For that to be honest
the ρ_b must be the one each counter is calibrated to: here it is recomputed from the σ² the
engine's counters actually sample with (Δ²/(2σ²), Canonne, Kamath & Steinke 2020, Theorem 14 for
the lattice factorization; ρ/L per node-level for the tree, tree.py) and compared with the ledger.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import parse_config
from pipeline.plan import planned_schedule
from pipeline.stream.releaser.engine import ReleaseEngine
from pipeline.synth.cumulative import counter_weights

N, T = 30, 7


def deployment(counter=None, neighbours="replace"):
    """A stream deployment (the configuration accepts replace only; the add_remove split is the
    library's, checked through the synthesizer below)."""
    rel = {"name": "cu", "type": "cumulative", "attribute": "pov", "share": 1.0}
    if counter is not None:
        rel["counter"] = counter
    return parse_config({
        "name": "plan", "roster": {"size": N}, "horizon": T, "neighbours": neighbours,
        "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 0.3},
        "random": {"kind": "seeded", "seed": 5}, "releases": [rel],
    })


def drawn_rho(counter) -> float:
    """The zCDP cost implied by the σ² the counter samples with and its sensitivity."""
    if hasattr(counter, "sensitivity2"):
        return counter.sensitivity2 / (2 * counter.sigma2)
    # tree: Σ_nodes c² ≤ L (add_remove) or 2L (replace), each node N_Z(0, σ²)
    factor = 1 if counter.neighbours == "add_remove" else 2
    return factor * counter.levels / (2 * counter.sigma2)


def test_default_counter_is_the_factorization_and_stated_in_the_manifest():
    """The default ``auto`` resolves to the square-root factorization at this horizon (≤ 1024 steps)."""
    dep = deployment()
    assert dep.release("cu").counter == "auto"
    engine = ReleaseEngine(dep, N)
    out = engine.release(1, [{"users": N, "releases": {"cu": {"z": np.r_[0, 4, np.zeros(T - 1, int)]}}}])
    assert out[0].manifest["parameters"]["counter"] == "factorization"


@pytest.mark.parametrize("counter", ["tree", "factorization", "blt"])
def test_charged_rho_equals_the_noise_each_counter_draws(counter):
    neighbours = "replace"
    dep = deployment(counter, neighbours)
    sched = planned_schedule(dep)["cu"]
    engine = ReleaseEngine(dep, N)
    counters = engine.mechanisms["cu"].counters
    drawn = np.array([drawn_rho(c) for c in counters])
    np.testing.assert_allclose(sched, drawn, rtol=1e-9)
    assert np.all(drawn <= sched * (1 + 1e-12))
    w = counter_weights(T, counter, neighbours)
    np.testing.assert_allclose(sched, 0.3 * w / w.sum(), rtol=1e-12)
    # and the ledger records exactly that schedule as the steps are released
    for t in range(1, T + 1):
        z = np.zeros(T + 1, dtype=np.int64)
        engine.release(t, [{"users": N, "releases": {"cu": {"z": z}}}])
    charged = [e.cost.rho for e in engine.ledger.entries]
    np.testing.assert_allclose(charged, sched, rtol=1e-12)


@pytest.mark.parametrize("counter", ["tree", "factorization"])
def test_add_remove_split_equals_the_noise_each_counter_draws(counter):
    """Batch use (add_remove, the paper's constants): the synthesizer's ρ_b are the counters' ρ."""
    from pipeline.synth.cumulative import CumulativeSynthesizer

    syn = CumulativeSynthesizer(T, 0.3, seed=0, counter=counter)
    drawn = np.array([drawn_rho(c) for c in syn.counters])
    np.testing.assert_allclose(syn.rhos, drawn, rtol=1e-9)
    w = counter_weights(T, counter, "add_remove")
    np.testing.assert_allclose(syn.rhos, 0.3 * w / w.sum(), rtol=1e-12)


def test_the_split_differs_between_counters():
    tree, fact = planned_schedule(deployment("tree"))["cu"], planned_schedule(deployment("factorization"))["cu"]
    assert tree.sum() == pytest.approx(fact.sum()) and not np.allclose(tree, fact)


@pytest.mark.parametrize("counter", ["tree", "factorization"])
def test_engine_release_equals_batch_reference_for_each_counter(counter):
    """The releaser-side counter is the only change: the workers' z_b counts are the same, and the
    engine's synthetic panel equals the library run (batch_reference) bit for bit."""
    from pipeline.stream.releaser.engine import batch_reference

    dep = deployment(counter)
    X = np.random.default_rng(3).integers(0, 2, size=(N, T))
    engine = ReleaseEngine(dep, N)
    weights = np.zeros(N, dtype=np.int64)
    for t in range(1, T + 1):
        ones = X[:, t - 1] == 1
        z = np.bincount(weights[ones] + 1, minlength=T + 1).astype(np.int64)
        weights += X[:, t - 1]
        out = engine.release(t, [{"users": N, "releases": {"cu": {"z": z}}}])
        assert out[0].manifest["parameters"]["counter"] == counter
    ref = batch_reference(dep, {"pov": X})["cu"]
    np.testing.assert_array_equal(engine.mechanisms["cu"].synthetic, ref)
