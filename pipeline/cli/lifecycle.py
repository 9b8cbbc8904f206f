"""The lifecycle commands: `up` (services, workers and releaser, supervised), `down`, the stream processes
(`worker`, `releaser`), `demo` and `batch`."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.cli.common import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_STATE_LOST,
    _endpoints,
    _fail,
    _load,
    _stale,
    _up_record,
)
from pipeline.extras import missing_extra

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline.config import Deployment
    from pipeline.stream.state.store import StateStore


# -- stream processes ---------------------------------------------------------------------------
def _run_job(role: str, args) -> int:
    """Check the configuration, resolve the endpoints, then become the job's process (exec: the same pid,
    signals and exit code; the job loads the configuration at its own entry point, and refuses a changed
    one with exit code 2 or a lost state with exit code 4)."""
    from pipeline.stream.process.runtime import job_command

    deployment = _load(args.config)
    broker, redis_url = _endpoints(deployment, check=False)  # the jobs retry while services start
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
    """Create the endpoints file with only this process's pid and its supervisor tag, atomically (two `up`
    starting at once: one wins), before any process is started; LocalCluster.start completes it with the
    endpoints, LocalCluster.stop removes it."""
    from pipeline.stream.local.cluster import endpoints_file, private_home
    from pipeline.stream.local.leftovers import SUPERVISOR_ENV

    private_home()
    path = endpoints_file(name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "supervisor": os.environ.get(SUPERVISOR_ENV)}))
    return True


def cmd_up(args) -> int:
    """Start the deployment and supervise it: a worker or the releaser that exits unexpectedly is restarted
    (bounded, with backoff), as are the embedded broker and its storage; a refusal (exit code 2, 3, 4) or
    repeated failure stops everything with the failing process's own line and code. On Ctrl-C or SIGTERM
    (`kill`, `dpstream down`) the stream processes stop first, then the broker, its storage and Redis."""
    from pipeline.stream.kafka.topics import PartitionCountChanged
    from pipeline.stream.local.cluster import (
        SUPERVISION_INTERVAL,
        LocalCluster,
        ProcessFailed,
        state_dir,
    )
    from pipeline.stream.local.file_sd import targets_file
    from pipeline.stream.local.housekeeper import Housekeeper
    from pipeline.stream.local.leftovers import SUPERVISOR_ENV, new_tag
    from pipeline.stream.state.store import StateStore
    from pipeline.upload_time import deadline_warning

    deployment = _load(args.config)
    rec = _up_record(deployment.name)
    if rec and rec["alive"]:  # two would share one Redis data directory
        return _fail(
            EXIT_CONFIG,
            f"`dpstream up` is already running for deployment {deployment.name!r} (pid {rec['pid']}); "
            f"`dpstream down --config {args.config}` stops it",
        )
    if rec:
        print(f"dpstream up: replacing {_stale(rec).split(';')[0]}", file=sys.stderr)
        _stop_leftovers(rec)
        rec["path"].unlink(missing_ok=True)
    # The embedded Redis (release records, ledger) and the embedded broker's log live in
    # DPSTREAM_HOME/<deployment>/{redis,log} unless --ephemeral: losing them would leave the deployment
    # unable to continue (the fence refuses) or lose reports the broker acknowledged.
    embedded = not (deployment.redis and deployment.broker)
    data_dir = None if args.ephemeral or not embedded else state_dir(deployment.name)
    log_dir = Path(args.log_dir).resolve()
    cluster = LocalCluster(
        args.config,
        deployment,
        workers=args.workers,
        log_dir=log_dir,
        metrics=True,
        data_dir=data_dir,
        durable_log=data_dir is not None and not deployment.broker,
        isolated=True,
    )
    os.environ[SUPERVISOR_ENV] = new_tag(
        deployment.name
    )  # inherited by every process started from here on
    if not _claim(deployment.name):
        return _fail(
            EXIT_CONFIG, f"another `dpstream up` of deployment {deployment.name!r} is starting"
        )
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    code, marking = EXIT_OK, None
    try:
        cluster.start_services()
        cluster.write_endpoints()  # Redis's pid, before anything else can fail (leftovers.py)
        marker_dir = data_dir if data_dir is not None and not deployment.redis else None
        refused = _check_marker(deployment, cluster.redis_url, marker_dir)
        if refused and marker_dir is not None:  # a refusal needs a marker (_check_marker)
            code = _fail(
                EXIT_STATE_LOST,
                f"up: state lost: {refused}. Restore {marker_dir / 'redis'} from a backup "
                "(docs/streaming.md, Backup and restore), or start a new deployment under a "
                "new name with a new budget; nothing was started",
            )
            return code
        cluster.start()
        targets = _write_targets(deployment.name, cluster.metrics_ports, None)
        redis_where = (
            "configured"
            if deployment.redis
            else f"data in {data_dir / 'redis'}"
            if data_dir
            else "ephemeral: deleted on stop"
        )
        log_where = (
            "configured"
            if deployment.broker
            else f"log in {data_dir / 'log'}"
            if cluster.durable_log and data_dir
            else "memory-only: its log is lost on stop"
        )
        print(
            f"dpstream up: broker {cluster.broker}, redis {cluster.redis_url} ({redis_where}), "
            f"{args.workers} worker(s) + releaser; broker {log_where}; process logs in {log_dir}; "
            f"metrics ports {cluster.metrics_ports} (Prometheus file_sd: {targets_file(deployment.name)}). Ctrl-C or "
            "`dpstream down` stops.",
            flush=True,
        )
        if not deployment.broker:
            from pipeline.stream.local.broker_access import embedded_broker_notice

            print(
                embedded_broker_notice(cluster.broker, cluster.broker_tls()),
                file=sys.stderr,
                flush=True,
            )
        late = deadline_warning(deployment)
        if late:
            print(f"WARNING: {late}", file=sys.stderr, flush=True)
        # Beside this loop, in threads: their rounds wait on Redis, the broker or its object store,
        # and would hold up the supervise() that restarts a dead one (docs/operations.md, Supervision).
        cluster.start_housekeeping()
        if marker_dir is not None:
            store = StateStore.from_url(cluster.redis_url, deployment.name)
            marking = Housekeeper(_marker_round(store, marker_dir), SUPERVISION_INTERVAL).start()
        while True:
            for line in cluster.supervise() + cluster.housekeeping_lines():
                print(
                    f"dpstream up: {time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True
                )
            targets = _write_targets(
                deployment.name, cluster.metrics_ports, targets
            )  # a restart takes a new port
            time.sleep(SUPERVISION_INTERVAL)
    except KeyboardInterrupt:
        code = EXIT_OK
    except ProcessFailed as err:
        code = _fail(err.exit_code, f"up: {err}; stopping (logs in {log_dir})")
    except PartitionCountChanged as err:  # before RuntimeError: a refusal of the configuration
        code = _fail(EXIT_CONFIG, f"up: {err}")
    except (RuntimeError, TimeoutError, OSError) as err:  # a service did not start
        code = _fail(EXIT_RUNTIME, f"up: {err}; stopping (logs in {log_dir})")
    finally:
        for sig in previous:  # a second signal must not cut the shutdown short
            signal.signal(sig, signal.SIG_IGN)
        if marking is not None:
            marking.stop()
        cluster.stop()
        targets_file(deployment.name).unlink(missing_ok=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


def _write_targets(
    name: str, ports: dict[str, int], written: dict[str, int] | None
) -> dict[str, int]:
    """The Prometheus file_sd targets of this `up` (pipeline.stream.local.file_sd), when they changed."""
    from pipeline.stream.local.file_sd import targets_file, write_targets

    if ports != written:
        write_targets(targets_file(name), name, ports)
    return dict(ports)


def _check_marker(deployment: Deployment, redis_url: str, marker_dir: Path | None) -> str | None:
    """Why this `up` would be a state-less start over a deployment that has released (None: it is not)."""
    from pipeline.stream.local.marker import read_marker, stateless_start
    from pipeline.stream.state.store import StateStore

    if marker_dir is None:
        return None
    try:
        marker = read_marker(marker_dir)
    except ValueError as err:
        return str(err)
    if marker is None:
        return None
    store = StateStore.from_url(redis_url, deployment.name)
    return stateless_start(marker, store.identity(), store.last_released())


def _marker_round(store: StateStore, marker_dir: Path) -> Callable[[], list[str]]:
    """A housekeeping round (:class:`pipeline.stream.local.housekeeper.Housekeeper`) that keeps the
    deployment marker up to date; it has nothing to tell the operator."""
    last = None

    def keep_marker() -> list[str]:
        nonlocal last
        last = _update_marker(store, marker_dir, last)
        return []

    return keep_marker


def _update_marker(store: StateStore, marker_dir: Path, last):
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
    """Stop every process a killed `up` left running: those carrying its supervisor tag
    (:mod:`pipeline.stream.local.leftovers`: recorded or not), then those it recorded whose pid and
    command line both match (Redis: its process title overwrites the environment the tag is in; a
    record written before tags)."""
    from pipeline.stream.local.cluster import process_cmdline
    from pipeline.stream.local.embedded import pid_alive
    from pipeline.stream.local.leftovers import stop_tagged

    stopped = stop_tagged(rec["supervisor"]) if rec.get("supervisor") else []
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

    deployment = _load(args.config)
    rec = _up_record(deployment.name)
    if rec is None:
        print(f"no `dpstream up` is running for deployment {deployment.name!r}; nothing to stop")
        return EXIT_OK
    if rec["alive"]:
        if not args.force:  # the deployment it would stop is not the one this file describes
            from pipeline.cli.config_check import refuse_if_started_differently

            refuse_if_started_differently(deployment, "; --force stops it anyway")
        os.kill(rec["pid"], signal.SIGTERM)
        os.kill(rec["pid"], signal.SIGCONT)  # a stopped `up` takes its SIGTERM once continued
        deadline = time.monotonic() + args.wait
        while pid_alive(rec["pid"]):
            if time.monotonic() > deadline:
                return _fail(
                    EXIT_RUNTIME,
                    f"`dpstream up` (pid {rec['pid']}) did not stop within {args.wait:g} s",
                )
            time.sleep(0.2)
        print(f"stopped `dpstream up` (pid {rec['pid']}) of deployment {deployment.name!r}")
    else:
        print(f"removed {_stale(rec).split(';')[0]}")
    left = _stop_leftovers(rec)  # nothing after a clean shutdown; a killed `up`'s orphans otherwise
    if left:
        print(f"stopped processes it had left running: {', '.join(left)}")
    rec["path"].unlink(missing_ok=True)
    return EXIT_OK


# -- batch and demo ------------------------------------------------------------------------------
def cmd_batch(args) -> int:
    missing = missing_extra("dpstream batch", "matplotlib", "tqdm")
    if missing:
        return _fail(EXIT_CONFIG, missing)
    cmd = [
        sys.executable,
        "-m",
        "jobs.eval.sipp_batch",
        *args.rest,
    ]  # a job: started, never imported by the library
    sys.stdout.flush()
    os.execv(cmd[0], cmd)
    return EXIT_RUNTIME  # not reached


def cmd_demo(args) -> int:
    missing = missing_extra("dpstream demo", "matplotlib")
    if missing:
        return _fail(EXIT_CONFIG, missing)
    from pipeline.demo import run_demo

    return run_demo(args)
