"""Checkpoint state of the monitors: get_state()/from_state() from a list of fields plus the random source."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.privacy.rng import as_random_source, random_source_from_state

__all__ = ["StatefulMixin"]


class StatefulMixin:
    """get_state()/from_state() on top of ``_state_fields`` (arrays/scalars) plus the random source."""

    _state_fields: tuple[str, ...] = ()

    def _rng_init(self, seed: Any) -> None:
        self._source = as_random_source(seed)

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"kind": type(self).__name__, "rng": self._source.get_state()}
        for name in self._state_fields:
            value = getattr(self, name)
            state[name] = value.copy() if isinstance(value, np.ndarray) else value
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]):
        if state.get("kind") != cls.__name__:
            raise ValueError(f"state is of kind {state.get('kind')!r}, not {cls.__name__}")
        obj = cls.__new__(cls)
        obj._source = random_source_from_state(state["rng"])
        for name in cls._state_fields:
            value = state[name]
            setattr(obj, name, value.copy() if isinstance(value, np.ndarray) else value)
        obj._after_restore()
        return obj

    def _after_restore(self) -> None:  # rebuild derived (non-state) attributes
        pass
