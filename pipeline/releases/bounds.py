"""What a kind reports for ``dpstream plan``: one release's error bounds, read off its built mechanism
(``kind.bounds``); :mod:`pipeline.error_bounds` gathers them for a deployment."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BAND_BETA", "ReleaseBounds"]

BAND_BETA = 0.05  # failure probability of the band margin shown (band releases configure no β)


@dataclass(frozen=True)
class ReleaseBounds:
    """One release's bounds. ``bounds``: name -> value (counts of users or records); ``largest``
    is the one compared with the population n; ``padding``: public padding records per pattern."""

    release: str
    type: str
    beta: float
    bounds: dict[str, float]
    largest: str
    padding: int = 0
    notes: list[str] = field(default_factory=list)
    meaning: str = (
        "outputs"  # what a bound above n leaves without information (the warning's words)
    )

    def as_json(self) -> dict:
        return {
            "type": self.type,
            "beta": self.beta,
            "padding": self.padding,
            "bounds": dict(self.bounds),
            "compared_with_n": self.largest,
        }
