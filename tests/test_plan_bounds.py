"""`dpstream plan` shows, before anything runs, each release's padding and the error bound its theorem
gives at the configured β, and the whole planned spend as (ε, δ). The numbers must be the ones the
mechanisms calibrate with: each is compared with a mechanism built here from the library class and
the release's share of the budget, and with the mechanism the releaser's engine builds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.config import load_config, parse_config
from pipeline.error_bounds import planned_spend, release_bounds, warnings
from pipeline.monitors import BandMonitor, ShiftingHeavyHitters
from pipeline.plan_report import format_plan, plan_report
from pipeline.privacy.conversions import zcdp_to_approx_dp
from pipeline.privacy.events import ApproxDP
from pipeline.releases.bounds import BAND_BETA
from pipeline.stream.releaser.engine import ReleaseEngine
from pipeline.synth.cumulative import CumulativeSynthesizer
from pipeline.synth.fixed_window import FixedWindowSynthesizer

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "config").glob("*.yaml"))


def mixed(rho=0.5, epsilon=4.0, n=5000, horizon=12) -> dict:
    """All four release types in one deployment (both budget kinds)."""
    return {
        "name": "plan-bounds", "roster": {"size": n}, "horizon": horizon,
        "attributes": {"pov": {"type": "binary"}, "status": {"type": "categorical", "values": ["a", "b", "c"]},
                       "item": {"type": "hashed", "size": 4096}},
        "budget": {"rho": rho, "epsilon": epsilon, "delta": 1e-6, "report_delta": 1e-7},
        "releases": [
            {"name": "fw", "type": "fixed_window", "attribute": "status", "window": 2, "share": 0.3, "beta": 0.1},
            {"name": "cu", "type": "cumulative", "attribute": "pov", "share": 0.7, "counter": "tree"},
            {"name": "hh", "type": "heavy_hitters", "attribute": "item", "method": "svt_restart", "k": 2,
             "share": 0.6, "beta": 0.02},
            {"name": "band", "type": "band_monitor", "attribute": "status", "value": "b", "low": 100, "high": 900,
             "share": 0.4},
        ],
    }


def library_bounds(cfg: dict) -> dict[str, dict[str, float]]:
    """The bounds of mechanisms built here from the library classes with share × budget."""
    b, T, out = cfg["budget"], cfg["horizon"], {}
    for rel in cfg["releases"]:
        beta = rel.get("beta", 0.05)
        if rel["type"] == "fixed_window":
            attr = cfg["attributes"][rel["attribute"]]
            A = 2 if attr["type"] == "binary" else len(attr["values"])
            m = FixedWindowSynthesizer(T, rel["window"], rel["share"] * b["rho"], beta=beta, categories=A,
                                       neighbours="replace")
            out[rel["name"]] = {"lambda": m.accuracy_bound, "sigma2": m.sigma2, "padding": m.n_pad}
        elif rel["type"] == "cumulative":
            m = CumulativeSynthesizer(T, rel["share"] * b["rho"], beta=beta, neighbours="replace",
                                      counter=rel.get("counter", "factorization"))
            out[rel["name"]] = {"error": m.error_bound()}
        elif rel["type"] == "heavy_hitters":
            m = ShiftingHeavyHitters(cfg["attributes"][rel["attribute"]]["size"], rel["share"] * b["epsilon"],
                                     rel["share"] * b["delta"], rel.get("k", 3), T, beta=beta,
                                     method=rel.get("method", "tct"))
            out[rel["name"]] = {"tau": m.tau, "threshold": m.threshold}
        else:
            m = BandMonitor.from_target(0, rel["share"] * b["epsilon"], rel["share"] * b["delta"])
            out[rel["name"]] = {"margin": m.utility_margin(T, BAND_BETA)}
    return out


def test_plan_bounds_equal_the_mechanisms_own():
    cfg = mixed()
    report = plan_report(parse_config(cfg))
    expected = library_bounds(cfg)
    for name, want in expected.items():
        got = report["releases"][name]
        for bound, value in want.items():
            shown = got["padding"] if bound == "padding" else got["bounds"][bound]
            assert shown == pytest.approx(value, rel=1e-12), (name, bound)
    assert report["releases"]["fw"]["beta"] == 0.1 and report["releases"]["hh"]["beta"] == 0.02
    assert report["releases"]["fw"]["padding"] > 0 and report["releases"]["cu"]["padding"] == 0
    assert report["warnings"] == []


def test_plan_bounds_are_those_of_the_mechanisms_the_releaser_runs():
    dep = parse_config(mixed())
    bounds = release_bounds(dep, dep.budget_plan().allotments(), dep.n)
    engine = ReleaseEngine(dep, dep.n).mechanisms
    assert bounds["fw"].bounds["lambda"] == engine["fw"].accuracy_bound and bounds["fw"].padding == engine["fw"].n_pad
    assert engine["fw"].parameters()["accuracy_bound"] == bounds["fw"].bounds["lambda"]  # what the manifest says
    assert bounds["cu"].bounds["error"] == engine["cu"].error_bound()
    assert bounds["hh"].bounds["tau"] == engine["hh"].tau and bounds["hh"].bounds["threshold"] == engine["hh"].threshold
    assert bounds["band"].bounds["margin"] == engine["band"].utility_margin(dep.horizon, BAND_BETA)


def test_a_smaller_budget_gives_larger_bounds():
    """Each bound grows as its budget shrinks (a plan printing constants would fail this)."""
    big, small = plan_report(parse_config(mixed())), plan_report(parse_config(mixed(rho=0.05, epsilon=1.0)))
    for name, key in (("fw", "lambda"), ("cu", "error"), ("hh", "tau"), ("band", "margin")):
        assert small["releases"][name]["bounds"][key] > big["releases"][name]["bounds"][key], name


def test_planned_total_is_rho_converted_plus_the_monitors():
    dep = parse_config(mixed())
    total = planned_spend(dep, dep.budget_plan().allotments())
    # ρ = 0.5 at report_delta = 1e-7 (CKS 2020 conversion), basic composition with the monitors' (4, 1e-6)
    assert total.epsilon == pytest.approx(zcdp_to_approx_dp(0.5, 1e-7) + 4.0, rel=1e-12)
    assert total.delta == pytest.approx(1e-7 + 1e-6, rel=1e-12)
    only_monitors = parse_config(dict(mixed(), budget={"epsilon": 2.0, "delta": 1e-6},
                                      releases=mixed()["releases"][2:]))
    assert planned_spend(only_monitors, only_monitors.budget_plan().allotments()) == ApproxDP(2.0, 1e-6)


def test_a_tiny_budget_warns_that_a_bound_exceeds_the_population():
    dep = parse_config(mixed(rho=1e-6, epsilon=1e-3))
    report = plan_report(dep)
    assert len(report["warnings"]) == 4  # one line per release
    for name, line in zip(("fw", "cu", "hh", "band"), report["warnings"]):
        assert f"release {name!r}" in line and "exceeds the population n = 5,000" in line and "\n" not in line
    # the warning compares the right number: λ just below n gives none
    bounds = release_bounds(dep, dep.budget_plan().allotments(), dep.n)
    lam = bounds["fw"].bounds["lambda"]
    assert any("'fw'" in w for w in warnings(bounds, int(lam) + 1)) is False
    assert any("'fw'" in w for w in warnings(bounds, int(lam) - 1))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_plan_without_warnings(path):
    report = plan_report(load_config(path))
    assert report["warnings"] == [], report["warnings"]


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, **kw)


def test_plan_command_prints_the_bounds_and_total(tmp_path):
    path = ROOT / "config" / "sipp-poverty.yaml"
    proc = _cli("plan", "--config", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr
    dep = load_config(path)
    report = plan_report(dep)
    for name, r in report["releases"].items():
        assert f"{name} ({r['type']})" in proc.stdout
    fw = FixedWindowSynthesizer(12, 3, 0.005, beta=0.05, categories=2, neighbours="replace")
    assert f"λ = {fw.accuracy_bound:,.2f}" in proc.stdout and f"{fw.n_pad} padding records" in proc.stdout
    cu = CumulativeSynthesizer(12, 0.005, beta=0.05, neighbours="replace")
    assert f"error bound = {cu.error_bound():,.2f}" in proc.stdout
    assert f"(ε, δ) = ({zcdp_to_approx_dp(0.01, 1e-6):.6g}, 1e-06)" in proc.stdout
    assert proc.stdout.strip() == format_plan(report)

    as_json = json.loads(_cli("plan", "--config", str(path), "--json").stdout)
    assert as_json["releases"]["poverty-quarterly"]["bounds"]["lambda"] == fw.accuracy_bound
    assert as_json["releases"]["poverty-quarterly"]["schedule"][2] == pytest.approx(0.005 / 10)


def test_plan_command_warns_for_a_tiny_budget(tmp_path):
    cfg = yaml.safe_load((ROOT / "config" / "live-heavy-hitters.yaml").read_text())
    cfg["budget"]["epsilon"] = 1e-3
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = _cli("plan", "--config", str(path))
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if line.startswith("WARNING:")]
    assert len(warned) == 2 and all("exceeds the population n = 100,000" in w for w in warned), proc.stderr
    assert "release 'item-heavy-hitters': tau = " in warned[0] and "release 'unemployment-band': margin = " in warned[1]


def test_status_spend_reports_and_never_refuses():
    """`dpstream status` reports what the ledger holds even if the configuration's budget is now
    smaller (an edited file): reporting is not spending."""
    from pipeline.error_bounds import spend_as_approx_dp
    from pipeline.privacy.events import ZCDP

    dep = parse_config(mixed(rho=0.5, epsilon=4.0))
    spent = spend_as_approx_dp(dep, [ZCDP(0.4), ZCDP(0.6), ApproxDP(1.0, 1e-6), ApproxDP(5.0, 1e-6)])
    assert spent.epsilon == pytest.approx(zcdp_to_approx_dp(1.0, 1e-7) + 6.0, rel=1e-12)
    assert spent.delta == pytest.approx(1e-7 + 2e-6, rel=1e-12)
