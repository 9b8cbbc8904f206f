"""Downstream consumer: materialise the synthetic panels from the public topics and query them.

Reads ``releases`` (manifests), ``synthetic`` (column chunks) and ``alerts``. Messages are
deduplicated by their deterministic keys (release, step, chunk): a republished step after a
releaser restart carries the same bytes, so duplicates are harmless. A step is accepted only when
all its chunks are present and the SHA-256 of its new columns matches the manifest.

Queries work on the synthetic records as ordinary data. For fixed-window releases the padding
(n_pad synthetic records per length-k pattern at every step, public) can be subtracted — the
"debiased" answers of Bun et al. 2024 — see :mod:`pipeline.queries`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from pipeline.connections import kafka_security
from pipeline.releases.codecs import SYNTHETIC_DTYPES, IncompleteStep, columns_checksum
from pipeline.releases.relative_error import answer_query
from pipeline.stream.kafka.topics import PUBLIC_TOPICS

__all__ = ["SyntheticPanel", "PanelStore", "read_topics", "IncompleteStep"]


@dataclass
class SyntheticPanel:
    """One release's synthetic records: ``values[i, t-1]`` is record i's value at step t (-1 = not yet)."""

    release: str
    type: str
    manifests: dict[int, dict[str, Any]] = field(default_factory=dict)
    values: np.ndarray | None = None
    complete_steps: set[int] = field(default_factory=set)
    histograms: dict[int, np.ndarray] = field(
        default_factory=dict
    )  # relative_error: step -> ĥ_t (float64)

    @property
    def parameters(self) -> dict[str, Any]:
        last = max(self.manifests) if self.manifests else None
        return self.manifests[last].get("parameters", {}) if last else {}

    @property
    def released_through(self) -> int:
        """Largest t such that every column 1..t is present."""
        if self.values is None:
            return next(t for t in range(len(self.histograms) + 1) if t + 1 not in self.histograms)
        have = [(self.values[:, j] >= 0).all() for j in range(self.values.shape[1])]
        t = 0
        while t < len(have) and have[t]:
            t += 1
        return t

    def as_array(self) -> np.ndarray:
        """The released columns (m, released_through), in the manifest's ``synthetic.dtype`` (relative_error:
        the histograms, codes × steps, float64)."""
        if self.values is None and self.histograms:
            return np.column_stack(
                [self.histograms[t] for t in range(1, self.released_through + 1)]
            )
        if self.values is None:  # the readers ask a panel only once it has released a step
            raise ValueError(f"release {self.release!r} has released nothing yet")
        return self.values[:, : self.released_through]

    # -- queries --------------------------------------------------------------------------------
    def window_counts(self, step: int, debias: bool = False) -> np.ndarray:
        """Synthetic count of every length-k pattern at ``step`` (fixed-window releases)."""
        from pipeline.queries import window_histogram

        p = self.parameters
        k, a = int(p["window"]), int(p["categories"])
        counts = window_histogram(self.as_array(), step, k, a).astype(np.int64)
        return counts - int(p["n_pad"]) if debias else counts

    def cumulative_counts(self, step: int) -> np.ndarray:
        """#records with synthetic weight ≥ b at ``step`` for b = 0..T (cumulative releases)."""
        from pipeline.queries import cumulative_counts

        arr = self.as_array()
        if not 1 <= step <= arr.shape[1]:
            raise ValueError(f"step must be in 1..{arr.shape[1]} (released so far), got {step}")
        counts = cumulative_counts(arr[:, :step])[step - 1]
        assert self.values is not None  # a records panel: as_array() above read them
        horizon = self.values.shape[1]
        return np.concatenate([counts, np.zeros(horizon + 1 - counts.size, dtype=counts.dtype)])

    def group_count(self, step: int, group: str, attribute=None) -> dict[str, Any]:
        """A group's count from the released histogram of ``step`` with its (ζ, α) interval
        (relative_error releases; :func:`pipeline.releases.relative_error.answer_query`)."""
        return answer_query(self.manifests[step], self.histograms[step], group, attribute)

    def export_csv(self, path: str | Path) -> Path:
        """The released columns as CSV (record, step_1..); ``dpstream export`` adds the data dictionary."""
        from pipeline.analyst.tables import write_csv

        write_csv(Path(path), self.as_array(), None)
        return Path(path)

    def export_parquet(self, path: str | Path) -> Path:
        from pipeline.analyst.tables import write_parquet

        write_parquet(
            Path(path), self.as_array(), None, {"release": self.release, "type": self.type}
        )
        return Path(path)


class PanelStore:
    """Applies messages from the public topics; idempotent and order-tolerant."""

    def __init__(self) -> None:
        self.panels: dict[str, SyntheticPanel] = {}
        self.alerts: dict[tuple[str, int], dict[str, Any]] = {}
        self.descriptor: dict[str, Any] | None = (
            None  # the last deployment descriptor (pipeline.descriptor)
        )
        self._chunks: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
        self.duplicates = 0

    def handlers(self, topic_names: dict[str, str]) -> dict[str, Any]:
        """Broker topic name -> the method applying its messages, for every public topic named."""
        by_topic = {
            "releases": self.add_manifest,
            "synthetic": self.add_chunk,
            "alerts": self.add_alert,
            "deployment": self.add_descriptor,
        }
        return {topic_names[t]: by_topic[t] for t in PUBLIC_TOPICS if t in topic_names}

    def _panel(self, release: str, type_: str = "") -> SyntheticPanel:
        panel = self.panels.get(release)
        if panel is None:
            panel = self.panels[release] = SyntheticPanel(release, type_)
        elif type_ and not panel.type:
            panel.type = type_
        return panel

    def add_manifest(self, value: bytes) -> None:
        m = orjson.loads(value)
        panel = self._panel(m["release"], m["type"])
        if int(m["step"]) in panel.manifests:
            self.duplicates += 1
        panel.manifests[int(m["step"])] = m
        self._try_complete(m["release"], int(m["step"]))

    def add_chunk(self, value: bytes) -> None:
        c = _digit_chunk(value) or orjson.loads(value)
        key = (c["release"], int(c["step"]))
        bucket = self._chunks.setdefault(key, {})
        if int(c["chunk"]) in bucket:
            self.duplicates += 1
        bucket[int(c["chunk"])] = c
        self._try_complete(*key)

    def add_alert(self, value: bytes) -> None:
        a = orjson.loads(value)
        self.alerts[(a["release"], int(a["step"]))] = a

    def add_descriptor(self, value: bytes | None) -> None:
        if value is not None:  # a tombstone deletes nothing a reader keeps
            self.descriptor = orjson.loads(value)

    def _try_complete(self, release: str, step: int) -> None:
        panel = self._panel(release)
        manifest = panel.manifests.get(step)
        if manifest is None or step in panel.complete_steps:
            return
        syn = manifest.get("synthetic")
        if syn is None:
            panel.complete_steps.add(step)
            return
        chunks = self._chunks.get((release, step), {})
        if len(chunks) < int(syn["chunks"]):
            return
        if _output_of(manifest) == "histogram":
            _complete_histogram(panel, manifest, chunks)
            self._chunks.pop((release, step), None)
            return
        m = int(syn["records"])
        cols = [int(s) for s in syn["columns"]]
        dtype = syn.get("dtype", "int8")  # manifests of earlier versions: int8
        if dtype not in SYNTHETIC_DTYPES:
            raise IncompleteStep(f"{release} step {step}: unknown synthetic dtype {dtype!r}")
        new = np.full((m, len(cols)), -1, dtype=dtype)
        try:
            for c in chunks.values():
                for j, s in enumerate(cols):
                    values = np.asarray(c["values"][str(s)], dtype=np.int64)
                    if values.size and (values.min() < 0 or values.max() > np.iinfo(new.dtype).max):
                        raise ValueError(f"values outside {dtype}")  # would wrap
                    new[int(c["start"]) : int(c["stop"]), j] = values
        except (KeyError, ValueError, TypeError, OverflowError) as err:
            raise IncompleteStep(
                f"{release} step {step}: malformed chunk ({type(err).__name__}: {err})"
            ) from None
        if columns_checksum(new) != syn["sha256"]:
            raise IncompleteStep(
                f"{release} step {step}: checksum mismatch (corrupt or mixed chunks)"
            )
        if panel.values is None:
            panel.values = np.full((m, int(manifest["horizon"])), -1, dtype=new.dtype)
        for j, s in enumerate(cols):
            panel.values[:, s - 1] = new[:, j]
        panel.complete_steps.add(step)
        self._chunks.pop((release, step), None)


_VALUES = b',"values":{'


def _digit_chunk(value: bytes) -> dict[str, Any] | None:
    """A synthetic chunk whose value lists hold single digits only, as the releaser writes them
    (``{..., "values": {"<step>": [0,1,...], ...}}``, no spaces), decoded with numpy instead of one
    Python int per value (most of a reader's time on a 10⁶-record step); None for anything else,
    which the caller decodes as JSON. The values are exactly what the JSON decoder would give."""
    at = value.find(_VALUES)
    if at < 0 or not value.endswith(b"}}"):
        return None
    try:
        head = orjson.loads(value[:at] + b"}")
    except orjson.JSONDecodeError:
        return None
    if type(head) is not dict or "values" in head:
        return None
    raw = np.frombuffer(value, dtype=np.uint8)
    values, pos, end = {}, at + len(_VALUES), len(value) - 2
    while True:  # "<step>":[d,d,...] then "," and the next, or the end
        close = value.find(b'":[', pos + 1)
        stop = value.find(b"]", close)
        if value[pos : pos + 1] != b'"' or close < 0 or stop < 0:
            return None
        key, text = value[pos + 1 : close], raw[close + 3 : stop]
        if not key.isdigit() or text.size % 2 == 0 and text.size:
            return None
        digits = text[0::2]
        if not (
            (text[1::2] == ord(",")).all()
            and (digits >= ord("0")).all()
            and (digits <= ord("9")).all()
        ):
            return None
        values[key.decode()] = (digits - ord("0")).astype(np.int8)
        pos = stop + 1
        if pos == end:
            break
        if value[pos : pos + 1] != b"," or stop > end:
            return None
        pos += 1
    head["values"] = values
    return head


def _output_of(manifest: dict) -> str:
    """The output shape the release's kind declares (pipeline.releases: ``output``)."""
    from pipeline.releases import get_kind

    try:
        return get_kind(manifest["type"]).output
    except ValueError:  # a kind this version does not know: its manifest says what it published
        return "histogram" if manifest.get("synthetic", {}).get("histogram") else "records"


def _complete_histogram(panel: SyntheticPanel, manifest: dict, chunks: dict[int, dict]) -> None:
    """Assemble a ``histogram`` step (one float64 column over the codes) from its chunks into
    ``panel.histograms``; a malformed chunk or a checksum mismatch raises ``IncompleteStep``."""
    step, syn = int(manifest["step"]), manifest["synthetic"]
    where = f"{manifest['release']} step {step}"
    hist = np.full(int(syn["records"]), np.nan)
    try:
        for c in chunks.values():
            hist[int(c["start"]) : int(c["stop"])] = np.asarray(
                c["values"][str(step)], dtype=np.float64
            )
    except (KeyError, ValueError, TypeError) as err:
        raise IncompleteStep(f"{where}: malformed chunk ({type(err).__name__}: {err})") from None
    if columns_checksum(hist) != syn["sha256"]:
        raise IncompleteStep(f"{where}: checksum mismatch (corrupt or mixed chunks)")
    panel.histograms[step] = hist
    panel.complete_steps.add(step)


BOOTSTRAP_TIMEOUT_MS = 8000  # a live broker answers its first request in well under this


def read_to_end(
    bootstrap: str,
    topics: list[str],
    handle,
    timeout: float = 30.0,
    until=None,
    start: dict | None = None,
) -> None:
    """Call ``handle(message)`` for every record of ``topics`` from the beginning (or from ``start``,
    TopicPartition -> offset) up to their current end (or until ``until()`` is true). The end is
    each partition's true log end
    (:func:`pipeline.stream.kafka.log_end.log_ends`), not the ListOffsets answer, which the embedded
    broker gives short (the last batch's base offset + 1). Each topic's partitions are the broker's
    own; a topic it does not have is :class:`~pipeline.stream.kafka.topic_presence.TopicsMissing`
    before any request names it (the embedded broker would create it)."""
    from kafka import KafkaConsumer, TopicPartition

    from pipeline.stream.kafka.log_end import log_ends
    from pipeline.stream.kafka.topic_presence import existing_partitions

    # a listener that is not a broker is one line within seconds, not kafka-python's 30 s bootstrap wait
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        **kafka_security(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        allow_auto_create_topics=False,  # a broker that honours it (Tansu does not: checked first)
        bootstrap_timeout_ms=BOOTSTRAP_TIMEOUT_MS,
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    try:
        partitions = existing_partitions(consumer, bootstrap, topics)
        tps = [TopicPartition(topic, p) for topic, parts in partitions.items() for p in parts]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        for tp in tps:
            if start and tp in start:
                consumer.seek(tp, start[tp])
        end = log_ends(bootstrap, tps)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=200)
            for msgs in batch.values():
                for msg in msgs:
                    handle(msg)
            if until is not None:
                if until():
                    break
            elif all(consumer.position(tp) >= end[tp] for tp in tps):
                break
    finally:
        consumer.close()


def read_topics(
    bootstrap: str,
    topic_names: dict[str, str],
    store: PanelStore | None = None,
    timeout: float = 30.0,
    until: Callable[[PanelStore], bool] | None = None,
) -> PanelStore:
    """Read the public topics from the beginning up to their current end (or until ``until(store)``)
    into ``store`` (:func:`read_to_end`)."""
    store = store or PanelStore()
    handlers = store.handlers(topic_names)
    read_to_end(
        bootstrap,
        list(handlers),
        lambda msg: handlers[msg.topic](msg.value),
        timeout,
        None if until is None else (lambda: until(store)),
    )
    return store
