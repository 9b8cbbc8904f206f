"""``python -m pipeline.cli``: the ``dpstream`` command."""

import sys

from pipeline.cli import main

sys.exit(main())
