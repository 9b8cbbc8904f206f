"""What a stream process needs, resolved once at its entry point: configuration, roster, topic
names, broker, Redis. Inside the process it is passed as an argument (a :class:`Runtime`), never
through the environment.

A job started as a process (``python -m jobs.worker``, ``python -m jobs.releaser``; ``dpstream
worker|releaser`` execs them) reads its arguments, each of which falls back to an environment
variable — the interface for a supervisor that starts the process (docs/streaming.md, "Processes"):

  --config        DPSTREAM_CONFIG        path of the deployment YAML (required)
  --broker        DPSTREAM_BROKER        bootstrap servers (``host:port``; default: the configuration's)
  --redis         DPSTREAM_REDIS         Redis URL (default: the configuration's)
  --metrics-port  DPSTREAM_METRICS_PORT  port of this process's Prometheus endpoint (0 = none)
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from pipeline.config import Deployment, load_config
from pipeline.connections import use_security
from pipeline.security import check_no_password_in_url
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.kafka.topics import topic_names

__all__ = ["Runtime", "JOB_MODULES", "job_command"]

# The stream jobs by role: started as processes (the library never imports ``jobs``).
JOB_MODULES = {"worker": "jobs.worker", "releaser": "jobs.releaser"}
LOGLEVELS = ("crit", "error", "warn", "info", "debug")


def job_command(
    role: str,
    config_path: str | Path,
    broker: str,
    redis_url: str,
    loglevel: str = "info",
    metrics_port: int | None = None,
) -> list[str]:
    """The command line starting the job of ``role`` (worker|releaser) as a process."""
    if role not in JOB_MODULES:
        raise ValueError(f"role must be one of {sorted(JOB_MODULES)}, got {role!r}")
    cmd = [
        sys.executable,
        "-m",
        JOB_MODULES[role],
        "--config",
        str(Path(config_path).resolve()),
        "--broker",
        broker,
        "--redis",
        redis_url,
        "--loglevel",
        loglevel,
    ]
    if metrics_port is not None:
        cmd += ["--metrics-port", str(metrics_port)]
    return cmd


@dataclass
class Runtime:
    deployment: Deployment
    broker: str
    redis_url: str
    config_path: str | None = None
    metrics_port: int = 0

    @classmethod
    def from_args(cls, role: str, argv: list[str] | None = None) -> tuple[Runtime, str]:
        """(runtime, log level) of a job process from its command line (and the environment fallbacks)."""
        env = os.environ
        ap = argparse.ArgumentParser(
            prog=f"python -m {JOB_MODULES[role]}", description=f"the dpstream {role}"
        )
        ap.add_argument(
            "--config", default=env.get("DPSTREAM_CONFIG"), help="deployment YAML (DPSTREAM_CONFIG)"
        )
        ap.add_argument(
            "--broker",
            default=env.get("DPSTREAM_BROKER"),
            help="bootstrap servers (DPSTREAM_BROKER)",
        )
        ap.add_argument(
            "--redis", default=env.get("DPSTREAM_REDIS"), help="Redis URL (DPSTREAM_REDIS)"
        )
        ap.add_argument(
            "--metrics-port",
            type=int,
            default=int(env.get("DPSTREAM_METRICS_PORT", "0") or 0),
            help="Prometheus endpoint port, 0 = none (DPSTREAM_METRICS_PORT)",
        )
        ap.add_argument("--loglevel", default="info", choices=LOGLEVELS)
        args = ap.parse_args(argv)
        if not args.config:
            ap.error("no configuration: pass --config FILE (or set DPSTREAM_CONFIG)")
        deployment = load_config(args.config)
        use_security(deployment.security)  # every client of this process connects as configured
        broker, redis_url = args.broker or deployment.broker, args.redis or deployment.redis
        if args.redis:
            try:
                check_no_password_in_url(args.redis, "--redis/DPSTREAM_REDIS")
            except ValueError as err:
                ap.error(str(err))
        if not broker or not redis_url:
            ap.error(
                "no broker/Redis configured: pass --broker and --redis, or start the job through `dpstream`"
            )
        return cls(deployment, broker, redis_url, args.config, args.metrics_port), args.loglevel

    @cached_property
    def roster(self) -> Roster:
        return Roster.from_config(self.deployment.roster)

    @cached_property
    def names(self) -> dict[str, str]:
        return topic_names(self.deployment)

    def store(self):
        """The synchronous store: the identity claim at start and reads (a worker's checkpoints when assigned)."""
        from pipeline.stream.state.store import StateStore

        return StateStore.from_url(self.redis_url, self.deployment.name)

    def async_store(self):
        """The asyncio store: every Redis call from a running job's event loop."""
        from pipeline.stream.state.store_async import AsyncStateStore

        return AsyncStateStore.from_url(self.redis_url, self.deployment.name)
