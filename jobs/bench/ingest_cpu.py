"""The worker's own ingest and close work in CPU time, on the working tree and earlier commits, in one run.

    python -m jobs.bench.ingest_cpu [--base main] [--n 1000000] [--reps 5] [--json out/ingest_cpu.json]

The stream benchmark's figures are wall-clock rates through the broker; on a shared machine they
move with everything else it runs. This job measures what a worker's hot path itself costs, in
**CPU seconds of its process** (``time.process_time``), which other processes' load changes far less:
an :class:`IngestCore` owning one of 4 partitions of an n-user roster (the benchmark's deployment)
is fed that partition's step-1 reports as records, 12,500 per fetch, as the worker's consumer hands
them over (enqueue, drain: parse, id lookup, checks, apply), then closes the step (partials and
checkpoint). Three forms of the same reports: single-report messages, columnar batches of 5,000,
and the close; the columnar batches again after the close (all late: dead-lettered); and the
single-report messages sent to another partition (as a CRC32 or random
partitioner does), forwarded through an in-memory ``repartition`` log and applied by their owner
(source and owner in the one process: the whole extra CPU a forwarded report costs). Each commit
is checked out into a temporary git worktree (as :mod:`jobs.bench.compare` does) and measured in
its own process, the commits taking turns; a figure is the median over repetitions of the best of
3 passes, and its ratio is working tree / base.
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
from pathlib import Path

from jobs.bench import write_json
from jobs.bench.compare import add_worktree, resolve

# Runs in the measured tree's own process (PYTHONPATH = that tree).
_HARNESS = r"""
import json, sys, time
import numpy as np, orjson
from pipeline.config import parse_config
from pipeline.stream.ingest.core import IngestCore
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.kafka.topics import topic_names

n, P, FETCH = int(sys.argv[1]), 4, 12_500
deployment = parse_config({"name": "bench", "roster": {"size": n}, "horizon": 12, "topics": {"partitions": P},
    "attributes": {"poverty": {"type": "binary"}, "item": {"type": "hashed", "size": 1_000_000}},
    "budget": {"rho": 0.01, "epsilon": 1.0, "delta": 1e-6}, "random": {"kind": "seeded", "seed": 1},
    "steps": {"max_ahead": 3},
    "releases": [{"name": "fw", "type": "fixed_window", "attribute": "poverty", "window": 3, "share": 0.5},
                 {"name": "cu", "type": "cumulative", "attribute": "poverty", "share": 0.5},
                 {"name": "hh", "type": "heavy_hitters", "attribute": "item", "method": "tct", "k": 3,
                  "share": 1.0}]})
roster = Roster.from_config(deployment.roster)
core = IngestCore(deployment, roster, topic_names(deployment), isolated=True)
rows = np.random.default_rng(0).permutation(np.flatnonzero(roster.owners(P) == 0))
ids = [roster.ids[r] for r in rows.tolist()]
item = np.random.default_rng(1).integers(0, 1_000_000, rows.size)
item[: rows.size // 50] = 12345

class Rec:  # what the worker's consumer hands over: offset, value, headers
    __slots__ = ("offset", "value", "headers")
    def __init__(self, offset, value, headers=()):
        self.offset, self.value, self.headers = offset, value, headers

single = [orjson.dumps({"user": u, "step": 1, "values": {"poverty": int(r % 2), "item": int(i)}})
          for u, r, i in zip(ids, rows.tolist(), item.tolist())]
columnar = [orjson.dumps({"columns": {"user": ids[j:j + 5000], "step": 1,
                                      "poverty": (rows[j:j + 5000] % 2).tolist(), "item": item[j:j + 5000].tolist()}})
            for j in range(0, len(ids), 5000)]

def ingest(values, per_fetch):
    core.revoke(0)
    core.assign(0)
    records = [Rec(i, v) for i, v in enumerate(values)]
    started = time.process_time()
    for i in range(0, len(records), per_fetch):
        core.enqueue(0, records[i:i + per_fetch])
        core.drain_all(0)
    spent = time.process_time() - started
    assert core.states[0].intake.accepted == len(ids), core.states[0].intake.accepted
    return spent

fcore = IngestCore(deployment, roster, topic_names(deployment))  # not isolated: forwards to the owner and waits for markers

def forwarded(values, per_fetch):
    # the same reports arriving on partition 1 (a producer not partitioning by murmur2): forwarded
    # through an in-memory `repartition` log to partition 0, which applies them
    for p in (0, 1):
        fcore.revoke(p)
        fcore.assign(p)
    records = [Rec(i, v) for i, v in enumerate(values)]
    log = []
    started = time.process_time()
    for i in range(0, len(records), per_fetch):
        fcore.enqueue(1, records[i:i + per_fetch])
        for out in fcore.drain_all(1):
            for q, value, headers in getattr(out, "forwards", ()):
                log.append(Rec(len(log), value, tuple(headers)))
                fcore.enqueue_forwarded(q, [log[-1]])
        fcore.drain_all(0)
    spent = time.process_time() - started
    assert fcore.states[0].intake.accepted == len(ids), fcore.states[0].intake.accepted
    return spent

def close():
    started = time.process_time()
    core.close(0, 1, len(single), None)
    return time.process_time() - started

def late(values, per_fetch):
    # the closed step's batches again (a close that overtook an upload): every report late
    start = core.states[0].offset + 1
    records = [Rec(start + i, v) for i, v in enumerate(values)]
    started = time.process_time()
    for i in range(0, len(records), per_fetch):
        core.enqueue(0, records[i:i + per_fetch])
        core.drain_all(0)
    spent = time.process_time() - started
    assert core.states[0].intake.rejected == {"late": len(ids)}, core.states[0].intake.rejected
    return spent

out = {"single_us_per_report": min(ingest(single, FETCH) for _ in range(3)) / len(ids) * 1e6,
       "columnar_us_per_report": min(ingest(columnar, max(1, FETCH // 5000)) for _ in range(3)) / len(ids) * 1e6,
       "forwarded_us_per_report": min(forwarded(single, FETCH) for _ in range(3)) / len(ids) * 1e6}
closes, lates = [], []
for _ in range(3):
    ingest(columnar, 3)
    closes.append(close())
    lates.append(late(columnar, max(1, FETCH // 5000)))
out["close_ms_per_partition"] = min(closes) * 1e3
out["late_columnar_us_per_report"] = min(lates) / len(ids) * 1e6
out["users_in_partition"] = len(ids)
print("RESULT " + json.dumps(out), flush=True)
"""

FIGURES = {
    "single_us_per_report": "ingest, single-report messages (CPU µs per report)",
    "columnar_us_per_report": "ingest, columnar batches (CPU µs per report)",
    "forwarded_us_per_report": "ingest, single-report messages on the wrong partition, forwarded (CPU µs)",
    "close_ms_per_partition": "close of a partition: partials + checkpoint (CPU ms)",
    "late_columnar_us_per_report": "columnar batches of a closed step, all late (CPU µs per report)",
}


def run(tree: Path, n: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run(
        [sys.executable, "-c", _HARNESS, str(n)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(
            f"{tree}: the harness failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return json.loads(line[len("RESULT ") :])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--base",
        action="append",
        default=None,
        help="commit to compare with (repeatable; default main)",
    )
    ap.add_argument("--head", default=None, help="measure this commit instead of the working tree")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    repo = Path(__file__).resolve().parents[2]
    work = Path(tempfile.mkdtemp(prefix="dpstream-ingest-cpu-"))
    trees: dict[str, Path] = {}
    try:
        if args.head:
            trees[f"{args.head} ({resolve(repo, args.head)})"] = add_worktree(
                repo, args.head, work / "head"
            )
        else:
            trees["working tree"] = repo
        for base in args.base or ["main"]:
            trees[f"{base} ({resolve(repo, base)})"] = add_worktree(
                repo, base, work / f"base-{resolve(repo, base)}"
            )
        sides = list(trees)
        runs: dict[str, list[dict]] = {s: [] for s in sides}
        for rep in range(args.reps):
            for side in sides[rep % len(sides) :] + sides[: rep % len(sides)]:
                runs[side].append(run(trees[side], args.n))
                print(
                    f"[{rep + 1}/{args.reps}] {side}: "
                    + ", ".join(f"{k} {v:.3f}" for k, v in runs[side][-1].items() if k in FIGURES),
                    flush=True,
                )
        med = {s: {k: statistics.median(r[k] for r in runs[s]) for k in FIGURES} for s in sides}
        head, bases = sides[0], sides[1:]
        print(
            f"\nn = {args.n:,} (one partition of 4: {runs[head][0]['users_in_partition']:,} users), "
            f"{args.reps} interleaved runs per side, medians; lower is better:"
        )
        print(
            "| figure | "
            + " | ".join(sides)
            + " | "
            + " | ".join(f"{head} ÷ {b}" for b in bases)
            + " |"
        )
        print("|---" * (1 + len(sides) + len(bases)) + "|")
        for k, label in FIGURES.items():
            print(
                f"| {label} | "
                + " | ".join(f"{med[s][k]:.3f}" for s in sides)
                + " | "
                + " | ".join(f"{med[head][k] / med[b][k]:.2f}×" for b in bases)
                + " |"
            )
        result = {"n": args.n, "reps": args.reps, "runs": runs, "medians": med}
        write_json(args.json, result)
        return result
    finally:
        for tree in trees.values():
            if tree != repo:
                subprocess.run(
                    ["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)],
                    capture_output=True,
                )
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
