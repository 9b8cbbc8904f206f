"""The mechanism a configured release runs, built with its planned allotment: one construction for
the stream's releaser (:class:`pipeline.stream.release.engine.ReleaseEngine`) and for ``dpstream plan``
(:mod:`pipeline.error_bounds`), so the bounds the plan shows are the ones the releases run with."""

from __future__ import annotations

__all__ = ["build_mechanism"]


def build_mechanism(deployment, release, allotment, n: int | None, seed=None):
    """The library mechanism of ``release`` (a configured release of ``deployment``) calibrated to
    ``allotment`` (its :class:`~pipeline.privacy.accounting.ZCDP` or ``ApproxDP`` share of the budget)
    for ``n`` users. ``seed``: None (secure randomness), an int or a RandomSource."""
    dep, rel = deployment, release
    attr = dep.attributes[rel.attribute]
    if rel.type == "fixed_window":
        from pipeline.synth.fixed_window import FixedWindowSynthesizer

        return FixedWindowSynthesizer(dep.horizon, rel.window, allotment.rho, beta=rel.beta,
                                      categories=attr.size, neighbours=dep.neighbours, seed=seed, n=n)
    if rel.type == "cumulative":
        from pipeline.synth.cumulative import CumulativeSynthesizer

        return CumulativeSynthesizer(dep.horizon, allotment.rho, beta=rel.beta, neighbours=dep.neighbours,
                                     seed=seed, n=n, counter=rel.counter)
    if rel.type == "heavy_hitters":
        from pipeline.monitors import ShiftingHeavyHitters

        return ShiftingHeavyHitters(attr.size, allotment.epsilon, allotment.delta, rel.k, dep.horizon, beta=rel.beta,
                                    method=rel.method, seed=seed, neighbours=dep.neighbours)
    if rel.type == "band_monitor":
        from pipeline.monitors import BandMonitor

        # n_users 0: the stream's workers keep the active set; the releaser only adds noise to counts
        return BandMonitor.from_target(0, allotment.epsilon, allotment.delta, neighbours=dep.neighbours, seed=seed)
    if rel.type == "relative_error":
        from pipeline.stream import relative_error

        return relative_error.build_mechanism(dep, rel, allotment, dep.n if n is None else n, seed)
    raise ValueError(f"release {rel.name!r}: unknown type {rel.type!r}")
