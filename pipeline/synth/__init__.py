"""Continual synthetic longitudinal data (Bun, Gaboardi, Neunhoeffer, Zhang 2024, arXiv 2306.07884):
fixed-window (Algorithm 1, categorical generalisation) and cumulative (Algorithm 2 + Appendix B)
synthesizers. See docs/synthesizers.md."""

from .cumulative import CumulativeSynthesizer, counter_weights
from .fixed_window import FixedWindowSynthesizer, rounding_constant, rounding_proxy

__all__ = [
    "CumulativeSynthesizer",
    "FixedWindowSynthesizer",
    "counter_weights",
    "rounding_constant",
    "rounding_proxy",
]
