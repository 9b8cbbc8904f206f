"""ReleaseEngine: the stream path (3 partitions -> partials -> engine) equals the library
synthesizers run in batch with the same derived seeds, bit for bit; restore mid-run; ledger;
manifests carry no true counts; budget exhaustion is refused before the mechanism runs."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from pipeline.config import parse_config
from pipeline.plan import planned_schedule, release_seed
from pipeline.privacy.errors import BudgetExceededError, BudgetExhaustedError
from pipeline.privacy.events import ZCDP
from pipeline.serialization import dumps_state, loads_state
from pipeline.releases.codecs import columns_checksum
from pipeline.releases.histograms import merge_histograms
from pipeline.stream.releaser.engine import ReleaseEngine, ReleaseOutput
from pipeline.stream.kafka.messages import synthetic_chunks
from pipeline.stream.ingest.partition_state import PartitionState
from pipeline.stream.ingest.reports import ReportParser
from pipeline.stream.ingest.roster import Roster
from pipeline.synth.cumulative import CumulativeSynthesizer
from pipeline.synth.fixed_window import FixedWindowSynthesizer
from support.stores import WritableStore

STATUS = ["employed", "unemployed", "inactive"]
N, T = 45, 6


def config(seed=2026, shares=(0.3, 0.3, 0.4), rho=2.0):
    return {
        "name": "eng",
        "roster": {"size": N},
        "horizon": T,
        "attributes": {"poverty": {"type": "binary"}, "status": {"type": "categorical", "values": STATUS}},
        "budget": {"rho": rho, "allow_large": True},  # ρ = 2 is ε ≈ 11.7 at δ = 1e-6: above the ceiling
        "random": {"kind": "seeded", "seed": seed},
        "steps": {"max_ahead": 1},
        "releases": [
            {"name": "fw", "type": "fixed_window", "attribute": "poverty", "window": 3, "share": shares[0]},
            {"name": "fw-status", "type": "fixed_window", "attribute": "status", "window": 2, "share": shares[1],
             "beta": 0.1},
            {"name": "cu", "type": "cumulative", "attribute": "poverty", "share": shares[2]},
        ],
    }


def panel(seed=1):
    """Reported values with gaps, and the carry-forward imputed matrices the releases see."""
    rng = np.random.default_rng(seed)
    pov = (rng.random((N, T)) < 0.35).astype(int)
    sta = rng.integers(0, 3, (N, T))
    miss = rng.random((N, T)) < 0.2
    X, S = pov.copy(), sta.copy()
    for i in range(N):
        lp = ls = 0
        for t in range(T):
            if miss[i, t]:
                X[i, t], S[i, t] = lp, ls
            lp, ls = X[i, t], S[i, t]
    return pov, sta, miss, X, S


def stream_partials(dep, pov, sta, miss, partitions=3):
    """Per step, the partials of ``partitions`` PartitionStates fed with JSON reports."""
    roster = Roster.from_range(N)
    parser = ReportParser(roster, dep.attributes, dep.horizon)
    states = [PartitionState(dep, p, roster.rows_of(p, partitions), N) for p in range(partitions)]
    out = []
    for t in range(1, T + 1):
        parts = []
        for st in states:
            raws = [orjson.dumps({"user": roster.ids[u], "step": t,
                                  "values": {"poverty": int(pov[u, t - 1]), "status": STATUS[sta[u, t - 1]]}})
                    for u in st.rows if not miss[u, t - 1]]
            parsed = parser.parse(raws)
            assert not parsed.rejections
            st.apply(parsed)
            parts.append(st.close(t))
        out.append(parts)
    return out


def strip(manifest):
    m = dict(manifest)
    m.pop("released_at")
    return m


@pytest.fixture(scope="module")
def run():
    dep = parse_config(config())
    pov, sta, miss, X, S = panel()
    partials = stream_partials(dep, pov, sta, miss)
    engine = ReleaseEngine(dep, N)
    outputs = [engine.release(t, partials[t - 1]) for t in range(1, T + 1)]
    return dep, X, S, partials, engine, outputs


def test_stream_equals_batch_synthesizers_bit_for_bit(run):
    dep, X, S, partials, engine, outputs = run
    allot = dep.budget_plan().allotments()
    fw = dep.release("fw")
    fws = dep.release("fw-status")
    batch = {
        "fw": FixedWindowSynthesizer(T, 3, allot["fw"].rho, beta=fw.beta, categories=2,
                                     neighbours=dep.neighbours, seed=release_seed(dep, "fw"), n=N),
        "fw-status": FixedWindowSynthesizer(T, 2, allot["fw-status"].rho, beta=fws.beta, categories=3,
                                            neighbours=dep.neighbours, seed=release_seed(dep, "fw-status"), n=N),
        "cu": CumulativeSynthesizer(T, allot["cu"].rho, beta=dep.release("cu").beta, neighbours=dep.neighbours,
                                    seed=release_seed(dep, "cu"), n=N),
    }
    data = {"fw": X, "fw-status": S, "cu": X}
    for t in range(1, T + 1):
        by_name = {o.release: o for o in outputs[t - 1]}
        assert list(by_name) == ["fw", "fw-status", "cu"]
        for name, mech in batch.items():
            cols = mech.update(data[name][:, t - 1])
            out = by_name[name]
            if out.columns is None:
                assert cols.size == 0, (name, t)
                continue
            assert out.columns.dtype == np.int8
            np.testing.assert_array_equal(out.columns, cols, err_msg=f"{name} step {t}")
            assert out.manifest["noisy_counts"] == mech.noisy_counts[t].tolist()
            if name == "cu":
                assert out.manifest["monotone_counts"] == mech.monotone_counts[t].tolist()
            else:
                assert out.manifest["projected_counts"] == mech.projected_counts[t].tolist()
                assert out.manifest["parameters"]["n_pad"] == mech.n_pad
    for name, mech in batch.items():
        np.testing.assert_array_equal(engine.mechanisms[name].synthetic, mech.synthetic)
    # column bookkeeping: the first window's k columns at t = k, then one column per step
    fw_steps = [o.column_steps for outs in outputs for o in outs if o.release == "fw"]
    assert fw_steps == [[], [], [1, 2, 3], [4], [5], [6]]
    assert [o.column_steps for outs in outputs for o in outs if o.release == "cu"] == [[t] for t in range(1, T + 1)]


def test_release_does_not_depend_on_the_number_of_partitions(run):
    dep, X, S, partials, engine, outputs = run
    pov, sta, miss, _, _ = panel()
    one = stream_partials(dep, pov, sta, miss, partitions=1)
    e1 = ReleaseEngine(dep, N)
    for t in range(1, T + 1):
        assert [p["users"] for p in one[t - 1]] == [N]
        for a, b in zip(e1.release(t, one[t - 1]), outputs[t - 1]):
            assert strip(a.manifest) == strip(b.manifest)
            if a.columns is None:
                assert b.columns is None
            else:
                np.testing.assert_array_equal(a.columns, b.columns)


def test_release_seed_is_derived_per_release():
    dep = parse_config(config(seed=5))
    seeds = {r.name: release_seed(dep, r.name) for r in dep.releases}
    assert len(set(seeds.values())) == 3 and all(0 <= s < 2**63 for s in seeds.values())
    assert seeds == {r.name: release_seed(parse_config(config(seed=5)), r.name) for r in dep.releases}
    assert release_seed(parse_config(config(seed=6)), "fw") != seeds["fw"]
    cfg = config()
    cfg["random"] = {"kind": "secure"}
    secure = parse_config(cfg)
    assert release_seed(secure, "fw") is None
    assert ReleaseEngine(secure, N).mechanisms["fw"].secure


def test_restore_mid_run_continues_identically(run):
    dep, X, S, partials, engine, outputs = run
    e = ReleaseEngine(dep, N)
    for t in (1, 2, 3, 4):
        e.release(t, partials[t - 1])
    blob = dumps_state(e.get_state())
    restored = ReleaseEngine.from_state(dep, loads_state(blob))
    assert restored.step == 4 and len(restored.ledger) == len(e.ledger)
    for t in (5, 6):
        a = e.release(t, partials[t - 1])
        b = restored.release(t, partials[t - 1])
        for x, y in zip(a, b):
            assert strip(x.manifest) == strip(y.manifest)
            np.testing.assert_array_equal(x.columns, y.columns)
    # and both equal the uninterrupted run
    for x, y in zip(outputs[5], b):
        assert strip(x.manifest) == strip(y.manifest)
        np.testing.assert_array_equal(x.columns, y.columns)
    for name in ("fw", "fw-status", "cu"):
        np.testing.assert_array_equal(restored.mechanisms[name].synthetic, engine.mechanisms[name].synthetic)
    assert [(x.release, x.step, x.cost) for x in restored.ledger.entries] == \
        [(x.release, x.step, x.cost) for x in engine.ledger.entries]


def test_restored_engine_refuses_to_redo_a_released_step(run):
    dep, X, S, partials, engine, outputs = run
    e = ReleaseEngine(dep, N)
    e.release(1, partials[0])
    restored = ReleaseEngine.from_state(dep, loads_state(dumps_state(e.get_state())))
    with pytest.raises(ValueError, match="next step to release is 2"):
        restored.release(1, partials[0])


def test_ledger_has_one_entry_per_release_and_spending_step(run):
    dep, X, S, partials, engine, outputs = run
    sched = planned_schedule(dep)
    keys = [(e.release, e.step) for e in engine.ledger.entries]
    assert len(keys) == len(set(keys))
    expected = {(name, t) for name, s in sched.items() for t in range(1, T + 1) if s[t - 1] > 0}
    assert set(keys) == expected
    assert len(keys) == (T - 3 + 1) + (T - 2 + 1) + T
    for e in engine.ledger.entries:
        assert e.cost.rho == pytest.approx(sched[e.release][e.step - 1], rel=1e-12)
    allot = dep.budget_plan().allotments()
    for name in sched:
        assert engine.ledger.spent_rho(name) == pytest.approx(allot[name].rho, rel=1e-9)
    assert engine.ledger.spent_rho() == pytest.approx(dep.budget.rho, rel=1e-9)
    # manifests report the same spend
    last = {o.release: o.manifest["privacy"] for o in outputs[-1]}
    assert last["cu"]["release_spent"]["rho"] == pytest.approx(allot["cu"].rho)
    assert last["cu"]["deployment_spent"]["rho"] == pytest.approx(dep.budget.rho)


FORBIDDEN = ("true", "reported", "coverage", "users", "weight", "real", "raw", "exact", "partial", "z")


def _keys(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"{path}.{k}", k
            yield from _keys(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _keys(v, f"{path}[{i}]")


def test_manifests_carry_no_true_counts(run):
    dep, X, S, partials, engine, outputs = run
    allowed_top = {"deployment", "instance", "release", "type", "attribute", "step", "horizon", "neighbours",
                   "released_at", "parameters", "status", "noisy_counts", "projected_counts", "monotone_counts",
                   "clamped_bins", "synthetic", "privacy"}
    for outs in outputs:
        for o in outs:
            assert set(o.manifest) <= allowed_top, set(o.manifest) - allowed_top
            for path, key in _keys(o.manifest):
                low = key.lower()
                assert not any(word == low or word in low.split("_") for word in FORBIDDEN), path
            assert o.manifest["neighbours"] == "replace"
            orjson.dumps(o.manifest)  # plain JSON
    # the released counts are the noisy ones, never the partials' sums
    t = T
    fw_true = np.sum([p["releases"]["fw"]["counts"] for p in partials[t - 1]], axis=0)
    fw_out = next(o for o in outputs[t - 1] if o.release == "fw")
    assert fw_out.manifest["noisy_counts"] != fw_true.tolist()
    assert fw_out.manifest["parameters"]["n_pad"] > 0


def test_manifest_synthetic_section_matches_columns(run):
    dep, X, S, partials, engine, outputs = run
    for outs in outputs:
        for o in outs:
            if o.columns is None:
                assert "synthetic" not in o.manifest and "status" in o.manifest
                continue
            syn = o.manifest["synthetic"]
            assert syn["columns"] == o.column_steps and syn["records"] == o.columns.shape[0]
            assert syn["sha256"] == columns_checksum(o.columns)
            assert syn["chunks"] == len(list(synthetic_chunks(o.release, o.step, o.column_steps, o.columns)))
            back = ReleaseOutput.from_bytes(o.to_bytes())
            assert back.manifest == o.manifest and back.column_steps == o.column_steps
            np.testing.assert_array_equal(back.columns, o.columns)


def test_stream_releases_are_calibrated_for_replace_and_say_so():
    """The deployment's relation is replace (the default; add_remove is refused at load), so each
    window histogram gets twice the add_remove variance and the manifest states the relation."""
    dep = parse_config(config())
    b = ReleaseEngine(dep, N)
    allot = b.allotments["fw"]
    add_remove = FixedWindowSynthesizer(T, 3, allot.rho, neighbours="add_remove", seed=0)
    assert b.mechanisms["fw"].sigma2 == pytest.approx(2 * add_remove.sigma2)
    assert b.mechanisms["fw"].parameters()["neighbours"] == "replace"
    assert b.mechanisms["cu"].parameters()["neighbours"] == "replace"


def test_engine_refuses_over_budget_plan():
    with pytest.raises(BudgetExceededError):
        ReleaseEngine(parse_config(config(shares=(0.5, 0.5, 0.5))), N)


def test_engine_refuses_bad_step_and_bad_coverage_before_spending(run):
    dep, X, S, partials, engine, outputs = run
    e = ReleaseEngine(dep, N)
    with pytest.raises(ValueError, match="next step to release is 1"):
        e.release(2, partials[1])
    with pytest.raises(ValueError, match="cover"):
        e.release(1, partials[0][:2])  # a partition's partial is missing
    assert len(e.ledger) == 0 and e.step == 0
    assert all(m.t == 0 for m in e.mechanisms.values())
    e.release(1, partials[0])  # still usable


def test_budget_exhausted_is_raised_before_the_mechanism_runs(run):
    dep, X, S, partials, engine, outputs = run
    e = ReleaseEngine(dep, N)
    for t in (1, 2, 3):
        e.release(t, partials[t - 1])
    allot = e.allotments["fw"].rho
    per_step = allot / (T - 3 + 1)
    # someone else's spend for this release sits in the ledger: step 4 would exceed the allotment
    e.ledger.record("fw", 0, ZCDP(allot - e.ledger.spent_rho("fw") - per_step / 2))
    before_state = dumps_state(e.mechanisms["fw"].get_state())
    t_before = {n: m.t for n, m in e.mechanisms.items()}
    entries = len(e.ledger)
    with pytest.raises(BudgetExhaustedError) as info:
        e.release(4, partials[3])
    assert info.value.release == "fw" and info.value.step == 4
    assert {n: m.t for n, m in e.mechanisms.items()} == t_before
    assert dumps_state(e.mechanisms["fw"].get_state()) == before_state  # no noise drawn
    assert len(e.ledger) == entries and not e.ledger.has("fw", 4) and e.step == 3


def test_budget_exhausted_on_a_later_release_leaves_the_engine_unchanged(run):
    dep, X, S, partials, engine, outputs = run
    e = ReleaseEngine(dep, N)
    for t in (1, 2, 3):
        e.release(t, partials[t - 1])
    cu_allot = e.allotments["cu"].rho
    sched = planned_schedule(dep)["cu"]
    e.ledger.record("cu", 0, ZCDP(cu_allot - e.ledger.spent_rho("cu") - sched[3] / 2))  # "cu" fails at step 4
    t_before = {n: m.t for n, m in e.mechanisms.items()}
    entries = len(e.ledger)
    with pytest.raises(BudgetExhaustedError):
        e.release(4, partials[3])
    assert {n: m.t for n, m in e.mechanisms.items()} == t_before  # today fw and fw-status moved to t = 4
    assert len(e.ledger) == entries


def test_engine_state_round_trip_through_redis_store(run, redis_client):
    """The releaser commits the engine state with the step record and resumes from latest_state()."""
    from pipeline.stream.state.store import StepRecord

    dep, X, S, partials, engine, outputs = run
    store = WritableStore(redis_client, dep.name)
    e = ReleaseEngine(dep, N)
    for t in (1, 2, 3):
        outs = e.release(t, partials[t - 1])
        ledger = {f"{x.release}:{x.step}": x.get_state() for x in e.ledger.entries if x.step == t}
        store.commit_step(StepRecord(t, {o.release: o.to_bytes() for o in outs}, dumps_state(e.get_state())), ledger)
    step, blob = store.latest_state()
    assert step == 3
    resumed = ReleaseEngine.from_state(dep, loads_state(blob))
    for t in (4, 5, 6):
        for x, y in zip(resumed.release(t, partials[t - 1]), outputs[t - 1]):
            assert strip(x.manifest) == strip(y.manifest)
            np.testing.assert_array_equal(x.columns, y.columns)
    # a committed step is republished from its record, identical to what was computed
    rec = store.load_step(2)
    for o in outputs[1]:
        back = ReleaseOutput.from_bytes(rec.releases[o.release])
        assert strip(back.manifest) == strip(o.manifest)


@pytest.mark.parametrize("domain", [50, 2**40])  # dense count and sort paths
def test_merge_histograms_sums_partitions_exactly(domain):
    rng = np.random.default_rng(4)
    parts, want = [], {}
    for _ in range(3):
        elements = np.unique(rng.integers(0, 50, 30)) * (domain // 50)
        counts = rng.integers(1, 10**6, elements.size)
        parts.append({"elements": elements.tolist(), "counts": counts.tolist()})
        for e, c in zip(elements.tolist(), counts.tolist()):
            want[e] = want.get(e, 0) + c
    parts.append({"elements": [], "counts": []})  # a partition with no active user
    support, summed = merge_histograms(parts, domain)
    assert support.tolist() == sorted(want) and summed.tolist() == [want[e] for e in sorted(want)]
    assert summed.dtype == np.int64


def test_released_at_is_the_public_close_time_not_the_computation_time(run):
    """Manifests are stamped with the step's public close time from the partials (the close
    markers'), so two releases of the same step computed at different moments are identical; a
    step whose markers carried no time gets no time."""
    dep, X, S, partials, engine, outputs = run
    closed = [1_700_000_000_000 + 60_000 * t for t in range(1, 4)]
    stamped = [[{**p, "closed_at": closed[t]} for p in partials[t]] for t in range(3)]
    stamped[2][1]["closed_at"] = closed[2] + 1500  # markers rewritten after a releaser restart: the latest
    runs = []
    for _ in range(2):
        e = ReleaseEngine(dep, N)
        runs.append([e.release(t + 1, stamped[t]) for t in range(3)])
    for t in range(3):
        want = (closed[t] + (1500 if t == 2 else 0)) / 1000
        for a, b in zip(runs[0][t], runs[1][t]):
            assert a.manifest["released_at"] == want and a.manifest == b.manifest
    assert all(o.manifest["released_at"] is None for o in outputs[0])  # unstamped partials


@pytest.mark.parametrize("values", [128, 300])
def test_wide_categorical_alphabet_is_published_without_wrapping(values):
    """A categorical attribute of 128 (int8 still holds 0..127) and 300 values (int16) through the
    engine, the chunk codec, the checksum and the consumer: what the consumer reads back equals the
    library synthesizer's columns (int8 would wrap 300 values)."""
    from pipeline.consumer import PanelStore
    from pipeline.stream.releaser.engine import batch_reference
    from pipeline.stream.ingest.reports import ParsedReports

    n, horizon = 60, 3
    dep = parse_config({
        "name": f"wide-{values}", "roster": {"size": n}, "horizon": horizon, "topics": {"partitions": 1},
        "attributes": {"code": {"type": "categorical", "values": [f"v{i}" for i in range(values)]}},
        "budget": {"rho": 1.0}, "random": {"kind": "seeded", "seed": 4},
        "releases": [{"name": "fw", "type": "fixed_window", "attribute": "code", "window": 1, "share": 1.0}],
    })
    X = np.random.default_rng(values).integers(0, values, size=(n, horizon))
    X[:20] = values - 1  # the largest code, held by many
    rows = np.arange(n)
    st = PartitionState(dep, 0, rows, n)
    engine, store = ReleaseEngine(dep, n), PanelStore()
    for t in range(1, horizon + 1):
        st.apply(ParsedReports.of_singles(rows, np.full(n, t), {"code": X[:, t - 1]}))
        (out,) = engine.release(t, [st.close(t)])
        assert out.manifest["synthetic"]["dtype"] == ("int8" if values <= 128 else "int16")
        store.add_manifest(orjson.dumps(out.manifest))
        for _, chunk in synthetic_chunks(out.release, t, out.column_steps, out.columns):
            store.add_chunk(chunk)
    ref = batch_reference(dep, {"code": X})["fw"]
    assert ref.max() == values - 1  # the top code is in the synthetic data
    np.testing.assert_array_equal(store.panels["fw"].as_array(), ref)
