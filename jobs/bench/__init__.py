"""Benchmarks run on demand (not part of `make test`); results and commands: docs/performance.md."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(path: str | Path | None, result) -> None:
    """Write a job's ``result`` as JSON to ``path`` (its folder created); nothing when ``path`` is None."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2, default=float))
