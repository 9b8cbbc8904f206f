"""Deployment configuration (pipeline.config) and the budget plan / spend schedule (pipeline.plan).

Every validation rule is exercised through ``parse_config`` and the message is checked to name
the offending key, because that message is all an operator sees when ``dpstream`` refuses a file.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.config import ConfigError, Deployment, load_config, parse_config
from pipeline.plan import planned_schedule, step_cost
from pipeline.privacy.errors import BudgetExceededError
from pipeline.privacy.events import ApproxDP, ZCDP
from pipeline.privacy.neighbours import Neighbours
from pipeline.synth.cumulative import CumulativeSynthesizer, counter_weights

CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"


def base() -> dict:
    """A small valid deployment with one attribute of every kind and a zCDP and (ε, δ) budget."""
    return {
        "name": "unit",
        "roster": {"source": "range", "size": 50},
        "horizon": 6,
        "attributes": {
            "poverty": {"type": "binary"},
            "status": {"type": "categorical", "values": ["employed", "unemployed", "inactive"]},
            "query": {"type": "hashed", "size": 1024, "dictionary": {3: "flu"}},
        },
        "budget": {"rho": 1.0, "epsilon": 2.0, "delta": 1e-6},
        "releases": [
            {"name": "fw", "type": "fixed_window", "attribute": "poverty", "window": 3, "share": 0.5},
            {"name": "cu", "type": "cumulative", "attribute": "poverty", "share": 0.5},
            {"name": "hh", "type": "heavy_hitters", "attribute": "query", "share": 0.5},
            {"name": "band", "type": "band_monitor", "attribute": "status", "value": "unemployed",
             "low": 1.0, "high": 10.0, "share": 0.5},
        ],
    }


def refused(cfg: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(cfg, source="unit.yaml")
    msg = str(info.value)
    assert msg.startswith("unit.yaml: "), msg  # the file is named too
    return msg


def names_key(msg: str, *path: str) -> bool:
    """True when ``msg`` names the dotted key ``path``; the release index may carry its name in
    parentheses (``releases.0 (fw).window``) as the cross-field checks write it."""
    pattern = r"\.".join(re.escape(p) + (r"(?: \([^)]*\))?" if p.isdigit() else "") for p in path)
    return re.search(r"(?<![\w.])" + pattern + r"(?![\w-])", msg) is not None


def test_base_is_valid_and_helper_is_strict():
    dep = parse_config(base())
    assert isinstance(dep, Deployment) and dep.n == 50
    assert names_key("x: releases.0 (fw).window: bad", "releases", "0", "window")
    assert names_key("x: releases.0.window: bad", "releases", "0", "window")
    assert not names_key("x: releases.0.windowed: bad", "releases", "0", "window")
    assert not names_key("x: releases.1.window: bad", "releases", "0", "window")


# --- shipped files -----------------------------------------------------------------------------

SHIPPED = sorted(CONFIG_DIR.glob("*.yaml"))


def test_there_are_shipped_configs():
    assert SHIPPED, "config/*.yaml is empty"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_config_loads_and_its_plan_fits(path):
    dep = load_config(path)
    plan = dep.budget_plan()  # raises if over budget
    allot = plan.allotments()
    assert set(allot) == {r.name for r in dep.releases}
    assert dep.n >= 1 and dep.horizon >= 1
    assert dep.random.kind == "secure" or not dep.production


def test_sipp_config_contents():
    dep = load_config(CONFIG_DIR / "sipp-poverty.yaml")
    assert dep.n == 23374 and dep.horizon == 12
    assert dep.release("poverty-quarterly").window == 3
    assert dep.release("poverty-cumulative").type == "cumulative"
    assert dep.budget.rho == pytest.approx(0.01)
    assert dep.random.kind == "secure"


# --- field-level rules (pydantic) -----------------------------------------------------------

@pytest.mark.parametrize("window", [0, -2])
def test_window_below_one(window):
    cfg = base()
    cfg["releases"][0]["window"] = window
    assert names_key(refused(cfg), "releases", "0", "window")


def test_window_above_horizon():
    cfg = base()
    cfg["releases"][0]["window"] = 7
    msg = refused(cfg)
    assert names_key(msg, "releases", "0", "window") and "exceeds horizon 6" in msg


def test_window_equal_to_horizon_is_fine():
    cfg = base()
    cfg["releases"][0]["window"] = 6
    assert parse_config(cfg).release("fw").window == 6


def test_error_names_the_right_release_index():
    cfg = base()
    cfg["releases"][1], cfg["releases"][0] = cfg["releases"][0], cfg["releases"][1]
    cfg["releases"][1]["window"] = 0
    msg = refused(cfg)
    assert names_key(msg, "releases", "1", "window") and not names_key(msg, "releases", "0", "window")


def test_unknown_field_in_release():
    cfg = base()
    cfg["releases"][2]["windw"] = 3
    msg = refused(cfg)
    assert names_key(msg, "releases", "2", "windw") and "Extra inputs" in msg


def test_unknown_top_level_key():
    cfg = base()
    cfg["horizn"] = 6
    assert names_key(refused(cfg), "horizn")


def test_unknown_nested_key():
    cfg = base()
    cfg["budget"]["rhoo"] = 1
    assert names_key(refused(cfg), "budget", "rhoo")


def test_unknown_release_type():
    cfg = base()
    cfg["releases"][0]["type"] = "fixed-window"
    msg = refused(cfg)
    assert "releases.0" in msg and "fixed-window" in msg


@pytest.mark.parametrize("share", [0, -0.1, 1.5])
def test_share_out_of_range(share):
    cfg = base()
    cfg["releases"][1]["share"] = share
    assert names_key(refused(cfg), "releases", "1", "share")


@pytest.mark.parametrize("beta", [0, 1, 1.5])
def test_beta_out_of_range(beta):
    cfg = base()
    cfg["releases"][0]["beta"] = beta
    assert names_key(refused(cfg), "releases", "0", "beta")


def test_release_name_pattern():
    cfg = base()
    cfg["releases"][0]["name"] = "has space"
    assert names_key(refused(cfg), "releases", "0", "name")


@pytest.mark.parametrize("name", [".", "..", "..."])
def test_deployment_name_of_dots_refused(name):
    cfg = base()
    cfg["name"] = name
    msg = refused(cfg)
    assert names_key(msg, "name") and "parent directory" in msg


def test_deployment_name_with_dots_and_letters_allowed():
    cfg = base()
    cfg["name"] = "survey.2026..q1"
    assert parse_config(cfg).name == "survey.2026..q1"


def test_horizon_bounds():
    cfg = base()
    cfg["horizon"] = 0
    assert names_key(refused(cfg), "horizon")


def test_categorical_values_distinct():
    cfg = base()
    cfg["attributes"]["status"]["values"] = ["a", "b", "a"]
    msg = refused(cfg)
    assert names_key(msg, "attributes", "status", "values") and "distinct" in msg


def test_categorical_needs_two_values():
    cfg = base()
    cfg["attributes"]["status"]["values"] = ["only"]
    assert names_key(refused(cfg), "attributes", "status", "values")


def test_hashed_size_at_least_two():
    cfg = base()
    cfg["attributes"]["query"]["size"] = 1
    assert names_key(refused(cfg), "attributes", "query", "size")


def test_hashed_dictionary_ids_inside_the_domain():
    cfg = base()
    cfg["attributes"]["query"]["dictionary"] = {5000: "flu"}
    assert names_key(refused(cfg), "attributes", "query", "dictionary")


def test_unknown_attribute_type():
    cfg = base()
    cfg["attributes"]["poverty"]["type"] = "boolean"
    msg = refused(cfg)
    assert "attributes.poverty" in msg


def test_error_names_attribute_called_like_a_type_tag():
    cfg = base()
    cfg["attributes"]["categorical"] = {"type": "categorical", "values": ["a", "a"]}
    # today: "unit.yaml: attributes.values: values must be distinct"
    assert names_key(refused(cfg), "attributes", "categorical", "values")


# --- cross-field rules -------------------------------------------------------------------------

def test_release_on_unknown_attribute():
    cfg = base()
    cfg["releases"][0]["attribute"] = "income"
    msg = refused(cfg)
    assert names_key(msg, "releases", "0", "attribute") and "'income'" in msg


def test_cumulative_on_categorical_attribute():
    cfg = base()
    cfg["releases"][1]["attribute"] = "status"
    msg = refused(cfg)
    assert names_key(msg, "releases", "1", "attribute") and "binary" in msg


def test_cumulative_on_hashed_attribute():
    cfg = base()
    cfg["releases"][1]["attribute"] = "query"
    assert names_key(refused(cfg), "releases", "1", "attribute")


def test_fixed_window_on_hashed_attribute():
    cfg = base()
    cfg["releases"][0]["attribute"] = "query"
    assert names_key(refused(cfg), "releases", "0", "attribute")


def test_fixed_window_on_categorical_attribute_is_fine():
    cfg = base()
    cfg["releases"][0]["attribute"] = "status"
    assert parse_config(cfg).release("fw").attribute == "status"


def test_fixed_window_too_many_bins():
    cfg = base()
    cfg["horizon"] = 30
    cfg["releases"][0]["window"] = 23  # 2^23 > 2^22
    msg = refused(cfg)
    assert names_key(msg, "releases", "0", "window") and "2^23" in msg
    cfg["releases"][0]["window"] = 22  # 2^22 is the limit, allowed
    parse_config(cfg)
    cfg["releases"][0].update(attribute="status", window=14)  # 3^14 > 2^22
    assert names_key(refused(cfg), "releases", "0", "window")


def test_band_monitor_value_outside_domain():
    cfg = base()
    cfg["releases"][3]["value"] = "retired"
    msg = refused(cfg)
    assert names_key(msg, "releases", "3", "value") and "'retired'" in msg


def test_band_monitor_on_hashed_attribute_takes_any_value():
    cfg = base()
    cfg["releases"][3].update(attribute="query", value="anything at all")
    parse_config(cfg)


@pytest.mark.parametrize("low,high", [(5.0, 1.0), (2.0, 2.0)])
def test_band_monitor_low_below_high(low, high):
    cfg = base()
    cfg["releases"][3].update(low=low, high=high)
    msg = refused(cfg)
    assert "releases.3" in msg and "low" in msg and "high" in msg


def test_duplicate_release_names():
    cfg = base()
    cfg["releases"][1]["name"] = "fw"
    msg = refused(cfg)
    assert "unique" in msg and "'fw'" in msg


def test_seeded_random_refused_in_production():
    cfg = base()
    cfg.update(production=True, random={"kind": "seeded", "seed": 1})
    msg = refused(cfg)
    assert names_key(msg, "random") and "production" in msg
    cfg["production"] = False
    assert parse_config(cfg).random.seed == 1
    cfg.update(production=True, random={"kind": "secure"})
    assert parse_config(cfg).production


def test_seeded_needs_seed_and_secure_refuses_seed():
    cfg = base()
    cfg["random"] = {"kind": "seeded"}
    assert names_key(refused(cfg), "random")
    cfg["random"] = {"kind": "secure", "seed": 3}
    assert names_key(refused(cfg), "random")


@pytest.mark.parametrize("budget", [{"rho": 1.0, "epsilon": 1.0}, {"rho": 1.0, "delta": 1e-6}])
def test_epsilon_and_delta_together(budget):
    cfg = base()
    cfg["budget"] = budget
    msg = refused(cfg)
    assert names_key(msg, "budget") and "epsilon and delta" in msg


def test_budget_needs_something():
    cfg = base()
    cfg["budget"] = {}
    assert names_key(refused(cfg), "budget")


@pytest.mark.parametrize("field,value", [("rho", 0), ("rho", -1), ("epsilon", 0), ("delta", 1.0), ("delta", -1e-9)])
def test_budget_values_positive(field, value):
    cfg = base()
    cfg["budget"][field] = value
    assert names_key(refused(cfg), "budget", field)


def test_zcdp_release_needs_rho():
    cfg = base()
    cfg["budget"] = {"epsilon": 1.0, "delta": 1e-6}
    msg = refused(cfg)
    assert "releases.0" in msg and "budget.rho" in msg


def test_monitor_release_needs_epsilon():
    cfg = base()
    cfg["budget"] = {"rho": 1.0}
    msg = refused(cfg)
    assert "releases.2" in msg and "budget.epsilon" in msg


def test_roster_rules():
    cfg = base()
    cfg["roster"] = {"source": "range"}
    assert names_key(refused(cfg), "roster")
    cfg["roster"] = {"source": "file"}
    assert names_key(refused(cfg), "roster")
    cfg["roster"] = {"source": "range", "size": 0}
    assert names_key(refused(cfg), "roster", "size")


def test_roster_from_file(tmp_path):
    f = tmp_path / "ids.txt"
    f.write_text("alice\n\nbob\ncarol\n")
    cfg = base()
    cfg["roster"] = {"source": "file", "path": str(f)}
    assert parse_config(cfg).n == 3


def test_deadline_close_needs_seconds():
    cfg = base()
    cfg["steps"] = {"close": "deadline"}
    assert names_key(refused(cfg), "steps")
    cfg["steps"] = {"close": "deadline", "deadline_seconds": 30}
    parse_config(cfg)


def test_close_on_exact_coverage_is_refused_naming_the_key_and_why():
    cfg = base()
    cfg["steps"] = {"close": "coverage"}
    msg = refused(cfg)
    assert names_key(msg, "steps", "close") and "who reported" in msg and "'deadline'" in msg
    for rule in ("control", "deadline"):
        cfg["steps"] = {"close": rule, "deadline_seconds": 5}
        assert parse_config(cfg).steps.close == rule


def test_publish_delay_non_negative():
    cfg = base()
    cfg["steps"] = {"publish_delay_seconds": -1}
    assert names_key(refused(cfg), "steps", "publish_delay_seconds")
    cfg["steps"] = {"publish_delay_seconds": 2.5}
    assert parse_config(cfg).steps.publish_delay_seconds == 2.5


def test_max_ahead_non_negative():
    cfg = base()
    cfg["steps"] = {"max_ahead": -1}
    assert names_key(refused(cfg), "steps", "max_ahead")


def test_imputation_default_unknown_attribute():
    cfg = base()
    cfg["imputation"] = {"rule": "default", "default": {"povrty": 0}}
    assert names_key(refused(cfg), "imputation", "default", "povrty")


def test_imputation_rule_values():
    cfg = base()
    cfg["imputation"] = {"rule": "interpolate"}
    assert names_key(refused(cfg), "imputation", "rule")


@pytest.mark.parametrize("attr,value", [("poverty", 5), ("status", "retired"), ("status", 7)])
def test_imputation_default_outside_domain(attr, value):
    cfg = base()
    cfg["imputation"] = {"rule": "default", "default": {attr: value}}
    assert names_key(refused(cfg), "imputation", "default", attr)


def test_topics_partitions_bounds():
    cfg = base()
    cfg["topics"] = {"partitions": 0}
    assert names_key(refused(cfg), "topics", "partitions")


def test_neighbours_values():
    cfg = base()
    cfg["neighbours"] = "swap"
    assert names_key(refused(cfg), "neighbours")


def test_neighbours_default_to_replace_and_add_remove_is_refused():
    """Fixed public roster + imputation: an absent user moves between bins, so a stream deployment's
    only relation is replace (docs/privacy.md); an explicit add_remove is refused, saying why."""
    assert parse_config(base()).neighbours is Neighbours.REPLACE
    cfg = base()
    cfg["neighbours"] = "replace"
    assert parse_config(cfg).neighbours is Neighbours.REPLACE
    cfg["neighbours"] = "add_remove"
    msg = refused(cfg)
    assert names_key(msg, "neighbours")
    assert "imputed" in msg and "roster" in msg and "replace" in msg and "docs/privacy.md" in msg


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_state_replace(path):
    assert yaml.safe_load(path.read_text())["neighbours"] == "replace"
    assert load_config(path).neighbours is Neighbours.REPLACE


def test_release_lookup():
    dep = parse_config(base())
    assert dep.release("hh").type == "heavy_hitters"
    with pytest.raises(KeyError, match="nope"):
        dep.release("nope")


def test_config_is_frozen():
    dep = parse_config(base())
    with pytest.raises(Exception):
        dep.horizon = 99


# --- loading files -----------------------------------------------------------------------------

def test_load_config_reports_bad_yaml(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(f)


def test_load_config_top_level_must_be_mapping(tmp_path):
    f = tmp_path / "list.yaml"
    f.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(f)


def test_load_config_names_file_and_key(tmp_path):
    cfg = base()
    cfg["releases"][0]["window"] = 0
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert str(f) in str(info.value) and names_key(str(info.value), "releases", "0", "window")


def test_load_config_refuses_over_budget_plan(tmp_path):
    cfg = base()
    cfg["releases"][1]["share"] = 0.9  # fw 0.5 + cu 0.9 of rho
    f = tmp_path / "over.yaml"
    f.write_text(yaml.safe_dump(cfg))
    with pytest.raises((ConfigError, BudgetExceededError)):
        load_config(f)


# --- budget plan ---------------------------------------------------------------------------------

def test_plan_refuses_rho_shares_above_one():
    cfg = base()
    cfg["releases"][1]["share"] = 0.6
    dep = parse_config(cfg)  # the config itself is valid; the plan is not
    with pytest.raises(BudgetExceededError) as info:
        dep.budget_plan()
    assert set(info.value.releases) == {"fw", "cu"}
    assert "fw" in str(info.value) and "cu" in str(info.value)
    assert "hh" not in info.value.releases  # the (ε, δ) releases fit


def test_plan_refuses_epsilon_shares_above_one():
    cfg = base()
    cfg["releases"][2]["share"] = 0.75
    dep = parse_config(cfg)
    with pytest.raises(BudgetExceededError) as info:
        dep.budget_plan()
    assert set(info.value.releases) == {"hh", "band"}
    assert "hh" in str(info.value) and "band" in str(info.value)


def test_plan_with_shares_summing_to_one_is_accepted():
    dep = parse_config(base())
    allot = dep.budget_plan().allotments()
    assert allot["fw"] == ZCDP(0.5) and allot["cu"] == ZCDP(0.5)
    assert allot["hh"].epsilon == pytest.approx(1.0) and allot["hh"].delta == pytest.approx(5e-7)
    assert isinstance(allot["band"], ApproxDP)


def test_plan_with_many_small_shares_summing_to_one():
    cfg = base()
    cfg["releases"] = [
        {"name": f"c{i}", "type": "cumulative", "attribute": "poverty", "share": 0.1} for i in range(10)
    ]
    parse_config(cfg).budget_plan()  # 10 × 0.1 sums to 1 up to rounding: accepted
    cfg["releases"].append({"name": "extra", "type": "cumulative", "attribute": "poverty", "share": 0.01})
    with pytest.raises(BudgetExceededError) as info:
        parse_config(cfg).budget_plan()
    assert "extra" in info.value.releases


# --- per-step schedule -----------------------------------------------------------------------

@pytest.mark.parametrize("horizon,window", [(6, 3), (6, 1), (6, 6), (12, 3)])
def test_fixed_window_schedule(horizon, window):
    cfg = base()
    cfg["horizon"] = horizon
    cfg["releases"][0]["window"] = window
    dep = parse_config(cfg)
    sched = planned_schedule(dep)["fw"]
    rho = 0.5
    R = horizon - window + 1
    assert sched.shape == (horizon,)
    assert np.all(sched[: window - 1] == 0)
    np.testing.assert_allclose(sched[window - 1 :], rho / R, rtol=1e-12)
    assert sched.sum() == pytest.approx(rho, rel=1e-12)
    allot = dep.budget_plan().allotments()["fw"]
    if window > 1:
        assert step_cost(dep, dep.release("fw"), window - 1, allot) is None
    assert step_cost(dep, dep.release("fw"), window, allot) == ZCDP(rho / R)


@pytest.mark.parametrize("horizon", [1, 2, 5, 6, 12, 33])
def test_cumulative_schedule_uses_appendix_b_weights(horizon):
    cfg = base()
    cfg["horizon"] = horizon
    cfg["releases"] = [cfg["releases"][1]]
    cfg["releases"][0]["share"] = 0.8
    cfg["releases"][0]["counter"] = "tree"  # the factorization's split: tests/test_counters_plan.py
    dep = parse_config(cfg)
    sched = planned_schedule(dep)["cu"]
    rho = 0.8
    # w_b = max(ceil(log2(T - b + 1)), 1)^3, written out independently of counter_weights
    w = np.array([max(int(np.ceil(np.log2(horizon - b + 1))) if horizon - b + 1 > 1 else 0, 1) ** 3
                  for b in range(1, horizon + 1)], dtype=float)
    np.testing.assert_allclose(counter_weights(horizon), w)
    np.testing.assert_allclose(sched, rho * w / w.sum(), rtol=1e-12)
    assert sched.sum() == pytest.approx(rho, rel=1e-12)
    # the ledger charges counter b's whole ρ_b at t = b: the mechanism's own allocation
    mech = CumulativeSynthesizer(horizon, rho, seed=1, n=5, counter="tree")
    np.testing.assert_allclose(sched, mech.rhos, rtol=1e-12)


def test_cumulative_schedule_small_horizon_by_hand():
    cfg = base()
    cfg["horizon"] = 4
    cfg["releases"] = [cfg["releases"][1]]
    cfg["releases"][0]["share"] = 1.0
    cfg["releases"][0]["counter"] = "tree"
    dep = parse_config(cfg)
    # T = 4: horizons 4, 3, 2, 1 -> ceil(log2) 2, 2, 1, 0 -> max(.,1)^3 = 8, 8, 1, 1
    np.testing.assert_allclose(planned_schedule(dep)["cu"], np.array([8, 8, 1, 1]) / 18.0)


def test_monitor_schedule_charges_everything_at_step_one():
    dep = parse_config(base())
    sched = planned_schedule(dep)
    assert sched["hh"][0] == pytest.approx(1.0) and np.all(sched["hh"][1:] == 0)
    assert sched["band"][0] == pytest.approx(1.0) and np.all(sched["band"][1:] == 0)
    allot = dep.budget_plan().allotments()
    assert step_cost(dep, dep.release("hh"), 1, allot["hh"]) == allot["hh"]
    assert step_cost(dep, dep.release("hh"), 2, allot["hh"]) is None


def test_schedule_of_every_release_sums_to_its_allotment():
    dep = load_config(CONFIG_DIR / "sipp-poverty.yaml")
    allot = dep.budget_plan().allotments()
    for name, sched in planned_schedule(dep).items():
        assert sched.sum() == pytest.approx(allot[name].rho, rel=1e-12), name
        assert np.all(sched >= 0)


def test_plan_does_not_import_the_configuration_module():
    """No config <-> plan import cycle: the configuration checks the budget plan itself
    (Deployment.budget_plan), the plan needs the configuration's types for annotations only."""
    import subprocess
    import sys

    code = "import sys, pipeline.plan; sys.exit('pipeline.config' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
    code = "import sys, pipeline.config; sys.exit('pipeline.plan' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_budget_above_the_epsilon_ceiling_needs_allow_large():
    """ρ = 500000 (ε ≈ 505,000 at report_delta) or ε = 1e9 is refused with the key named, unless
    budget.allow_large acknowledges it; allow_large is an acknowledgement, not calibration (not in the
    fingerprint), and `plan` shows it. (Before: both planned with exit 0.)"""
    from pipeline.config import EPSILON_CEILING
    from pipeline.plan_report import format_plan, plan_report
    from pipeline.stream.state.fingerprint import privacy_config

    for budget in ({"rho": 500000.0, "epsilon": 2.0, "delta": 1e-6}, {"rho": 1.0, "epsilon": 1e9, "delta": 1e-6}):
        cfg = base()
        cfg["budget"] = budget
        msg = refused(cfg)
        assert names_key(msg, "budget") and f"above the ceiling ε = {EPSILON_CEILING:g}" in msg
        assert "budget.allow_large: true" in msg
    cfg = base()
    cfg["budget"] = {"rho": 1.0, "epsilon": 2.5, "delta": 1e-6}  # 7.77 + 2.5 = 10.27 > 10: just above
    assert "above the ceiling" in refused(cfg)
    cfg["budget"]["allow_large"] = True
    dep = parse_config(cfg)
    assert dep.budget.total_epsilon() > EPSILON_CEILING
    cfg["releases"] = cfg["releases"][:2]  # plan the zCDP pair only (fast)
    cfg["budget"] = {"rho": 50.0, "allow_large": True}
    text = format_plan(plan_report(parse_config(cfg)))
    assert "budget.allow_large: true" in text and "it is above it" in text
    ids = [f"u{i}" for i in range(50)]
    plain = dict(cfg, budget={"rho": 0.5})
    flagged = dict(cfg, budget={"rho": 0.5, "allow_large": True})
    assert privacy_config(parse_config(plain), ids) == privacy_config(parse_config(flagged), ids)
