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
  {p}:close-times         hash: step -> its public close time (ms), as its markers carry it (a close
                          re-driven after a lost log writes the same time again)
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

from pipeline.connections import redis_client

__all__ = ["StoreLayout", "ReleaseStore", "StepAlreadyReleased", "StepOutOfOrder", "StepRecord", "FINGERPRINTS_KEY"]

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


class StoreLayout:
    """The key layout and encodings of a deployment's Redis state, shared by the synchronous store
    (:class:`ReleaseStore`: command-line tools, tests) and the asyncio one the jobs use
    (:class:`pipeline.stream.state.store_async.AsyncReleaseStore`)."""

    client_class: Any = None  # the redis-py client class of the subclass (synchronous or asyncio)
    client_options: dict[str, Any] = {}  # and its options

    def __init__(self, client, deployment: str):
        self.r = client
        self.deployment = deployment
        self.prefix = f"dpstream:{deployment}"

    @classmethod
    def from_url(cls, url: str, deployment: str):
        return cls(redis_client(url, client_class=cls.client_class, **cls.client_options), deployment)

    def _k(self, *parts: Any) -> str:
        return ":".join([self.prefix, *map(str, parts)])

    def key(self, *parts: Any) -> str:
        """The Redis key of ``parts`` under this deployment's prefix (errors name the key they are about)."""
        return self._k(*parts)

    @staticmethod
    def _as_int(value: bytes | None) -> int:
        """An integer pointer; 0 until it is first set."""
        return int(value) if value is not None else 0

    @staticmethod
    def _decode_step(step: int, raw: dict[bytes, bytes]) -> StepRecord | None:
        if not raw:
            return None
        state = raw.pop(b"__state__", None)
        return StepRecord(step, {k.decode(): v for k, v in raw.items()}, state)

    @staticmethod
    def _check_next(step: int, last: int, exists: bool, clash: list[str]) -> None:
        """Refuse to commit ``step`` unless it is the next one and nothing of it is stored."""
        if step <= last or exists:
            raise StepAlreadyReleased(f"step {step} is already released (last released {last})")
        if step != last + 1:
            raise StepOutOfOrder(f"cannot commit step {step}: last released step is {last}")
        if clash:
            raise StepAlreadyReleased(f"ledger already holds {clash}")

    @staticmethod
    def _step_mapping(record: StepRecord) -> dict[str, bytes]:
        mapping = dict(record.releases)
        if record.state is not None:
            mapping["__state__"] = record.state
        return mapping

    @staticmethod
    def _ledger_mapping(ledger: dict[str, dict[str, Any]]) -> dict[str, str]:
        return {k: json.dumps(v, sort_keys=True) for k, v in ledger.items()}

    @staticmethod
    def _intake_mapping(summaries: dict[int, dict[str, Any]]) -> dict[str, str]:
        return {str(p): json.dumps(s, sort_keys=True) for p, s in summaries.items()}


class ReleaseStore(StoreLayout):
    client_class = redis.Redis

    def _int(self, name: str) -> int:
        """An integer pointer of this deployment; 0 until it is first set."""
        return self._as_int(self.r.get(self._k(name)))

    # -- releases ----------------------------------------------------------------------------
    def last_released(self) -> int:
        return self._int("released")

    def load_step(self, step: int) -> StepRecord | None:
        return self._decode_step(step, self.r.hgetall(self._k("step", step)))

    def commit_step(self, record: StepRecord, ledger: dict[str, dict[str, Any]]) -> None:
        """Atomically store step ``record.step`` and its ledger entries (``"<release>:<t>"`` -> entry)."""
        released_key = self._k("released")
        step_key = self._k("step", record.step)
        ledger_key = self._k("ledger")
        with self.r.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(released_key, step_key, ledger_key)
                    last = self._as_int(pipe.get(released_key))
                    self._check_next(record.step, last, bool(pipe.exists(step_key)),
                                     [key for key in ledger if pipe.hexists(ledger_key, key)])
                    pipe.multi()
                    pipe.hset(step_key, mapping=self._step_mapping(record))
                    if ledger:
                        pipe.hset(ledger_key, mapping=self._ledger_mapping(ledger))
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

    def mark_closing(self, step: int, closed_at: int | None = None) -> None:
        """Close markers of ``step`` (public close time ``closed_at``, ms) are written to every reports partition."""
        with self.r.pipeline(transaction=True) as tx:
            if closed_at is not None:
                tx.hset(self._k("close-times"), str(step), int(closed_at))
            tx.set(self._k("closing"), step)
            tx.execute()

    def close_time(self, step: int) -> int | None:
        """The public close time (ms) recorded for ``step``'s markers (None: not recorded)."""
        raw = self.r.hget(self._k("close-times"), str(step))
        return None if raw is None else int(raw)

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
            self.r.hset(self._k("intake"), mapping=self._intake_mapping(summaries))

    def intake(self) -> dict[int, dict[str, Any]]:
        """Reports partition -> its latest intake counts (partitions no worker has handled yet are absent)."""
        return {int(k): json.loads(v) for k, v in self.r.hgetall(self._k("intake")).items()}

    def reset(self) -> None:
        """Delete every key of this deployment (tests only)."""
        for key in self.r.scan_iter(match=f"{self.prefix}:*"):
            self.r.delete(key)
        self.r.hdel(FINGERPRINTS_KEY, self.deployment)
