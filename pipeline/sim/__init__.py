"""Simulated panels for demos, batch jobs and tests (simulation randomness, not privacy noise)."""

from .panel import (
    POVERTY_TYPES,
    PlantedHeavyHitter,
    simulate_categorical_panel,
    simulate_poverty_panel,
)

__all__ = [
    "POVERTY_TYPES",
    "PlantedHeavyHitter",
    "simulate_categorical_panel",
    "simulate_poverty_panel",
]
