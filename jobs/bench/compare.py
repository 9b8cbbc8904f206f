"""Regression guard: the stream benchmark on the working tree and on earlier commits, in one run.

    python -m jobs.bench.compare [--base main] [--base 1c6acdb] [--n 1000000] [--reps 3]
                                 [--json out/compare.json] [--markdown out/compare.md]

Each named commit is checked out into a temporary ``git worktree`` and its own stream benchmark
(``jobs/bench/bench_stream.py``, or ``jobs/bench_stream.py`` in older trees) runs from there with
``PYTHONPATH`` pointing at that tree, in this environment's interpreter and packages, so the
processes it starts (embedded broker, Redis, worker and releaser jobs) run that commit's code.
The working tree and the bases run in turns, the order rotating every repetition so that a drift
of the machine's speed (other work on a shared machine) does not fall on one side; each figure is
the median over its repetitions, and its ratio is working tree / base. Only figures both sides
report are compared; what only one side reports is listed.

The releaser cost sweep of the benchmark (in-process, not a stream figure) is left out unless
``--releaser-cost``: it takes longer than the stream part and has its own job figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jobs.bench import write_json
from jobs.bench.own_broker import use_own_brokers

# figure -> (label, unit, True if higher is better)
FIGURES: dict[str, tuple[str, str, bool]] = {
    "raw_consume_msgs_per_s": ("raw aiokafka consumption (broker-side ceiling)", "msgs/s", True),
    "ingest_single_reports_per_s": ("worker ingest, single-report messages", "reports/s", True),
    "single_vs_raw": ("  the same, as a share of raw", "share", True),
    "ingest_single_two_workers_reports_per_s": (
        "two workers, single-report messages",
        "reports/s",
        True,
    ),
    "raw_consume_batch_reports_per_s": (
        "raw aiokafka consumption of the batch messages",
        "reports/s",
        True,
    ),
    "ingest_batch_reports_per_s": ("worker ingest, batch (columnar) messages", "reports/s", True),
    "batch_vs_raw": ("  the same, as a share of raw", "share", True),
    "latency_manifests_s": ("close → every manifest published (median over steps)", "s", False),
    "latency_whole_step_s": ("close → whole step read back (median over steps)", "s", False),
    "latency_markers_s": ("  of which: close command → markers written", "s", False),
    "latency_partitions_closed_s": ("  markers → every partition closed (worker)", "s", False),
    "latency_partials_at_releaser_s": ("  markers → all partials at the releaser", "s", False),
    "latency_mechanisms_s": ("  releaser: mechanisms", "s", False),
    "latency_redis_commit_s": ("  releaser: Redis commit", "s", False),
    "latency_publish_s": ("  releaser: publish", "s", False),
    "latency_read_back_s": (
        "  reading side: manifests published → whole step read back",
        "s",
        False,
    ),
    "state_bytes_per_user": ("worker state per user", "B", False),
    "kept_partials_bytes_per_user": (
        "  kept partials beside it (written once per close)",
        "B",
        False,
    ),
    "state_after_close_bytes_per_user": (
        "  state and kept partials right after a close",
        "B",
        False,
    ),
    "worker_rss_mb": ("worker RSS after ingest", "MB", False),
    "parser_single": ("parser, single-report messages (one core)", "reports/s", True),
    "parser_row_batch": ("parser, row batches (one core)", "reports/s", True),
    "parser_columnar_batch": ("parser, columnar batches (one core)", "reports/s", True),
    "mismatched_vs_matched_crc32": ("CRC32 producer, share of matched", "share", True),
    "mismatched_vs_matched_random": ("random producer, share of matched", "share", True),
}

# Runs a tree's benchmark module; the releaser sweep is replaced unless asked for. It prints the
# package's location first, so the guard can check it measured the tree it meant to.
_RUNNER = """
import importlib, sys
mod = importlib.import_module(sys.argv[1])
import pipeline
print("PIPELINE_AT", pipeline.__file__, flush=True)
if sys.argv[2] == "0":
    mod.releaser_cost = lambda quick: []
if "two_workers" in sys.argv[3].split(","):
    mod._two_worker_rate = lambda *args, **kw: float("nan")
if "parser" in sys.argv[3].split(","):
    mod.parser_throughput = lambda *args, **kw: {}
mod.main(sys.argv[4:])
"""


def flatten(result: dict) -> dict[str, float]:
    """The figures of one benchmark result (its JSON), by the names of :data:`FIGURES`."""
    out = {
        k: float(result[k])
        for k in FIGURES
        if k in result and isinstance(result[k], (int, float)) and result[k] == result[k]
    }  # not NaN (skipped)
    lat = result.get("release_latency_s") or {}
    if lat:
        out["latency_manifests_s"] = statistics.median(float(v[0]) for v in lat.values())
        out["latency_whole_step_s"] = statistics.median(float(v[1]) for v in lat.values())
    breakdown = result.get("latency_breakdown_s") or {}
    for part in (
        "markers",
        "partitions_closed",
        "partials_at_releaser",
        "mechanisms",
        "redis_commit",
        "publish",
        "read_back",
    ):
        values = [float(row[part]) for row in breakdown.values() if part in row]
        if values:
            out[f"latency_{part}_s"] = statistics.median(values)
    for name, rate in (result.get("parser_reports_per_s") or {}).items():
        out[f"parser_{name}"] = float(rate)
    for name, share in (result.get("mismatched_vs_matched") or {}).items():
        out[f"mismatched_vs_matched_{name}"] = float(share)
    return out


def bench_module(tree: Path) -> str:
    if (tree / "jobs/bench/bench_stream.py").exists():
        return "jobs.bench.bench_stream"
    if (tree / "jobs/bench_stream.py").exists():
        return "jobs.bench_stream"
    raise FileNotFoundError(
        f"{tree}: no stream benchmark (jobs/bench/bench_stream.py or jobs/bench_stream.py)"
    )


def run_once(
    tree: Path,
    bench_args: list[str],
    work: Path,
    tag: str,
    releaser_cost: bool,
    timeout: float,
    skip: str = "",
) -> dict[str, float]:
    """One benchmark run of ``tree``; its figures."""
    out_json = work / f"{tag}.json"
    out_json.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(tree), DPSTREAM_HOME=str(work / f"home-{tag}"))
    cmd = [
        sys.executable,
        "-c",
        _RUNNER,
        bench_module(tree),
        "1" if releaser_cost else "0",
        skip,
        *bench_args,
        "--json",
        str(out_json),
        "--out",
        str(work / f"out-{tag}"),
    ]
    log_path = work / f"{tag}.log"
    with open(log_path, "w") as log:
        proc = subprocess.run(
            cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
        )
    text = log_path.read_text()
    at = next(
        (line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("PIPELINE_AT ")), ""
    )
    if not at.startswith(str(tree)):
        raise RuntimeError(f"{tag}: the benchmark imported pipeline from {at!r}, not from {tree}")
    if proc.returncode != 0 or not out_json.exists():
        raise RuntimeError(
            f"{tag}: the benchmark failed (exit {proc.returncode}); last lines:\n"
            + "\n".join(text.splitlines()[-15:])
        )
    return flatten(json.loads(out_json.read_text()))


def add_worktree(repo: Path, commit: str, where: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(repo), "worktree", "add", "--detach", "--force", str(where), commit],
        check=True,
        capture_output=True,
    )
    return where


def resolve(repo: Path, commit: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", commit],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def summarise(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Each side's median of each figure over its runs."""
    return {
        side: {k: statistics.median(r[k] for r in rs if k in r) for k in {k for r in rs for k in r}}
        for side, rs in runs.items()
    }


def table(
    sides: list[str], medians: dict[str, dict[str, float]], runs: dict[str, list[dict]]
) -> list[str]:
    """Markdown rows: each figure's median per side and the working tree's ratio to each base."""
    head, bases = sides[0], sides[1:]
    lines = [
        "| figure | "
        + " | ".join(sides)
        + " | "
        + " | ".join(f"ratio to {b}" for b in bases)
        + " |",
        "|---" * (1 + len(sides) + len(bases)) + "|",
    ]
    for key, (label, unit, higher) in FIGURES.items():
        if key not in medians[head]:
            continue
        cells = []
        for side in sides:
            value = medians[side].get(key)
            cells.append("—" if value is None else _fmt(value, unit))
        ratios = []
        for b in bases:
            base = medians[b].get(key)
            ratios.append(
                "—"
                if not base
                else f"{medians[head][key] / base:.2f}×{'' if higher else ' (lower is better)'}"
            )
        lines.append(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return lines


def _fmt(value: float, unit: str) -> str:
    if unit == "share":
        return f"{value:.1%}"
    if unit in ("reports/s", "msgs/s"):
        return f"{value / 1000:,.0f}k/s"
    if unit == "s":
        return f"{value:.2f} s"
    return f"{value:.0f} {unit}"


def main(argv=None) -> dict:
    use_own_brokers("compare")  # never a running `up`'s gate
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--base",
        action="append",
        default=None,
        help="a commit to compare with (repeatable; default: main)",
    )
    ap.add_argument(
        "--head",
        default=None,
        help="measure this commit (checked out like the bases) instead of the working tree, "
        "so the tree can be edited while the guard runs",
    )
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument(
        "--reps", type=int, default=3, help="runs per side, interleaved (median reported)"
    )
    ap.add_argument(
        "--releaser-cost", action="store_true", help="include the in-process releaser sweep"
    )
    ap.add_argument(
        "--skip",
        default="",
        help="stages left out on every side, comma-separated: two_workers, parser "
        "(a loaded machine: each run of n = 10^6 can take 10+ minutes)",
    )
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark run")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the temporary worktrees and logs")
    args = ap.parse_args(argv)
    repo = Path(__file__).resolve().parents[2]
    bases = args.base or ["main"]
    bench_args = ["--n", str(args.n), "--partitions", str(args.partitions)]
    work = Path(tempfile.mkdtemp(prefix="dpstream-compare-"))
    trees = {"working tree": repo}
    labels = {}
    try:
        if args.head:
            trees = {
                f"{args.head} ({resolve(repo, args.head)})": add_worktree(
                    repo, args.head, work / "tree-head"
                )
            }
        for base in bases:
            label = f"{base} ({resolve(repo, base)})" if resolve(repo, base) != base else base
            labels[label] = base
            trees[label] = add_worktree(repo, base, work / f"tree-{resolve(repo, base)}")
        sides = list(trees)
        runs: dict[str, list[dict]] = {side: [] for side in sides}
        for rep in range(args.reps):
            order = sides[rep % len(sides) :] + sides[: rep % len(sides)]  # rotate who goes first
            for side in order:
                tag = f"{side.split()[0].replace('/', '_')}-{rep}"
                started = time.monotonic()
                print(
                    f"[rep {rep + 1}/{args.reps}] {side}: bench_stream {' '.join(bench_args)} ...",
                    flush=True,
                )
                figures = run_once(
                    trees[side], bench_args, work, tag, args.releaser_cost, args.timeout, args.skip
                )
                runs[side].append(figures)
                print(
                    f"    {time.monotonic() - started:.0f} s: "
                    + ", ".join(f"{k}={v:.4g}" for k, v in figures.items()),
                    flush=True,
                )
        medians = summarise(runs)
        lines = table(sides, medians, runs)
        only = {side: sorted(set(medians[side]) - set(medians[sides[0]])) for side in sides[1:]}
        print(
            f"\nn = {args.n:,}, {args.partitions} partitions, {args.reps} interleaved runs per side (medians):"
        )
        print("\n".join(lines))
        for side, keys in only.items():
            if keys:
                print(f"only {side} reports: {', '.join(keys)}")
        result = {
            "n": args.n,
            "partitions": args.partitions,
            "reps": args.reps,
            "sides": {side: labels.get(side, args.head or str(repo)) for side in sides},
            "runs": runs,
            "medians": medians,
        }
        write_json(args.json, result)
        if args.markdown:
            Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(args.markdown).write_text("\n".join(lines) + "\n")
        return result
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            for tree in trees.values():
                if tree != repo:
                    subprocess.run(
                        ["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)],
                        capture_output=True,
                    )
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
