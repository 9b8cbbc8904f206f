"""The command line as an operator uses it: `dpstream up` in one terminal, then produce, close,
status, query and export from another (real embedded broker and Redis, real processes)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

N, T = 800, 4


def dpstream(*args, env, timeout=120, check=True):
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"dpstream {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


@pytest.fixture
def deployment(tmp_path):
    cfg = {
        "name": "cli-test",
        "roster": {"size": N},
        "horizon": T,
        "topics": {"partitions": 2},
        "attributes": {"poverty": {"type": "binary"}},
        "budget": {"rho": 0.5},
        "random": {"kind": "seeded", "seed": 3},
        "releases": [
            {"name": "quarterly", "type": "fixed_window", "attribute": "poverty", "window": 2, "share": 0.5},
            {"name": "cumulative", "type": "cumulative", "attribute": "poverty", "share": 0.5},
        ],
    }
    path = tmp_path / "cli.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, DPSTREAM_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    return path, env


def test_operator_workflow(deployment, tmp_path):
    path, env = deployment
    up = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "up", "--config", str(path), "--workers", "1",
                           "--log-dir", str(tmp_path / "logs")], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        banner = up.stdout.readline()
        assert "dpstream up: broker" in banner, banner
        # reports from a CSV file for step 1 (one row per user), the simulator for the others
        rows = [{"user": f"u{i}", "step": 1, "poverty": i % 2} for i in range(N)]
        with (tmp_path / "step1.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["user", "step", "poverty"])
            w.writeheader()
            w.writerows(rows)
        assert "sent 800 reports" in dpstream("produce", "--config", str(path), "--csv", str(tmp_path / "step1.csv"),
                                              env=env).stdout
        dpstream("close", "--config", str(path), "--step", "1", env=env)
        for t in range(2, T + 1):
            dpstream("produce", "--config", str(path), "--step", str(t), env=env)
            dpstream("close", "--config", str(path), "--step", str(t), env=env)
        deadline = time.monotonic() + 90
        while True:
            status = json.loads(dpstream("status", "--config", str(path), env=env).stdout)
            if status["released_step"] == T or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert status["released_step"] == T and status["published_step"] == T
        assert len(status["ledger"]) == (T - 1) + T  # window 2: steps 2..T; cumulative: every step
        assert sum(e["cost"]["rho"] for e in status["ledger"].values()) == pytest.approx(0.5)

        q = json.loads(dpstream("query", "--config", str(path), "--release", "quarterly", "--step", "2",
                                env=env).stdout)
        qd = json.loads(dpstream("query", "--config", str(path), "--release", "quarterly", "--step", "2",
                                 "--debias", env=env).stdout)
        assert len(q["counts"]) == 4 and all(a > b for a, b in zip(q["counts"], qd["counts"]))
        c = json.loads(dpstream("query", "--config", str(path), "--release", "cumulative", "--step", str(T),
                                env=env).stdout)
        assert c["at_least"][0] == N and all(x >= y for x, y in zip(c["at_least"], c["at_least"][1:]))

        out_csv, out_pq = tmp_path / "cum.csv", tmp_path / "cum.parquet"
        dpstream("export", "--config", str(path), "--release", "cumulative", "--out", str(out_csv), env=env)
        dpstream("export", "--config", str(path), "--release", "cumulative", "--out", str(out_pq), env=env)
        arr = np.loadtxt(out_csv, delimiter=",", skiprows=1, dtype=np.int64)
        assert arr.shape == (N, T + 1) and set(np.unique(arr[:, 1:])) <= {0, 1}
        table = pq.read_table(out_pq)
        assert table.num_rows == N and table.column_names == ["record"] + [f"step_{t}" for t in range(1, T + 1)]
        np.testing.assert_array_equal(np.column_stack([table[f"step_{t}"].to_numpy() for t in range(1, T + 1)]),
                                      arr[:, 1:])
        # the panel's counts are what the releases say (the consumer only post-processes)
        assert c["at_least"][1] == int((arr[:, 1:].sum(axis=1) >= 1).sum())
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=60)
    assert not (tmp_path / "home" / "cli-test.json").exists()  # `up` cleaned up after itself


def test_commands_without_a_running_deployment_fail_clearly(deployment):
    path, env = deployment
    proc = dpstream("status", "--config", str(path), env=env, check=False)
    assert proc.returncode == 2 and "no `dpstream up` is running" in proc.stderr
    proc = dpstream("close", "--config", str(path), "--step", "99", env=env, check=False)
    assert proc.returncode == 2 and "--step must be in 1..4" in proc.stderr
    proc = dpstream("plan", "--config", str(path) + ".missing", env=env, check=False)
    assert proc.returncode == 2 and "no such configuration file" in proc.stderr


def test_add_remove_deployment_is_refused_with_exit_code_2(deployment, tmp_path):
    """A stream deployment's relation is replace; `neighbours: add_remove` is a configuration error."""
    path, env = deployment
    cfg = yaml.safe_load(path.read_text())
    bad = tmp_path / "add_remove.yaml"
    bad.write_text(yaml.safe_dump(dict(cfg, neighbours="add_remove")))
    for command in (("plan", "--config", str(bad)), ("status", "--config", str(bad))):
        proc = dpstream(*command, env=env, check=False)
        assert proc.returncode == 2, proc.stderr
        assert "neighbours: add_remove is refused" in proc.stderr and "imputed" in proc.stderr
    assert dpstream("plan", "--config", str(path), env=env).returncode == 0  # the same file with replace runs
