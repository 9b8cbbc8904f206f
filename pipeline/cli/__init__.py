"""``dpstream`` command line.

Exit codes: 0 success; 1 runtime failure (a process died, a timeout, nothing published yet); 2 usage
or configuration error (an optional dependency not installed, the line naming the extra to install,
pipeline/extras.py; a budget plan that exceeds the budget; a privacy-relevant
configuration that differs from the one the deployment's state was created under or from its
published descriptor, each differing key named; a deployment name the broker has no topics of,
nothing created on it); 3 refused by the deployment's state now, nothing
done (a step already closed or too far ahead, every step closed, a close that needs ``--force``: several
steps, lost reports, a ``close: deadline`` deployment) — never a budget: the whole spend is planned and
checked at load (2), so no budget runs out at run time; 4 state lost: the public topics hold releases
the Redis state does not know (the fence), or the state cannot be verified — releasing would redraw
noise for steps already public. 5 ``produce``: the workers rejected (dead-lettered) some of the reports it
sent, counted by reason (``--dry-run``: would reject); 130 interrupted (Ctrl-C).

The commands live by audience: ``lifecycle`` (up, down, worker, releaser, demo, batch), ``operator``
(produce, close, status, plan, dead-letters), ``analyst`` (query, export, alerts, report); what they
share (exit codes, endpoints, reachability, configuration loading) in ``common``. This module holds the
parser and ``main``, and re-exports the commands' names under ``pipeline.cli``.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from pipeline.cli.analyst import (
    _analyst,
    add_alerts_args,
    add_hash_parser,
    add_source_args,
    cmd_alerts,
    cmd_export,
    cmd_query,
    cmd_report,
)
from pipeline.cli.common import (
    _CONFIG_ARG,
    _REACH_TIMEOUT,
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_RUNTIME,
    EXIT_STATE_LOST,
    _check_reachable,
    _endpoints,
    _fail,
    _load,
    _reached,
    _redacted,
    _stale,
    _unreachable,
    _up_record,
)
from pipeline.cli.lifecycle import (
    _check_marker,
    _claim,
    _interrupt,
    _run_job,
    _stop_leftovers,
    _update_marker,
    cmd_batch,
    cmd_demo,
    cmd_down,
    cmd_releaser,
    cmd_up,
    cmd_worker,
)
from pipeline.cli.operator import (
    _intake,
    _producer,
    _redis_at_rest,
    _send_file,
    _step_refused,
    cmd_close,
    cmd_dead_letters,
    cmd_plan,
    cmd_produce,
    cmd_status,
)
from pipeline.cli.quick_exit import collect_less, is_quick, leave
from pipeline.cli.verdict import DEFAULT_FATE_TIMEOUT
from pipeline.extras import extra_of_error
from pipeline.stream.kafka.topic_presence import TopicsMissing

__all__ = [
    "EXIT_CONFIG",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_RUNTIME",
    "EXIT_STATE_LOST",
    "build_parser",
    "main",
    "cmd_alerts",
    "cmd_batch",
    "cmd_close",
    "cmd_dead_letters",
    "cmd_demo",
    "cmd_down",
    "cmd_export",
    "cmd_plan",
    "cmd_produce",
    "cmd_query",
    "cmd_releaser",
    "cmd_report",
    "cmd_status",
    "cmd_up",
    "cmd_worker",
    "_CONFIG_ARG",
    "_REACH_TIMEOUT",
    "_analyst",
    "_check_marker",
    "_check_reachable",
    "_claim",
    "_endpoints",
    "_fail",
    "_intake",
    "_interrupt",
    "_load",
    "_producer",
    "_reached",
    "_redacted",
    "_redis_at_rest",
    "_run_job",
    "_send_file",
    "_stale",
    "_step_refused",
    "_stop_leftovers",
    "_unreachable",
    "_up_record",
    "_update_marker",
]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dpstream")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dpstream",
        description="Continual differentially private releases from a "
        "stream of user reports (synthetic longitudinal data, heavy hitters).",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(sp):
        sp.add_argument("--config", required=True, help="deployment YAML (see config/)")
        return sp

    d = sub.add_parser(
        "demo",
        help="the main job: embedded broker + Redis, a simulated SIPP-like panel streamed "
        "through real workers and the releaser, consumed back; prints a table and writes plots",
    )
    d.add_argument(
        "--n", type=int, default=23374, help="households (default 23,374 as in SIPP 2021)"
    )
    d.add_argument("--workers", type=int, default=2)
    d.add_argument(
        "--seed",
        type=int,
        default=2021,
        help="simulation seed; noise uses the secure source unless --seeded",
    )
    d.add_argument(
        "--seeded", action="store_true", help="seeded (non-secure) noise, for reproducible runs"
    )
    d.add_argument("--out", default="out/demo", help="directory for plots, logs and summary.json")
    d.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser(
        "batch", help="the batch SIPP job (repeated runs of both synthesizers, plots)"
    )
    b.add_argument(
        "rest", nargs=argparse.REMAINDER, help="arguments of `python -m jobs.eval.sipp_batch`"
    )
    b.set_defaults(func=cmd_batch)

    for name, fn, help_ in (
        ("worker", cmd_worker, "run an ingest worker (aiokafka, bulk)"),
        ("releaser", cmd_releaser, "run the releaser (aiokafka, one instance)"),
    ):
        sp = with_config(sub.add_parser(name, help=help_))
        sp.add_argument(
            "--loglevel", default="info", choices=["critical", "error", "warning", "info", "debug"]
        )
        sp.set_defaults(func=fn)

    u = with_config(
        sub.add_parser(
            "up", help="start services (embedded when not configured), workers and releaser"
        )
    )
    u.add_argument("--workers", type=int, default=1)
    u.add_argument("--log-dir", default="out/logs")
    u.add_argument(
        "--ephemeral",
        action="store_true",
        help="keep the embedded Redis in a temporary directory "
        "deleted on stop and the embedded broker's log in memory (throwaway runs); default: "
        "DPSTREAM_HOME/<deployment>/redis and .../log, kept",
    )
    u.set_defaults(func=cmd_up)

    pr = with_config(
        sub.add_parser(
            "produce",
            help="send reports from a CSV/JSONL/Parquet file (or, --simulate, "
            "simulated ones) and wait for the workers' verdict on them",
        )
    )
    g = pr.add_mutually_exclusive_group()
    g.add_argument("--csv", help="columns user,step,<attribute>... (docs/own-data.md)")
    g.add_argument("--jsonl", help="one report object per line")
    g.add_argument(
        "--simulate",
        action="store_true",
        help="simulated reports of every attribute (refused when the "
        "configuration says production: true)",
    )
    g.add_argument("--parquet", help="columns user, step and the attributes (or a values struct)")
    pr.add_argument(
        "--step",
        type=int,
        help="send only this step (default, simulator: the next open step "
        "without reports; files: every row, all within the steps the workers accept now)",
    )
    pr.add_argument(
        "--attribute", help="simulator: fill only this attribute (default: every attribute)"
    )
    pr.add_argument(
        "--seed",
        type=int,
        default=2021,
        help="simulator: the panel's seed (the same seed continues the same panel step after step)",
    )
    pr.add_argument(
        "--wait",
        type=float,
        default=10.0,
        help="seconds to wait for the workers to count what was sent before (default 10)",
    )
    pr.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_FATE_TIMEOUT,
        help="seconds to wait for the workers' "
        f"verdict on the reports sent (default {DEFAULT_FATE_TIMEOUT:g}); exit 1 if not all handled by "
        "then, 5 if any was rejected",
    )
    pr.add_argument(
        "--no-wait",
        action="store_true",
        help="do not wait for the workers' verdict (exit 0 once the "
        "broker acknowledged everything)",
    )
    pr.add_argument(
        "--replace",
        action="store_true",
        help="files: corrections — each report replaces the one the workers hold for "
        "its user and step while the step is open (docs/streaming.md)",
    )
    pr.add_argument(
        "--dry-run",
        action="store_true",
        help="check everything (file, steps the workers accept now, "
        "reports the workers already hold for those steps: the exact number of duplicates, "
        "read from the reports log) and say what would be sent; send nothing",
    )
    pr.set_defaults(func=cmd_produce)

    c = with_config(
        sub.add_parser(
            "close",
            help="close a step (and every earlier open step); shows the intake "
            "counts and what closing spends",
        )
    )
    c.add_argument("--step", type=int, required=True)
    c.add_argument(
        "--force",
        action="store_true",
        help="close several steps at once, a step whose reports were "
        "lost with the broker's log (their users are then imputed), or any step of a deployment that "
        "closes on a deadline (steps.close: deadline)",
    )
    c.add_argument(
        "--wait",
        type=float,
        default=30.0,
        help="seconds to wait for the workers' counts and the "
        "releaser's close markers (default 30)",
    )
    c.set_defaults(func=cmd_close)

    dn = with_config(
        sub.add_parser(
            "down",
            help="stop the `dpstream up` of a deployment (started in another "
            "terminal); remove a stale endpoints file",
        )
    )
    dn.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for it to stop (default 60)"
    )
    dn.add_argument(
        "--force",
        action="store_true",
        help="stop it even when the configuration given is "
        "not the one the deployment was started with (refused otherwise, exit 2)",
    )
    dn.set_defaults(func=cmd_down)

    st = with_config(
        sub.add_parser(
            "status",
            help="released and closed steps, the budget spent, and what the workers "
            "hold per step (flags reports lost with the broker's log); works without `up`",
        )
    )
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument(
        "--wait",
        type=float,
        default=5.0,
        help="seconds to wait for the workers to count what was sent (default 5)",
    )
    st.set_defaults(func=cmd_status)
    pl = with_config(
        sub.add_parser(
            "plan",
            help="check the budget plan; per release the padding, error bounds "
            "and per-step schedule; the total spend as (ε, δ)",
        )
    )
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.add_argument(
        "--sweep",
        metavar="KEY=V1,V2,...",
        help="plan once per value of one configuration key "
        "(e.g. budget.rho=0.005,0.01,0.02) and print the releases' bounds as a table",
    )
    pl.add_argument(
        "--target",
        metavar="RELEASE=SHARE",
        help="the smallest value of --vary at which RELEASE's a-priori bound is within "
        "SHARE of n (e.g. poverty-quarterly=0.02), by bisection",
    )
    pl.add_argument(
        "--vary",
        metavar="KEY",
        help="the key --target searches over "
        "(default budget.rho, or budget.epsilon for a monitor release)",
    )
    pl.add_argument(
        "--within",
        metavar="LOW,HIGH",
        help="the range --target searches (default: the configured value /1000 .. ×1000)",
    )
    pl.set_defaults(func=cmd_plan)

    e = add_source_args(
        sub.add_parser(
            "export",
            help="a release's synthetic records to CSV or Parquet, with their data "
            "dictionary (public topics only)",
        )
    )
    e.add_argument("--release", required=True)
    e.add_argument(
        "--out",
        required=True,
        help="*.csv (dictionary in *.csv.dictionary.json) or *.parquet "
        "(dictionary in the schema metadata)",
    )
    e.set_defaults(func=cmd_export)

    q = add_source_args(
        sub.add_parser(
            "query",
            help="a release's answer at a step: labelled rows with interval and share "
            "of n (public topics only)",
        )
    )
    q.add_argument("--release", required=True)
    q.add_argument("--step", type=int, required=True)
    q.add_argument(
        "--raw",
        action="store_true",
        help="the synthetic records' counts with the padding (default: "
        "debiased, the padding subtracted)",
    )
    q.add_argument(
        "--debias", action="store_true", help=argparse.SUPPRESS
    )  # the default now; kept for scripts
    q.add_argument(
        "--group",
        help="relative_error releases: a declared group, a code or value, or a code range "
        "lo:hi (dyadic); default: every declared group",
    )
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.set_defaults(func=cmd_query)

    al = add_source_args(
        sub.add_parser(
            "alerts",
            help="the alerts by step, with labels, what a flag means and when flags "
            "run out (public topics only)",
        )
    )
    al.add_argument("--release", help="only this release's alerts")
    al.add_argument("--step", type=int, help="only this step")
    al.add_argument("--json", action="store_true", help="machine-readable output")
    add_alerts_args(al)
    al.set_defaults(func=cmd_alerts)
    add_hash_parser(sub)

    rp = add_source_args(
        sub.add_parser(
            "report",
            help="write DIR/report.html: one self-contained page of every release's "
            "series, the privacy spend and the alerts (public topics only)",
        )
    )
    rp.add_argument("--out", required=True, help="directory of report.html")
    rp.set_defaults(func=cmd_report)

    dl = with_config(
        sub.add_parser("dead-letters", help="rejected reports summarised by reason (curator side)")
    )
    dl.add_argument(
        "--examples", type=int, default=0, help="show the first N details of each reason"
    )
    dl.add_argument("--json", action="store_true", help="machine-readable output")
    dl.set_defaults(func=cmd_dead_letters)
    return p


def run() -> NoReturn:
    """The ``dpstream`` command (its console script and ``python -m pipeline.cli``): :func:`main`
    on the process's arguments, then its exit; a quick command (``produce``, ``status``) ends
    without the interpreter's teardown (:mod:`pipeline.cli.quick_exit`)."""
    argv = sys.argv[1:]
    quick = is_quick(argv)
    if quick:
        collect_less()
    code = main(argv)
    if quick:
        leave(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "config", None):
        _CONFIG_ARG[:] = [args.config]
    try:
        return int(args.func(args) or 0)
    except (
        OverflowError
    ) as err:  # e.g. budget.epsilon: 1e9 under allow_large: e^ε overflows a calibration
        return _fail(
            EXIT_CONFIG,
            f"configuration refused: a budget too large to calibrate ({err}); check budget.rho "
            "and budget.epsilon",
        )
    except (
        ModuleNotFoundError
    ) as err:  # an optional dependency (pipeline.extras): the extra to install
        line = extra_of_error(
            err, f"dpstream {args.func.__name__.removeprefix('cmd_').replace('_', '-')}"
        )
        if line is None:
            raise
        return _fail(EXIT_CONFIG, line)
    except TopicsMissing as err:  # a reader of a deployment's topics the broker does not have
        return _fail(EXIT_CONFIG, str(err))
    except Exception as err:  # noqa: BLE001 - expected connection failures become one line; the rest a traceback
        # imported here, not at the top: the parser needs none of pydantic (tests/test_cli_imports.py)
        from pipeline.connections import SecretUnavailable

        if isinstance(err, SecretUnavailable):
            return _fail(EXIT_CONFIG, f"configuration refused: {err}")
        why = _unreachable(err)
        if why is None:
            raise
        return _fail(EXIT_RUNTIME, why)
