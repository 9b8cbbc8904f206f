"""Simulated longitudinal panels (data simulation only; no privacy noise here).

The simulators stand in for survey panels such as the SIPP monthly poverty indicator used in
Bun et al. 2024, Section 5, and for a categorical attribute with persistence (employment status, a
region, a programme) that the heavy-hitter monitors consume. They draw from numpy's seeded
``Generator``: this is synthetic *input* data, so reproducibility matters and cryptographic
randomness does not (privacy noise always comes from :mod:`pipeline.privacy.rng`).

Everything is vectorised over users: one loop over time steps, none over users.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.validation import check_int

__all__ = [
    "POVERTY_TYPES",
    "PlantedHeavyHitter",
    "simulate_poverty_panel",
    "simulate_categorical_panel",
]

# Latent household types for the poverty chain: (name, population share, P(enter poverty | not
# poor), P(stay poor | poor)). Stationary monthly rates: chronic ≈ 0.90, transient ≈ 0.22,
# rarely poor ≈ 0.005, giving an overall rate ≈ 0.12 and P(poor_t | poor_{t-1}) ≈ 0.84.
POVERTY_TYPES: tuple[tuple[str, float, float, float], ...] = (
    ("chronic", 0.06, 0.27, 0.97),
    ("transient", 0.30, 0.07, 0.75),
    ("rarely_poor", 0.64, 0.003, 0.40),
)


def _as_generator(seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)):
        return np.random.default_rng(seed)
    raise TypeError(f"seed must be None, an int or a numpy Generator, got {type(seed).__name__}")


def simulate_poverty_panel(
    n: int = 23374,
    horizon: int = 12,
    seed=2021,
    *,
    seasonal_amplitude: float = 0.08,
    peak_month: int = 1,
    return_types: bool = False,
):
    """A SIPP-like monthly poverty indicator: ``(n, horizon)`` uint8, 1 = household in poverty.

    Model: each household has a latent type (chronic / transient / rarely poor, shares and
    transition probabilities in :data:`POVERTY_TYPES`) and follows a two-state Markov chain with
    its type's entry and stay probabilities. The first month is drawn from each type's stationary
    distribution. A mild seasonal drift multiplies the entry probability in calendar month ``t``
    by ``1 + seasonal_amplitude * cos(2π (t - peak_month) / 12)``.

    Calibration targets (approximate; the model is a stand-in, not fitted to microdata):

    * monthly poverty rate ≈ 11-13 %: the order of the SIPP 2021 sample's household poverty
      indicator in Bun et al. 2024 and of the Census Bureau's published SIPP monthly poverty rates
      (Dynamics of Economic Well-Being: Poverty reports put average monthly rates in the low teens);
    * month-to-month persistence P(poor_t | poor_{t-1}) ≈ 0.8-0.9: those reports find most
      spells last several months (median spells of a few to several months) and monthly exit
      rates of roughly 10-20 %;
    * heterogeneity: a few percent of households are poor in every month of a year (chronic
      poverty), far more than a homogeneous chain with the same rate and persistence would give,
      while a much larger share (roughly a quarter) is poor in at least one month.

    The test suite checks the simulated panel against these targets.

    Args:
        n: number of households (rows).
        horizon: number of months T (columns).
        seed: int, None or a ``numpy.random.Generator`` (simulation randomness, not privacy noise).
        seasonal_amplitude: relative amplitude of the seasonal entry drift, in [0, 1).
        peak_month: calendar month (1-12) where entry into poverty is most likely.
        return_types: also return the latent type index of every household (0 = chronic,
            1 = transient, 2 = rarely poor).
    """
    n = check_int(n, "n", low=1)
    horizon = check_int(horizon, "horizon", low=1)
    if not 0.0 <= seasonal_amplitude < 1.0:
        raise ValueError(f"seasonal_amplitude must be in [0, 1), got {seasonal_amplitude!r}")
    rng = _as_generator(seed)

    shares = np.array([t[1] for t in POVERTY_TYPES])
    enter = np.array([t[2] for t in POVERTY_TYPES])
    stay = np.array([t[3] for t in POVERTY_TYPES])
    types = rng.choice(len(shares), size=n, p=shares / shares.sum())

    months = np.arange(1, horizon + 1)
    season = 1.0 + seasonal_amplitude * np.cos(2 * np.pi * (months - peak_month) / 12.0)

    panel = np.empty((n, horizon), dtype=np.uint8)
    p_enter0 = enter[types] * season[0]
    stationary = p_enter0 / (p_enter0 + 1.0 - stay[types])
    state = rng.random(n) < stationary
    panel[:, 0] = state
    stay_u = stay[types]
    enter_u = enter[types]
    for t in range(1, horizon):
        p = np.where(state, stay_u, enter_u * season[t])
        state = rng.random(n) < p
        panel[:, t] = state
    if return_types:
        return panel, types
    return panel


@dataclass(frozen=True)
class PlantedHeavyHitter:
    """One planted heavy element: ``holders`` users hold ``element`` at steps start..stop (1-based, inclusive)."""

    element: int
    start: int
    stop: int
    holders: int


def simulate_categorical_panel(
    n: int,
    horizon: int,
    categories: int,
    seed=None,
    *,
    persistence: float = 0.9,
    weights=None,
    heavy_per_phase: int = 0,
    heavy_share: float = 0.02,
    phase_length: int = 3,
):
    """A categorical attribute with persistence: ``(n, horizon)`` int array of values in [0, categories).

    Background process: the first value is drawn from ``weights`` (uniform by default); at each
    later step a user keeps their value with probability ``persistence`` and otherwise redraws
    from ``weights``. Example: employment status with ``categories=3`` (employed / unemployed /
    not in labour force) and ``weights=[0.60, 0.04, 0.36]``.

    Shifting heavy hitters (for the heavy-hitter monitors, Kaplan–Mansour–Stemmer): with ``heavy_per_phase > 0``
    the horizon is cut into phases of ``phase_length`` steps; in each phase ``heavy_per_phase``
    distinct elements are drawn at random from the domain, and for each a fresh random group of
    ``round(heavy_share * n)`` users (disjoint within the phase) holds it for the whole phase,
    overriding the background value. With a large domain and uniform background the planted
    elements are the only ones held by many users. Returns ``(panel, schedule)`` in that case,
    ``schedule`` a list of :class:`PlantedHeavyHitter` sorted by start step; otherwise the panel only.

    Args:
        n, horizon, categories: panel shape and domain size (all positive integers).
        seed: int, None or a ``numpy.random.Generator`` (simulation randomness only).
        persistence: probability of keeping last step's value, in [0, 1].
        weights: background distribution over the domain (length ``categories``), or None for uniform.
        heavy_per_phase, heavy_share, phase_length: heavy-hitter planting, see above.
    """
    n = check_int(n, "n", low=1)
    horizon = check_int(horizon, "horizon", low=1)
    categories = check_int(categories, "categories", low=1)
    if not 0.0 <= persistence <= 1.0:
        raise ValueError(f"persistence must be in [0, 1], got {persistence!r}")
    if (
        isinstance(heavy_per_phase, bool)
        or not isinstance(heavy_per_phase, (int, np.integer))
        or heavy_per_phase < 0
    ):
        raise ValueError(f"heavy_per_phase must be a non-negative integer, got {heavy_per_phase!r}")
    rng = _as_generator(seed)

    if weights is None:
        probs = None
    else:
        probs = np.asarray(weights, dtype=float)
        if probs.shape != (categories,) or np.any(probs < 0) or probs.sum() <= 0:
            raise ValueError(
                f"weights must be {categories} non-negative numbers with a positive sum"
            )
        probs = probs / probs.sum()

    def draw(size: int) -> np.ndarray:
        if probs is None:
            return rng.integers(0, categories, size=size)
        return rng.choice(categories, size=size, p=probs)

    dtype = np.min_scalar_type(categories - 1) if categories <= 2**31 else np.int64
    panel = np.empty((n, horizon), dtype=dtype)
    value = draw(n)
    panel[:, 0] = value
    for t in range(1, horizon):
        move = rng.random(n) >= persistence
        value = value.copy()
        value[move] = draw(int(move.sum()))
        panel[:, t] = value

    if heavy_per_phase == 0:
        return panel

    phase_length = check_int(phase_length, "phase_length", low=1)
    if heavy_per_phase > categories:
        raise ValueError(
            f"heavy_per_phase={heavy_per_phase} exceeds the domain size categories={categories}"
        )
    holders = int(round(heavy_share * n))
    if not heavy_share > 0.0 or holders < 1 or holders * heavy_per_phase > n:
        raise ValueError(
            f"heavy_share={heavy_share!r} must give between 1 and n/heavy_per_phase holders per element "
            f"(n={n}, heavy_per_phase={heavy_per_phase})"
        )
    schedule: list[PlantedHeavyHitter] = []
    for start in range(1, horizon + 1, phase_length):
        stop = min(start + phase_length - 1, horizon)
        elements = rng.choice(categories, size=heavy_per_phase, replace=False)
        users = rng.permutation(n)[: holders * heavy_per_phase].reshape(heavy_per_phase, holders)
        for element, group in zip(elements, users):
            panel[group, start - 1 : stop] = element
            schedule.append(PlantedHeavyHitter(int(element), start, stop, holders))
    return panel, schedule
