"""The Redis keys of a deployment, laid out by secrecy, and which role reaches each class of them.

One prefix per class, so that an ACL key pattern (``~dpstream:<deployment>:release:*``) holds exactly
one kind of secret. ``{p}`` is ``dpstream:<deployment>``:

==============================  =============================================================  ===========================
key                             what it holds                                                  who (r: read, w: write)
==============================  =============================================================  ===========================
``{p}:release:step:<t>``        hash: release name -> record (manifest, synthetic columns,     releaser rw
                                alerts, feedback); ``__state__`` -> mechanism state after t:
                                the drawn noise and the true per-node sums
``{p}:release:partials-resume`` step-partials offset a restarted releaser re-reads from        releaser rw
``{p}:release:partials-log``    the topic id of the step-partials log that offset is in         releaser rw
                                (:mod:`pipeline.stream.kafka.log_identity`)
``{p}:release:close-times``     hash: step -> its public close time (ms), as its markers       releaser rw
                                carry it (a close re-driven after a lost log writes it again)
``{p}:release:close-markers``  hash: step -> its close marker as written (signed by the
releaser rw
                                curator or the deadline key): a re-driven close re-sends it
``{p}:release:identity``        the releaser's own copy of the identity record (fingerprint
releaser rw
                                and configuration), written at its first start: the workers
                                may rewrite ``{p}:identity``, never this (docs/security.md)
``{p}:ledger``                  hash: ``<release>:<t>`` -> ledger entry (the privacy spent)    releaser rw, operator r
``{p}:pointer:released``        last released step                                             releaser rw, operator r
``{p}:pointer:published``       last step whose messages the broker acknowledged               releaser rw, operator r
``{p}:pointer:closing``         last step whose close markers were written                     releaser rw, operator r
``{p}:ingest:checkpoint:<i>``   a reports partition's worker state (per-user values, charges)  worker rw
                                and, under ``...:<i>:partials``, a hash: closed step -> its
                                partial (true sums), the last 8 (a re-driven close re-sends it)
``{p}:ingest:intake``           hash: reports partition -> intake counts (accepted, rejected   worker rw, operator r
                                by reason, reported/imputed per step)
``{p}:identity``                JSON written once (SET NX): instance id, the privacy-relevant  worker, releaser: read and
                                configuration and its sha256, the key layout version          claim; operator r
``{p}:fingerprint:<sha256>``    empty marker: this deployment's configuration without its      worker, releaser: claim
                                name (a renamed deployment over the same roster is found by
                                the key's name, ``SCAN``, never by reading another
                                deployment's keys)
==============================  =============================================================  ===========================

Analysts have no Redis user: everything they read is on the public topics.

:data:`LAYOUT` is the version of this layout; it is part of the identity record, and a state written
under another layout is refused (exit code 4) naming ``{p}:identity`` (docs/streaming.md, "State format").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LAYOUT", "KeyClass", "KEY_CLASSES", "REDIS_ROLES", "REDIS_COMMANDS", "Keys"]

LAYOUT = 2  # 1: every key flat under {p} (no classes), a shared ``dpstream-fingerprints`` hash

REDIS_ROLES = ("worker", "releaser", "operator")  # analysts have none


@dataclass(frozen=True)
class KeyClass:
    name: str
    pattern: str  # after ``{p}:``; an ACL key pattern (glob)
    access: dict[str, str]  # role -> "r" | "rw"
    secret: str  # what reading it reveals (docs/privacy.md's threat model)


KEY_CLASSES: tuple[KeyClass, ...] = (
    KeyClass(
        "release",
        "release:*",
        {"releaser": "rw"},
        "the drawn noise and true per-node sums: subtracting it de-noises every release",
    ),
    KeyClass(
        "ledger",
        "ledger",
        {"releaser": "rw", "operator": "r"},
        "the privacy spent per release and step",
    ),
    KeyClass(
        "pointers", "pointer:*", {"releaser": "rw", "operator": "r"}, "how far releasing has got"
    ),
    KeyClass(
        "checkpoints",
        "ingest:checkpoint:*",
        {"worker": "rw"},
        "each user's true last values and charges in a partition",
    ),
    KeyClass(
        "intake",
        "ingest:intake",
        {"worker": "rw", "operator": "r"},
        "exact counts of reports accepted and rejected per step (no noise)",
    ),
    KeyClass(
        "identity",
        "identity",
        {"worker": "rw", "releaser": "rw", "operator": "r"},
        "the configuration and a hash of the roster ids",
    ),
    KeyClass(
        "fingerprint",
        "fingerprint:*",
        {"worker": "rw", "releaser": "rw"},
        "the hash of the configuration without the name",
    ),
)

# The commands each role's process sends (the stores' calls; tests/test_redis_roles.py runs them against a
# Redis started with these rules). Redis 6.2 grants commands per user, not per key: a role with a write
# command may write every key its patterns name, which is why the classes above hold one role's keys each.
REDIS_COMMANDS: dict[str, list[str]] = {  # besides logging in (+@connection -@dangerous)
    # hget: its partitions' last intake counts and kept partials; hdel, multi/exec: a checkpoint with its partials
    "worker": ["get", "set", "hget", "hset", "hdel", "exists", "scan", "multi", "exec", "discard"],
    "releaser": [
        "get",
        "set",
        "hget",
        "hset",
        "hgetall",
        "exists",
        "hexists",
        "watch",
        "unwatch",
        "multi",
        "exec",
        "discard",
        "scan",
    ],
    "operator": ["get", "hgetall"],
}


class Keys:
    """The key names of one deployment."""

    def __init__(self, deployment: str):
        self.prefix = f"dpstream:{deployment}"

    def _k(self, *parts) -> str:
        return ":".join([self.prefix, *map(str, parts)])

    def step(self, t: int) -> str:
        return self._k("release", "step", t)

    @property
    def partials_resume(self) -> str:
        return self._k("release", "partials-resume")

    @property
    def partials_log(self) -> str:
        return self._k("release", "partials-log")

    @property
    def close_times(self) -> str:
        return self._k("release", "close-times")

    @property
    def close_markers(self) -> str:
        return self._k("release", "close-markers")

    @property
    def release_identity(self) -> str:
        return self._k("release", "identity")

    @property
    def ledger(self) -> str:
        return self._k("ledger")

    def pointer(self, name: str) -> str:
        if name not in ("released", "published", "closing"):
            raise ValueError(f"pointer: unknown pointer {name!r}")
        return self._k("pointer", name)

    def checkpoint(self, partition: int) -> str:
        return self._k("ingest", "checkpoint", partition)

    def kept_partials(self, partition: int) -> str:
        return self._k("ingest", "checkpoint", partition, "partials")

    @property
    def intake(self) -> str:
        return self._k("ingest", "intake")

    @property
    def identity(self) -> str:
        return self._k("identity")

    def fingerprint(self, portable: str) -> str:
        return self._k("fingerprint", portable)

    def pattern(self, cls: KeyClass) -> str:
        return f"{self.prefix}:{cls.pattern}"
