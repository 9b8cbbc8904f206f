"""Retention of the embedded durable log: the `reports` and `repartition` batches no recovery can need.

The bundled broker lists a partition's every stored batch on each fetch, so a log that only grows makes
every fetch slower (docs/streaming.md, "The durable log"), and its ``DeleteRecords`` is not implemented
(Tansu 0.6's ``DynoStore::delete_records`` is a ``todo!()``). ``dpstream up`` therefore deletes, through
the object store's own S3 interface (so its listing index stays exact), the batches of `reports` and
`repartition` that lie wholly before a *retention point* per partition.

The retention point of a partition is where its worker's checkpoint resumes (`reports`: the offset after
its last close marker; `repartition`: its inbox's resume offset) — **as read before the last released
step was committed**. Each round reads the checkpoints first, then the released step, and keeps that
sample; when a later round sees the released step advance past the sample's, the sample's points apply.
Why every recovery still has its records:

* a worker restarted (or a partition reassigned) resumes from the partition's current checkpoint, and a
  checkpoint only moves forward: at or after the sample;
* a Redis backup can only be restored if it holds the last released step (the fence refuses an older
  one: docs/streaming.md, "Backup and restore"), so it was taken after that step's commit, after the
  sample was read: its checkpoints are at or after the sample's;
* a lost close is re-driven by new markers appended to the log and answered from the partials kept in
  Redis or the state the checkpoint holds: nothing before the checkpoint is read;
* the lost-log check compares counts with the log's *end*, and the last batch of a partition is never
  deleted (nor any batch holding the point or a record after it), so the end stays where it was.

Other topics are not trimmed: `feedback` is re-read from its start on assignment, `control` by the
releaser, `releases` by the fence; they, `step-partials` and the public topics grow by a few batches a
step, not with the producers' batching.
"""

from __future__ import annotations

import http.client
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

from pipeline.stream.local.embedded import OBJECT_STORE_BUCKET, EmbeddedObjectStore

if TYPE_CHECKING:
    from pipeline.stream.state.store import StateStore

__all__ = ["RetentionPoints", "LogRetention", "deletable"]

log = logging.getLogger("dpstream.retention")

_BATCH = re.compile(r"(\d{20})\.batch$")


@dataclass(frozen=True)
class RetentionPoints:
    """Per (topic, partition), the first offset recovery may read; sampled before ``released`` moved on."""

    released: int
    points: dict[tuple[str, int], int]


def deletable(bases: list[int], point: int) -> list[int]:
    """The batches (by base offset, sorted) wholly before ``point``: each ends where the next begins, and
    the last one is always kept."""
    return [base for base, following in zip(bases, bases[1:]) if following <= point]


def checkpoint_points(
    store: StateStore, names: dict[str, str], partitions: int
) -> dict[tuple[str, int], int]:
    """Where each partition's checkpoint resumes `reports` and `repartition` (0 without a checkpoint)."""
    from pipeline.serialization import loads_state

    points = {}
    for p in range(partitions):
        blob = store.load_checkpoint(p)
        state = loads_state(blob, store.keys.checkpoint(p)) if blob is not None else {}
        points[(names["reports"], p)] = int(state.get("offset", -1)) + 1
        points[(names["repartition"], p)] = int(state.get("repartition", {}).get("resume", 0))
    return points


class _ObjectStoreClient:
    """ListObjectsV2 and DeleteObject on the embedded object store, authorised as the broker is."""

    def __init__(self, storage: EmbeddedObjectStore):
        self.storage = storage

    def _request(self, method: str, path: str) -> bytes:
        conn = http.client.HTTPConnection("127.0.0.1", self.storage.port, timeout=30)
        try:
            auth = f"AWS4-HMAC-SHA256 Credential={self.storage.access_key}/retention/us-east-1/s3/aws4_request"
            conn.request(method, f"/{OBJECT_STORE_BUCKET}{path}", headers={"Authorization": auth})
            resp = conn.getresponse()
            body = resp.read()
            if resp.status >= 300:
                raise OSError(f"object store answered {resp.status} to {method} {path[:80]}")
            return body
        finally:
            conn.close()

    def keys(self, prefix: str) -> list[str]:
        found, token = [], None
        while True:
            query = f"?list-type=2&prefix={quote(prefix)}"
            if token:
                query += f"&continuation-token={quote(token)}"
            body = self._request("GET", query).decode()
            found += re.findall(r"<Key>([^<]+)</Key>", body)
            token = (
                re.findall(r"<NextContinuationToken>([^<]+)</NextContinuationToken>", body)
                or [None]
            )[0]
            if token is None:
                return found

    def delete(self, key: str) -> None:
        self._request("DELETE", "/" + quote(key))


class LogRetention:
    """One deployment's retention, run from ``dpstream up``'s supervision loop (:meth:`round`)."""

    def __init__(
        self,
        storage: EmbeddedObjectStore,
        store: StateStore,
        names: dict[str, str],
        partitions: int,
    ):
        self.client = _ObjectStoreClient(storage)
        self.store = store
        self.names = names
        self.partitions = partitions
        self.sample: RetentionPoints | None = None
        self.deleted = 0
        self._cluster_prefixes: list[str] = []

    def round(self) -> int:
        """Apply the sample once the released step moved past it, and take a new one; batches deleted."""
        points = checkpoint_points(
            self.store, self.names, self.partitions
        )  # first the checkpoints,
        released = self.store.last_released()  # then the step: the sample predates the next commit
        deleted = 0
        if self.sample is not None and released > self.sample.released:
            deleted = sum(
                self.trim(topic, p, point) for (topic, p), point in self.sample.points.items()
            )
        if self.sample is None or released > self.sample.released:
            self.sample = RetentionPoints(released, points)
        self.deleted += deleted
        return deleted

    def trim(self, topic: str, partition: int, point: int) -> int:
        if point <= 0:
            return 0
        by_base = {}
        for cluster in self._clusters():
            prefix = f"{cluster}topics/{topic}/partitions/{partition:010d}/records/"
            for key in self.client.keys(prefix):
                found = _BATCH.search(key)
                if found:
                    by_base[int(found.group(1))] = key
        doomed = deletable(sorted(by_base), point)
        for base in doomed:
            self.client.delete(by_base[base])
        if doomed:
            log.info(
                "retention: %s partition %d: %d batches before offset %d deleted",
                topic,
                partition,
                len(doomed),
                point,
            )
        return len(doomed)

    def _clusters(self) -> list[str]:
        """The broker's cluster folders (one: its cluster id), listed once."""
        if not self._cluster_prefixes:
            body = self.client._request("GET", "?list-type=2&prefix=clusters/&delimiter=/").decode()
            self._cluster_prefixes = re.findall(r"<Prefix>(clusters/[^<]+/)</Prefix>", body)
        return self._cluster_prefixes
