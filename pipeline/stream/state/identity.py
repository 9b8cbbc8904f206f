"""Which deployment a Redis state belongs to, and under which privacy-relevant configuration.

At its first start a deployment writes ``{p}:identity`` to Redis (SET NX, first writer wins): a
random instance id, the canonical privacy-relevant configuration (:mod:`pipeline.stream.state.fingerprint`)
and its sha256. Every later start of the releaser or of a worker recomputes the document from its
own configuration and refuses to start when the hash differs, naming each changed key — restored
state is calibrated for the stored parameters (a heavy-hitter mechanism for k = 3 must not meet
aggregators rebuilt for k = 20).

``{p}:identity`` is readable and writable by the workers' Redis login too (Redis 6.2 grants commands
per user, not per key, and a worker claims the identity at its first start). So the releaser keeps
its
own copy under ``{p}:release:identity``, a key only its login reaches, written at its first start;
at
every later start it checks its configuration against that copy as well. A worker credential that
rewrites ``{p}:identity`` to the fingerprint of a changed configuration therefore gets nothing
released
under it: the releaser refuses (exit code 2) naming the changed keys, and ``dpstream up`` stops
with it.

The instance id is random (``uuid4``), independent of the data, and public: the releaser stamps it
into every manifest, and the fence (:mod:`pipeline.stream.releaser.fence`) uses it to recognise releases
of this deployment that the state in Redis does not know.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.stream.state.fingerprint import (
    config_changes,
    fingerprint,
    portable_fingerprint,
    privacy_config,
)
from pipeline.stream.state.keys import LAYOUT

if TYPE_CHECKING:
    from pipeline.config import Deployment
    from pipeline.stream.state.store import StateStore

__all__ = [
    "StateRefused",
    "ConfigurationChanged",
    "StateLost",
    "DeploymentIdentity",
    "establish_identity",
    "ACCEPT_NEW_SPEND_ENV",
]

log = logging.getLogger("dpstream.identity")

ACCEPT_NEW_SPEND_ENV = "DPSTREAM_ACCEPT_NEW_SPEND"


class StateRefused(RuntimeError):
    """A process refuses to start on this state; it exits with the subclass's ``exit_code`` and
    ``label`` (docs/operations.md, "Exit codes")."""

    exit_code, label = 1, "state refused"


class ConfigurationChanged(StateRefused):
    """The configuration differs from the one the state was created under (exit code 2)."""

    exit_code, label = 2, "configuration refused"


class StateLost(StateRefused):
    """Releases exist that the state does not know: it was lost, wiped or replaced (exit code 4)."""

    exit_code, label = 4, "state lost"


@dataclass(frozen=True)
class DeploymentIdentity:
    instance: str
    fingerprint: str
    config: dict[str, Any]


def establish_identity(
    deployment: Deployment, roster_ids: list[str], store: StateStore, role: str
) -> DeploymentIdentity:
    """Register this deployment's identity on first start, or check the configuration against it.

    Raises :class:`ConfigurationChanged` when the privacy-relevant configuration changed or when a
    ``production: true`` configuration meets a state created with a seeded random source, and
    :class:`StateLost` when released steps exist without an identity record, or (production only)
    when another deployment on this Redis has the same configuration and roster.
    """
    current = privacy_config(deployment, roster_ids)
    digest = fingerprint(current)
    stored = store.identity()
    if stored is None:
        _check_no_orphaned_state(deployment, store, role)
        _check_not_a_repeat(deployment, store, current, role)
        stored, won = store.claim_identity(
            {
                "instance": uuid.uuid4().hex,
                "fingerprint": digest,
                "config": current,
                "created_at": time.time(),
                "layout": LAYOUT,
            }
        )
        if won:
            store.register_fingerprint(portable_fingerprint(current))
            log.info(
                "%s: new deployment state: instance %s, configuration %s",
                role,
                stored["instance"],
                digest,
            )
    layout = stored.get("layout", 1)  # layout 1 had no version in its identity record
    if layout != LAYOUT:
        raise StateLost(
            f"{role}: {store.keys.identity}: Redis key layout version {layout!r}, this dpstream reads layout "
            f"{LAYOUT} (keys by secrecy, pipeline.stream.state.keys): keep running the version that wrote it until "
            'the deployment\'s horizon, or start a new deployment (docs/streaming.md, "State format")'
        )
    identity = DeploymentIdentity(stored["instance"], stored["fingerprint"], stored["config"])
    if deployment.production and identity.config.get("random", {}).get("kind") != "secure":
        raise ConfigurationChanged(
            f"{role}: the state in Redis was created with a {identity.config.get('random', {}).get('kind')!r} "
            "(non-secure) random source; production: true refuses to continue it: start a new deployment "
            "with random.kind: secure"
        )
    if identity.fingerprint != digest:
        raise _changed(role, deployment, identity.config, current, "")
    if role == "releaser":
        _check_release_copy(deployment, store, identity, current)
    return identity


def _changed(
    role: str, deployment: Deployment, stored: dict[str, Any], current: dict[str, Any], where: str
):
    return ConfigurationChanged(
        f"{role}: the privacy-relevant configuration differs from the one deployment "
        f"{deployment.name!r} was started with{where}: "
        f"{'; '.join(config_changes(stored, current))}. "
        "Refusing to start: the stored state is calibrated for the old values. Revert the "
        "configuration, or start a new deployment (new name, new budget)."
    )


def _check_release_copy(
    deployment: Deployment, store: StateStore, identity: DeploymentIdentity, current: dict[str, Any]
) -> None:
    """The releaser's own copy of the identity (see the module docstring): kept at its first start,
    then
    compared; ``{p}:identity`` agreeing with a changed configuration while the copy does not means
    it was
    rewritten by another login."""
    own = store.release_identity()
    if own is None:
        own = store.keep_release_identity(
            {
                "instance": identity.instance,
                "fingerprint": identity.fingerprint,
                "config": identity.config,
            }
        )
    if own["fingerprint"] != identity.fingerprint:
        raise _changed(
            "releaser",
            deployment,
            own["config"],
            current,
            f" (as the releaser's own copy {store.keys.release_identity} records it; "
            f"{store.keys.identity} was rewritten to agree with the new one)",
        )


def _check_no_orphaned_state(deployment: Deployment, store: StateStore, role: str) -> None:
    """State without an identity record was written by a dpstream whose identity was deleted: the configuration
    it was calibrated under cannot be checked. Each role looks at the state it can read."""
    if role == "releaser":
        released = store.last_released()
        found = f"{released} released step(s)" if released > 0 else None
    else:
        found = "workers' intake counts and checkpoints" if store.holds_ingest_state() else None
    if found:
        raise StateLost(
            f"{role}: Redis holds {found} of deployment {deployment.name!r} but no identity record "
            f"({store.keys.identity}: deleted, or written by a dpstream without one): the configuration they were "
            "calibrated under cannot be checked; restore the whole Redis state from a backup (docs/streaming.md)"
        )


def _check_not_a_repeat(
    deployment: Deployment, store: StateStore, current: dict[str, Any], role: str
) -> None:
    """A deployment seen for the first time whose configuration and roster equal another deployment's on this
    Redis is probably that deployment renamed: its releases would spend a second budget over the same people
    with fresh noise. Refused under ``production: true`` unless the operator accepts the new spend."""
    others = store.deployments_with_fingerprint(portable_fingerprint(current))
    if not others:
        return
    what = (
        f"deployment {deployment.name!r} is new on this Redis, but {', '.join(map(repr, others))} has the same "
        "roster and privacy configuration: a renamed deployment releases the same people's data again with "
        "fresh noise, and the spends add up"
    )
    if deployment.production and os.environ.get(ACCEPT_NEW_SPEND_ENV) != "1":
        raise StateLost(
            f"{role}: {what}. If this is a deliberate new budget, set {ACCEPT_NEW_SPEND_ENV}=1"
        )
    log.warning("%s: %s", role, what)
