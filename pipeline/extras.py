"""Optional dependencies: extras of the dpstream package (pyproject.toml) that the stream processes
(workers, releaser) never import. A command that needs a missing one stops with one line naming the
extra to install, before it does anything.

======  ===================  ==========================================================
extra   packages             needed by
======  ===================  ==========================================================
plots   matplotlib, tqdm     ``dpstream demo`` and ``batch`` (PNG plots, progress), jobs/
report  plotly               ``dpstream report`` (the analyst page)
files   pyarrow              ``dpstream produce --file`` (CSV/JSONL/Parquet), ``export`` to Parquet
======  ===================  ==========================================================
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRA_OF", "missing_extra", "extra_of_error"]

# top-level module -> the extra that installs it
EXTRA_OF = {"matplotlib": "plots", "tqdm": "plots", "plotly": "report", "pyarrow": "files"}


def _line(module: str, what: str) -> str:
    extra = EXTRA_OF[module]
    return f"{what} needs {module}, which is not installed: pip install 'dpstream[{extra}]'"


def missing_extra(what: str, *modules: str) -> str | None:
    """The one line to show when one of ``modules`` (keys of :data:`EXTRA_OF`) is not installed, else
    None. ``what`` names the command, e.g. ``"dpstream report"``."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            return _line(module, what)
    return None


def extra_of_error(err: BaseException, what: str) -> str | None:
    """The one line for an import of an extra's module that failed (None: another error)."""
    if isinstance(err, ModuleNotFoundError) and err.name:
        module = err.name.split(".")[0]
        if module in EXTRA_OF:
            return _line(module, what)
    return None
