"""``python -m pipeline.cli``: the ``dpstream`` command."""

from pipeline.cli import run

run()
