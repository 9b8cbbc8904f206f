"""The public deployment descriptor: what an analyst needs besides the releases, on a public topic.

The releaser writes one record to ``<prefix>.<deployment>.deployment`` (key ``descriptor``) at every
start, before its fence: the roster size n, the privacy-relevant configuration document and its
fingerprint (:mod:`pipeline.stream.state.fingerprint`, the same document the processes check their
configuration against) and the public part of the configuration (attributes with their labels and
dictionaries, releases, budget, steps, imputation, topics), and the public keys the workers verify
close markers with (``close_keys``: the curator's always, the deadline key's when ``steps.close:
deadline``; PEM, as in ``curator.pub``), so that the operator's ``produce --dry-run`` tells a forged
marker from a real one as the workers do (:mod:`pipeline.held_reports`). The bytes are canonical
JSON, so a restart under the same configuration and keys writes the same record again; a reader
keeps the last one (after a key rotation, the new keys').

Left out, because they are curator-side: the broker and Redis addresses, security, the roster's ids
and file (n and a sha256 of the ids are enough), the close guard, and a seeded source's seed (it
would let anyone redraw the noise of a seeded, non-production deployment).

With it, ``dpstream query|export|alerts|report`` need only the broker and the deployment's name
(:func:`deployment_from`), and a configuration an analyst passes is checked against the published
fingerprint document (:func:`differences`) as the processes check theirs against Redis.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives import serialization

from pipeline.stream.state.fingerprint import config_changes, fingerprint, privacy_config

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from pipeline.config import Deployment
    from pipeline.stream.control.signatures import CloseVerifier

__all__ = [
    "FORMAT",
    "KEY",
    "build",
    "encode",
    "deployment_from",
    "differences",
    "close_verifier",
    "published",
]

FORMAT = 1
KEY = "descriptor"
_CURATOR_KEYS = {"broker", "redis", "security", "close_guard", "roster", "random"}


def build(
    deployment: Deployment,
    roster_ids: list[str],
    instance: str,
    close_keys: Mapping[str, Ed25519PublicKey],
) -> dict[str, Any]:
    """The descriptor of ``deployment`` (JSON-serialisable; docs/topics.md, "deployment");
    ``close_keys``: the public keys the stream processes verify closes with, by action."""
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
        "close_keys": {action: _pem(key) for action, key in sorted(close_keys.items())},
    }


def _pem(key: Ed25519PublicKey) -> str:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


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


def close_verifier(descriptor: dict[str, Any]) -> CloseVerifier | None:
    """The workers' check of close markers, from the published keys and fingerprint (None: a
    descriptor from before the keys were published); ValueError when a key is not an Ed25519
    public key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from pipeline.stream.control.signatures import CloseVerifier

    published_keys = descriptor.get("close_keys")
    if not isinstance(published_keys, dict):
        return None
    name, digest = descriptor.get("deployment"), descriptor.get("fingerprint")
    if not isinstance(name, str) or not isinstance(digest, str):
        raise ValueError("no deployment name or fingerprint to verify closes under")
    keys = {}
    for action, text in published_keys.items():
        try:
            key = serialization.load_pem_public_key(str(text).encode())
        except ValueError as err:
            raise ValueError(f"close_keys.{action} is not a PEM public key ({err})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"close_keys.{action} is not an Ed25519 key")
        keys[action] = key
    return CloseVerifier(name, digest, keys)


def published(broker: str, topic: str, timeout: float = 30.0) -> dict[str, Any] | None:
    """The last descriptor on ``topic``, read as the analysts' commands read it
    (:func:`pipeline.consumer.read_topics`; None when there is none; ValueError when it is not a
    JSON object)."""
    from pipeline.consumer import read_topics

    document = read_topics(broker, {"deployment": topic}, timeout=timeout).descriptor
    if document is not None and not isinstance(document, dict):
        raise ValueError("the descriptor is not a JSON object")
    return document
