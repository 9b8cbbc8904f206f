"""Warn when the workers fall behind the reports log (``dpstream up``).

Each sample is the number of records on `reports` and `repartition` past what the workers' intake
snapshots say they handled (the figure ``dpstream status`` shows per partition). A backlog that grew in
every one of the last ``SAMPLES`` samples, ``INTERVAL`` seconds apart, and is at least ``FLOOR`` records
is a deployment whose workers do not keep up with the producers: said once on ``up``'s stderr, and again
only after the backlog shrank in between.
"""

from __future__ import annotations

from collections import deque

__all__ = ["LagWatch"]

INTERVAL = 30.0  # seconds between samples
SAMPLES = 3  # growing across this many intervals
FLOOR = 10_000  # records: below this a growing backlog is a burst being read, not a trend


class LagWatch:
    def __init__(self, samples: int = SAMPLES, floor: int = FLOOR):
        self.history: deque[int] = deque(maxlen=samples + 1)
        self.floor = floor
        self.warned = False

    def observe(self, unhandled: int) -> str | None:
        """Record one sample; the warning to print, if this sample completes a growing run."""
        self.history.append(int(unhandled))
        values = list(self.history)
        growing = len(values) == self.history.maxlen and all(
            b > a for a, b in zip(values, values[1:])
        )
        if not growing:
            if values[-1] < values[0]:
                self.warned = False
            return None
        if self.warned or values[-1] < self.floor:
            return None
        self.warned = True
        span = (len(values) - 1) * INTERVAL
        return (
            f"the workers are falling behind: {values[-1]:,} records not handled, up from {values[0]:,} "
            f"{span:.0f} s ago (`dpstream status` per partition; docs/streaming.md, 'The durable log')"
        )
