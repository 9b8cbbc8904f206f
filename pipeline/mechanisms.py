"""The mechanism a configured release runs, built with its planned allotment: one construction for
the stream's releaser (:class:`pipeline.stream.release.engine.ReleaseEngine`) and for ``dpstream plan``
(:mod:`pipeline.error_bounds`), so the bounds the plan shows are the ones the releases run with."""

from __future__ import annotations

__all__ = ["build_mechanism"]


def build_mechanism(deployment, release, allotment, n: int | None, seed=None):
    """The library mechanism of ``release`` (a configured release of ``deployment``) calibrated to
    ``allotment`` (its :class:`~pipeline.privacy.accounting.ZCDP` or ``ApproxDP`` share of the budget)
    for ``n`` users. ``seed``: None (secure randomness), an int or a RandomSource."""
    from pipeline.releases import Setting, kind_of

    attribute = deployment.attributes[release.attribute]
    setting = Setting(horizon=deployment.horizon, neighbours=deployment.neighbours, domain_size=attribute.size,
                      allotment=allotment, seed=seed, n=deployment.n if n is None else n, attribute=attribute)
    return kind_of(release).build(release, setting)
