"""`dpstream plan` warns about a production deployment that closes on a deadline without a publish
delay, and the production template sets one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.config import parse_config
from pipeline.plan_report import deployment_warnings

TEMPLATE = Path(__file__).resolve().parents[1] / "deploy" / "config" / "dpstream.yaml"
CFG = {
    "name": "plan-warn", "production": True, "roster": {"size": 2000}, "horizon": 4,
    "attributes": {"poverty": {"type": "binary"}}, "budget": {"rho": 0.1},
    "random": {"kind": "secure"},
    "steps": {"close": "deadline", "deadline_seconds": 3600},
    "releases": [{"name": "quarterly", "type": "fixed_window", "attribute": "poverty", "window": 2,
                  "share": 1.0}],
}
WORDS = "without steps.publish_delay_seconds"


def plan_stderr(tmp_path, cfg) -> str:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, DPSTREAM_HOME=str(tmp_path / "home"))
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "plan", "--config", str(path)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_plan_warns_for_a_production_deadline_without_a_delay(tmp_path):
    expected = f"WARNING: production deployment closing on a deadline {WORDS}"
    assert expected in plan_stderr(tmp_path, CFG)


@pytest.mark.parametrize("change", [{"steps": {"close": "deadline", "deadline_seconds": 3600,
                                               "publish_delay_seconds": 60}},
                                    {"production": False},
                                    {"steps": {"close": "control"}}])
def test_no_warning_with_a_delay_or_outside_production_deadlines(change):
    assert deployment_warnings(parse_config(dict(CFG, **change))) == []


def test_production_template_sets_a_publish_delay():
    data = yaml.safe_load(TEMPLATE.read_text())
    dep = parse_config(data, source=str(TEMPLATE))
    assert dep.production and dep.steps.close == "deadline" and dep.steps.publish_delay_seconds > 0
    assert deployment_warnings(dep) == []
