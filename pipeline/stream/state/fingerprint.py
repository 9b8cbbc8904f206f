"""The privacy-relevant configuration of a deployment as one canonical JSON document, and its hash.

A restarted process restores state calibrated for the configuration it was created under (the
releaser's mechanisms, the workers' per-user state and charging counters). Every key that the
calibration, the sensitivity or the accounting depends on is in the document:

* ``roster``: the size n and a sha256 of the ids in order (the rows the state is indexed by);
* ``horizon``, ``neighbours`` (the neighbouring relation), ``budget`` and ``plan`` (each release's
  allotment, from :meth:`pipeline.config.Deployment.budget_plan`);
* ``attributes``: every attribute's type and domain (declared values or hashed size);
* ``releases``: every release's full parameters, keyed by release name (type, attribute, share,
  window, method, k, beta, band, ...);
* ``random``: the kind of random source (``secure`` or ``seeded``);
* ``topics.partitions``: the workers' checkpoints are per reports partition, each holding the rows of
  the users that partition owns (murmur2 of the user id modulo the count); restored under another
  count they would be applied to other users' rows, so a change is refused like a calibration change.

Left out on purpose, because changing them changes no calibration or state layout: topic names, step
closing, imputation, descriptions, binary attributes' ``label`` and the public dictionary of hashed
attributes (labels only), the seed value of a seeded source. The deployment ``name`` is in the document but
not in :func:`portable_fingerprint`, which recognises the same configuration under another name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = [
    "privacy_config",
    "fingerprint",
    "portable_fingerprint",
    "config_changes",
    "roster_digest",
]

FORMAT = (
    1  # bump when the document's layout changes (a stored document of another format is a change)
)

_ATTRIBUTE_NOISE = (
    "description",
    "dictionary",
    "label",
)  # public labels, no effect on any calibration


def roster_digest(ids: list[str]) -> str:
    """sha256 of the roster ids in order, one per line (the identity of the rows state is kept by)."""
    h = hashlib.sha256()
    for start in range(
        0, len(ids), 65_536
    ):  # chunked: one join of 10^6 ids would double the memory
        h.update(("\n".join(ids[start : start + 65_536]) + "\n").encode())
    return h.hexdigest()


def privacy_config(deployment: Deployment, roster_ids: list[str]) -> dict[str, Any]:
    """The canonical privacy-relevant configuration of ``deployment`` (JSON-serialisable)."""
    doc = {
        "format": FORMAT,
        "name": deployment.name,
        "roster": {"size": len(roster_ids), "sha256": roster_digest(roster_ids)},
        "horizon": deployment.horizon,
        "neighbours": deployment.neighbours,
        "budget": deployment.budget.model_dump(
            exclude={"allow_large"}
        ),  # an acknowledgement, no calibration
        "random": {"kind": deployment.random.kind},
        "topics": {"partitions": deployment.topics.partitions},
        "attributes": {
            name: attr.model_dump(exclude=set(_ATTRIBUTE_NOISE) & set(type(attr).model_fields))
            for name, attr in deployment.attributes.items()
        },
        "releases": {rel.name: rel.model_dump(exclude={"name"}) for rel in deployment.releases},
        "plan": {
            name: dataclasses.asdict(cost)
            for name, cost in deployment.budget_plan().allotments().items()
        },
    }
    return json.loads(
        _canonical(doc)
    )  # as it reads back from Redis (string keys, lists), so both compare


def _canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def fingerprint(doc: dict[str, Any]) -> str:
    """sha256 of the canonical document (name included)."""
    return hashlib.sha256(_canonical(doc)).hexdigest()


def portable_fingerprint(doc: dict[str, Any]) -> str:
    """sha256 of the document without the deployment name: equal for a renamed deployment."""
    return fingerprint({k: v for k, v in doc.items() if k != "name"})


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            _flatten(sub, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value
    return out


_ABSENT = "(absent)"


def config_changes(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Each changed key as ``"releases.hh.k: 3 -> 20"``, sorted; empty when the documents agree."""
    old, new = _flatten(stored, "", {}), _flatten(current, "", {})
    changes = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if before != after:
            changes.append(f"{key}: {_show(before)} -> {_show(after)}")
    return changes


def _show(value: Any) -> str:
    return value if value == _ABSENT else json.dumps(value, sort_keys=True)
