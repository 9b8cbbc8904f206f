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
    "HorizonExceededError",
    "SqrtFactorizationCounter",
    "TreeCounter",
    "check_counter",
    "counter_from_state",
    "make_counter",
    "released_nodes",
    "tree_levels",
    "tree_sigma2",
]

#: Counter names: "tree" (binary tree mechanism), "factorization" (square-root factorization).
COUNTERS = ("tree", "factorization")
_BY_NAME = {"tree": TreeCounter, "factorization": SqrtFactorizationCounter}
_BY_KIND = {"tree_counter": TreeCounter, SqrtFactorizationCounter._kind: SqrtFactorizationCounter,
            BLTCounter._kind: BLTCounter}


def check_counter(counter, name: str = "counter") -> str:
    if counter not in COUNTERS:
        raise ValueError(f"{name} must be one of {COUNTERS}, got {counter!r}")
    return counter


def make_counter(counter: str, horizon: int, rho: float, seed=None, neighbours: str = "add_remove"):
    """A ρ-zCDP continual counter of the named kind over ``horizon`` steps."""
    return _BY_NAME[check_counter(counter)](horizon, rho, seed=seed, neighbours=neighbours)


def counter_from_state(state, rng=None):
    """Restore whichever counter ``state`` (from ``get_state``) belongs to."""
    cls = _BY_KIND.get(state.get("kind"))
    if cls is None:
        raise ValueError(f"unknown counter state kind {state.get('kind')!r}")
    return cls.from_state(state, rng=rng)
