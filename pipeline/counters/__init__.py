"""Continual counters: the binary tree mechanism, the square-root factorization and a BLT counter.

:func:`make_counter` builds one by name (the ``counter`` option of the cumulative synthesizer and
of cumulative releases) and :func:`counter_from_state` restores any of them from its state.
"""

from .blt import BLTCounter
from .factorization import SqrtFactorizationCounter
from .tree import HorizonExceededError, TreeCounter, released_nodes, tree_levels, tree_sigma2

__all__ = [
    "COUNTERS",
    "BLTCounter",
    "BLT_ABOVE_HORIZON",
    "HorizonExceededError",
    "SqrtFactorizationCounter",
    "TreeCounter",
    "check_counter",
    "counter_from_state",
    "make_counter",
    "released_nodes",
    "resolve_counter",
    "tree_levels",
    "tree_sigma2",
]

#: Counter names: "tree" (binary tree mechanism), "factorization" (square-root factorization, O(T)
#: time and memory per step), "blt" (a BLT fitted to the square-root factorization: O(1) per step,
#: max error within 0.2% of it up to T = 10⁵), "auto" (:func:`resolve_counter`).
COUNTERS = ("tree", "factorization", "blt", "auto")
#: "auto" picks the square-root factorization up to this horizon and the BLT above it: at T ≤ 1000
#: both have the same max error to 0.1% (jobs/bench/bench_counters.py) and the factorization's O(T)
#: step is cheap; beyond, its step and memory grow with T while the BLT's stay constant.
BLT_ABOVE_HORIZON = 1024
_BY_NAME = {"tree": TreeCounter, "factorization": SqrtFactorizationCounter, "blt": BLTCounter}
_BY_KIND: dict[str, type[TreeCounter | SqrtFactorizationCounter | BLTCounter]] = {
    "tree_counter": TreeCounter,
    SqrtFactorizationCounter._kind: SqrtFactorizationCounter,
    BLTCounter._kind: BLTCounter,
}


def check_counter(counter, name: str = "counter") -> str:
    if counter not in COUNTERS:
        raise ValueError(f"{name} must be one of {COUNTERS}, got {counter!r}")
    return counter


def resolve_counter(counter: str, horizon: int) -> str:
    """The concrete counter for a name: "auto" is "factorization" for horizon ≤ BLT_ABOVE_HORIZON,
    "blt" above; the other names are themselves. Privacy is the same for every choice (each counter
    is calibrated to its ρ by its own exact sensitivity); only error and cost differ."""
    counter = check_counter(counter)
    if counter != "auto":
        return counter
    return "factorization" if int(horizon) <= BLT_ABOVE_HORIZON else "blt"


def make_counter(counter: str, horizon: int, rho: float, seed=None, neighbours: str = "add_remove"):
    """A ρ-zCDP continual counter of the named kind (or "auto", :func:`resolve_counter`) over ``horizon`` steps."""
    return _BY_NAME[resolve_counter(counter, horizon)](
        horizon, rho, seed=seed, neighbours=neighbours
    )


def counter_from_state(state, rng=None):
    """Restore whichever counter ``state`` (from ``get_state``) belongs to."""
    cls = _BY_KIND.get(state.get("kind"))
    if cls is None:
        raise ValueError(f"unknown counter state kind {state.get('kind')!r}")
    return cls.from_state(state, rng=rng)
