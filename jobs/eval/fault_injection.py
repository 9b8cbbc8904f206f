"""Fault injection at scale: the crash scenarios of ``tests/test_stream_faults.py`` on a bigger panel.

    python -m jobs.eval.fault_injection [--n 100000] [--horizon 12] [--seed 0] [--workers 2] [--partitions 4]
                                   [--scenarios baseline,releaser-before-commit,...] [--log-dir DIR]

Every scenario runs a fresh seeded deployment (its own topics and Redis keys) on one embedded broker
and Redis, with real worker and releaser processes, over the whole horizon, and injects one fault at
a step (and, where it applies, a process and a moment) drawn from ``--seed``:

  baseline                   no fault (the harness itself must pass)
  releaser-before-commit     DPSTREAM_FAULT=releaser.before_commit@t   (mechanisms ran, nothing in Redis)
  releaser-after-commit      DPSTREAM_FAULT=releaser.after_commit@t    (record in Redis, nothing published)
  releaser-mid-publish       DPSTREAM_FAULT=releaser.mid_publish@t     (half of the step's messages out)
  releaser-kill9             SIGKILL of the releaser a random moment after the close command of step t
  releaser-kill9-partial-step  a worker killed before step t closes, so the releaser holds only some
                             partials of t; the releaser killed after it committed past them; both
                             restarted (the partials must be re-read from the Redis resume offset)
  worker-before-checkpoint   DPSTREAM_FAULT=worker.before_checkpoint@t on one worker
  worker-kill9-mid-step      SIGKILL of one worker while step t's reports are being ingested
  redis-restart              the embedded Redis stopped and started again between steps t-1 and t

Checks per scenario: the consumed synthetic panels equal the library run in batch with the same
seeds (= an uninterrupted run: a lost or doubled report, redrawn noise or a step released twice would
change them); every step complete; a deduplicating consumer saw each (release, step); the ledger holds
exactly one entry per (release, spending step) and the spend equals the budget; the fault really
fired (exit code of the fault point). Prints a summary table; exit code 0 when every scenario passed.
Not part of the test suite (minutes, not seconds).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from jobs.bench.own_broker import use_own_brokers
from jobs.eval.testbed import write_panel_deployment

K = 3
FAULT_POINTS = {
    "releaser-before-commit": "releaser.before_commit",
    "releaser-after-commit": "releaser.after_commit",
    "releaser-mid-publish": "releaser.mid_publish",
}
SCENARIOS = (
    "baseline",
    "releaser-before-commit",
    "releaser-after-commit",
    "releaser-mid-publish",
    "releaser-kill9",
    "releaser-kill9-partial-step",
    "worker-before-checkpoint",
    "worker-kill9-mid-step",
    "redis-restart",
)


def _config(
    directory: Path, svc, name: str, n: int, horizon: int, partitions: int, seed: int
) -> str:
    return write_panel_deployment(
        directory, svc, name, n=n, horizon=horizon, partitions=partitions, seed=seed, window=K
    )


class Run:
    """One scenario: a deployment, its cluster and a driver; ``step`` sends and closes a step."""

    def __init__(self, scenario: str, args, svc, X, rng, workdir: Path):
        from pipeline.config import load_config
        from pipeline.stream.ingest.roster import Roster

        self.scenario, self.args, self.svc, self.X, self.rng = scenario, args, svc, X, rng
        self.workdir = workdir / scenario
        self.workdir.mkdir(parents=True, exist_ok=True)
        name = f"fi-{scenario}-{args.seed}-{int(time.time())}"
        self.path = _config(
            self.workdir, svc, name, args.n, args.horizon, args.partitions, args.seed + 1
        )
        self.deployment = load_config(self.path)
        self.roster = Roster.from_config(self.deployment.roster)
        self.notes: list[str] = []
        self.fault_fired: bool | None = None
        self.drv: Any = None  # the StreamDriver, started with the cluster

    def send(self, t: int, present=None) -> int:
        return self.drv.producer.send_step(t, {"pov": self.X[:, t - 1]}, present=present)

    def step(self, t: int) -> None:
        self.send(t)
        self.drv.close(t, timeout=self.args.timeout)


def _drive(run: Run, cluster) -> None:
    from pipeline.stream.process.faults import FAULT_EXIT_CODE

    T, rng, sc = run.args.horizon, run.rng, run.scenario
    at = int(
        rng.integers(2, T + 1)
    )  # the faulty step (never step 1 alone: something to lose before it)
    victim = f"worker-{int(rng.integers(0, run.args.workers))}"
    run.notes.append(f"step {at}")
    drv = run.drv
    if sc in FAULT_POINTS:
        cluster.kill("releaser")
        cluster.spawn("releaser", "releaser", {"DPSTREAM_FAULT": f"{FAULT_POINTS[sc]}@{at}"})
    if sc == "worker-before-checkpoint":
        run.notes.append(victim)
        cluster.kill(victim)
        cluster.spawn("worker", victim, {"DPSTREAM_FAULT": f"worker.before_checkpoint@{at}"})
    for t in range(1, T + 1):
        if t != at or sc == "baseline":
            run.step(t)
            continue
        if sc in FAULT_POINTS:
            run.send(t)
            drv.close(t, wait=False)
            run.fault_fired = (
                cluster.wait_exit("releaser", timeout=run.args.timeout) == FAULT_EXIT_CODE
            )
            cluster.spawn("releaser", "releaser")
            drv.wait_released(t, timeout=run.args.timeout)
        elif sc == "releaser-kill9":
            run.send(t)
            delay = float(rng.uniform(0.0, 1.5))
            run.notes.append(f"kill after {delay:.2f}s")
            drv.close(t, wait=False)
            time.sleep(delay)
            cluster.kill("releaser")
            cluster.spawn("releaser", "releaser")
            drv.wait_released(t, timeout=run.args.timeout)
        elif sc == "releaser-kill9-partial-step":
            run.notes.append(victim)
            run.send(t)
            time.sleep(1.0)
            cluster.kill(victim)
            drv.close(t, wait=False)
            time.sleep(4.0)  # the others' partials consumed and committed; the victim's missing
            cluster.kill("releaser")
            cluster.spawn("releaser", "releaser")
            cluster.spawn("worker", victim)
            drv.wait_released(t, timeout=run.args.timeout)
        elif sc == "worker-before-checkpoint":
            run.send(t)
            drv.close(t, wait=False)
            run.fault_fired = cluster.wait_exit(victim, timeout=run.args.timeout) == FAULT_EXIT_CODE
            cluster.spawn("worker", victim)
            drv.wait_released(t, timeout=run.args.timeout)
        elif sc == "worker-kill9-mid-step":
            share = float(rng.uniform(0.2, 0.8))
            delay = float(rng.uniform(0.5, 4.0))
            run.notes += [victim, f"{share:.0%} sent, kill after {delay:.1f}s"]
            first = rng.random(run.args.n) < share
            run.send(t, present=first)
            time.sleep(delay)
            cluster.kill(victim)
            run.send(t, present=~first)
            cluster.spawn("worker", victim)
            drv.close(t, timeout=run.args.timeout)
        elif sc == "redis-restart":
            run.svc.redis.stop()
            try:
                code = cluster.wait_exit("releaser", timeout=30)
                run.fault_fired = code not in (0, None)
                run.notes.append(f"releaser exit {code}")
            except Exception:  # noqa: BLE001 - it did not notice: reported, then restarted anyway
                run.fault_fired = False
                cluster.kill("releaser")
            run.svc.redis.start()
            cluster.spawn("releaser", "releaser")
            for name, proc in list(cluster.procs.items()):
                if name.startswith("worker") and proc.poll() is not None:
                    run.notes.append(f"{name} exit {proc.returncode}, restarted")
                    cluster.spawn("worker", name)
            run.step(t)


def _verify(run: Run) -> dict[str, bool]:
    from pipeline.stream.releaser.engine import batch_reference
    from pipeline.stream.state.store import StateStore

    T = run.args.horizon
    ref = batch_reference(run.deployment, {"pov": run.X})
    panels = run.drv.panels.panels
    checks = {}
    checks["complete"] = all(
        rel in panels and panels[rel].complete_steps == set(range(1, T + 1)) for rel in ("fw", "cu")
    )
    checks["equals_batch"] = checks["complete"] and all(
        np.array_equal(panels[rel].as_array(), ref[rel]) for rel in ("fw", "cu")
    )
    checks["each_step_seen"] = sorted(run.drv.manifests_seen) == sorted(
        (r, t) for r in ("fw", "cu") for t in range(1, T + 1)
    )
    store = StateStore.from_url(run.svc.redis.url, run.deployment.name)
    ledger = store.ledger()
    want = sorted([f"fw:{t}" for t in range(K, T + 1)] + [f"cu:{t}" for t in range(1, T + 1)])
    checks["ledger_once"] = sorted(ledger) == want
    checks["budget_exact"] = abs(sum(e["cost"]["rho"] for e in ledger.values()) - 0.5) < 1e-9
    if run.fault_fired is not None:
        checks["fault_fired"] = bool(run.fault_fired)
    dup = run.drv.panels.duplicates
    if dup:
        run.notes.append(f"{dup} duplicate messages deduplicated")
    return checks


def run_scenario(
    scenario: str, args, svc, X, rng, workdir: Path
) -> tuple[bool, dict[str, bool], str, float]:
    from pipeline.stream.local.cluster import LocalCluster
    from pipeline.stream.local.driver import StepDriver

    started = time.monotonic()
    run = Run(scenario, args, svc, X, rng, workdir)
    checks: dict[str, bool] = {}
    cwd = os.getcwd()
    os.chdir(run.workdir)  # anything a process writes stays in the run's directory
    try:
        with LocalCluster(
            run.path, run.deployment, workers=args.workers, log_dir=run.workdir / "logs"
        ) as cluster:
            run.drv = StepDriver(cluster.broker, run.deployment, run.roster, cluster.names)
            try:
                _drive(run, cluster)
                time.sleep(1.0)
                run.drv.poll(1000)
                checks = _verify(run)
            finally:
                run.drv.shutdown()
    except Exception as err:  # noqa: BLE001 - a failed scenario is reported, the others still run
        checks["ran"] = False
        run.notes.append(f"{type(err).__name__}: {err}"[:200])
        if args.verbose:
            traceback.print_exc()
    finally:
        os.chdir(cwd)
    ok = bool(checks) and all(checks.values())
    return (
        ok,
        checks,
        "; ".join(run.notes) + f" (logs: {run.workdir / 'logs'})",
        time.monotonic() - started,
    )


def main(argv: list[str] | None = None) -> int:
    use_own_brokers("fault_injection")  # never a running `up`'s gate
    ap = argparse.ArgumentParser(
        prog="python -m jobs.eval.fault_injection", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--n", type=int, default=100_000, help="roster size")
    ap.add_argument("--horizon", type=int, default=12)
    ap.add_argument(
        "--seed", type=int, default=0, help="fault steps, victims and moments; the panel"
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated, of {', '.join(SCENARIOS)}",
    )
    ap.add_argument(
        "--timeout", type=float, default=240.0, help="seconds to wait for one step's release"
    )
    ap.add_argument("--log-dir", default=None, help="keep configurations and process logs here")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenarios {sorted(unknown)}")

    from pipeline.stream.local.embedded import EmbeddedServices

    rng = np.random.default_rng(args.seed)
    X = rng.integers(0, 2, size=(args.n, args.horizon))
    workdir = Path(args.log_dir or tempfile.mkdtemp(prefix="dpstream-faults-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"fault injection: n={args.n} T={args.horizon} seed={args.seed} workers={args.workers} "
        f"partitions={args.partitions}; logs in {workdir}",
        flush=True,
    )
    rows: list[
        tuple[str, bool, dict[str, bool], str, float]
    ] = []  # scenario, ok, checks, notes, seconds
    with EmbeddedServices(data_dir=workdir / "services") as svc:
        for sc in scenarios:
            ok, checks, notes, secs = run_scenario(
                sc, args, svc, X, np.random.default_rng([args.seed, len(rows)]), workdir
            )
            rows.append((sc, ok, checks, notes, secs))
            print(f"  {sc:<26} {'passed' if ok else 'FAILED'}  {secs:6.1f} s  {notes}", flush=True)
    print()
    width = max(len(r[0]) for r in rows)
    print(f"{'scenario':<{width}}  result  seconds  checks")
    for sc, ok, checks, _notes, secs in rows:
        marks = " ".join(f"{k}:{'ok' if v else 'FAIL'}" for k, v in checks.items())
        print(f"{sc:<{width}}  {'passed' if ok else 'FAILED':<6}  {secs:7.1f}  {marks}")
    failed = [r[0] for r in rows if not r[1]]
    print(
        f"\n{len(rows) - len(failed)}/{len(rows)} scenarios passed"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(
        signal.SIGTERM, lambda *_: sys.exit(143)
    )  # stop the cluster and services on SIGTERM
    sys.exit(main())
