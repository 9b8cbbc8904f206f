"""Redis persistence: release records, the budget ledger, mechanism state, worker checkpoints.

Release protocol (docs/streaming.md, "Releasing a step"): the releaser computes step t's complete
release — every release's manifest, synthetic columns, alerts and feedback, the ledger entries, and
the mechanism state after step t — and commits it with :meth:`ReleaseStore.commit_step` in ONE Redis transaction
(WATCH/MULTI/EXEC) **before** publishing anything. A step whose record exists is republished from
the record, never recomputed, so noise is never redrawn and budget never spent twice. The
transaction refuses to commit a step that is not the next one (a second releaser, or a replay, loses
the race and must republish instead).

Keys (``{p}`` = ``dpstream:<deployment>``):
  {p}:released            last released step (int)
  {p}:published           last step whose messages the broker acknowledged (int)
  {p}:partials-resume     step-partials offset a restarted releaser re-reads from
  {p}:closing             last step whose close markers were written
  {p}:step:<t>            hash: release name -> record bytes; "__state__" -> mechanism state after t
  {p}:ledger              hash: "<release>:<t>" -> ledger entry JSON (append-only by construction)
  {p}:checkpoint:<part>   worker checkpoint bytes of one reports partition
  {p}:identity            JSON written once at first start (first writer wins): a random instance id
                          (public, stamped into every manifest), the privacy-relevant configuration
                          and its sha256 (``pipeline.stream.state.identity``)
  dpstream-fingerprints   hash over every deployment on this Redis: name -> fingerprint without the
                          name (recognises a renamed deployment over the same roster)
  {p}:intake              hash: reports partition -> its intake counts JSON (accepted, rejected by
                          reason, reported/imputed per step; curator-side, for status and close)

Everything here is curator-side except the records' public parts (manifests etc. carry only
noisy/projected values); the mechanism state holds true per-node sums and must not be exposed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

__all__ = ["ReleaseStore", "StepAlreadyReleased", "StepOutOfOrder", "StepRecord", "FINGERPRINTS_KEY"]

FINGERPRINTS_KEY = "dpstream-fingerprints"  # outside every deployment's prefix


class StepAlreadyReleased(RuntimeError):
    """The step has a committed record: republish it, never recompute it."""


class StepOutOfOrder(RuntimeError):
    """Only the step after the last released one can be committed."""


@dataclass(frozen=True)
class StepRecord:
    step: int
    releases: dict[str, bytes]  # release name -> serialised record (manifest, synthetic, alerts, feedback)
    state: bytes | None  # releaser mechanism state after this step


class ReleaseStore:
    def __init__(self, client: redis.Redis, deployment: str):
        self.r = client
        self.deployment = deployment
        self.prefix = f"dpstream:{deployment}"

    @classmethod
    def from_url(cls, url: str, deployment: str) -> "ReleaseStore":
        return cls(redis.Redis.from_url(url), deployment)

    def _k(self, *parts: Any) -> str:
        return ":".join([self.prefix, *map(str, parts)])

    def key(self, *parts: Any) -> str:
        """The Redis key of ``parts`` under this deployment's prefix (errors name the key they are about)."""
        return self._k(*parts)

    def _int(self, name: str) -> int:
        """An integer pointer of this deployment; 0 until it is first set."""
        value = self.r.get(self._k(name))
        return int(value) if value is not None else 0

    # -- releases ----------------------------------------------------------------------------
    def last_released(self) -> int:
        return self._int("released")

    def load_step(self, step: int) -> StepRecord | None:
        raw = self.r.hgetall(self._k("step", step))
        if not raw:
            return None
        state = raw.pop(b"__state__", None)
        return StepRecord(step, {k.decode(): v for k, v in raw.items()}, state)

    def commit_step(self, record: StepRecord, ledger: dict[str, dict[str, Any]]) -> None:
        """Atomically store step ``record.step`` and its ledger entries (``"<release>:<t>"`` -> entry)."""
        released_key = self._k("released")
        step_key = self._k("step", record.step)
        ledger_key = self._k("ledger")
        with self.r.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(released_key, step_key, ledger_key)
                    last = pipe.get(released_key)
                    last = int(last) if last is not None else 0
                    if record.step <= last or pipe.exists(step_key):
                        raise StepAlreadyReleased(f"step {record.step} is already released (last released {last})")
                    if record.step != last + 1:
                        raise StepOutOfOrder(f"cannot commit step {record.step}: last released step is {last}")
                    clash = [key for key in ledger if pipe.hexists(ledger_key, key)]
                    if clash:
                        raise StepAlreadyReleased(f"ledger already holds {clash}")
                    pipe.multi()
                    mapping = dict(record.releases)
                    if record.state is not None:
                        mapping["__state__"] = record.state
                    pipe.hset(step_key, mapping=mapping)
                    if ledger:
                        pipe.hset(ledger_key, mapping={k: json.dumps(v, sort_keys=True) for k, v in ledger.items()})
                    pipe.set(released_key, record.step)
                    pipe.execute()
                    return
                except redis.WatchError:
                    continue  # someone else wrote meanwhile: re-check (we will then refuse)

    def last_published(self) -> int:
        return self._int("published")

    def mark_published(self, step: int) -> None:
        """Everything of ``step`` reached the broker (acknowledged); a restart republishes the rest."""
        self.r.set(self._k("published"), step)

    def partials_resume(self) -> int:
        return self._int("partials-resume")

    def set_partials_resume(self, offset: int) -> None:
        """Where a restarted releaser re-reads ``step-partials`` from (no unreleased partial before it)."""
        self.r.set(self._k("partials-resume"), offset)

    def last_closing(self) -> int:
        return self._int("closing")

    def mark_closing(self, step: int) -> None:
        """Close markers of ``step`` are written to every reports partition."""
        self.r.set(self._k("closing"), step)

    def ledger(self) -> dict[str, dict[str, Any]]:
        return {k.decode(): json.loads(v) for k, v in self.r.hgetall(self._k("ledger")).items()}

    def latest_state(self) -> tuple[int, bytes | None]:
        """(last released step, mechanism state after it)."""
        last = self.last_released()
        if last == 0:
            return 0, None
        return last, self.r.hget(self._k("step", last), "__state__")

    # -- identity and worker checkpoints ---------------------------------------------------------
    def identity(self) -> dict[str, Any] | None:
        raw = self.r.get(self._k("identity"))
        return None if raw is None else json.loads(raw)

    def claim_identity(self, identity: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Store ``identity`` unless one exists (SET NX: the first writer wins); (stored one, whether it is ours)."""
        key = self._k("identity")
        won = bool(self.r.set(key, json.dumps(identity, sort_keys=True), nx=True))
        return json.loads(self.r.get(key)), won

    def register_fingerprint(self, portable: str) -> None:
        self.r.hset(FINGERPRINTS_KEY, self.deployment, portable)

    def deployments_with_fingerprint(self, portable: str) -> list[str]:
        """Other deployments on this Redis registered with the same name-free fingerprint."""
        return sorted(name.decode() for name, fp in self.r.hgetall(FINGERPRINTS_KEY).items()
                      if fp.decode() == portable and name.decode() != self.deployment)

    def save_checkpoint(self, partition: int, blob: bytes) -> None:
        self.r.set(self._k("checkpoint", partition), blob)

    def load_checkpoint(self, partition: int) -> bytes | None:
        return self.r.get(self._k("checkpoint", partition))

    def save_intake(self, summaries: dict[int, dict[str, Any]]) -> None:
        """Store the partitions' intake counts (a snapshot each, replacing the previous one)."""
        if summaries:
            self.r.hset(self._k("intake"), mapping={str(p): json.dumps(s, sort_keys=True) for p, s in summaries.items()})

    def intake(self) -> dict[int, dict[str, Any]]:
        """Reports partition -> its latest intake counts (partitions no worker has handled yet are absent)."""
        return {int(k): json.loads(v) for k, v in self.r.hgetall(self._k("intake")).items()}

    def reset(self) -> None:
        """Delete every key of this deployment (tests only)."""
        for key in self.r.scan_iter(match=f"{self.prefix}:*"):
            self.r.delete(key)
        self.r.hdel(FINGERPRINTS_KEY, self.deployment)
