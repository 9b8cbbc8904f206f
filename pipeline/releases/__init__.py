"""Release kinds as plug-ins: one module per kind, registered by name (see :mod:`.base`).

Importing this package registers the built-in kinds, in the order the configuration lists them.
"""

from .base import (AlertsKind, CountsKind, ReleaseConfig, ReleaseKind, ReleaseReader, ReleaseWriter,
                   Setting, StepInput, StepOutput, PrivacyEvent, get_kind, kind_of, kinds, register)
from . import fixed_window, cumulative, heavy_hitters, band_monitor, relative_error  # noqa: F401  (registration)

__all__ = ["AlertsKind", "CountsKind", "ReleaseConfig", "ReleaseKind", "ReleaseReader", "ReleaseWriter",
           "Setting", "StepInput", "StepOutput", "PrivacyEvent", "get_kind", "kind_of", "kinds", "register"]
