"""Least privilege: what each role may do on the broker and in Redis, derived from a deployment.

The grants follow what the code does (docs/security.md has the table and the reasons):

* ``worker`` (jobs/worker.py): reads ``reports`` and ``feedback`` in its consumer group, writes
  ``step-partials`` and ``dead-letter``.
* ``releaser`` (jobs/releaser.py): reads ``step-partials`` and ``control`` in its group and the public
  ``releases`` (the fence checks what was published); writes ``releases``, ``synthetic``, ``alerts``,
  ``feedback`` and the close markers into ``reports``. Its lag monitor describes both groups.
* ``operator`` (``dpstream produce|close|status``): writes ``reports`` and ``control``; reads the end of
  ``reports`` (the intake counts of ``close``); Redis read-only.
* ``producer`` (a data-collection service): writes ``reports`` only.
* ``analyst`` (``dpstream export|query``, any consumer): reads the public topics only; no Redis user.
* ``admin`` (deploy/create_topics.py): creates and describes the deployment's topics.

Kafka ACLs are emitted as ``kafka-acls.sh`` commands (``python -m pipeline.acl --config FILE kafka``);
Redis ACL rules as ``user`` lines for an ACL file (``... redis``), with the password as a SHA-256 hash
taken from an environment variable at generation time, never in the output in clear.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass

__all__ = ["Grant", "ROLES", "kafka_grants", "kafka_acl_commands", "kafka_acl_script", "redis_acl_rules", "main"]

ROLES = ("worker", "releaser", "operator", "producer", "analyst", "admin")

# role -> (operation, logical topic) pairs; Describe is added for every topic a role reads or writes
_TOPICS: dict[str, list[tuple[str, str]]] = {
    "worker": [("Read", "reports"), ("Read", "feedback"), ("Write", "step-partials"), ("Write", "dead-letter")],
    "releaser": [("Read", "step-partials"), ("Read", "control"), ("Read", "releases"), ("Write", "releases"),
                 ("Write", "synthetic"), ("Write", "alerts"), ("Write", "feedback"), ("Write", "reports")],
    "operator": [("Write", "reports"), ("Write", "control"), ("Read", "reports")],
    "producer": [("Write", "reports")],
    "analyst": [("Read", "releases"), ("Read", "synthetic"), ("Read", "alerts")],
    "admin": [("Create", "*"), ("DescribeConfigs", "*")],
}
_GROUPS: dict[str, list[tuple[str, str]]] = {  # consumer groups (the jobs' group ids)
    "worker": [("Read", "ingest")],
    "releaser": [("Read", "releaser"), ("Describe", "ingest"), ("Describe", "releaser")],
}
# Redis: both stream roles read and write the deployment's keys (and the registry of fingerprints); the
# operator only reads. Commands outside these categories (CONFIG, KEYS, FLUSHALL, DEBUG, ...) are denied.
_REDIS_COMMANDS = {
    "worker": "+@read +@write +@transaction +@connection -@dangerous",
    "releaser": "+@read +@write +@transaction +@connection -@dangerous",
    "operator": "+@read +@connection -@dangerous",
}


@dataclass(frozen=True)
class Grant:
    role: str
    operation: str  # Kafka operation: Read, Write, Describe, Create, DescribeConfigs
    resource: str  # topic | group
    name: str  # the full topic or group name; ``pattern`` = prefixed for "*"
    prefixed: bool = False


def kafka_grants(deployment, role: str) -> list[Grant]:
    """The ACLs ``role`` needs on the deployment's topics and consumer groups."""
    from pipeline.stream.kafka.topics import topic_names

    if role not in ROLES:
        raise ValueError(f"role: unknown role {role!r}; one of {', '.join(ROLES)}")
    names = topic_names(deployment)
    prefix = f"{deployment.topics.prefix}.{deployment.name}."
    grants: list[Grant] = []
    for op, topic in _TOPICS[role]:
        if topic == "*":
            grants.append(Grant(role, op, "topic", prefix, prefixed=True))
            grants.append(Grant(role, "Describe", "topic", prefix, prefixed=True))
        else:
            grants.append(Grant(role, op, "topic", names[topic]))
            grants.append(Grant(role, "Describe", "topic", names[topic]))
    for op, group in _GROUPS.get(role, []):
        grants.append(Grant(role, op, "group", f"dpstream-{deployment.name}-{group}"))
    return sorted(set(grants), key=lambda g: (g.resource, g.name, g.operation))


def kafka_acl_commands(deployment, principals: dict[str, str]) -> list[str]:
    """``kafka-acls.sh`` commands granting every role its ACLs; ``principals`` maps role -> SASL user."""
    lines = []
    for role in ROLES:
        user = principals.get(role, f"dpstream-{role}")
        for g in kafka_grants(deployment, role):
            pattern = " --resource-pattern-type prefixed" if g.prefixed else ""
            lines.append(f'"$KAFKA_ACLS" --bootstrap-server "$BOOTSTRAP" --command-config "$ADMIN_CONFIG" --add '
                         f"--allow-principal {shlex.quote('User:' + user)} --operation {g.operation} "
                         f"--{g.resource} {shlex.quote(g.name)}{pattern}")
    return lines


_SCRIPT_HEAD = """#!/bin/sh
# Kafka users and ACLs of deployment {name!r}: one SCRAM-SHA-512 user per role, each allowed only what
# its code does (docs/security.md). GENERATED by `python -m pipeline.acl --config {config} script`;
# tests/test_deploy.py checks it matches. Run with the broker's admin (super user) credentials:
#   BOOTSTRAP=kafka:9094 ADMIN_CONFIG=/etc/kafka/admin.properties SECRETS=/run/secrets/kafka-users sh kafka-acls.sh
# $SECRETS/<role> holds each role's password (deploy/make-secrets.sh writes them).
set -eu
KAFKA_BIN="${{KAFKA_BIN:-/opt/kafka/bin}}"
KAFKA_ACLS="$KAFKA_BIN/kafka-acls.sh"
: "${{BOOTSTRAP:?}}" "${{ADMIN_CONFIG:?}}" "${{SECRETS:?}}"
for role in {roles}; do
  "$KAFKA_BIN/kafka-configs.sh" --bootstrap-server "$BOOTSTRAP" --command-config "$ADMIN_CONFIG" --alter \\
    --entity-type users --entity-name "dpstream-$role" \\
    --add-config "SCRAM-SHA-512=[iterations=8192,password=$(cat "$SECRETS/$role")]"
done
"""


def kafka_acl_script(deployment, config: str) -> str:
    """The shell script creating every role's SCRAM user and ACLs (deploy/kafka-acls.sh)."""
    head = _SCRIPT_HEAD.format(name=deployment.name, config=config, roles=" ".join(ROLES))
    return head + "\n".join(kafka_acl_commands(deployment, {})) + "\n"


def redis_acl_rules(deployment, passwords: dict[str, str]) -> list[str]:
    """ACL-file ``user`` lines for the stream roles (and ``default off``); ``passwords`` maps role -> password,
    written as its SHA-256 (``#<hex>``). A role without a password is left out."""
    from pipeline.stream.local.embedded import password_hash
    from pipeline.stream.state.store import FINGERPRINTS_KEY

    keys = f"~dpstream:{deployment.name}:* ~{FINGERPRINTS_KEY}"
    rules = ["user default off"]
    for role, commands in _REDIS_COMMANDS.items():
        if passwords.get(role):
            rules.append(f"user dpstream-{role} on {password_hash(passwords[role])} resetchannels {keys} {commands}")
    return rules


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.acl", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("what", choices=["kafka", "script", "redis"],
                    help="kafka: kafka-acls.sh commands; script: the whole deploy/kafka-acls.sh; redis: ACL file "
                         "lines (passwords from DPSTREAM_REDIS_PASSWORD_<ROLE> variables, hashed)")
    args = ap.parse_args(argv)
    from pipeline.config import load_config

    dep = load_config(args.config)
    if args.what == "kafka":
        print("\n".join(kafka_acl_commands(dep, {})))
    elif args.what == "script":
        sys.stdout.write(kafka_acl_script(dep, args.config))
    else:
        passwords = {r: os.environ.get(f"DPSTREAM_REDIS_PASSWORD_{r.upper()}", "") for r in _REDIS_COMMANDS}
        missing = sorted(r for r, p in passwords.items() if not p)
        if missing:
            print(f"no password for {', '.join(missing)}: set DPSTREAM_REDIS_PASSWORD_<ROLE>", file=sys.stderr)
            return 2
        print("\n".join(redis_acl_rules(dep, passwords)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
