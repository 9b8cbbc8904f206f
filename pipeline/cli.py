"""``dpstream`` command line.

Exit codes: 0 success; 1 runtime failure (a process died, a timeout); 2 usage or configuration
error (including a budget plan that exceeds the budget, and a privacy-relevant configuration that
differs from the one the deployment's state was created under); 3 budget exhausted / refused at run
time; 4 state lost: the public topics hold releases the Redis state does not know (the fence), or
the state cannot be verified — releasing would redraw noise for steps already public.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from pipeline.connections import (SecretUnavailable, check_secrets, connection_failure, kafka_security, redis_client,
                                  use_security)
from pipeline.security import check_no_password_in_url, redact_url

EXIT_OK, EXIT_RUNTIME, EXIT_CONFIG, EXIT_BUDGET = 0, 1, 2, 3
EXIT_STATE_LOST = 4
_CONFIG_ARG: list[str] = []  # the --config as typed, for the hints in messages


def _load(path: str):
    from pipeline.config import ConfigError, load_config
    from pipeline.privacy.accounting import PrivacyBudgetError

    try:
        dep = load_config(path)  # includes the budget plan: refused before anything starts
    except FileNotFoundError:
        raise SystemExit(_fail(EXIT_CONFIG, f"no such configuration file: {path}"))
    except (ConfigError, PrivacyBudgetError) as err:
        raise SystemExit(_fail(EXIT_CONFIG, f"configuration refused: {err}"))
    use_security(dep.security)  # every client this command builds connects as configured (pipeline.connections)
    return dep


def _fail(code: int, message: str) -> int:
    print(f"dpstream: {message}", file=sys.stderr)
    return code


def _up_record(name: str) -> dict | None:
    """What `dpstream up` of deployment ``name`` recorded in its endpoints file, with ``alive``: whether that
    `up` still runs (False: a stale file left by a killed `up`). None when there is no file."""
    from pipeline.stream.local.cluster import endpoints_file
    from pipeline.stream.local.embedded import pid_alive

    path = endpoints_file(name)
    try:
        data = json.loads(path.read_text())
        pid = int(data["pid"])
    except FileNotFoundError:
        return None
    except (KeyError, ValueError, TypeError):
        return {"pid": None, "alive": False, "path": path}
    return dict(data, pid=pid, alive=pid_alive(pid), path=path)


def _stale(rec: dict) -> str:
    config = _CONFIG_ARG[0] if _CONFIG_ARG else "<config>"
    return (f"stale endpoints file {rec['path']}: the `dpstream up` that wrote it (pid {rec['pid']}) is no longer "
            f"running; `dpstream down --config {config}` removes it and stops anything it left behind")


_REACH_TIMEOUT = 5.0  # seconds per service: a command against a dead broker or Redis fails in well under 15 s
_reached: set[str] = set()


def _check_reachable(broker: str, redis_url: str | None) -> None:
    """One line and exit 1 if the broker or Redis (unless None) does not answer (instead of a client's retry loop)."""
    import socket

    import redis

    if broker not in _reached:
        errors = []
        for address in broker.split(","):
            host, _, port = address.strip().rpartition(":")
            try:
                socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=_REACH_TIMEOUT).close()
                break
            except (OSError, ValueError) as err:
                errors.append(f"{address}: {err}")
        else:
            raise SystemExit(_fail(EXIT_RUNTIME, f"broker unreachable ({'; '.join(errors)})"))
        _reached.add(broker)
    if redis_url is not None and redis_url not in _reached:
        try:
            redis_client(redis_url, socket_connect_timeout=_REACH_TIMEOUT, socket_timeout=_REACH_TIMEOUT).ping()
        except redis.RedisError as err:
            raise SystemExit(_fail(EXIT_RUNTIME, connection_failure(err)
                                   or f"Redis unreachable at {redact_url(redis_url)} ({_redacted(err, redis_url)})"))
        _reached.add(redis_url)


def _redacted(err: BaseException, url: str) -> str:
    """An error's text without the URL's password, should the client have quoted it."""
    from urllib.parse import urlsplit

    text = str(err)
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    return text.replace(password, "***") if password else text


def _endpoints(dep, check: bool = True, redis: bool = True) -> tuple[str, str | None]:
    """Broker and Redis of a deployment: configured, or those of a running `dpstream up`; checked to answer.
    ``redis=False`` (the analysts' commands: public topics only) neither needs nor touches Redis."""
    from pipeline.stream.local.cluster import endpoints_file

    # an unset variable or unreadable file is one line now, not a client's retry loop; an analyst has no
    # Redis secret to read
    check_secrets() if redis else kafka_security()
    broker = os.environ.get("DPSTREAM_BROKER") or dep.broker
    redis_url = (os.environ.get("DPSTREAM_REDIS") or dep.redis) if redis else None
    redis_url_given = bool(redis_url)
    if redis and os.environ.get("DPSTREAM_REDIS"):
        try:
            check_no_password_in_url(os.environ["DPSTREAM_REDIS"], "DPSTREAM_REDIS")
        except ValueError as err:
            raise SystemExit(_fail(EXIT_CONFIG, str(err))) from None
    if not (broker and (redis_url or not redis)):
        rec = _up_record(dep.name)
        if rec is None:
            raise SystemExit(_fail(EXIT_CONFIG, f"deployment {dep.name!r} names no broker/Redis and no `dpstream up` "
                                                f"is running for it (no {endpoints_file(dep.name)})"))
        if not rec["alive"]:
            raise SystemExit(_fail(EXIT_CONFIG, _stale(rec)))
        if "broker" not in rec:
            raise SystemExit(_fail(EXIT_RUNTIME, f"`dpstream up` of deployment {dep.name!r} (pid {rec['pid']}) is "
                                                 "still starting; try again in a moment"))
        broker, redis_url = broker or rec["broker"], (redis_url or rec["redis"]) if redis else None
        if redis and rec.get("local_secrets") and not redis_url_given:
            from pipeline.stream.local.embedded import LOCAL_SECRETS_ENV

            os.environ.setdefault(LOCAL_SECRETS_ENV, rec["local_secrets"])  # the embedded Redis's password file
    if check:
        _check_reachable(broker, redis_url)
    return broker, redis_url


# -- stream processes ---------------------------------------------------------------------------
def _run_job(role: str, args) -> int:
    """Check the configuration, resolve the endpoints, then become the job's process (exec: the same pid,
    signals and exit code; the job loads the configuration at its own entry point, and refuses a changed
    one with exit code 2 or a lost state with exit code 4)."""
    from pipeline.stream.kafka.runtime import job_command

    dep = _load(args.config)
    broker, redis_url = _endpoints(dep, check=False)  # the jobs retry while services start
    cmd = job_command(role, args.config, broker, redis_url, args.loglevel)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(cmd[0], cmd)
    return EXIT_RUNTIME  # not reached


def cmd_worker(args) -> int:
    return _run_job("worker", args)


def cmd_releaser(args) -> int:
    return _run_job("releaser", args)


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM takes the same shutdown path as Ctrl-C


def _claim(name: str) -> bool:
    """Create the endpoints file with only this process's pid, atomically (two `up` starting at once: one
    wins); LocalCluster.start completes it with the endpoints, LocalCluster.stop removes it."""
    from pipeline.stream.local.cluster import endpoints_file, private_home

    private_home()
    path = endpoints_file(name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps({"pid": os.getpid()}))
    return True


def cmd_up(args) -> int:
    """Start the deployment and supervise it: a worker or the releaser that exits unexpectedly is restarted
    (bounded, with backoff), as are the embedded broker and its storage; a refusal (exit code 2, 3, 4) or
    repeated failure stops everything with the failing process's own line and code. On Ctrl-C or SIGTERM
    (`kill`, `dpstream down`) the stream processes stop first, then the broker, its storage and Redis."""
    from pipeline.stream.local.cluster import LocalCluster, ProcessFailed, state_dir
    from pipeline.stream.state.store import ReleaseStore

    dep = _load(args.config)
    rec = _up_record(dep.name)
    if rec and rec["alive"]:  # two would share one Redis data directory
        return _fail(EXIT_CONFIG, f"`dpstream up` is already running for deployment {dep.name!r} (pid {rec['pid']}); "
                                  f"`dpstream down --config {args.config}` stops it")
    if rec:
        print(f"dpstream up: replacing {_stale(rec).split(';')[0]}", file=sys.stderr)
        _stop_leftovers(rec)
        rec["path"].unlink(missing_ok=True)
    # The embedded Redis (release records, ledger) and the embedded broker's log live in
    # DPSTREAM_HOME/<deployment>/{redis,log} unless --ephemeral: losing them would leave the deployment
    # unable to continue (the fence refuses) or lose reports the broker acknowledged.
    embedded = not (dep.redis and dep.broker)
    data_dir = None if args.ephemeral or not embedded else state_dir(dep.name)
    log_dir = Path(args.log_dir).resolve()
    cluster = LocalCluster(args.config, dep, workers=args.workers, log_dir=log_dir, metrics=True,
                           data_dir=data_dir, durable_log=data_dir is not None and not dep.broker)
    if not _claim(dep.name):
        return _fail(EXIT_CONFIG, f"another `dpstream up` of deployment {dep.name!r} is starting")
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = EXIT_OK
    try:
        cluster.start_services()
        marker_dir = data_dir if data_dir is not None and not dep.redis else None
        refused = _check_marker(dep, cluster.redis_url, marker_dir)
        if refused:
            code = _fail(EXIT_STATE_LOST, f"up: state lost: {refused}. Restore {marker_dir / 'redis'} from a backup "
                                          "(docs/streaming.md, Backup and restore), or start a new deployment under a "
                                          "new name with a new budget; nothing was started")
            return code
        cluster.start()
        redis_where = ("configured" if dep.redis else f"data in {data_dir / 'redis'}" if data_dir
                       else "ephemeral: deleted on stop")
        log_where = ("configured" if dep.broker else f"log in {data_dir / 'log'}" if cluster.durable_log
                     else "memory-only: its log is lost on stop")
        print(f"dpstream up: broker {cluster.broker}, redis {cluster.redis_url} ({redis_where}), "
              f"{args.workers} worker(s) + releaser; broker {log_where}; process logs in {log_dir}; "
              f"metrics ports {cluster.metrics_ports}. Ctrl-C or `dpstream down` stops.", flush=True)
        last_mark, store = None, ReleaseStore.from_url(cluster.redis_url, dep.name)
        while True:
            for line in cluster.supervise():
                print(f"dpstream up: {time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)
            if marker_dir is not None:
                last_mark = _update_marker(store, marker_dir, last_mark)
            time.sleep(0.5)
    except KeyboardInterrupt:
        code = EXIT_OK
    except ProcessFailed as err:
        code = _fail(err.exit_code, f"up: {err}; stopping (logs in {log_dir})")
    except (RuntimeError, TimeoutError, OSError) as err:  # a service did not start
        code = _fail(EXIT_RUNTIME, f"up: {err}; stopping (logs in {log_dir})")
    finally:
        for sig in previous:  # a second signal must not cut the shutdown short
            signal.signal(sig, signal.SIG_IGN)
        cluster.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


def _check_marker(dep, redis_url: str, marker_dir: Path | None) -> str | None:
    """Why this `up` would be a state-less start over a deployment that has released (None: it is not)."""
    from pipeline.stream.local.marker import read_marker, stateless_start
    from pipeline.stream.state.store import ReleaseStore

    if marker_dir is None:
        return None
    try:
        marker = read_marker(marker_dir)
    except ValueError as err:
        return str(err)
    if marker is None:
        return None
    store = ReleaseStore.from_url(redis_url, dep.name)
    return stateless_start(marker, store.identity(), store.last_released())


def _update_marker(store, marker_dir: Path, last):
    """Record the instance and last released step outside the Redis directory when they change."""
    import redis

    from pipeline.stream.local.marker import DeploymentMarker, write_marker

    try:
        identity, released = store.identity(), store.last_released()
    except redis.RedisError:
        return last  # the supervisor reports a dead Redis
    if identity is None or released < 1:
        return last
    mark = DeploymentMarker(identity["instance"], released)
    if mark != last:
        write_marker(marker_dir, mark)
    return mark


def _stop_leftovers(rec: dict) -> list[str]:
    """Stop the processes a killed `up` recorded and left running (pid and command line must both match)."""
    from pipeline.stream.local.cluster import process_cmdline
    from pipeline.stream.local.embedded import pid_alive

    stopped = []
    for name, proc in (rec.get("processes") or {}).items():
        pid, cmdline = proc.get("pid"), proc.get("cmdline")
        if not pid or not cmdline or process_cmdline(pid) != cmdline:
            continue  # gone, or the pid now belongs to another process
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                if os.getpgid(pid) == pid:  # the stream processes lead their own groups
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + 10
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not pid_alive(pid):
                break
        stopped.append(f"{name} (pid {pid})")
    return stopped


def cmd_down(args) -> int:
    """Stop the `dpstream up` of a deployment (SIGTERM, then wait for its shutdown); clean a stale file."""
    from pipeline.stream.local.embedded import pid_alive

    dep = _load(args.config)
    rec = _up_record(dep.name)
    if rec is None:
        print(f"no `dpstream up` is running for deployment {dep.name!r}; nothing to stop")
        return EXIT_OK
    if rec["alive"]:
        os.kill(rec["pid"], signal.SIGTERM)
        deadline = time.monotonic() + args.wait
        while pid_alive(rec["pid"]):
            if time.monotonic() > deadline:
                return _fail(EXIT_RUNTIME, f"`dpstream up` (pid {rec['pid']}) did not stop within {args.wait:g} s")
            time.sleep(0.2)
        print(f"stopped `dpstream up` (pid {rec['pid']}) of deployment {dep.name!r}")
    else:
        print(f"removed {_stale(rec).split(';')[0]}")
    left = _stop_leftovers(rec)  # nothing after a clean shutdown; a killed `up`'s orphans otherwise
    if left:
        print(f"stopped processes it had left running: {', '.join(left)}")
    rec["path"].unlink(missing_ok=True)
    return EXIT_OK


# -- producing and controlling ------------------------------------------------------------------
def _producer(dep):
    from pipeline.stream.kafka.producer import ReportProducer
    from pipeline.stream.ingest.roster import Roster
    from pipeline.stream.kafka.topics import topic_names

    broker, _ = _endpoints(dep)
    return ReportProducer(broker, dep, Roster.from_config(dep.roster), topic_names(dep))


def _intake(dep, wait: float):
    """(store, view): the workers' intake counts once they have handled the reports sent so far."""
    from pipeline.stream.ingest.intake_view import intake_view
    from pipeline.stream.state.store import ReleaseStore
    from pipeline.stream.kafka.topics import topic_names

    broker, redis_url = _endpoints(dep)
    store = ReleaseStore.from_url(redis_url, dep.name)
    names = topic_names(dep)
    from pipeline.producer import progress_printer

    return store, intake_view(store, broker, names["reports"], dep.topics.partitions, wait=wait,
                              repartition_topic=names["repartition"],
                              progress=progress_printer("waiting for the workers: handled", " records sent before"))


def _step_refused(dep, step: int, window: range) -> str | None:
    """Why the workers would dead-letter reports of ``step`` now (None: they accept them)."""
    if step < window.start:
        return f"step {step} is closed (steps up to {window.start - 1} are): the workers would dead-letter it as late"
    if step > window.stop - 1:
        return (f"step {step} is more than steps.max_ahead = {dep.steps.max_ahead} step(s) past the open step "
                f"{window.start}: the workers would dead-letter every report as future_step. Close step "
                f"{step - dep.steps.max_ahead - 1} first (dpstream close), then send it")
    return None


def cmd_produce(args) -> int:
    """Send one step's reports, never more than the deployment accepts now (see docs/streaming.md)."""
    from pipeline.stream.ingest.intake_view import open_window
    from pipeline.stream.ingest.report_files import ReportFileError, check_report_file
    from pipeline.stream.ingest.roster import Roster

    dep = _load(args.config)
    if args.step is not None and not 1 <= args.step <= dep.horizon:
        return _fail(EXIT_CONFIG, f"--step must be in 1..{dep.horizon}, got {args.step}")
    path = args.jsonl or args.csv
    found = None
    if path:  # the whole file is checked (a chunk at a time) before anything is sent
        try:
            found = check_report_file(path, dep, Roster.from_config(dep.roster))
        except ReportFileError as err:
            return _fail(EXIT_CONFIG, f"nothing sent: {err}")
    _, view = _intake(dep, wait=args.wait)
    window = open_window(dep, view.closing)
    if not len(window):
        return _fail(EXIT_BUDGET, f"nothing sent: every step (1..{dep.horizon}) is closed")
    if found is not None:
        if args.step is not None:
            found = found.only_step(args.step)
            if not len(found):
                return _fail(EXIT_CONFIG, f"nothing sent: {path} has no report for step {args.step}")
        for step, line in sorted(found.first_lines.items(), key=lambda kv: kv[1]):  # the first refused line
            why = _step_refused(dep, step, window)
            if why:
                return _fail(EXIT_BUDGET, f"nothing sent: {path}:{line}: {why}")
    else:
        step = args.step
        if step is None:  # the next open step without reports yet
            step = next((t for t in window if view.reported(t) == 0), None)
            if step is None:
                return _fail(EXIT_BUDGET, f"nothing sent: the steps the workers accept now ({window.start}.."
                                          f"{window.stop - 1}) already have reports; close step {window.start} first")
        why = _step_refused(dep, step, window)
        if why is None and view.reported(step):
            why = (f"step {step} already has {view.reported(step):,} accepted reports: sending it again would only "
                   f"be dead-lettered as duplicate")
        if why:
            return _fail(EXIT_BUDGET, f"nothing sent: {why}")
    if found is not None:
        return _send_file(dep, found, args.dry_run)
    if args.dry_run:
        print(f"dry run: would send {dep.n:,} simulated reports for step {step}; nothing sent")
        return EXIT_OK
    prod = _producer(dep)
    try:
        from pipeline.sim.panel import simulate_poverty_panel

        panel = simulate_poverty_panel(n=prod.roster.n, horizon=dep.horizon, seed=args.seed)
        attr = args.attribute or next(a for a, v in dep.attributes.items() if v.type == "binary")
        n = prod.send_step(step, {attr: panel[:, step - 1]})
    finally:
        prod.close()
    print(f"sent {n} reports for step {step}")
    return EXIT_OK


def _send_file(dep, found, dry_run: bool) -> int:
    """A checked report file through the producer helper (pipeline.producer): the topic must exist, every
    report is keyed by its user id, and what the broker acknowledged is what is reported."""
    from pipeline.producer import ReportSender, TopicMissing, progress_printer
    from pipeline.stream.ingest.report_files import ReportFileError

    steps = ", ".join(map(str, sorted(found.steps())))
    plural = "s" if len(found.steps()) > 1 else ""
    if dry_run:
        print(f"dry run: {len(found):,} reports for step{plural} {steps} pass the workers' checks; nothing sent")
        return EXIT_OK
    broker, _ = _endpoints(dep)
    with ReportSender(dep, broker) as sender:
        try:
            sender.check_topic()
        except TopicMissing as err:
            return _fail(EXIT_RUNTIME, str(err))
        try:  # the file read again, a chunk at a time
            result = sender.send(found.reports(), total=len(found), progress=progress_printer("acknowledged", " reports"))
        except ReportFileError as err:
            return _fail(EXIT_RUNTIME, str(err))
    if result.failed:
        i, why = result.failed[0]
        return _fail(EXIT_RUNTIME, f"sent {result.sent:,} reports, {result.acknowledged:,} acknowledged; "
                                   f"{len(result.failed):,} not (first: line {found.line_of(i)}: {why}); resend those")
    print(f"sent {result.acknowledged} reports for step{plural} {steps} (all acknowledged)")
    return EXIT_OK


def cmd_close(args) -> int:
    """Close steps through --step: say what the workers hold and what it spends; refuse a step whose
    reports were lost with the broker's log (without --force). The close guard only warns: a refusal
    on coverage would make the close time a function of an un-noised count (docs/privacy.md)."""
    from pipeline.plan import spend_of_steps
    from pipeline.stream.ingest.intake_view import close_assessment

    dep = _load(args.config)
    if not 1 <= args.step <= dep.horizon:
        return _fail(EXIT_CONFIG, f"--step must be in 1..{dep.horizon}, got {args.step}")
    store, view = _intake(dep, wait=args.wait)
    steps = range(view.closing + 1, args.step + 1)
    if not len(steps):
        released = store.last_released()
        which = (f"step {view.closing} is" if released + 1 == view.closing
                 else f"steps {released + 1}..{view.closing} are")
        pending = (f"; {which} closed but not released yet: the releaser is "
                   "gathering their partials, or they were lost with the broker's log — it writes their close "
                   "markers again when it starts (docs/streaming.md, 'A lost close'): if they are not released "
                   "soon, restart it (`dpstream down`, then `dpstream up`)" if released < view.closing else "")
        print(f"steps through {view.closing} are already closed; nothing to do{pending}")
        return EXIT_OK
    for p, count in view.unhandled.items():
        if count:
            print(f"WARNING: reports partition {p} has {count:,} records no worker has handled yet; "
                  "the counts below miss them", file=sys.stderr)
    checks = close_assessment(dep, view, steps)
    for c in checks:
        print(f"step {c.step}: {c.reported:,} of {c.users:,} users reported ({c.imputed_share:.1%} imputed, as the "
              f"workers' state holds it); rejected while open: {sum(c.rejected.values()):,} {c.rejected or ''}".rstrip())
        for w in c.warnings:
            print(f"WARNING: {w}", file=sys.stderr)
    for line in view.log_lost_warnings():
        print(f"LOST: {line}", file=sys.stderr)
    spend = spend_of_steps(dep, steps)
    label = f"steps {steps.start}..{steps.stop - 1}" if len(steps) > 1 else f"step {steps.start}"
    print(f"closing {label} releases {'them' if len(steps) > 1 else 'it'} and spends: "
          + (", ".join(f"{name} {next(iter(v))}={v[next(iter(v))]:.6g} ({v['share_of_release']:.1%} of its budget)"
                       for name, v in spend.items()) or "nothing"))
    if not args.force:
        if len(steps) > 1:
            return _fail(EXIT_BUDGET, f"refusing to close {len(steps)} steps at once without --force "
                                      f"(steps {steps.start}..{steps.stop - 1})")
        lost = [t for t in steps if t in view.lost()]
        if lost or any(view.stale.values()):
            return _fail(EXIT_BUDGET, f"refusing to close step(s) {lost or list(steps)}: reports the workers had "
                                      "counted were lost with the broker's log (LOST above); send them again, or "
                                      "pass --force to close with those users imputed")
    prod = _producer(dep)
    try:
        prod.close_step(args.step)
    finally:
        prod.close()
    from pipeline.producer import progress_printer

    deadline, started = time.monotonic() + args.wait, time.monotonic()
    waiting = progress_printer(f"waiting for the releaser's close markers of step {args.step}", " s")
    while store.last_closing() < args.step:
        waiting(int(time.monotonic() - started), int(args.wait))
        if time.monotonic() > deadline:
            return _fail(EXIT_RUNTIME, f"close of step {args.step} requested, but the releaser has not written its "
                                       f"close markers within {args.wait:g} s (is it running?)")
        time.sleep(0.1)
    print(f"closed through step {args.step} (close markers written)")
    return EXIT_OK


def cmd_status(args) -> int:
    """The deployment's state: from the running `dpstream up` (or the configured services), or, when
    nothing runs, from the embedded Redis's data directory (started briefly, read, stopped)."""
    from pipeline.status_view import format_status, status_document
    from pipeline.stream.ingest.intake_view import IntakeView
    from pipeline.stream.state.store import ReleaseStore

    dep = _load(args.config)
    rec = _up_record(dep.name)
    running = dep.redis or os.environ.get("DPSTREAM_REDIS") or (rec and rec["alive"])
    if running:
        _, redis_url = _endpoints(dep)
        store = ReleaseStore.from_url(redis_url, dep.name)
        try:
            intake = _intake(dep, wait=args.wait)[1].as_json()  # curator-side counts: the operator's terminal only
        except Exception as err:  # noqa: BLE001 - e.g. the broker is down: the rest of the status still shows
            intake = {"unavailable": f"{type(err).__name__}: {err}"}
        status = status_document(dep, store, intake, f"Redis at {redis_url}")
    else:
        if rec:  # a killed `up` may have left its Redis running on the data directory
            raise SystemExit(_fail(EXIT_CONFIG, _stale(rec)))
        with _redis_at_rest(dep) as (redis_url, where):
            store = ReleaseStore.from_url(redis_url, dep.name)
            view = IntakeView(store.last_closing(), dep.topics.partitions, store.intake())
            status = status_document(dep, store, view.as_json(), f"{where} (`dpstream up` is not running: the "
                                     "workers' counts are as they last wrote them; the broker's log is not checked)")
    print(json.dumps(status, indent=2, sort_keys=True) if args.json else format_status(status))
    return EXIT_OK


@contextlib.contextmanager
def _redis_at_rest(dep):
    """The embedded Redis of a stopped deployment, started on its data directory for one read."""
    from pipeline.stream.local.cluster import dpstream_home, endpoints_file
    from pipeline.stream.local.embedded import EmbeddedRedis

    data = dpstream_home() / dep.name / "redis"
    if not data.is_dir():
        raise SystemExit(_fail(EXIT_CONFIG, f"deployment {dep.name!r} names no broker/Redis, no `dpstream up` is "
                                            f"running for it (no {endpoints_file(dep.name)}) and it has no state in "
                                            f"{data}"))
    redis = EmbeddedRedis(data).start()
    try:
        yield redis.url, f"the embedded Redis's data in {data}"
    finally:
        redis.stop()


# -- consuming: the analysts' commands (pipeline.analyst), public topics only, never Redis ------------------
def _analyst(command: str, args) -> int:
    from pipeline.analyst import commands
    from pipeline.analyst.reader import AnalystError, NotReleased

    dep = _load(args.config)
    broker, _ = _endpoints(dep, redis=False)
    try:
        return getattr(commands, command)(dep, broker, args)
    except AnalystError as err:
        return _fail(EXIT_CONFIG, str(err))
    except NotReleased as err:
        return _fail(EXIT_RUNTIME, str(err))


def cmd_export(args) -> int:
    return _analyst("export", args)


def cmd_query(args) -> int:
    return _analyst("query", args)


def cmd_alerts(args) -> int:
    return _analyst("alerts", args)


def cmd_report(args) -> int:
    return _analyst("report", args)


def cmd_dead_letters(args) -> int:
    """Rejected reports by reason (curator side: the dead-letter topic holds the original reports)."""
    from pipeline.consumer import read_to_end
    from pipeline.dead_letters import format_summary, summarise
    from pipeline.stream.kafka.topics import topic_names

    dep = _load(args.config)
    broker, _ = _endpoints(dep, redis=False)
    topic = topic_names(dep)["dead-letter"]
    messages = []
    read_to_end(broker, [topic], messages.append)
    summary = summarise(messages, examples=args.examples)
    if args.json:
        print(json.dumps({reason: s.__dict__ for reason, s in summary.items()}))
    else:
        print(format_summary(summary, topic))
    return EXIT_OK


def cmd_plan(args) -> int:
    """Per release: allotment, padding, error bounds at its β, schedule; the total as (ε, δ); warnings."""
    from pipeline.plan_report import format_plan, plan_report

    report = plan_report(_load(args.config))
    print(json.dumps(report, indent=2) if args.json else format_plan(report))
    for line in report["warnings"]:
        print(f"WARNING: {line}", file=sys.stderr)
    return EXIT_OK


# -- batch and demo ------------------------------------------------------------------------------
def cmd_batch(args) -> int:
    cmd = [sys.executable, "-m", "jobs.eval.sipp_batch", *args.rest]  # a job: started, never imported by the library
    sys.stdout.flush()
    os.execv(cmd[0], cmd)
    return EXIT_RUNTIME  # not reached


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
    b.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of `python -m jobs.eval.sipp_batch`")
    b.set_defaults(func=cmd_batch)

    for name, fn, help_ in (("worker", cmd_worker, "run an ingest worker (aiokafka, bulk)"),
                            ("releaser", cmd_releaser, "run the releaser (aiokafka, one instance)")):
        sp = with_config(sub.add_parser(name, help=help_))
        sp.add_argument("--loglevel", default="info", choices=["critical", "error", "warning", "info", "debug"])
        sp.set_defaults(func=fn)

    u = with_config(sub.add_parser("up", help="start services (embedded when not configured), workers and releaser"))
    u.add_argument("--workers", type=int, default=1)
    u.add_argument("--log-dir", default="out/logs")
    u.add_argument("--ephemeral", action="store_true", help="keep the embedded Redis in a temporary directory "
                   "deleted on stop and the embedded broker's log in memory (throwaway runs); default: "
                   "DPSTREAM_HOME/<deployment>/redis and .../log, kept")
    u.set_defaults(func=cmd_up)

    pr = with_config(sub.add_parser("produce", help="send reports from a CSV/JSONL file or the simulator"))
    g = pr.add_mutually_exclusive_group()
    g.add_argument("--csv", help="columns user,step,<attribute>...")
    g.add_argument("--jsonl", help="one report object per line")
    pr.add_argument("--step", type=int, help="send only this step (default, simulator: the next open step "
                    "without reports; files: every row, all within the steps the workers accept now)")
    pr.add_argument("--attribute", help="simulator: the binary attribute to fill")
    pr.add_argument("--seed", type=int, default=2021)
    pr.add_argument("--wait", type=float, default=10.0, help="seconds to wait for the workers to count what was "
                    "sent before (default 10)")
    pr.add_argument("--dry-run", action="store_true", help="check everything (file, steps the workers accept now) "
                    "and say what would be sent; send nothing")
    pr.set_defaults(func=cmd_produce)

    c = with_config(sub.add_parser("close", help="close a step (and every earlier open step); shows the intake "
                                   "counts and what closing spends"))
    c.add_argument("--step", type=int, required=True)
    c.add_argument("--force", action="store_true", help="close several steps at once, or a step whose reports were "
                   "lost with the broker's log (their users are then imputed)")
    c.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the workers' counts and the "
                   "releaser's close markers (default 30)")
    c.set_defaults(func=cmd_close)

    dn = with_config(sub.add_parser("down", help="stop the `dpstream up` of a deployment (started in another "
                                    "terminal); remove a stale endpoints file"))
    dn.add_argument("--wait", type=float, default=60.0, help="seconds to wait for it to stop (default 60)")
    dn.set_defaults(func=cmd_down)

    st = with_config(sub.add_parser("status", help="released and closed steps, the budget spent, and what the workers "
                                    "hold per step (flags reports lost with the broker's log); works without `up`"))
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--wait", type=float, default=5.0, help="seconds to wait for the workers to count what was sent "
                    "(default 5)")
    st.set_defaults(func=cmd_status)
    pl = with_config(sub.add_parser("plan", help="check the budget plan; per release the padding, error bounds "
                                    "and per-step schedule; the total spend as (ε, δ)"))
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.set_defaults(func=cmd_plan)

    e = with_config(sub.add_parser("export", help="a release's synthetic records to CSV or Parquet, with their data "
                                   "dictionary (public topics only)"))
    e.add_argument("--release", required=True)
    e.add_argument("--out", required=True, help="*.csv (dictionary in *.csv.dictionary.json) or *.parquet "
                   "(dictionary in the schema metadata)")
    e.set_defaults(func=cmd_export)

    q = with_config(sub.add_parser("query", help="a release's answer at a step: labelled rows with interval and share "
                                   "of n (public topics only)"))
    q.add_argument("--release", required=True)
    q.add_argument("--step", type=int, required=True)
    q.add_argument("--raw", action="store_true", help="the synthetic records' counts with the padding (default: "
                   "debiased, the padding subtracted)")
    q.add_argument("--debias", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for scripts
    q.add_argument("--group", help="relative_error releases: a declared group, a code or value, or a code range "
                                   "lo:hi (dyadic); default: every declared group")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.set_defaults(func=cmd_query)

    al = with_config(sub.add_parser("alerts", help="the alerts by step, with labels, what a flag means and when flags "
                                    "run out (public topics only)"))
    al.add_argument("--release", help="only this release's alerts")
    al.add_argument("--step", type=int, help="only this step")
    al.add_argument("--json", action="store_true", help="machine-readable output")
    al.set_defaults(func=cmd_alerts)

    rp = with_config(sub.add_parser("report", help="write DIR/report.html: one self-contained page of every release's "
                                    "series, the privacy spend and the alerts (public topics only)"))
    rp.add_argument("--out", required=True, help="directory of report.html")
    rp.set_defaults(func=cmd_report)

    dl = with_config(sub.add_parser("dead-letters", help="rejected reports summarised by reason (curator side)"))
    dl.add_argument("--examples", type=int, default=0, help="show the first N details of each reason")
    dl.add_argument("--json", action="store_true", help="machine-readable output")
    dl.set_defaults(func=cmd_dead_letters)
    return p


def _unreachable(err: BaseException) -> str | None:
    """What a broker/Redis connection failure in the middle of a command was, or None (not one)."""
    import redis
    from kafka import errors as kafka_errors
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError

    NoBrokersAvailable = getattr(kafka_errors, "NoBrokersAvailable", KafkaConnectionError)  # gone in kafka-python 3

    try:
        from aiokafka.errors import KafkaConnectionError as AioConnectionError
    except ImportError:  # pragma: no cover
        AioConnectionError = KafkaConnectionError
    refused = connection_failure(err)  # a refused login, a TLS failure: says which key to check
    if refused:
        return refused
    if isinstance(err, (redis.ConnectionError, redis.TimeoutError)):
        return f"Redis unreachable ({err})"
    if isinstance(err, (NoBrokersAvailable, KafkaConnectionError, KafkaTimeoutError, AioConnectionError)):
        return f"broker unreachable ({type(err).__name__}: {err})"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "config", None):
        _CONFIG_ARG[:] = [args.config]
    try:
        return int(args.func(args) or 0)
    except SecretUnavailable as err:
        return _fail(EXIT_CONFIG, f"configuration refused: {err}")
    except OverflowError as err:  # e.g. budget.epsilon: 1e9 under allow_large: e^ε overflows a calibration
        return _fail(EXIT_CONFIG, f"configuration refused: a budget too large to calibrate ({err}); check budget.rho "
                                  "and budget.epsilon")
    except Exception as err:  # noqa: BLE001 - expected connection failures become one line; the rest a traceback
        why = _unreachable(err)
        if why is None:
            raise
        return _fail(EXIT_RUNTIME, why)


if __name__ == "__main__":
    sys.exit(main())
