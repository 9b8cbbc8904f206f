"""What a stream process needs, resolved once: configuration, roster, topic names, broker, Redis.

The jobs read their settings from the environment, which the ``dpstream`` command line sets:

  DPSTREAM_CONFIG   path of the deployment YAML (required)
  DPSTREAM_BROKER   bootstrap servers (``host:port``); required by the jobs (the CLI starts the
                    embedded broker and fills this in when the configuration names none)
  DPSTREAM_REDIS    Redis URL (likewise)
  DPSTREAM_METRICS_PORT  port of the Prometheus endpoint of this process (0 = none)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

from pipeline.config import Deployment, load_config
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.kafka.topics import topic_names

__all__ = ["Runtime"]


@dataclass
class Runtime:
    deployment: Deployment
    broker: str
    redis_url: str
    config_path: str | None = None
    metrics_port: int = 0

    @classmethod
    def from_env(cls) -> "Runtime":
        path = os.environ.get("DPSTREAM_CONFIG")
        if not path:
            raise SystemExit("DPSTREAM_CONFIG is not set: run the jobs through `dpstream worker|releaser --config FILE`")
        deployment = load_config(path)
        broker = os.environ.get("DPSTREAM_BROKER") or deployment.broker
        redis_url = os.environ.get("DPSTREAM_REDIS") or deployment.redis
        if not broker or not redis_url:
            raise SystemExit("no broker/Redis configured: start the job through `dpstream`, which starts the embedded ones")
        return cls(deployment, broker, redis_url, path, int(os.environ.get("DPSTREAM_METRICS_PORT", "0") or 0))

    @cached_property
    def roster(self) -> Roster:
        return Roster.from_config(self.deployment.roster)

    @cached_property
    def names(self) -> dict[str, str]:
        return topic_names(self.deployment)

    def store(self):
        from pipeline.stream.state.store import ReleaseStore

        return ReleaseStore.from_url(self.redis_url, self.deployment.name)
