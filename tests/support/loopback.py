"""One ingest core owning several partitions, with what it forwards fed back to it through
in-memory logs (the repartition protocol without a broker)."""

from __future__ import annotations

from pipeline.stream.ingest.core import Record
from pipeline.stream.ingest.repartition import ForwardMarkers


class Loopback:
    """Drives one core owning several partitions, feeding what it forwards (batches and markers)
    back through in-memory ``repartition`` logs, as the broker would."""

    def __init__(self, core):
        self.core = core
        self.logs: dict[int, list[Record]] = {}

    def drain(self, partitions) -> list:
        """Handle ``partitions`` and every partition forwarded to, until nothing moves; returns the
        ApplyResults and CloseOutputs in order."""
        todo, results = list(partitions), []
        while todo:
            touched = set()
            for p in todo:
                for out in self.core.drain_all(p):
                    sent = (out.messages if isinstance(out, ForwardMarkers)
                            else getattr(out, "forwards", []))
                    for q, value, headers in sent:
                        log = self.logs.setdefault(q, [])
                        log.append(Record(len(log), value, tuple(headers)))
                        assert self.core.enqueue_forwarded(q, [log[-1]]) is None
                        touched.add(q)
                    if not isinstance(out, ForwardMarkers):
                        results.append(out)
            todo = sorted(touched)
        return results
