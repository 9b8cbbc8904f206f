"""When steps close, and the public time each close carries (releaser side, no I/O).

A step closes on a public event only: a close command (its record timestamp, set by the
operator's client), or, with ``steps.close: deadline``, ``deadline_seconds`` after the previous
step's close (the first step: after the releaser started). The deadline clock never looks at the
reports, and the close time it yields is the scheduled one, not the moment the releaser got round
to writing the markers (which would drift with how long the previous release took to compute). That
time is the marker's ``closed_at``; the workers pass it on in their partials and the releaser stamps
every public record of the step with it (docs/privacy.md, "Closing rules and timing").
"""

from __future__ import annotations

import time

__all__ = ["DeadlineClock", "now_ms", "public_close_time"]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class DeadlineClock:
    """The deadline of the open step: ``deadline_seconds`` after the last public close time.

    ``deadline_seconds`` None (``steps.close: control``) never comes due.
    """

    def __init__(self, deadline_seconds: float | None, opened_ms: int):
        self.period_ms = None if deadline_seconds is None else round(deadline_seconds * 1000)
        self.opened_ms = int(opened_ms)

    def due(self, now: int) -> int | None:
        """The open step's scheduled close time (ms) if it has passed at ``now`` (ms), else None."""
        if self.period_ms is None:
            return None
        at = self.opened_ms + self.period_ms
        return at if now >= at else None

    def closed(self, at_ms: int) -> None:
        """A step closed at the public time ``at_ms``: the next one's deadline counts from there."""
        self.opened_ms = int(at_ms)


def public_close_time(partials: list[dict]) -> int | None:
    """The public close time (ms) of a step from its partitions' partials, None if no marker had one.

    All markers of a step carry the same time, unless the releaser died while writing them and
    wrote the rest again after its restart; the latest is when the close was complete."""
    times = [int(p["closed_at"]) for p in partials if p.get("closed_at") is not None]
    return max(times) if times else None
