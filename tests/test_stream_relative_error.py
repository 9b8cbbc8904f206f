"""A relative_error release through the real stream (embedded Tansu broker, real Redis, worker and
releaser processes) equals the library: each step's published histogram is
``pipeline.synth.prem.PREM`` (Ghazi et al., arXiv 2502.14809) fitted on that step's batch histogram —
imputed values included — with the per-step target (ε_r/T, δ_r/T) and the seed derivation
``step_seed(release_seed(deployment, release), t)``, bit for bit. The ledger holds the per-step event,
and ``dpstream query`` answers a group with the (ζ, α) interval from the published histogram."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.cli import main as cli_main
from pipeline.config import load_config
from pipeline.stream.local.cluster import LocalCluster
from pipeline.stream.local.driver import StepDriver
from pipeline.stream.local.embedded import EmbeddedServices
from pipeline.plan import release_seed
from pipeline.releases.codecs import columns_checksum
from pipeline.releases.relative_error import group_interval, step_seed
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.state.store import StateStore
from jobs.eval.testbed import write_panel_deployment
from pipeline.synth.prem import PREM
from pipeline.synth.prem_privacy import charged_plan, plan_privacy

N, T, CODES = 400, 3, 12
EPS, DELTA = 3.0, 3e-6
GROUPS = {"low": ["c0", "c1", "c2"], "mid": ["c3", "c4", 5, "c6"], "top": ["c11"], "rest": [7, 8, 9, 10]}


@pytest.fixture(scope="module")
def services():
    with EmbeddedServices() as svc:
        yield svc


def test_relative_error_stream_equals_library_prem(services, tmp_path, capsys):
    values = [f"c{i}" for i in range(CODES)]
    path = write_panel_deployment(
        tmp_path, services, "e2e-relative-error", n=N, horizon=T, seed=23,
        attributes={"occ": {"type": "categorical", "values": values}},
        budget={"epsilon": EPS, "delta": DELTA},
        imputation={"rule": "carry_forward", "default": {"occ": "c0"}},
        releases=[{"name": "occ-groups", "type": "relative_error", "attribute": "occ", "share": 1.0,
                   "queries": "groups", "groups": GROUPS}])
    dep = load_config(path)
    rng = np.random.default_rng(8)
    X = rng.choice(CODES, size=(N, T), p=np.linspace(1, 3, CODES) / np.linspace(1, 3, CODES).sum())
    present = rng.random((N, T)) > 0.1
    present[:, 0] |= np.arange(N) % 2 == 0  # half of the step-1 absentees have nothing to carry: default c0
    with LocalCluster(path, dep, workers=2, log_dir=tmp_path / "logs") as cluster:
        drv = StepDriver(cluster.broker, dep, Roster.from_config(dep.roster), cluster.names, cluster=cluster)
        for t in range(1, T + 1):
            drv.producer.send_step(t, {"occ": X[:, t - 1]}, present=present[:, t - 1])
            drv.close(t)
        drv.shutdown()
        cluster.check_alive()

    # the batch panel the workers saw: carry-forward, the default c0 when nothing to carry
    seen = np.zeros_like(X)
    for t in range(T):
        previous = seen[:, t - 1] if t else np.zeros(N, dtype=X.dtype)
        seen[:, t] = np.where(present[:, t], X[:, t], previous)
    codes = [[values.index(v) if isinstance(v, str) else v for v in g] for g in GROUPS.values()]
    plan = charged_plan(CODES, len(GROUPS), 0.1, EPS / T, DELTA / T, 0.05)
    panel = drv.panels.panels["occ-groups"]
    assert panel.released_through == T
    for t in range(1, T + 1):
        prem = PREM(CODES, codes, 0.1, EPS / T, DELTA / T, beta=0.05, accounting="charged", plan=plan,
                    seed=step_seed(release_seed(dep, "occ-groups"), t))
        truth = np.bincount(seen[:, t - 1], minlength=CODES)
        expected = prem.fit(truth)
        np.testing.assert_array_equal(panel.histograms[t], expected)
        manifest = panel.manifests[t]
        assert manifest["synthetic"]["sha256"] == columns_checksum(expected)
        params = manifest["parameters"]
        assert (params["zeta"], params["alpha"], params["beta"], params["n_queries"]) == (0.1, prem.alpha, 0.05, 4)
        assert manifest["privacy"]["step_cost"] == {"epsilon": plan_privacy(plan).epsilon,
                                                    "delta": plan_privacy(plan).delta}

    # one ledger entry per step, each the per-step event; T of them are the allotment
    ledger = StateStore.from_url(services.redis.url, dep.name).ledger()
    assert sorted(ledger) == [f"occ-groups:{t}" for t in range(1, T + 1)]
    assert all(e["cost"]["epsilon"] == plan_privacy(plan).epsilon for e in ledger.values())
    assert sum(e["cost"]["epsilon"] for e in ledger.values()) == pytest.approx(EPS, rel=1e-9)

    # dpstream query: a group's count and its interval, read from the topics
    capsys.readouterr()
    assert cli_main(["query", "--config", path, "--release", "occ-groups", "--step", "2", "--group", "mid", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)["answers"][0]
    estimate = float(panel.histograms[2][[3, 4, 5, 6]].sum())
    assert answer["estimate"] == estimate
    assert answer["interval"] == list(group_interval(estimate, 0.1, panel.manifests[2]["parameters"]["alpha"], N))
    assert cli_main(["query", "--config", path, "--release", "occ-groups", "--step", "2", "--group", "nope"]) == 2
    assert "no group 'nope'" in capsys.readouterr().err
