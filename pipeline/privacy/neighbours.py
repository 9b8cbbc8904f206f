"""The neighbouring relation of the privacy guarantee and the sensitivity it implies."""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["Neighbours", "NEIGHBOURS", "check_neighbours", "sensitivity_factor"]


class Neighbours(enum.StrEnum):
    """Which datasets are neighbours; the privacy unit is one user's whole report sequence.

    * ``REPLACE`` (``"replace"``): one user's sequence is replaced by any other sequence of the
      domain, including the all-missing one. The only coherent relation for a stream deployment:
      the roster is fixed and public and a user without reports is imputed, so an "absent" user's
      count moves from its real bin to the imputed bin (−1 in one bin, +1 in another) and n is
      unchanged (the cumulative release publishes it exactly). ``pipeline.config`` refuses anything
      else for a deployment (docs/privacy.md, "Unit of privacy and neighbouring relation").
    * ``ADD_REMOVE`` (``"add_remove"``): one user's sequence is present or absent. Coherent only
      for batch use where the unit really disappears from every histogram and n is not published.

    Mechanisms accept the enum or its string value (normalised by :func:`check_neighbours`).
    """

    ADD_REMOVE = "add_remove"
    REPLACE = "replace"


NEIGHBOURS: tuple[str, ...] = tuple(m.value for m in Neighbours)


def check_neighbours(neighbours: Any, name: str = "neighbours") -> Neighbours:
    """Normalise ``neighbours`` (a :class:`Neighbours` member or its string value) to the enum;
    anything else raises ValueError naming the argument ``name``."""
    try:
        return Neighbours(neighbours)
    except ValueError:
        raise ValueError(f"{name} must be one of {NEIGHBOURS}, got {neighbours!r}") from None


def sensitivity_factor(neighbours: Neighbours | str) -> float:
    """Multiplier on ρ (equivalently on σ² for a fixed ρ) of a histogram release.

    A histogram with Gaussian noise of variance σ² per bin is Δ₂²/(2σ²)-zCDP, Δ₂ its L2 sensitivity
    (Bun & Steinke 2016, Proposition 1.6). One user's report at a step sits in one bin:

    * ``add_remove``: one bin changes by 1, Δ₂² = 1 → factor 1;
    * ``replace``: one bin loses 1 and another gains 1, Δ₂² = 2 → factor 2 (twice the ρ for the
      same noise, or twice the σ² for the same ρ).
    """
    return 1.0 if check_neighbours(neighbours) is Neighbours.ADD_REMOVE else 2.0
