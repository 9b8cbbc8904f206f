"""Release kinds as plug-ins: one module per kind, registered by name (see :mod:`.base`).

Importing this package registers the built-in kinds, in the order the configuration lists them.
"""

from . import band_monitor, cumulative, fixed_window, heavy_hitters, relative_error  # noqa: F401  (registration)
from .base import (
    AlertsKind,
    CountsKind,
    PrivacyEvent,
    ReleaseConfig,
    ReleaseKind,
    ReleaseReader,
    ReleaseWriter,
    Setting,
    StepInput,
    StepOutput,
    get_kind,
    kind_of,
    kinds,
    register,
)

__all__ = [
    "AlertsKind",
    "CountsKind",
    "ReleaseConfig",
    "ReleaseKind",
    "ReleaseReader",
    "ReleaseWriter",
    "Setting",
    "StepInput",
    "StepOutput",
    "PrivacyEvent",
    "get_kind",
    "kind_of",
    "kinds",
    "register",
]
