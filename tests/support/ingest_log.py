"""A reports partition driven through :class:`IngestCore` without Kafka: a small deployment, a
log of records with increasing offsets, and the outputs of a drain sorted by kind (shared by the
ingest tests)."""

from __future__ import annotations

import orjson

from pipeline.config import parse_config
from pipeline.stream.ingest.core import ApplyResult, CloseOutput, IngestCore, Record
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.kafka.messages import CONTROL_HEADER
from pipeline.stream.kafka.topics import topic_names

PARTS = 3
MARK = ((CONTROL_HEADER, b"close"),)


def deployment(monitors=True, n=30):
    releases = [
        {"name": "fw", "type": "fixed_window", "attribute": "poverty", "window": 2, "share": 0.5},
        {"name": "cu", "type": "cumulative", "attribute": "poverty", "share": 0.5},
    ]
    budget = {"rho": 1.0}
    if monitors:
        budget.update(epsilon=1.0, delta=1e-6)
        releases.append({"name": "hh", "type": "heavy_hitters", "attribute": "query", "k": 2, "share": 1.0})
    return parse_config({
        "name": "ing",
        "topics": {"partitions": PARTS},
        "roster": {"size": n},
        "horizon": 5,
        "attributes": {"poverty": {"type": "binary"}, "query": {"type": "hashed", "size": 20}},
        "budget": budget,
        "random": {"kind": "seeded", "seed": 3},
        "releases": releases,
    })


class Log:
    """A reports partition's log: appends records with increasing offsets."""

    def __init__(self):
        self.records: list[Record] = []

    def report(self, user, step, **values) -> Record:
        values = values or {"poverty": 1, "query": 1}
        rec = Record(len(self.records), orjson.dumps({"user": user, "step": step, "values": values}))
        self.records.append(rec)
        return rec

    def raw(self, value: bytes) -> Record:
        rec = Record(len(self.records), value)
        self.records.append(rec)
        return rec

    def marker(self, step) -> Record:
        rec = Record(len(self.records), orjson.dumps({"step": step}), MARK)
        self.records.append(rec)
        return rec


def users_of(roster, partition):
    return [roster.ids[i] for i in roster.rows_of(partition, PARTS)]


def core_for(dep, store=None):
    roster = Roster.from_range(dep.n)
    core = IngestCore(dep, roster, topic_names(dep), store=store, isolated=True)
    return core, roster


def closes(outputs):
    return [o for o in outputs if isinstance(o, CloseOutput)]


def applies(outputs):
    return [o for o in outputs if isinstance(o, ApplyResult)]


def reasons_of(outputs) -> dict[str, int]:
    """Reports rejected by reason over the runs' results (counts of reports, not dead letters)."""
    out: dict[str, int] = {}
    for a in applies(outputs):
        for r, n in a.reasons.items():
            out[r] = out.get(r, 0) + n
    return out
