"""`dpstream plan --sweep` and `--target` through the command line, each point checked against a
plain `dpstream plan --json` of a configuration file written with that value."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from support.cli import dpstream as cli_dpstream

CFG = {
    "name": "plan-search", "roster": {"size": 5000}, "horizon": 6,
    "attributes": {"poverty": {"type": "binary"}},
    "budget": {"rho": 0.05}, "random": {"kind": "seeded", "seed": 1},
    "releases": [
        {"name": "quarterly", "type": "fixed_window", "attribute": "poverty", "window": 2, "share": 0.5},
        {"name": "cumulative", "type": "cumulative", "attribute": "poverty", "share": 0.5}],
}


def dpstream(*args, env, check=True):
    return cli_dpstream(*args, env=env, timeout=300, check=check)  # a search runs longer


@pytest.fixture
def setup(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(CFG))
    return path, dict(os.environ, DPSTREAM_HOME=str(tmp_path / "home"))


def plain_shares(tmp_path, env, rho: float) -> dict[str, float]:
    """Each release's largest bound as a share of n from `dpstream plan --json` at this ρ."""
    path = tmp_path / f"rho-{rho!r}.yaml"
    path.write_text(yaml.safe_dump(dict(CFG, budget={"rho": rho})))
    report = json.loads(dpstream("plan", "--config", str(path), "--json", env=env).stdout)
    return {name: r["as_share_of_n"] for name, r in report["releases"].items()}


def test_sweep_table_matches_one_plan_per_value(setup, tmp_path):
    path, env = setup
    sweep = ("plan", "--config", str(path), "--sweep", "budget.rho=0.005,0.01,0.02")
    text = dpstream(*sweep, env=env).stdout
    assert text.count("\n| 0.0") == 3 and "In words: quarterly's bound goes from" in text
    out = json.loads(dpstream(*sweep, "--json", env=env).stdout)
    assert [p["value"] for p in out["points"]] == [0.005, 0.01, 0.02]
    for p in out["points"]:
        assert p["shares"] == pytest.approx(plain_shares(tmp_path, env, p["value"]), rel=1e-12)
    shares = [p["shares"]["quarterly"] for p in out["points"]]
    assert shares[0] > shares[1] > shares[2]  # more budget, smaller bound


def test_sweep_row_for_a_refused_value_says_why(setup):
    path, env = setup
    text = dpstream("plan", "--config", str(path), "--sweep", "budget.rho=0.01,500", env=env).stdout
    assert "| 500 | refused:" in text and "above the ceiling" in text


def test_target_is_the_smallest_budget_meeting_the_share(setup, tmp_path):
    path, env = setup
    target = ("plan", "--config", str(path), "--target", "quarterly=0.03")
    out = json.loads(dpstream(*target, "--json", env=env).stdout)
    rho = out["value"]
    assert out["key"] == "budget.rho" and rho is not None
    assert plain_shares(tmp_path, env, rho)["quarterly"] <= 0.03
    # a little less budget misses it
    assert plain_shares(tmp_path, env, rho / 1.002)["quarterly"] > 0.03
    text = dpstream(*target, env=env).stdout
    assert "the smallest budget.rho at which its a-priori bound is within 3.00% of n" in text


def test_target_out_of_reach_and_bad_arguments(setup):
    path, env = setup
    text = dpstream("plan", "--config", str(path), "--target", "quarterly=0.00001", env=env).stdout
    assert "no budget.rho up to" in text and "brings its bound within" in text
    for args, words in ((("--sweep", "budget.rho"), "--sweep must look like"),
                        (("--sweep", "budget.rho=a,b"), "--sweep values must be numbers"),
                        (("--target", "nope=0.1"), "no release named 'nope'"),
                        (("--target", "quarterly=2"), "share must be in (0, 1)"),
                        (("--sweep", "budget.rho=0.1", "--target", "quarterly=0.1"), "not both")):
        proc = dpstream("plan", "--config", str(path), *args, env=env, check=False)
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.stderr)
