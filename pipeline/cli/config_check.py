"""The operator's commands check their configuration against the deployment's, as the processes do.

The releaser and the workers refuse to start under a privacy-relevant configuration other than the
one the deployment's state was created with (:mod:`pipeline.stream.state.identity`). A command that
reads or changes that state (``produce``, ``close``, ``status``) would otherwise print spend, budget
and step counts for a file that is not the deployment's (a ρ of 0.05 against a deployment at 0.02)
or send a close under it; it refuses instead, exit code 2, naming each differing key.

``plan``, ``dead-letters`` and ``down`` work without the deployment's Redis (a plan is made before
anything starts; the dead letters are on the broker; ``down`` must stop a deployment whatever state
it is in), so they check when the deployment has a Redis to ask: its configuration or the
environment names one, or a ``dpstream up`` of it runs (:func:`refuse_if_started_differently`).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from pipeline.cli.common import EXIT_CONFIG, _endpoints, _fail, _up_record

if TYPE_CHECKING:
    from pipeline.config import Deployment
    from pipeline.stream.state.store import StateStore

__all__ = ["refuse_if_started_differently", "refuse_other_configuration"]

_PROBE_TIMEOUT = (
    3.0  # seconds: a Redis that does not answer leaves these commands unchecked, not stuck
)


def refuse_if_started_differently(deployment: Deployment, hint: str = "") -> None:
    """:func:`refuse_other_configuration` for the commands that also work without Redis: when the
    deployment's Redis is known and answers. Not started here (no Redis named, no `up` running):
    nothing to compare with, so nothing is refused; a Redis that does not answer: a warning."""
    import redis

    from pipeline.connections import redis_client
    from pipeline.stream.state.store import StateStore

    rec = _up_record(deployment.name)
    if not (
        os.environ.get("DPSTREAM_REDIS")
        or deployment.redis
        or (rec and rec["alive"] and "redis" in rec)
    ):
        return
    _, redis_url = _endpoints(deployment, check=False)
    assert redis_url is not None  # _endpoints(redis=True) names one or exits
    try:
        redis_client(
            redis_url, socket_connect_timeout=_PROBE_TIMEOUT, socket_timeout=_PROBE_TIMEOUT
        ).ping()
    except redis.RedisError as err:
        print(
            f"WARNING: the configuration was not checked against deployment {deployment.name!r}'s: its "
            f"Redis did not answer ({type(err).__name__})",
            file=sys.stderr,
        )
        return
    refuse_other_configuration(deployment, StateStore.from_url(redis_url, deployment.name), hint)


def refuse_other_configuration(deployment: Deployment, store: StateStore, hint: str = "") -> None:
    """SystemExit(2) naming the differing keys when ``deployment`` is not the configuration ``store``'s
    state was created under; nothing when it is, or when no process has started yet."""
    from pipeline.stream.ingest.roster import Roster
    from pipeline.stream.state.fingerprint import config_changes, fingerprint, privacy_config

    identity = store.identity()
    if identity is None:
        return
    try:
        ids = Roster.from_config(deployment.roster).ids
    except OSError as err:
        raise SystemExit(
            _fail(
                EXIT_CONFIG,
                f"roster.path: {err.filename}: {err.strerror} (the "
                "operator's commands check the roster against the "
                "deployment's)",
            )
        ) from None
    current = privacy_config(deployment, ids)
    if fingerprint(current) == identity.get("fingerprint"):
        return
    changes = "; ".join(config_changes(identity.get("config", {}), current))
    raise SystemExit(
        _fail(
            EXIT_CONFIG,
            "configuration refused: the privacy-relevant configuration "
            f"differs from the one deployment {deployment.name!r} was started "
            f"with: {changes}. Use the deployment's own configuration "
            f"file (the processes refuse this one too){hint}",
        )
    )
