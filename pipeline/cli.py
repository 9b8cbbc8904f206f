"""``dpstream`` command line.

Exit codes: 0 success; 1 runtime failure (a process died, a timeout); 2 usage or configuration
error (including a budget plan that exceeds the budget, and a privacy-relevant configuration that
differs from the one the deployment's state was created under); 3 budget exhausted / refused at run
time; 4 state lost: the public topics hold releases the Redis state does not know (the fence), or
the state cannot be verified — releasing would redraw noise for steps already public.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

EXIT_OK, EXIT_RUNTIME, EXIT_CONFIG, EXIT_BUDGET = 0, 1, 2, 3
EXIT_STATE_LOST = 4


def _load(path: str):
    from pipeline.config import ConfigError, load_config
    from pipeline.privacy.accounting import PrivacyBudgetError

    try:
        return load_config(path)  # includes the budget plan: refused before anything starts
    except FileNotFoundError:
        raise SystemExit(_fail(EXIT_CONFIG, f"no such configuration file: {path}"))
    except (ConfigError, PrivacyBudgetError) as err:
        raise SystemExit(_fail(EXIT_CONFIG, f"configuration refused: {err}"))


def _fail(code: int, message: str) -> int:
    print(f"dpstream: {message}", file=sys.stderr)
    return code


def _endpoints(dep) -> tuple[str, str]:
    """Broker and Redis of a deployment: configured, or those of a running `dpstream up`."""
    from pipeline.stream.cluster import endpoints_file

    broker = os.environ.get("DPSTREAM_BROKER") or dep.broker
    redis_url = os.environ.get("DPSTREAM_REDIS") or dep.redis
    if broker and redis_url:
        return broker, redis_url
    path = endpoints_file(dep.name)
    if not path.exists():
        raise SystemExit(_fail(EXIT_CONFIG, f"deployment {dep.name!r} names no broker/Redis and no `dpstream up` "
                                            f"is running for it (no {path})"))
    data = json.loads(path.read_text())
    return broker or data["broker"], redis_url or data["redis"]


# -- stream processes ---------------------------------------------------------------------------
def _run_job(module: str, args) -> int:
    os.environ["DPSTREAM_CONFIG"] = str(Path(args.config).resolve())
    dep = _load(args.config)
    broker, redis_url = _endpoints(dep)
    os.environ["DPSTREAM_BROKER"], os.environ["DPSTREAM_REDIS"] = broker, redis_url
    from pipeline.stream.identity import ConfigurationChanged, StateLost

    try:
        job = importlib.import_module(module)
        job.main(args.loglevel)
    except ConfigurationChanged as err:
        return _fail(EXIT_CONFIG, f"configuration refused: {err}")
    except StateLost as err:
        return _fail(EXIT_STATE_LOST, f"state lost: {err}")
    return EXIT_OK


def cmd_worker(args) -> int:
    return _run_job("jobs.worker", args)


def cmd_releaser(args) -> int:
    return _run_job("jobs.releaser", args)


def _running_up(name: str) -> int | None:
    """Pid of a live `dpstream up` of deployment ``name`` (two would share one Redis data directory)."""
    from pipeline.stream.cluster import endpoints_file

    try:
        pid = int(json.loads(endpoints_file(name).read_text())["pid"])
    except (FileNotFoundError, KeyError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # a stale file left by a killed `up`
    except PermissionError:
        pass  # alive, another user's
    return pid


def cmd_up(args) -> int:
    from pipeline.stream.cluster import LocalCluster, state_dir

    dep = _load(args.config)
    running = _running_up(dep.name)
    if running:
        return _fail(EXIT_CONFIG, f"`dpstream up` is already running for deployment {dep.name!r} (pid {running})")
    # The embedded Redis keeps the release records and the ledger in DPSTREAM_HOME/<deployment>/redis
    # unless --ephemeral: losing them would leave the deployment unable to continue (the fence refuses).
    data_dir = None if args.ephemeral or dep.redis else state_dir(dep.name)
    cluster = LocalCluster(args.config, dep, workers=args.workers, log_dir=args.log_dir, metrics=True,
                           data_dir=data_dir)
    with cluster:
        where = ("configured" if dep.redis else f"data in {data_dir / 'redis'}" if data_dir
                 else "ephemeral: deleted on stop")
        print(f"dpstream up: broker {cluster.broker}, redis {cluster.redis_url} ({where}), "
              f"{args.workers} worker(s) + releaser; metrics ports {cluster.metrics_ports}. Ctrl-C stops.", flush=True)
        try:
            while True:
                cluster.check_alive()
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return EXIT_OK


# -- producing and controlling ------------------------------------------------------------------
def _producer(dep):
    from pipeline.stream.producer import ReportProducer
    from pipeline.stream.roster import Roster
    from pipeline.stream.topics import topic_names

    broker, _ = _endpoints(dep)
    return ReportProducer(broker, dep, Roster.from_config(dep.roster), topic_names(dep))


def cmd_produce(args) -> int:
    dep = _load(args.config)
    prod = _producer(dep)
    try:
        if args.jsonl:
            n = prod.send_jsonl(args.jsonl)
        elif args.csv:
            n = prod.send_csv(args.csv)
        else:
            from pipeline.sim.panel import simulate_poverty_panel

            panel = simulate_poverty_panel(n=prod.roster.n, horizon=dep.horizon, seed=args.seed)
            attr = args.attribute or next(a for a, v in dep.attributes.items() if v.type == "binary")
            n = 0
            steps = [args.step] if args.step else range(1, dep.horizon + 1)
            for t in steps:
                n += prod.send_step(t, {attr: panel[:, t - 1]})
    finally:
        prod.close()
    print(f"sent {n} reports")
    return EXIT_OK


def cmd_close(args) -> int:
    dep = _load(args.config)
    if not 1 <= args.step <= dep.horizon:
        return _fail(EXIT_CONFIG, f"--step must be in 1..{dep.horizon}, got {args.step}")
    prod = _producer(dep)
    prod.close_step(args.step)
    prod.close()
    print(f"close requested for step {args.step}")
    return EXIT_OK


def cmd_status(args) -> int:
    from pipeline.plan import budget_plan
    from pipeline.stream.store import ReleaseStore

    dep = _load(args.config)
    _, redis_url = _endpoints(dep)
    store = ReleaseStore.from_url(redis_url, dep.name)
    ledger = store.ledger()
    identity = store.identity() or {}
    status = {
        "deployment": dep.name,
        "instance": identity.get("instance"),
        "fingerprint": identity.get("fingerprint"),
        "released_step": store.last_released(),
        "published_step": store.last_published(),
        "horizon": dep.horizon,
        "plan": {k: v.__dict__ for k, v in budget_plan(dep).allotments().items()},
        "ledger": ledger,
    }
    print(json.dumps(status, indent=2, sort_keys=True))
    return EXIT_OK


# -- consuming ---------------------------------------------------------------------------------
def _panels(dep):
    from pipeline.consumer import read_topics
    from pipeline.stream.topics import topic_names

    broker, _ = _endpoints(dep)
    return read_topics(broker, topic_names(dep))


def _synthetic_panel(args):
    """The materialised panel of ``args.release`` read from the topics, or None before its first records."""
    panel = _panels(_load(args.config)).panels.get(args.release)
    return panel if panel is not None and panel.values is not None else None


def cmd_export(args) -> int:
    panel = _synthetic_panel(args)
    if panel is None:
        return _fail(EXIT_RUNTIME, f"no synthetic data for release {args.release!r} yet")
    out = Path(args.out)
    (panel.export_parquet if out.suffix == ".parquet" else panel.export_csv)(out)
    print(f"wrote {panel.as_array().shape[0]} records x {panel.released_through} steps to {out}")
    return EXIT_OK


def cmd_query(args) -> int:
    panel = _synthetic_panel(args)
    if panel is None:
        return _fail(EXIT_RUNTIME, f"no synthetic data for release {args.release!r} yet")
    if panel.type == "fixed_window":
        counts = panel.window_counts(args.step, debias=args.debias)
        out = {"release": args.release, "step": args.step, "debiased": args.debias, "counts": counts.tolist()}
    else:
        out = {"release": args.release, "step": args.step, "at_least": panel.cumulative_counts(args.step).tolist()}
    print(json.dumps(out))
    return EXIT_OK


def cmd_plan(args) -> int:
    from pipeline.plan import planned_schedule

    dep = _load(args.config)
    sched = planned_schedule(dep)
    print(json.dumps({k: v.tolist() for k, v in sched.items()}, indent=2))
    return EXIT_OK


# -- batch and demo ------------------------------------------------------------------------------
def cmd_batch(args) -> int:
    from jobs import sipp_batch

    sipp_batch.main(args.rest)
    return EXIT_OK


def cmd_demo(args) -> int:
    from pipeline.demo import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dpstream", description="Continual differentially private releases from a "
                                "stream of user reports (synthetic longitudinal data, heavy hitters).")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(sp):
        sp.add_argument("--config", required=True, help="deployment YAML (see config/)")
        return sp

    d = sub.add_parser("demo", help="the main job: embedded broker + Redis, a simulated SIPP-like panel streamed "
                       "through real workers and the releaser, consumed back; prints a table and writes plots")
    d.add_argument("--n", type=int, default=23374, help="households (default 23,374 as in SIPP 2021)")
    d.add_argument("--workers", type=int, default=2)
    d.add_argument("--seed", type=int, default=2021, help="simulation seed; noise uses the secure source unless --seeded")
    d.add_argument("--seeded", action="store_true", help="seeded (non-secure) noise, for reproducible runs")
    d.add_argument("--out", default="out/demo", help="directory for plots, logs and summary.json")
    d.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("batch", help="the batch SIPP job (repeated runs of both synthesizers, plots)")
    b.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of `python -m jobs.sipp_batch`")
    b.set_defaults(func=cmd_batch)

    for name, fn, help_ in (("worker", cmd_worker, "run an ingest worker (aiokafka, bulk)"),
                            ("releaser", cmd_releaser, "run the releaser (aiokafka, one instance)")):
        sp = with_config(sub.add_parser(name, help=help_))
        sp.add_argument("--loglevel", default="info", choices=["crit", "error", "warn", "info", "debug"])
        sp.set_defaults(func=fn)

    u = with_config(sub.add_parser("up", help="start services (embedded when not configured), workers and releaser"))
    u.add_argument("--workers", type=int, default=1)
    u.add_argument("--log-dir", default="out/logs")
    u.add_argument("--ephemeral", action="store_true", help="keep the embedded Redis in a temporary directory "
                   "deleted on stop (throwaway runs); default: DPSTREAM_HOME/<deployment>/redis, kept")
    u.set_defaults(func=cmd_up)

    pr = with_config(sub.add_parser("produce", help="send reports from a CSV/JSONL file or the simulator"))
    g = pr.add_mutually_exclusive_group()
    g.add_argument("--csv", help="columns user,step,<attribute>...")
    g.add_argument("--jsonl", help="one report object per line")
    pr.add_argument("--step", type=int, help="simulator: only this step")
    pr.add_argument("--attribute", help="simulator: the binary attribute to fill")
    pr.add_argument("--seed", type=int, default=2021)
    pr.set_defaults(func=cmd_produce)

    c = with_config(sub.add_parser("close", help="close a step (and every earlier open step)"))
    c.add_argument("--step", type=int, required=True)
    c.set_defaults(func=cmd_close)

    with_config(sub.add_parser("status", help="released steps and the budget ledger")).set_defaults(func=cmd_status)
    with_config(sub.add_parser("plan", help="check the budget plan and print the per-step schedule")).set_defaults(
        func=cmd_plan)

    e = with_config(sub.add_parser("export", help="materialise a release's synthetic panel to CSV or Parquet"))
    e.add_argument("--release", required=True)
    e.add_argument("--out", required=True, help="*.csv or *.parquet")
    e.set_defaults(func=cmd_export)

    q = with_config(sub.add_parser("query", help="window-pattern or cumulative counts from the synthetic panel"))
    q.add_argument("--release", required=True)
    q.add_argument("--step", type=int, required=True)
    q.add_argument("--debias", action="store_true", help="subtract the public padding (fixed-window releases)")
    q.set_defaults(func=cmd_query)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
