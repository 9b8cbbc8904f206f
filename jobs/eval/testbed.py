"""A small binary-panel deployment on given services: the stream tests' and fault job's test bed.

One binary attribute ``pov`` with a fixed-window release (window ``window``) and a cumulative
release sharing ρ = 0.5, seeded, so a run can be compared bit for bit with
``pipeline.stream.releaser.engine.batch_reference``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

__all__ = ["write_panel_deployment", "binary_panel"]


def write_panel_deployment(
    directory,
    services,
    name: str,
    n: int,
    horizon: int,
    partitions: int = 2,
    seed: int = 11,
    window: int = 3,
    **extra,
) -> str:
    """Write ``<directory>/<name>.yaml`` for ``services`` (embedded or not); returns its path."""
    cfg = {
        "name": name,
        "broker": services.broker.bootstrap,
        "redis": services.redis.url,
        "roster": {"size": n},
        "horizon": horizon,
        "topics": {"partitions": partitions},
        "attributes": {"pov": {"type": "binary"}},
        "budget": {"rho": 0.5},
        "random": {"kind": "seeded", "seed": seed},
        "releases": [
            {
                "name": "fw",
                "type": "fixed_window",
                "attribute": "pov",
                "window": window,
                "share": 0.5,
            },
            {"name": "cu", "type": "cumulative", "attribute": "pov", "share": 0.5},
        ],
        **extra,
    }
    path = Path(directory) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def binary_panel(seed: int, n: int, horizon: int) -> np.ndarray:
    """(n, horizon) uniform 0/1 reports."""
    return np.random.default_rng(seed).integers(0, 2, size=(n, horizon))
