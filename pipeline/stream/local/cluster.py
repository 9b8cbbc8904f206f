"""Run a deployment locally: services (embedded or configured) plus worker and releaser processes.

Used by ``dpstream up``, ``dpstream demo`` and the stream tests. The workers and the releaser are
separate operating-system processes running the jobs, exactly as in production; only the
broker and Redis may be the embedded ones.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from pipeline.stream.kafka.runtime import job_command
from pipeline.stream.kafka.topics import ensure_topics, topic_names
from pipeline.stream.local.embedded import (LOCAL_SECRETS_ENV, EmbeddedServices, free_port, open_private_log, private_dir,
                                             private_file)

__all__ = ["LocalCluster", "endpoints_file", "state_dir", "dpstream_home", "private_home", "process_cmdline"]


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


def process_cmdline(pid: int) -> str | None:
    """The command line of process ``pid`` (Linux /proc), None if unknown: recorded with each pid in the
    endpoints file so that ``dpstream down`` never signals an unrelated process that reused the pid."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def state_dir(deployment_name: str) -> Path:
    """The persistent data directory of a deployment's embedded services (its Redis in ``redis/``), mode
    0700: the release records, the ledger and the mechanism state outlive ``dpstream up``."""
    return private_dir(private_home() / deployment_name)  # no other local user reads a deployment's state


class LocalCluster:
    def __init__(self, config_path: str | Path, deployment, workers: int = 1, log_dir: str | Path | None = None,
                 data_dir: str | Path | None = None, metrics: bool = False):
        self.config_path = str(Path(config_path).resolve())
        self.deployment = deployment
        self.workers = int(workers)
        self.log_dir = Path(log_dir) if log_dir else None
        self.data_dir = data_dir
        self.metrics = metrics
        self.services: EmbeddedServices | None = None
        self.broker = deployment.broker
        self.redis_url = deployment.redis
        self.procs: dict[str, subprocess.Popen] = {}
        self.metrics_ports: dict[str, int] = {}
        self.names = topic_names(deployment)

    # -- services ------------------------------------------------------------------------------
    def start_services(self) -> None:
        if self.broker and self.redis_url:
            return
        if self.log_dir:
            private_dir(self.log_dir, narrow=False)
        self.services = EmbeddedServices(data_dir=self.data_dir,
                                         broker_log=(self.log_dir / "broker.log") if self.log_dir else None)
        self.services.start()
        self.broker = self.broker or self.services.broker.bootstrap
        self.redis_url = self.redis_url or self.services.redis.url

    def env(self) -> dict[str, str]:
        """The stream processes' environment (the configuration and endpoints go on their command line)."""
        return dict(os.environ, PYTHONUNBUFFERED="1")

    # -- processes -----------------------------------------------------------------------------
    def spawn(self, role: str, name: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
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
        proc = subprocess.Popen(
            job_command(role, self.config_path, self.broker, self.redis_url, metrics_port=port),
            env={**self.env(), **(extra_env or {})}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def start(self, releaser_env: dict[str, str] | None = None) -> "LocalCluster":
        self.start_services()
        ensure_topics(self.broker, self.deployment)
        self.spawn("releaser", "releaser", releaser_env)
        for i in range(self.workers):
            self.spawn("worker", f"worker-{i}")
        path = endpoints_file(self.deployment.name)
        private_home()
        record = {"broker": self.broker, "redis": self.redis_url, "pid": os.getpid(), "processes": self.process_record()}
        if os.environ.get(LOCAL_SECRETS_ENV):  # where the embedded Redis's password is (never the password)
            record["local_secrets"] = os.environ[LOCAL_SECRETS_ENV]
        private_file(path, json.dumps(record))  # owner-only, atomically: readers never see half a file
        return self

    def process_record(self) -> dict[str, dict]:
        """Pid and command line of every process this cluster started (services included)."""
        pids = {name: proc.pid for name, proc in self.procs.items()}
        if self.services is not None:
            pids.update(broker=self.services.broker.pid, redis=self.services.redis.pid)
        return {name: {"pid": pid, "cmdline": process_cmdline(pid)} for name, pid in pids.items() if pid}

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
            raise RuntimeError(f"stream processes exited: {dead}" + (f" (logs in {self.log_dir})" if self.log_dir else ""))

    def stop(self) -> None:
        for name, proc in list(self.procs.items()):
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
        try:
            endpoints_file(self.deployment.name).unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
