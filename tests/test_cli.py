"""The command line as an operator uses it: `dpstream up` in one terminal, then produce, close,
status, query and export from another (real embedded broker and Redis, real processes)."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from support.cli import N, T, deployment, dpstream, running  # noqa: F401 - a fixture

# 5 s group sessions (support.group_sessions): no check here depends on their length
pytestmark = pytest.mark.usefixtures("short_group_sessions")


def test_operator_workflow(deployment, tmp_path):
    path, env = deployment
    with running(path, env, tmp_path):
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
            dpstream("produce", "--simulate", "--config", str(path), "--step", str(t), env=env)
            dpstream("close", "--config", str(path), "--step", str(t), env=env)
        deadline = time.monotonic() + 90
        while True:
            status = json.loads(dpstream("status", "--config", str(path), "--json", env=env).stdout)
            if status["released_step"] == T or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert status["released_step"] == T and status["published_step"] == T
        assert len(status["ledger"]) == (T - 1) + T  # window 2: steps 2..T; cumulative: every step
        assert sum(e["cost"]["rho"] for e in status["ledger"].values()) == pytest.approx(0.5)
        # the spend so far as one (ε, δ): ρ = 0.5 converted at report_delta (default 1e-6), no monitors
        from pipeline.privacy.conversions import zcdp_to_approx_dp

        assert status["spent_as_approx_dp"] == {"epsilon": pytest.approx(zcdp_to_approx_dp(0.5, 1e-6), rel=1e-9),
                                                "delta": 1e-6}

        # --raw: the synthetic records' counts with the padding; the default is debiased (--debias still accepted)
        q = json.loads(dpstream("query", "--config", str(path), "--release", "quarterly", "--step", "2", "--raw",
                                "--json", env=env).stdout)
        qd = json.loads(dpstream("query", "--config", str(path), "--release", "quarterly", "--step", "2",
                                 "--debias", "--json", env=env).stdout)
        assert len(q["counts"]) == 4 and all(a > b for a, b in zip(q["counts"], qd["counts"]))
        c = json.loads(dpstream("query", "--config", str(path), "--release", "cumulative", "--step", str(T),
                                "--json", env=env).stdout)
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


@pytest.mark.parametrize("name", [".", ".."])
def test_dot_deployment_names_are_refused_before_anything_is_created(deployment, tmp_path, name):
    """The name is a directory under DPSTREAM_HOME: `..` would put the Redis data and the broker
    log in
    its parent (and narrow that directory to 0700). `up` refuses it with exit code 2, creating
    nothing."""
    path, env = deployment
    bad = tmp_path / "dots.yaml"
    bad.write_text(yaml.safe_dump(dict(yaml.safe_load(path.read_text()), name=name)))
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = dpstream("up", "--config", str(bad), "--log-dir", str(tmp_path / "logs"), env=env,
                    check=False)
    assert proc.returncode == 2, proc.stderr
    assert "name:" in proc.stderr and "parent directory" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no redis/, log/ or home beside it


def _jsonl(path, reports) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in reports))
    return str(path)


def test_never_release_silently_on_lost_data(deployment, tmp_path):
    """produce never runs ahead of the steps the workers accept; bad files are refused whole; close
    shows the intake counts and the spend, refuses several steps at once unless --force, and warns
    (never refuses: docs/privacy.md) about steps built mostly from imputation or with many rejections. (Before: `produce` sent every step at once,
    most of it dead-lettered as future_step, and `close --step T` released them from imputation.)"""
    path, env = deployment
    cfg = ["--config", str(path)]
    with running(path, env, tmp_path) as broker:
        assert "sent 800 simulated reports for step 1" in dpstream("produce", "--simulate", *cfg, env=env).stdout  # the next open step
        # a file with a misspelt attribute, then one with a bad line: nothing of either is sent
        bad = tmp_path / "bad.csv"
        bad.write_text("user,step,povrety\nu0,2,1\n")
        proc = dpstream("produce", *cfg, "--csv", str(bad), env=env, check=False)
        assert proc.returncode == 2 and f"nothing sent: {bad}:1: column 3 ('povrety')" in proc.stderr, proc.stderr
        half = [{"user": f"u{i}", "step": 2, "values": {"poverty": float(i % 2)}} for i in range(N // 2)]
        proc = dpstream("produce", *cfg, "--jsonl", _jsonl(tmp_path / "b.jsonl", half + ["oops"]), env=env, check=False)
        assert proc.returncode == 2 and f"b.jsonl:{N // 2 + 1}: column 1" in proc.stderr, proc.stderr
        assert "sent 400 reports for step 2" in dpstream("produce", *cfg, "--jsonl",
                                                         _jsonl(tmp_path / "half.jsonl", half), env=env).stdout
        proc = dpstream("produce", "--simulate", *cfg, "--step", "4", env=env, check=False)  # window 1..3 (max_ahead 2)
        assert proc.returncode == 3 and "future_step" in proc.stderr and "nothing sent" in proc.stderr
        status = json.loads(dpstream("status", *cfg, "--json", env=env).stdout)["intake"]
        assert status["open"]["1"]["reported"] == N and status["open"]["2"]["reported"] == N // 2
        assert status["since_last_close"] == {"since_closed": 0, "accepted": N + N // 2, "rejected": {}}

        # several steps at once: says what it spends, refuses without --force
        proc = dpstream("close", *cfg, "--step", "2", env=env, check=False)
        assert proc.returncode == 3 and "refusing to close 2 steps at once" in proc.stderr
        assert "closing steps 1..2 releases them and spends: quarterly rho=" in proc.stdout
        out = dpstream("close", *cfg, "--step", "1", env=env).stdout
        assert "step 1: 800 of 800 users reported (0.0% imputed" in out and "closed through step 1" in out
        # step 2: half the users have no report -> 50% imputed vs 0% before: a warning, never a refusal (a
        # refusal would tie the close time to an un-noised count: docs/privacy.md)
        proc = dpstream("close", *cfg, "--step", "2", env=env, check=False)
        assert proc.returncode == 0 and "WARNING: step 2: imputed share 50.0%" in proc.stderr, proc.stderr
        assert "refusing" not in proc.stderr and "closed through step 2" in proc.stdout
        closed = json.loads(dpstream("status", *cfg, "--json", env=env).stdout)["intake"]["closed"]
        assert closed["1"]["imputed"] == 0 and closed["2"]["imputed"] == N // 2 and closed["2"]["reported"] == N // 2

        # step 3: every user reports, but as many garbled messages arrive: rejected share 50%
        assert "sent 800 simulated reports for step 3" in dpstream("produce", "--simulate", *cfg, env=env).stdout
        from kafka import KafkaProducer

        from pipeline.connections import kafka_security

        producer = KafkaProducer(bootstrap_servers=broker, **kafka_security())
        for i in range(N):
            producer.send("dpstream.cli-test.reports", key=f"u{i}".encode(), value=b"{not json")
        producer.flush()
        producer.close()
        assert "sent 800 simulated reports for step 4" in dpstream("produce", "--simulate", *cfg, env=env).stdout
        proc = dpstream("produce", "--simulate", *cfg, env=env, check=False)
        assert proc.returncode == 3 and "already have reports" in proc.stderr
        proc = dpstream("close", *cfg, "--step", "3", env=env, check=False)
        assert proc.returncode == 0 and "rejected share 33.3%" in proc.stderr, proc.stderr  # 800 of 2,400 handled
        assert "{'malformed': 800}" in proc.stdout
        dpstream("close", *cfg, "--step", "3", "--force", env=env)
        out = dpstream("close", *cfg, "--step", "4", env=env).stdout  # nothing odd about step 4
        assert "step 4: 800 of 800 users reported" in out


def test_views_tell_the_truth_after_the_broker_lost_the_open_step(deployment, tmp_path):
    """`produce` step 1, `down`, the broker's log deleted, `up`: the workers' restored
    state holds none of them. `status` says so (human text by default, --json for machines) — also with
    `up` stopped, from the Redis data on disk — and `close` refuses the step without --force instead of
    printing "800 of 800 users reported". Sent again, the step closes normally. (Before: status showed
    the stale 800, close closed the step from imputed values, and status needed a running `up`.)"""
    path, env = deployment
    cfg = ["--config", str(path)]
    with running(path, env, tmp_path):
        assert "sent 800 simulated reports for step 1" in dpstream("produce", "--simulate", *cfg, env=env).stdout
        assert json.loads(dpstream("status", *cfg, "--json", env=env).stdout)["intake"]["open"]["1"]["reported"] == N
    import shutil  # the broker loses its log (as the memory-only broker did on every stop)

    shutil.rmtree(tmp_path / "home" / "cli-test" / "log")
    with running(path, env, tmp_path):
        proc = dpstream("close", *cfg, "--step", "1", env=env, check=False)
        assert proc.returncode == 3, (proc.stdout, proc.stderr)
        assert "step 1: 0 of 800 users reported (100.0% imputed" in proc.stdout and "800 of 800" not in proc.stdout
        assert "LOST: step 1: 800 reports the workers had counted are gone" in proc.stderr
        assert "refusing to close step(s) [1]" in proc.stderr
        text = dpstream("status", *cfg, env=env).stdout
        assert "step 1 open: 0 users reported so far" in text and "LOST: step 1: 800 reports" in text, text
    # `up` stopped: status reads the embedded Redis's data directory
    stopped = dpstream("status", *cfg, "--json", env=env)
    doc = json.loads(stopped.stdout)
    assert doc["intake"]["open"]["1"]["reported"] == 0 and doc["intake"]["lost_reports"] == {"1": N}
    assert "is not running" in doc["source"] and doc["released_step"] == 0
    with running(path, env, tmp_path):
        assert "sent 800 simulated reports for step 1" in dpstream("produce", "--simulate", *cfg, "--step", "1", env=env).stdout
        out = dpstream("close", *cfg, "--step", "1", env=env).stdout
        assert "step 1: 800 of 800 users reported (0.0% imputed" in out and "closed through step 1" in out
        text = dpstream("status", *cfg, env=env).stdout
        assert "step 1 closed: 800 of 800 users reported" in text and "LOST" not in text, text


def test_absurd_budgets_are_one_line_with_exit_code_2(deployment, tmp_path):
    """`rho: 500000` and `epsilon: 1e9` (also acknowledged with allow_large, where e^ε overflows a
    calibration) give one line and exit 2, never a traceback. (Before: exit 0, and an OverflowError.)"""
    path, env = deployment
    cfg = yaml.safe_load(path.read_text())
    hh = {"name": "hh", "type": "heavy_hitters", "attribute": "job", "share": 1.0}
    cases = {
        "rho": dict(cfg, budget={"rho": 500000}),
        "eps": dict(cfg, attributes={"job": {"type": "categorical", "values": ["a", "b", "c"]}}, releases=[hh],
                    budget={"epsilon": 1e9, "delta": 1e-6}),
    }
    cases["eps-allowed"] = dict(cases["eps"], budget={"epsilon": 1e9, "delta": 1e-6, "allow_large": True})
    for label, doc in cases.items():
        bad = tmp_path / f"{label}.yaml"
        bad.write_text(yaml.safe_dump(doc))
        proc = dpstream("plan", "--config", str(bad), env=env, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (label, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "configuration refused" in proc.stderr, proc.stderr
