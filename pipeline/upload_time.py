"""How long a step's upload takes, to plan ``steps.deadline_seconds`` with (docs/streaming.md,
"How long an upload takes").

``UPLOAD_SECONDS_PER_MILLION`` is a planning figure, not a promise. The upload benchmark
(``python -m jobs.bench.bench_upload``) measured the whole upload of one step of 10^6 users (file
checked, read again and sent, every message acknowledged) on the embedded broker of a shared 2-core
machine at 13.8 s (load average ~23; 37.7 s before the upload streamed); the figure here is about
1.5 times that, so a deadline that passes this check leaves room for a slower or busier machine.
The upload that keeps its checked messages (not reading the file again) took 0.55 s at a load of
8 and less than half the CPU, the one-pass upload 0.13-0.24 s at loads of 0.6-2.3; not re-measured at
~23, the figure is kept.
An upload's reports count for a step when its commit records are in the log before the step's
close marker; a deadline shorter than the upload closes the step before the commit, and all of
the upload's reports of it are dead-lettered ``late``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = ["UPLOAD_SECONDS_PER_MILLION", "expected_upload_seconds", "deadline_warning"]

UPLOAD_SECONDS_PER_MILLION = 20.0  # measured (docs/streaming.md), rounded up: conservative


def expected_upload_seconds(users: int) -> float:
    """Planned seconds to upload one step's reports of ``users`` users (at least one second)."""
    return max(1.0, UPLOAD_SECONDS_PER_MILLION * users / 1e6)


def deadline_warning(deployment: Deployment) -> str | None:
    """A warning when steps close on a deadline shorter than one step's planned upload, else
    None."""
    steps = deployment.steps
    if steps.close != "deadline" or steps.deadline_seconds is None:
        return None
    need = expected_upload_seconds(deployment.n)
    if steps.deadline_seconds >= need:
        return None
    return (
        f"steps.deadline_seconds = {steps.deadline_seconds:g} is shorter than the planned upload "
        f"of one step of "
        f"{deployment.n:,} users (~{need:.0f} s at {UPLOAD_SECONDS_PER_MILLION:g} s per million, "
        "a conservative "
        "figure: docs/streaming.md, 'How long an upload takes'): an upload not committed by the "
        "deadline has all its reports of the step dead-lettered as late; raise it, or upload "
        "each step right after the previous close"
    )
