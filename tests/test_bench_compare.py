"""The regression guard's arithmetic (jobs/bench/compare.py): figures read off a benchmark result,
medians per side, ratios working tree / base, and the worktree of a named commit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from jobs.bench import compare


def _result(single: float, batch: float, latencies: dict, state: float) -> dict:
    return {"n": 10, "raw_consume_msgs_per_s": 100.0, "ingest_single_reports_per_s": single,
            "ingest_batch_reports_per_s": batch, "single_vs_raw": single / 100.0, "state_bytes_per_user": state,
            "ingest_single_two_workers_reports_per_s": float("nan"),  # a skipped stage
            "release_latency_s": latencies, "parser_reports_per_s": {"single": 5.0},
            "latency_breakdown_s": {"1": {"mechanisms": 0.5}, "2": {"mechanisms": 0.3}, "3": {"mechanisms": 0.1}}}


def test_figures_medians_and_ratios():
    head = [compare.flatten(_result(80.0, 300.0, {"1": [0.2, 0.9], "2": [0.4, 1.1], "3": [0.3, 1.0]}, 32.0)),
            compare.flatten(_result(60.0, 100.0, {"1": [0.2, 0.9]}, 32.0))]
    base = [compare.flatten(_result(40.0, 200.0, {"1": [0.6, 2.0]}, 144.0))]
    assert head[0]["latency_manifests_s"] == 0.3 and head[0]["latency_whole_step_s"] == 1.0  # medians over steps
    assert head[0]["latency_mechanisms_s"] == 0.3 and head[0]["parser_single"] == 5.0
    assert "ingest_single_two_workers_reports_per_s" not in head[0]  # NaN: not measured, not a figure
    med = compare.summarise({"head": head, "base": base})
    assert med["head"]["ingest_single_reports_per_s"] == 70.0 and med["head"]["ingest_batch_reports_per_s"] == 200.0
    rows = {line.split(" | ")[0][2:]: line for line in compare.table(["head", "base"], med, {})}
    assert rows["worker ingest, single-report messages"].endswith("| 1.75× |")
    assert rows["worker ingest, batch (columnar) messages"].endswith("| 1.00× |")
    assert rows["worker state per user"].endswith("| 0.22× (lower is better) |")


def test_a_named_commit_is_checked_out_and_its_benchmark_found(tmp_path):
    repo = Path(compare.__file__).resolve().parents[2]
    if not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    tree = compare.add_worktree(repo, "HEAD", tmp_path / "tree")
    try:
        assert compare.bench_module(tree) == "jobs.bench.bench_stream"
        with pytest.raises(FileNotFoundError):
            compare.bench_module(tmp_path)
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], capture_output=True)


def test_release_cpu_job_runs_every_part_of_a_step():
    """The in-process split of a step's close and release (jobs/bench/release_cpu.py) on a small roster."""
    from jobs.bench import release_cpu

    rows = release_cpu.run(4000, 3)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(set(release_cpu.PARTS) <= set(r) for r in rows)
    assert rows[2]["public_mb"] > rows[1]["public_mb"]  # step 3: the fixed window's first three columns
