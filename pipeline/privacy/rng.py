"""Random sources for the samplers: a secure default and a seeded one for simulation.

Every mechanism takes ``rng`` (or ``seed``) and resolves it with :func:`as_random_source`:

* ``None``  -> :class:`SecureRandom`: 64-bit words from the operating system's CSPRNG
  (``os.urandom``, i.e. ``getrandom(2)`` on Linux), requested in bulk.
* ``int``   -> :class:`SeededRandom`: numpy's PCG64 seeded with that integer. Reproducible and
  **not** cryptographically secure; for simulation and tests only. Production configuration
  refuses it (``RandomSource.secure`` is False).
* a :class:`RandomSource` -> itself, so one source can be shared by a mechanism's parts.

Both sources expose one primitive, :meth:`RandomSource.words` (uniform uint64 words); everything
else (exact uniform integers, exact rational Bernoulli draws, random orderings) is shared code
built on it, so the seeded path exercises exactly the code the secure path runs.

A seeded deployment gives each part its own seed, :func:`derive_seed` of the deployment's seed and
the part's labels (a release's name; a release's step), so parts draw independent streams and one
part can be recomputed alone.
"""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "RandomSource",
    "SecureRandom",
    "SeededRandom",
    "as_random_source",
    "random_source_from_state",
    "restore_random_source",
    "derive_seed",
]

_U64 = np.uint64


class RandomSource(ABC):
    """A source of uniform 64-bit words plus exact derived draws."""

    secure: bool = False

    @abstractmethod
    def words(self, size: int) -> np.ndarray:
        """Return ``size`` independent uniform uint64 words."""

    # -- state (for checkpoints) ------------------------------------------------------------
    @abstractmethod
    def get_state(self) -> dict[str, Any]:
        """A JSON-serialisable description of the source's state."""

    @abstractmethod
    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`get_state` of the same kind of source."""

    # -- exact derived draws ------------------------------------------------------------------
    def integers(self, high, size: int | None = None) -> np.ndarray:
        """Exactly uniform integers in ``[0, high)`` as int64 (``high`` scalar or array, 1 ≤ high < 2**63).

        Rejection sampling on 64-bit words: a word ``w`` is accepted when ``w ≥ 2**64 mod high``,
        which leaves a multiple of ``high`` equally likely words, and ``w mod high`` is returned.
        """
        high_arr = np.asarray(high)
        if size is None:
            size = int(high_arr.size) if high_arr.ndim else 1
        if high_arr.ndim == 0:
            high_arr = np.full(size, high_arr, dtype=np.int64)
        else:
            high_arr = high_arr.astype(np.int64, copy=False).ravel()
            if high_arr.size != size:
                raise ValueError(f"size={size} does not match the {high_arr.size} bounds in high")
        if size == 0:
            return np.zeros(0, dtype=np.int64)
        if np.any(high_arr < 1):
            raise ValueError("high must be at least 1")
        h = high_arr.astype(_U64)
        floor = (_U64(0) - h) % h  # = 2**64 mod h
        out = np.empty(size, dtype=_U64)
        pending = np.arange(size)
        while pending.size:
            w = self.words(pending.size)
            ok = w >= floor[pending]
            idx = pending[ok]
            out[idx] = w[ok] % h[idx]
            pending = pending[~ok]
        return out.astype(np.int64)

    def bernoulli(self, num, den, size: int | None = None) -> np.ndarray:
        """Exact Bernoulli(num/den) draws for integers 0 ≤ num ≤ den, den ≥ 1 (scalars or arrays)."""
        num_arr, den_arr = np.broadcast_arrays(
            np.asarray(num, dtype=np.int64), np.asarray(den, dtype=np.int64)
        )
        if size is None:
            size = int(num_arr.size)
        if num_arr.ndim == 0 or num_arr.size == 1:
            num_arr = np.full(size, num_arr.ravel()[0] if num_arr.size else 0, dtype=np.int64)
            den_arr = np.full(size, den_arr.ravel()[0] if den_arr.size else 1, dtype=np.int64)
        else:
            num_arr, den_arr = num_arr.ravel(), den_arr.ravel()
        if np.any(num_arr < 0) or np.any(num_arr > den_arr):
            raise ValueError("bernoulli needs 0 <= num <= den")
        return self.integers(den_arr, size) < num_arr

    def random_keys(self, size: int) -> np.ndarray:
        """Uniform uint64 sort keys: ordering items by them gives a uniformly random order
        (exactly so conditional on no tie, which has probability below size**2 / 2**65)."""
        return self.words(size)

    def permutation(self, n: int) -> np.ndarray:
        """A uniformly random permutation of ``range(n)`` (argsort of random 64-bit keys)."""
        return np.argsort(self.random_keys(n), kind="stable")


class SecureRandom(RandomSource):
    """Words from the operating system CSPRNG. Stateless: nothing to checkpoint or replay."""

    secure = True

    def words(self, size: int) -> np.ndarray:
        if size <= 0:
            return np.zeros(0, dtype=_U64)
        return np.frombuffer(os.urandom(8 * size), dtype=_U64).copy()

    def get_state(self) -> dict[str, Any]:
        return {"kind": "secure"}

    def set_state(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "secure":
            raise ValueError(
                f"cannot restore a {state.get('kind')!r} random state into a secure source"
            )

    def __repr__(self) -> str:
        return "SecureRandom()"


class SeededRandom(RandomSource):
    """Reproducible PCG64 words. NOT cryptographically secure: simulation and tests only."""

    secure = False

    def __init__(self, seed: int):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.seed = int(seed)
        self._bitgen = np.random.PCG64(self.seed)

    def words(self, size: int) -> np.ndarray:
        if size <= 0:
            return np.zeros(0, dtype=_U64)
        return self._bitgen.random_raw(size).astype(_U64, copy=False)

    def get_state(self) -> dict[str, Any]:
        st = self._bitgen.state
        return {
            "kind": "seeded",
            "seed": self.seed,
            "state": int(st["state"]["state"]),
            "inc": int(st["state"]["inc"]),
            "has_uint32": int(st["has_uint32"]),
            "uinteger": int(st["uinteger"]),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "seeded":
            raise ValueError(
                f"cannot restore a {state.get('kind')!r} random state into a seeded source"
            )
        self.seed = int(state["seed"])
        self._bitgen.state = {
            "bit_generator": "PCG64",
            "state": {"state": int(state["state"]), "inc": int(state["inc"])},
            "has_uint32": int(state["has_uint32"]),
            "uinteger": int(state["uinteger"]),
        }

    def __repr__(self) -> str:
        return f"SeededRandom(seed={self.seed})"


def as_random_source(rng: RandomSource | int | None = None) -> RandomSource:
    """Resolve the ``rng``/``seed`` argument every mechanism accepts (see module docstring)."""
    if rng is None:
        return SecureRandom()
    if isinstance(rng, RandomSource):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return SeededRandom(int(rng))
    raise TypeError(
        f"rng must be None (secure), an int seed or a RandomSource, got {type(rng).__name__}"
    )


def random_source_from_state(state: dict[str, Any]) -> RandomSource:
    """Rebuild the source described by :meth:`RandomSource.get_state` (checkpoint restore).

    A secure source has no state to restore: noise already drawn lives in the mechanism's own
    state and is never redrawn; only future draws come fresh from the operating system.
    """
    kind = state.get("kind")
    if kind == "secure":
        return SecureRandom()
    if kind == "seeded":
        source = SeededRandom(int(state["seed"]))
        source.set_state(state)
        return source
    raise ValueError(f"unknown random source kind {kind!r} in state")


def restore_random_source(
    state: Mapping[str, Any], kind: str, rng=None, what: str | None = None
) -> RandomSource:
    """For a mechanism's ``from_state``: check that ``state`` is of ``kind`` and return its random
    source — ``rng`` if given (it replaces the stored one), else the stored one."""
    if state.get("kind") != kind:
        raise ValueError(f"state is not a {what or kind} state (kind={state.get('kind')!r})")
    if rng is None:
        if state.get("rng") is None:
            raise ValueError("state has no random source; pass rng")
        return random_source_from_state(state["rng"])
    return rng


def derive_seed(seed: int, *labels) -> int:
    """The seed of the part named by ``labels`` (e.g. a release's name, then a step) of a run seeded
    with ``seed``: the 64-bit BLAKE2b digest of ``"seed:label:..."`` read little-endian, less its
    lowest bit (a non-negative int64). Simulation only, as any seed: a secure run derives nothing."""
    digest = hashlib.blake2b(
        ":".join(str(part) for part in (seed, *labels)).encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "little") >> 1
