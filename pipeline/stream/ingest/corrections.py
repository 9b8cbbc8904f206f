"""Corrections of an open step (``dpstream produce --replace``): a later report replaces the
earlier one.

A message on ``reports`` with the header ``dpstream-replace: 1`` carries *replacements*. Each
replaces the whole report the worker holds for its (user, step) while that step is open (an
attribute it does not carry is then not reported, and imputed at close), where a report without the
header is dead-lettered as a ``duplicate`` (the first report wins). A replacement for a closed step
is dead-lettered ``late``, as any report. Rules (:meth:`PartitionState.replace`):

* a replacement beats a report without the header, whenever either arrived. Reports without the
  header are ranked among themselves as without corrections (the first accepted wins, the others
  are ``duplicate``), so which of them are dead-lettered does not depend on when a correction
  arrived; the one that wins is counted as accepted and superseded by the correction;
* a replacement superseded by a later one of its own log is counted as accepted, not dead-lettered;
* between replacements of one log (the partition's own, or those forwarded from one source
  partition), the later one in that log wins: its position (offset, row in the message) is kept;
* between replacements that reached the owner by different logs — Kafka orders no two logs — the
  one from the log of precedence wins, as for first reports: the direct log, then the lower source
  partition; the other is dead-lettered as a ``duplicate`` whether it came first or second.

Every rule compares positions in logs, never arrival times, so the state after a replay from a
checkpoint equals the state before the crash, whatever the interleaving of the logs. Only the state
at close enters the step's partials: a user still contributes one value per step, so sensitivity and
the privacy analysis are unchanged (docs/privacy.md, "Corrections of an open step").

The arrays exist only once a replacement has arrived and until the steps it touched have closed, so
a deployment that never corrects pays nothing: neither memory, nor checkpoint bytes, nor time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["REPLACE_HEADER", "is_replacement", "Corrections"]

REPLACE_HEADER = "dpstream-replace"


def is_replacement(headers) -> bool:
    """The record carries the correction header (any other header value is no correction)."""
    return any(key == REPLACE_HEADER and value == b"1" for key, value in headers or ())


class Corrections:
    """Per (open step, local user): the origin and log position of the replacement held, -1 for
    none."""

    def __init__(self, slots: int, users: int):
        self.origin = np.full((slots, users), -1, dtype=np.int32)
        self.position = np.full((slots, users), -1, dtype=np.int64)

    def held(self, flat: np.ndarray) -> np.ndarray:
        """Whether a correction is held at each flat (open step, user) index."""
        return self.origin.reshape(-1)[flat] >= 0

    def shift(self) -> bool:
        """Advance the open-step window after a close; False once nothing is held (drop the
        arrays)."""
        for buf in (self.origin, self.position):
            buf[:-1] = buf[1:]
            buf[-1] = -1
        return bool((self.origin >= 0).any())

    def get_state(self) -> dict[str, Any]:
        return {"origin": self.origin.copy(), "position": self.position.copy()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Corrections:
        out = cls.__new__(cls)
        out.origin = np.array(state["origin"], dtype=np.int32)
        out.position = np.array(state["position"], dtype=np.int64)
        return out
