"""Redis persistence: release records, the budget ledger, mechanism state, worker checkpoints.

Release protocol (docs/streaming.md, "Releasing a step"): the releaser computes step t's complete
release — every release's manifest, synthetic columns, alerts and feedback, the ledger entries, and
the mechanism state after step t — and commits it with :meth:`~pipeline.stream.state.store_async.AsyncStateStore.commit_step`
in ONE Redis transaction
(WATCH/MULTI/EXEC) **before** publishing anything. A step whose record exists is republished from
the record, never recomputed, so noise is never redrawn and budget never spent twice. The
transaction refuses to commit a step that is not the next one (a second releaser, or a replay, loses
the race and must republish instead).

Keys: :mod:`pipeline.stream.state.keys` lays them out by secrecy (one prefix per class, so that ACL
key patterns separate the drawn noise from what the workers and the operator read).

One writer: :class:`pipeline.stream.state.store_async.AsyncStateStore`, from the jobs' event loops, owns
every write (the commit transaction, the pointers, checkpoints, intake counts). :class:`StateStore` here
is the synchronous reader of the command-line tools (``status``, ``close``) and the identity claim a process
makes once at start (:mod:`pipeline.stream.state.identity`).

Everything here is curator-side except the records' public parts (manifests etc. carry only
noisy/projected values); the mechanism state holds true per-node sums and must not be exposed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from pipeline.connections import redis_client
from pipeline.stream.state.keys import Keys

__all__ = ["StoreLayout", "StateStore", "StepAlreadyReleased", "StepOutOfOrder", "StepRecord"]


class StepAlreadyReleased(RuntimeError):
    """The step has a committed record: republish it, never recompute it."""


class StepOutOfOrder(RuntimeError):
    """Only the step after the last released one can be committed."""


@dataclass(frozen=True)
class StepRecord:
    step: int
    releases: dict[
        str, bytes
    ]  # release name -> serialised record (manifest, synthetic, alerts, feedback)
    state: bytes | None  # releaser mechanism state after this step


class StoreLayout:
    """The keys and encodings of a deployment's Redis state, shared by the synchronous reader
    (:class:`StateStore`: command-line tools, the identity claim) and the asyncio writer the jobs use
    (:class:`pipeline.stream.state.store_async.AsyncStateStore`)."""

    client_class: Any = None  # the redis-py client class of the subclass (synchronous or asyncio)
    client_options: dict[str, Any] = {}  # and its options

    def __init__(self, client, deployment: str):
        self.r = client
        self.deployment = deployment
        self.keys = Keys(deployment)

    @classmethod
    def from_url(cls, url: str, deployment: str):
        return cls(
            redis_client(url, client_class=cls.client_class, **cls.client_options), deployment
        )

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
    def _decode_ledger(raw: dict[bytes, bytes]) -> dict[str, dict[str, Any]]:
        return {k.decode(): json.loads(v) for k, v in raw.items()}

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


class StateStore(StoreLayout):
    """A deployment's whole Redis state (release records, ledger, worker checkpoints, intake counts,
    identity): reads (command-line tools, tests) and the identity claim; every other write is the
    asyncio store's."""

    client_class = redis.Redis

    def _int(self, key: str) -> int:
        return self._as_int(self.r.get(key))

    # -- what the operator reads (status, close) -------------------------------------------------
    def last_released(self) -> int:
        return self._int(self.keys.pointer("released"))

    def last_published(self) -> int:
        return self._int(self.keys.pointer("published"))

    def last_closing(self) -> int:
        return self._int(self.keys.pointer("closing"))

    def close_time(self, step: int) -> int | None:
        """The public close time (ms) recorded for ``step``'s markers (the releaser's key: tests, recovery)."""
        raw = self.r.hget(self.keys.close_times, str(step))
        return None if raw is None else int(raw)

    def ledger(self) -> dict[str, dict[str, Any]]:
        return self._decode_ledger(self.r.hgetall(self.keys.ledger))

    def intake(self) -> dict[int, dict[str, Any]]:
        """Reports partition -> its latest intake counts (partitions no worker has handled yet are absent)."""
        return {int(k): json.loads(v) for k, v in self.r.hgetall(self.keys.intake).items()}

    def identity(self) -> dict[str, Any] | None:
        raw = self.r.get(self.keys.identity)
        return None if raw is None else json.loads(raw)

    # -- the releaser's records (its own login; tests) ------------------------------------------------
    def load_step(self, step: int) -> StepRecord | None:
        return self._decode_step(step, self.r.hgetall(self.keys.step(step)))

    def latest_state(self) -> tuple[int, bytes | None]:
        """(last released step, mechanism state after it)."""
        last = self.last_released()
        return (0, None) if last == 0 else (last, self.r.hget(self.keys.step(last), "__state__"))

    def partials_resume(self) -> int:
        return self._int(self.keys.partials_resume)

    # -- a worker's state (assignment reads its partitions' checkpoints) ------------------------------
    def load_checkpoint(self, partition: int) -> bytes | None:
        return self.r.get(self.keys.checkpoint(partition))

    def load_kept_partials(self, partition: int, steps) -> dict[int, bytes]:
        """Closed step -> its partial messages as the partition's worker keeps them (``kept_blob``), for
        those of ``steps`` that are kept (field by field: the worker's login reads no whole hash)."""
        pipe = self.r.pipeline(transaction=False)
        steps = [int(t) for t in steps]
        for t in steps:
            pipe.hget(self.keys.kept_partials(partition), str(t))
        return {t: v for t, v in zip(steps, pipe.execute()) if v is not None}

    def holds_ingest_state(self) -> bool:
        """Whether workers wrote intake counts (written with every checkpoint)."""
        return bool(self.r.exists(self.keys.intake))

    # -- the identity claim (once, at a process's start) ----------------------------------------------
    def claim_identity(self, identity: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Store ``identity`` unless one exists (SET NX: the first writer wins); (stored one, whether it is ours)."""
        key = self.keys.identity
        won = bool(self.r.set(key, json.dumps(identity, sort_keys=True), nx=True))
        return json.loads(self.r.get(key)), won

    def release_identity(self) -> dict[str, Any] | None:
        """The releaser's own copy of the identity (under ``release:``, which no other role
        reaches)."""
        raw = self.r.get(self.keys.release_identity)
        return None if raw is None else json.loads(raw)

    def keep_release_identity(self, identity: dict[str, Any]) -> dict[str, Any]:
        """Store the releaser's copy unless one exists (SET NX); the stored one."""
        key = self.keys.release_identity
        self.r.set(key, json.dumps(identity, sort_keys=True), nx=True)
        return json.loads(self.r.get(key))

    def register_fingerprint(self, portable: str) -> None:
        """Mark this deployment's name-free fingerprint under its own prefix."""
        self.r.set(self.keys.fingerprint(portable), b"")

    def deployments_with_fingerprint(self, portable: str) -> list[str]:
        """Other deployments on this Redis registered with the same name-free fingerprint: found by key name
        (``SCAN``), which needs no access to the other deployments' keys."""
        found = set()
        for key in self.r.scan_iter(match=f"dpstream:*:fingerprint:{portable}", count=1000):
            name = key.decode().split(":")[1]
            if name != self.deployment:
                found.add(name)
        return sorted(found)
