"""The operator's commands check their configuration against the deployment's, as the processes do.

The releaser and the workers refuse to start under a privacy-relevant configuration other than the
one the deployment's state was created with (:mod:`pipeline.stream.state.identity`). A command that
reads or changes that state (``produce``, ``close``, ``status``) would otherwise print spend, budget
and step counts for a file that is not the deployment's (a ρ of 0.05 against a deployment at 0.02)
or send a close under it; it refuses instead, exit code 2, naming each differing key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.cli.common import EXIT_CONFIG, _fail

if TYPE_CHECKING:
    from pipeline.stream.state.store import ReleaseStore
    from pipeline.config import Deployment

__all__ = ["refuse_other_configuration"]


def refuse_other_configuration(dep: Deployment, store: ReleaseStore) -> None:
    """SystemExit(2) naming the differing keys when ``dep`` is not the configuration ``store``'s
    state was created under; nothing when it is, or when no process has started yet."""
    from pipeline.stream.ingest.roster import Roster
    from pipeline.stream.state.fingerprint import config_changes, fingerprint, privacy_config

    identity = store.identity()
    if identity is None:
        return
    try:
        ids = Roster.from_config(dep.roster).ids
    except OSError as err:
        raise SystemExit(_fail(EXIT_CONFIG, f"roster.path: {err.filename}: {err.strerror} (the "
                                            "operator's commands check the roster against the "
                                            "deployment's)")) from None
    current = privacy_config(dep, ids)
    if fingerprint(current) == identity.get("fingerprint"):
        return
    changes = "; ".join(config_changes(identity.get("config", {}), current))
    raise SystemExit(_fail(EXIT_CONFIG, "configuration refused: the privacy-relevant configuration "
                                        f"differs from the one deployment {dep.name!r} was started "
                                        f"with: {changes}. Use the deployment's own configuration "
                                        "file (the processes refuse this one too)"))
