"""A deployment released in-process (the releaser's engine, the workers' partition state, the public
codecs) into a consumer's PanelStore: what the analysts' readers see, without a broker."""

from __future__ import annotations

import numpy as np
import orjson

N, T = 2000, 6


def analyst_config(n: int = N, horizon: int = T) -> dict:
    return {
        "name": "analyst-test", "roster": {"size": n}, "horizon": horizon, "topics": {"partitions": 1},
        "steps": {"unit": "month"},
        "attributes": {
            "poverty": {"type": "binary", "label": "poor", "description": "household below the poverty line"},
            "occupation": {"type": "hashed", "size": 64, "dictionary": {7: "nurse", 9: "driver"}},
        },
        "budget": {"rho": 0.5, "epsilon": 2.0, "delta": 1e-6},
        "random": {"kind": "seeded", "seed": 11},
        "releases": [
            {"name": "poverty-quarterly", "type": "fixed_window", "attribute": "poverty", "window": 3, "share": 0.5},
            {"name": "poverty-cumulative", "type": "cumulative", "attribute": "poverty", "share": 0.5},
            {"name": "occupation-heavy", "type": "heavy_hitters", "attribute": "occupation", "method": "tct", "k": 2,
             "share": 1.0},
        ],
    }


def panels(n: int = N, horizon: int = T, seed: int = 3):
    rng = np.random.default_rng(seed)
    poverty = (rng.random((n, horizon)) < 0.2).astype(np.int64)
    occupation = rng.integers(0, 64, size=(n, horizon))
    occupation[: n // 2] = 7  # "nurse": held by half the users at every step
    return poverty, occupation


def released_store(dep, values: dict, steps=None):
    """Release ``steps`` (default all) of ``values`` (attribute -> (n, T) codes) through the engine; the
    public records into a PanelStore."""
    from pipeline.consumer import PanelStore
    from pipeline.stream.ingest.partition_state import PartitionState
    from pipeline.stream.ingest.reports import ParsedReports
    from pipeline.stream.kafka.messages import synthetic_chunks
    from pipeline.stream.releaser.engine import ReleaseEngine

    n = next(iter(values.values())).shape[0]
    rows = np.arange(n)
    state, engine, store = PartitionState(dep, 0, rows, n), ReleaseEngine(dep, n), PanelStore()
    for t in steps or range(1, dep.horizon + 1):
        state.apply(ParsedReports.of_singles(rows, np.full(n, t), {a: v[:, t - 1] for a, v in values.items()}))
        outs = engine.release(t, [state.close(t)])
        for out in outs:
            store.add_manifest(orjson.dumps(out.manifest))
            if out.columns is not None:
                for _, chunk in synthetic_chunks(out.release, t, out.column_steps, out.columns):
                    store.add_chunk(chunk)
            if out.alerts is not None:
                store.add_alert(orjson.dumps(out.alerts))
            if out.feedback is not None:
                state.apply_feedback(t, out.release, out.feedback)
    return store
