"""The public deployment descriptor: what an analyst needs besides the releases, on a public topic.

The releaser writes one record to ``<prefix>.<deployment>.deployment`` (key ``descriptor``) at every
start, before its fence: the roster size n, the privacy-relevant configuration document and its
fingerprint (:mod:`pipeline.stream.state.fingerprint`, the same document the processes check their
configuration against) and the public part of the configuration (attributes with their labels and
dictionaries, releases, budget, steps, imputation, topics). The bytes are canonical JSON, so a
restart under the same configuration writes the same record again; a reader keeps the last one.

Left out, because they are curator-side: the broker and Redis addresses, security, the roster's ids
and file (n and a sha256 of the ids are enough), the close guard, and a seeded source's seed (it
would let anyone redraw the noise of a seeded, non-production deployment).

With it, ``dpstream query|export|alerts|report`` need only the broker and the deployment's name
(:func:`deployment_from`), and a configuration an analyst passes is checked against the published
fingerprint document (:func:`differences`) as the processes check theirs against Redis.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pipeline.stream.state.fingerprint import config_changes, fingerprint, privacy_config

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = ["FORMAT", "KEY", "build", "encode", "deployment_from", "differences"]

FORMAT = 1
KEY = "descriptor"
_CURATOR_KEYS = {"broker", "redis", "security", "close_guard", "roster", "random"}


def build(deployment: Deployment, roster_ids: list[str], instance: str) -> dict[str, Any]:
    """The descriptor of ``deployment`` (JSON-serialisable; docs/topics.md, "deployment")."""
    doc = privacy_config(deployment, roster_ids)
    public = deployment.model_dump(mode="json", exclude=_CURATOR_KEYS)
    public["roster"] = {"source": "range", "size": len(roster_ids)}
    public["random"] = {"kind": deployment.random.kind}
    return {
        "format": FORMAT,
        "deployment": deployment.name,
        "instance": instance,
        "n": len(roster_ids),
        "fingerprint": fingerprint(doc),
        "privacy_config": doc,
        "config": public,
    }


def encode(descriptor: dict[str, Any]) -> bytes:
    """Canonical bytes: the same configuration gives the same record on every start."""
    return json.dumps(descriptor, sort_keys=True, separators=(",", ":")).encode()


def deployment_from(descriptor: dict[str, Any]):
    """A :class:`pipeline.config.Deployment` to read the public topics with, from the descriptor.

    Its roster is a range of the published size n (the ids are not published and reading needs only
    n); its random source reads as ``secure`` whatever the deployment drew with, because a reader
    draws no noise (the published kind is ``descriptor["config"]["random"]``).
    """
    from pipeline.config import parse_config

    if descriptor.get("format") != FORMAT:
        raise ValueError(
            f"deployment descriptor format {descriptor.get('format')!r}; this "
            f"dpstream reads format {FORMAT}"
        )
    data = dict(descriptor["config"], random={"kind": "secure"})
    return parse_config(data, source=f"the published descriptor of {descriptor['deployment']!r}")


def differences(
    deployment: Deployment, descriptor: dict[str, Any], roster_ids: list[str] | None
) -> list[str]:
    """The privacy-relevant keys where ``deployment`` differs from the published descriptor, as
    ``"budget.rho: 0.02 -> 0.05"``. Without ``roster_ids`` (an analyst without the roster file) the
    roster is compared by nothing: n comes from the descriptor."""
    stored = descriptor["privacy_config"]
    if roster_ids is None:
        current = dict(privacy_config(deployment, []), roster=stored["roster"])
    else:
        current = privacy_config(deployment, roster_ids)
    return config_changes(stored, current)
