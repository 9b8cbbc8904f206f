"""Which deployment a Redis state belongs to, and under which privacy-relevant configuration.

At its first start a deployment writes ``{p}:identity`` to Redis (SET NX, first writer wins): a
random instance id, the canonical privacy-relevant configuration (:mod:`pipeline.stream.state.fingerprint`)
and its sha256. Every later start of the releaser or of a worker recomputes the document from its
own configuration and refuses to start when the hash differs, naming each changed key — restored
state is calibrated for the stored parameters (a heavy-hitter mechanism for k = 3 must not meet
aggregators rebuilt for k = 20).

``{p}:identity`` is readable and writable by the workers' Redis login too (Redis 6.2 grants commands
per user, not per key). So only the releaser writes it, at its first start, after its own copy under
``{p}:release:identity`` (a key only its login reaches); a worker that finds no identity waits for
the releaser's. At every later start the releaser checks its configuration against its copy as well,
and an identity it finds without its copy, on a state that has released nothing, was written by
another login before the releaser's first start: refused (:class:`IdentityNotOwn`), never adopted.
A worker credential that rewrites ``{p}:identity`` to the fingerprint of a changed configuration,
before or after that first start, therefore gets nothing released under it: the releaser refuses,
and ``dpstream up`` stops with it.

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
    "IdentityNotOwn",
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


class IdentityNotOwn(StateRefused):
    """An identity record the releaser did not write, on a state it never started on (exit code
    2)."""

    exit_code, label = 2, "configuration refused"


@dataclass(frozen=True)
class DeploymentIdentity:
    instance: str
    fingerprint: str
    config: dict[str, Any]


def establish_identity(
    deployment: Deployment,
    roster_ids: list[str],
    store: StateStore,
    role: str,
    wait_seconds: float | None = None,
) -> DeploymentIdentity:
    """Register this deployment's identity on first start, or check the configuration against it.

    Raises :class:`ConfigurationChanged` when the privacy-relevant configuration changed or when a
    ``production: true`` configuration meets a state created with a seeded random source, and
    :class:`StateLost` when released steps exist without an identity record, or (production only)
    when another deployment on this Redis has the same configuration and roster. Only the releaser
    claims a new identity; a worker waits for it (``wait_seconds``: for ever when None, then
    :class:`StateRefused`).
    """
    current = privacy_config(deployment, roster_ids)
    digest = fingerprint(current)
    stored = store.identity()
    if stored is None:
        _check_no_orphaned_state(deployment, store, role)
        if role != "releaser":  # only the releaser writes it (see the module docstring)
            stored = _wait_for_identity(store, role, wait_seconds)
    if stored is None:
        _check_not_a_repeat(deployment, store, current, role)
        stored = _claim_as_releaser(store, current, digest)
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
    if role == "releaser":  # its own copy first: it, not ``{p}:identity``, says what was started
        _check_release_copy(deployment, store, identity, current, digest)
    if identity.fingerprint != digest:
        raise _changed(role, deployment, identity.config, current, "")
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
    deployment: Deployment,
    store: StateStore,
    identity: DeploymentIdentity,
    current: dict[str, Any],
    digest: str,
) -> None:
    """The releaser's own copy of the identity (see the module docstring), written before
    ``{p}:identity`` at its first start; a configuration other than the copy's is refused, and so is
    an identity record that is not the copy (rewritten, or written before the copy existed)."""
    own = store.release_identity()
    if own is None:
        if store.last_released() == 0:
            raise IdentityNotOwn(
                f"releaser: {store.keys.identity} exists, but the releaser has never started on "
                f"this state (no {store.keys.release_identity}, nothing released): another Redis "
                "login (a worker's?) wrote it before the releaser's first start, and the "
                f"releaser does not adopt it. If deployment {deployment.name!r} is new, delete "
                "that key with an administrator's login and start again; rotate the workers' "
                "Redis password if nobody meant to write it"
            )
        # released steps but no copy: a state from before the releaser kept one; adopted as it is
        own = store.keep_release_identity(
            {
                "instance": identity.instance,
                "fingerprint": identity.fingerprint,
                "config": identity.config,
            }
        )
    if own["fingerprint"] != digest:
        raise _changed(
            "releaser",
            deployment,
            own["config"],
            current,
            f" (as the releaser's own copy {store.keys.release_identity} records it)",
        )
    if (own["fingerprint"], own["instance"]) != (identity.fingerprint, identity.instance):
        raise IdentityNotOwn(
            f"releaser: {store.keys.identity} is not the releaser's own copy "
            f"{store.keys.release_identity} (instance or configuration rewritten by another Redis "
            "login): refusing to start under it; restore it from the copy with an administrator's "
            "login, and rotate the workers' Redis password"
        )


def _claim_as_releaser(store: StateStore, current: dict[str, Any], digest: str) -> dict[str, Any]:
    """A new deployment's identity: the releaser's own copy first (kept from an interrupted first
    start), then ``{p}:identity`` from it (SET NX both: the first writer wins)."""
    own = store.release_identity() or store.keep_release_identity(
        {"instance": uuid.uuid4().hex, "fingerprint": digest, "config": current}
    )
    stored, won = store.claim_identity(dict(own, created_at=time.time(), layout=LAYOUT))
    if won:
        store.register_fingerprint(portable_fingerprint(own["config"]))
        log.info(
            "releaser: new deployment state: instance %s, configuration %s",
            stored["instance"],
            own["fingerprint"],
        )
    return stored


def _wait_for_identity(store: StateStore, role: str, wait_seconds: float | None) -> dict[str, Any]:
    """The identity once the releaser has written it (polled: a worker may start first)."""
    deadline = None if wait_seconds is None else time.monotonic() + wait_seconds
    log.info("%s: waiting for the releaser to record the deployment's identity", role)
    while (stored := store.identity()) is None:
        if deadline is not None and time.monotonic() > deadline:
            raise StateRefused(
                f"{role}: no identity record ({store.keys.identity}) after {wait_seconds:.0f} s: "
                "the releaser writes it at its first start; start the releaser"
            )
        time.sleep(0.5)
    return stored


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
